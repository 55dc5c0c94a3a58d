"""posenc.studies.analyze: attention weights, bias curves, RoPE wavelengths, per-position loss, end to end."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from helpers import decoder, tokens
from posenc.studies import analyze, analyze_plots


def _zero_queries(model):
    for block in model.blocks:
        block.attn.wq[...] = jnp.zeros_like(block.attn.wq[...])


def _softmax_rows(logits):
    L = logits.shape[-1]
    causal = np.tril(np.ones((L, L), bool))
    z = np.where(causal, logits, -np.inf)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_attention_weights_are_the_softmax_of_the_bias_when_queries_are_zero():
    # q = 0: every logit is the ALiBi bias, so each layer's weights are softmax(-m (i - j)) over j <= i.
    model = decoder("alibi", num_layers=2)
    _zero_queries(model)  # (the end-to-end test below reads the weights of trained RoPE / T5 layers)
    L = 40  # > head_dim (8): several one-hot value calls per layer
    weights = analyze.attention_weights(model, tokens(2, L))
    pos = np.arange(L)[None]
    want = _softmax_rows(np.asarray(posenc.alibi.bias(pos, pos, posenc.alibi.slopes(4)))[0])
    assert len(weights) == 2
    for w in weights:
        assert w.shape == (2, 4, L, L)
        np.testing.assert_allclose(w, np.broadcast_to(want, w.shape), atol=1e-6)


def test_profile_of_uniform_attention():
    L = 9
    w = np.tril(np.ones((L, L))) / np.arange(1, L + 1)[:, None]
    p = analyze.attention_profile([w[None, None]])
    np.testing.assert_allclose(p["entropy"][0], np.log(np.arange(1, L + 1)), atol=1e-12)
    np.testing.assert_allclose(p["distance"][0], np.arange(L) / 2, atol=1e-12)
    np.testing.assert_allclose(p["first_key"][0], 1 / np.arange(1, L + 1), atol=1e-12)
    assert p["first_key_share"][0] == pytest.approx(np.mean(1 / np.arange(2, L + 1)))


def test_first_key_share_of_learned_sinks_with_zero_queries():
    # q = 0 and no position terms (NoPE): every visible key has logit 0, and head h's sink s_h joins
    # the normalizer (gpt-oss), so key 0's weight for query i is 1 / (i + 1 + exp(s_h)).
    model = decoder("nope", num_layers=1, attention_sinks="learned")
    _zero_queries(model)
    sinks = np.array([-1.0, 0.0, 0.5, 2.0], np.float32)
    model.blocks[0].attn.sinks[...] = jnp.asarray(sinks)
    L = 10
    p = analyze.attention_profile(analyze.attention_weights(model, tokens(2, L)))
    i = np.arange(L)[None, :]
    want = (1 / (i + 1 + np.exp(sinks)[:, None])).mean(0)
    np.testing.assert_allclose(p["first_key"][0], want, atol=1e-6)
    assert p["first_key_share"][0] == pytest.approx(want[1:].mean(), abs=1e-6)


def test_bias_curves_follow_the_t5_buckets_and_merge_a_shared_table():
    model = decoder("t5", num_layers=2, perturb=0.1)
    table = np.asarray(model.blocks[0].attn.encoding.table[...])  # [buckets, H]
    curves = analyze.bias_curves(model, [15, 63])
    assert [c["layer"] for c in curves] == [0, 1]
    d = np.arange(64)
    bucket = np.asarray(posenc.t5.relative_position_bucket(-d, bidirectional=False, num_buckets=32,
                                                           max_distance=128))
    np.testing.assert_allclose(np.asarray(curves[0]["curves"][63]), table[bucket].T, atol=1e-6)
    merged = analyze_plots.shared_layers(curves)
    assert len(merged) == 1 and merged[0]["layers"] == [0, 1]


def _resolved(kind="rope", **model):
    from posenc.configs import default
    from posenc.training import prepare

    c = default.get_config("tiny")
    c.model.position.kind = kind
    c.model.update(model)
    return prepare.resolve(c)


def test_rope_wavelengths_and_what_each_scaling_changes():
    r = _resolved("rope", d_model=64, num_heads=2)  # head_dim 32: 16 pairs
    w = analyze.rope_wavelengths(r, 4)
    i = np.arange(16)
    np.testing.assert_allclose(w["wavelength"]["unscaled"], 2 * math.pi * 10000.0 ** (2 * i / 32), rtol=1e-6)
    np.testing.assert_allclose(w["pair_factor"]["PI"], 4.0, rtol=1e-6)  # PI stretches every pair
    ntk = np.asarray(w["pair_factor"]["NTK"])
    assert ntk[0] == pytest.approx(1.0) and ntk[-1] > 3.0 and np.all(np.diff(ntk) > 0)
    yarn = np.asarray(w["pair_factor"]["YaRN"])  # high frequencies kept, the lowest interpolated
    assert yarn[0] == pytest.approx(1.0) and yarn[-1] == pytest.approx(4.0, rel=1e-5)
    assert analyze.rope_wavelengths(_resolved("alibi"), 4) is None


def test_position_metrics_count_only_masked_tokens():
    model = decoder("nope", num_layers=1)
    x = tokens(3, 10)
    mask = jnp.zeros((3, 10)).at[:, 6:].set(1.0)
    m = analyze.position_metrics(model, x, x, mask)
    assert m["loss"][:6] == [None] * 6 and all(v is not None for v in m["loss"][6:])
    logp = np.asarray(jax.nn.log_softmax(model(x), -1))
    want = -np.take_along_axis(logp, np.asarray(x)[..., None], -1)[..., 0][:, 7].mean()
    assert m["loss"][7] == pytest.approx(float(want), rel=1e-5)


def test_analyze_a_trained_run_end_to_end(tmp_path):
    from posenc.configs import default
    from posenc.training import loop

    c = default.get_config("tiny")
    c.model.num_layers = 2
    c.model.position.layer_kinds = ("rope", "t5")  # one run: attention, bias curves and RoPE figures
    c.train.steps = 10
    c.eval.lengths = (16,)
    loop.run(c, str(tmp_path / "run"))
    written = analyze.analyze(str(tmp_path / "run"), str(tmp_path / "out"), prefix="x_", factor=4,
                              batch_size=4)
    assert set(written) == {"attention", "bias_curves", "rope_wavelengths", "answer_attention", "position_loss",
                            "answer_peaks", "analysis"}
    for path in written.values():
        assert os.path.basename(path).startswith("x_") and os.path.getsize(path) > 0
    numbers = json.load(open(written["analysis"]))
    for entropy in numbers["attention"]["64"]["entropy"]:  # 0 <= H(i) <= log(i + 1): rows of weights
        assert all(-1e-5 <= h <= math.log(i + 1) + 1e-5 for i, h in enumerate(entropy))
    assert numbers["lengths"] == [16, 64]
    assert [len(e) for e in numbers["attention"]["64"]["entropy"]] == [64, 64]
    assert [c["kind"] for c in numbers["bias_curves"]] == ["t5"]
    aa = numbers["answer_attention"]  # copy at 64: 31 answer symbols, 2 layers x 2 heads
    assert len(aa["queries"]) == 31 and np.asarray(aa["weights"]).shape == (2, 2, 31, 64)
    np.testing.assert_allclose(np.asarray(aa["weights"]).sum(-1), 1.0, atol=1e-5)  # rows of weights
    pl = numbers["position_loss"]
    with open(written["answer_peaks"]) as f:
        peaks = f.read().splitlines()  # a row per answer token, a column per head
    assert len(peaks) == 4 + 31 and peaks[2].endswith("| L0 H0 | L0 H1 | L1 H0 | L1 H1 |")
    first = round(aa["queries"][0])
    assert peaks[4].startswith(f"| 0 | {first} | {pl['accuracy'][first]:.3f} | {aa['peak_offset'][0][0][0]:+d} (")
    assert len(pl["loss"]) == 64 and pl["train_answer_tokens"] == 7  # copy at 16: strings of 7
    assert pl["loss"][pl["first_answer_position"] - 1] is None and pl["loss"][pl["first_answer_position"]] is not None
    # The restored parameters are the trained ones (the analysis is of this run, not a fresh model).
    resolved, model = analyze.load(str(tmp_path / "run"))
    fresh = nnx.state(loop.init_state(resolved)[0], nnx.Param)
    trained = nnx.state(model, nnx.Param)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(fresh), jax.tree.leaves(trained)))


def test_answer_attention_on_keys_with_the_predicted_tokens_id():
    # BOS a0 a1 + b0 b1 = c0 c1 with coupled ids: digits of equal significance share an id (2, 3)
    pos = np.array([[0, 2, 3, 1, 2, 3, 1, 2, 3]])
    mask = np.zeros((1, 9))
    mask[0, 6:] = 1  # '=' predicts c0 (id 2), c0 predicts c1 (id 3), c1 predicts EOS (past the end)
    L = 9
    w = np.zeros((1, 2, L, L))
    for t in range(L):
        keys = [j for j in range(t + 1) if t + 1 < L and pos[0, j] == pos[0, t + 1]]
        if keys:
            w[0, 0, t, keys] = 1 / len(keys)  # head 0: the keys of the predicted token's id
        else:
            w[0, 0, t, :t + 1] = 1 / (t + 1)
    w[0, 1, :, 0] = 1.0  # head 1: BOS
    out = analyze.answer_attention([w], mask, pos)
    assert out["queries"] == [6.0, 7.0, 8.0]
    np.testing.assert_allclose(out["same_id"][0], [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(out["peak_same_id"][0], [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    # the peak key's id minus the predicted id: head 0 on it (0), then (no key) BOS, id 0, past the
    # end's -1; head 1 on BOS: 0 - 2, 0 - 3, 0 - (-1)
    assert out["peak_offset"][0] == [[0, 0, 1], [-2, -3, 1]]
    assert out["peak_offset_share"][0] == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    # c0's id 2 is on a0 and b0 (keys 1, 4); key 7 has it too, but it is c0 itself, not yet visible
    np.testing.assert_allclose(out["same_id_keys"][0], [0, 1, 0, 0, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(out["same_id_keys"][1], [0, 0, 1, 0, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(out["weights"][0][0][0], [0, 0.5, 0, 0, 0.5, 0, 0, 0, 0])
    # without ids (0..L-1) the predicted token's id is its own position: never a visible key
    assert np.asarray(analyze.answer_attention([w], mask)["same_id"]).max() == 0.0


def test_analysis_examples_carry_the_tasks_coupled_ids():
    from posenc.configs import default
    from posenc.training import prepare

    c = default.get_config("tiny")
    c.task.update(name="addition", train_length=28, options={"coupled": True, "format": "reversed"})
    c.model.position.kind = "position_coupling"
    c.model.position.position_coupling.max_position = 32
    r = prepare.resolve(c)
    inputs, _, mask, positions = analyze.eval_batch(r, 28, 4, 0)
    want = r.task.batch(jax.random.split(jax.random.fold_in(jax.random.key(0), 28))[0], 4, 28, split="eval")
    np.testing.assert_array_equal(positions, want["position_ids"])
    np.testing.assert_array_equal(inputs, want["inputs"])
    assert positions[0, 1] == 2  # the first written digit (significance 0) of a: s0 + 1 + 0, s0 = 1 at evaluation
