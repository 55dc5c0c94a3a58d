"""posenc.experiments.analyze: attention weights, bias curves, RoPE wavelengths, per-position loss, end to end."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import decoder, tokens

import posenc
from posenc.experiments import analyze, analyze_plots


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
    from configs import default
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
    from configs import default
    from posenc.training import loop

    c = default.get_config("tiny")
    c.model.num_layers = 2
    c.model.position.layer_kinds = ("rope", "t5")  # one run: attention, bias curves and RoPE figures
    c.train.steps = 10
    c.eval.lengths = (16,)
    loop.run(c, str(tmp_path / "run"))
    written = analyze.analyze(str(tmp_path / "run"), str(tmp_path / "out"), prefix="x_", factor=4,
                              batch_size=4)
    assert set(written) == {"attention", "bias_curves", "rope_wavelengths", "position_loss", "analysis"}
    for path in written.values():
        assert os.path.basename(path).startswith("x_") and os.path.getsize(path) > 0
    numbers = json.load(open(written["analysis"]))
    for entropy in numbers["attention"]["64"]["entropy"]:  # 0 <= H(i) <= log(i + 1): rows of weights
        assert all(-1e-5 <= h <= math.log(i + 1) + 1e-5 for i, h in enumerate(entropy))
    assert numbers["lengths"] == [16, 64]
    assert [len(e) for e in numbers["attention"]["64"]["entropy"]] == [64, 64]
    assert [c["kind"] for c in numbers["bias_curves"]] == ["t5"]
    pl = numbers["position_loss"]
    assert len(pl["loss"]) == 64 and pl["train_answer_tokens"] == 7  # copy at 16: strings of 7
    assert pl["loss"][pl["first_answer_position"] - 1] is None and pl["loss"][pl["first_answer_position"]] is not None
    # The restored parameters are the trained ones (the analysis is of this run, not a fresh model).
    resolved, model = analyze.load(str(tmp_path / "run"))
    fresh = nnx.state(loop.init_state(resolved)[0], nnx.Param)
    trained = nnx.state(model, nnx.Param)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(fresh), jax.tree.leaves(trained)))
