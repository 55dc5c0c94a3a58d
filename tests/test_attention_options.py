"""model.attention_sinks and model.attention_gate in the decoder, against transcriptions of official code.

References (numpy float64, written from the official code):
- openai/gpt-oss @ 7b58334, gpt_oss/torch/model.py ``sdpa`` (tests/test_learned_sinks.py's
  transcription): learned sinks, GQA with KV-major query heads, sliding window;
- the off-by-one softmax ``exp(l_ij) / (1 + sum_k exp(l_ik))`` (a fixed sink of 0);
- huggingface/transformers @ 01cdc60, models/qwen3_next/modeling_qwen3_next.py
  ``Qwen3NextAttention.forward`` (tests/test_gated.py's transcription): q_proj viewed per head as
  [query, gate], ``attn_output * sigmoid(gate)`` before o_proj.

Paths: dense, blocked, fused (Pallas interpreter on CPU) and cached decoding give one model's
logits and gradients; a layer whose unit computes its own weights refuses sinks in one line.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_gated import qwen3_next_forward
from test_learned_sinks import np_softmax, official_sdpa

import helpers
from posenc.model import Decoder, ModelSpec


def _np(x):
    return np.asarray(x, np.float64)


def _layer(spec, seed=0):
    """The first layer's attention of a Decoder of ``spec`` with every parameter perturbed."""
    model = Decoder(spec, rngs=nnx.Rngs(seed))
    helpers.perturb_params(model, jax.random.key(seed + 7), 0.5)
    return model.blocks[0].attn


def _qkv(attn, x):
    """numpy q [T, H, Dh + gate], k, v [T, K, Dh] of the projections (no bias, no QK-norm)."""
    wq, wk, wv = (_np(p[...]) for p in (attn.wq, attn.wk, attn.wv))
    return (np.einsum("td,dhe->the", x, wq), np.einsum("td,dhe->the", x, wk),
            np.einsum("td,dhe->the", x, wv))


@pytest.mark.parametrize("span", [{}, {"attention_span": "window", "attention_window": 3}])
def test_learned_sinks_layer_matches_gpt_oss_sdpa(span):
    """One NoPE layer, 4 query heads on 2 kv heads, sinks from the parameter (perturbed away from
    0): the layer output is gpt-oss's sdpa (with its sliding window) followed by the out projection."""
    T, D = 7, 16
    spec = helpers.spec("nope", d_model=D, num_heads=4, num_kv_heads=2, attention_sinks="learned",
                        attention_impl="dense", **span)
    attn = _layer(spec)
    x = np.random.default_rng(0).normal(size=(T, D))
    q, k, v = _qkv(attn, x)
    H, K, Dh = 4, 2, spec.head_dim
    want = official_sdpa(q.reshape(T, K, H // K, Dh), k, v, _np(attn.sinks[...]), Dh ** -0.5,
                         span.get("attention_window", 0))
    want = want @ _np(attn.wo[...]).reshape(H * Dh, D)
    got = attn.forward(jnp.asarray(x[None], jnp.float32), jnp.arange(T)[None], seq_len=T)
    assert float(np.abs(_np(attn.sinks[...])).min()) > 0.05
    np.testing.assert_allclose(_np(got[0]), want, rtol=1e-4, atol=1e-5)


def test_zero_sink_is_the_off_by_one_softmax():
    """attention_sinks='zero': w_ij = exp(l_ij) / (1 + sum_k exp(l_ik)), no parameter."""
    T, D = 6, 16
    spec = helpers.spec("nope", d_model=D, num_heads=2, attention_sinks="zero", attention_impl="dense")
    attn = _layer(spec, seed=3)
    assert attn.sinks is None
    x = np.random.default_rng(1).normal(size=(T, D))
    q, k, v = _qkv(attn, x)
    logits = np.einsum("qhd,khd->hqk", q, k) * spec.head_dim ** -0.5
    e = np.where(np.tril(np.ones((T, T), bool)), np.exp(logits), 0.0)
    w = e / (1.0 + e.sum(-1, keepdims=True))
    want = np.einsum("hqk,khd->qhd", w, v).reshape(T, -1) @ _np(attn.wo[...]).reshape(-1, D)
    got = attn.forward(jnp.asarray(x[None], jnp.float32), jnp.arange(T)[None], seq_len=T)
    np.testing.assert_allclose(_np(got[0]), want, rtol=1e-4, atol=1e-5)
    plain = np_softmax(np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf))
    assert np.abs(w - plain).max() > 0.05  # the sink takes mass


@pytest.mark.parametrize("mode", ["elementwise", "headwise"])
def test_gated_layer_matches_qwen3_next_forward(mode):
    """q_proj output viewed per head as [query, gate] (Qwen3-Next's layout); attention of the
    queries; output * sigmoid(gate) before o_proj. Headwise: one gate per head (the paper's)."""
    T, D, H = 5, 16, 2
    spec = helpers.spec("nope", d_model=D, num_heads=H, attention_gate=mode, attention_impl="dense")
    attn = _layer(spec, seed=1)
    Dh = spec.head_dim
    assert attn.wq[...].shape == (D, H, Dh + (Dh if mode == "elementwise" else 1))
    x = np.random.default_rng(2).normal(size=(T, D))
    q_out = np.einsum("td,dhe->the", x, _np(attn.wq[...]))
    _, k, v = _qkv(attn, x)
    query = q_out[..., :Dh]
    logits = np.einsum("qhd,khd->hqk", query, k) * Dh ** -0.5
    w = np_softmax(np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf))
    attn_output = np.einsum("hqk,khd->qhd", w, v)
    if mode == "elementwise":
        q_states, gated_out = qwen3_next_forward(q_out.reshape(T, -1), attn_output, Dh)
        np.testing.assert_array_equal(q_states, query)
    else:  # the paper's headwise gate (G = 1: its layout is Qwen3-Next's with one gate per head)
        gated_out = (attn_output / (1.0 + np.exp(-q_out[..., Dh:]))).reshape(T, -1)
    want = gated_out @ _np(attn.wo[...]).reshape(-1, D)
    got = attn.forward(jnp.asarray(x[None], jnp.float32), jnp.arange(T)[None], seq_len=T)
    np.testing.assert_allclose(_np(got[0]), want, rtol=1e-4, atol=1e-5)


def _model_paths(fields, *, length=10, seed=0):
    """Logits of the full forward (dense, blocked with blocks of 4, fused) and of cached decoding
    (a prefill of 4, then token by token), and the dense and fused gradients of the sinks and wq."""
    out, grads = {}, {}
    tokens = helpers.tokens(2, length)
    for impl in ("dense", "blocked", "pallas"):
        spec = helpers.spec(**fields, attention_impl=impl, attention_block=4, attention_causal_block=0)
        model = Decoder(spec, rngs=nnx.Rngs(seed))
        helpers.perturb_params(model, jax.random.key(seed + 1), 0.3)
        g, params, rest = nnx.split(model, nnx.Param, ...)

        @jax.jit
        def run(params, rest):
            def loss(params):
                logits = nnx.merge(g, params, rest)(tokens)
                return jnp.sum(jnp.sin(logits)), logits

            (_, logits), d = jax.value_and_grad(loss, has_aux=True)(params)
            return logits, d

        out[impl], d = run(params, rest)
        attn = d["blocks"][0]["attn"]
        grads[impl] = {n: attn[n][...] for n in ("sinks", "wq") if n in attn}
        if impl == "dense":
            cached, _ = jax.jit(lambda p, r: helpers.decode_stepwise(nnx.merge(g, p, r), tokens, 4, length))(
                params, rest)
            out["cached"] = cached
    return out, grads


@pytest.mark.parametrize("fields", [
    dict(kind="alibi", num_kv_heads=2, attention_sinks="learned", attention_gate="headwise"),
    dict(kind="rope", attention_sinks="zero", attention_gate="elementwise",
         attention_span="window", attention_window=3, norm=dict(attn_softcap=5.0)),
], ids=["alibi-gqa-learned-headwise", "rope-window-softcap-zero-elementwise"])
def test_dense_blocked_fused_and_cached_agree(fields):
    out, grads = _model_paths(fields)
    for name in ("blocked", "pallas", "cached"):
        np.testing.assert_allclose(_np(out[name]), _np(out["dense"]), rtol=2e-5, atol=2e-5, err_msg=name)
    for name in ("blocked", "pallas"):
        for p in grads["dense"]:
            np.testing.assert_allclose(_np(grads[name][p]), _np(grads["dense"][p]), rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name} {p}")
    if "sinks" in grads["dense"]:
        assert float(jnp.abs(grads["dense"]["sinks"]).min()) > 1e-4


def test_blocked_stats_equal_dense_stats_with_sinks():
    """Entropy over the keys and the sink, and the largest key logit, on both paths."""
    tokens = helpers.tokens(2, 9)
    stats = {}
    for impl in ("dense", "blocked"):
        model = helpers.decoder("t5", attention_sinks="learned", attention_impl=impl, attention_block=4,
                                perturb=0.5)
        stats[impl] = model(tokens, return_stats=True)[1]
    for name in ("max_attention_logit", "attention_entropy"):
        np.testing.assert_allclose(float(stats["blocked"][name]), float(stats["dense"][name]), rtol=1e-5)


def test_the_gate_is_causal():
    """d output_i / d input_j = 0 for j > i with the gate (it reads the query's own token only)."""
    model = helpers.decoder("rope", attention_gate="elementwise", attention_sinks="learned", perturb=0.3)
    g, state = nnx.split(model)
    x = jax.random.normal(jax.random.key(0), (1, 6, 32))
    jac = jax.jacobian(lambda x: nnx.merge(g, state).forward_embeddings(x).sum(-1))(x)  # [1, 6, 1, 6, 32]
    dep = np.abs(np.asarray(jac[0, :, 0])).sum(-1)  # [out i, in j]
    assert np.all(dep[np.triu_indices(6, 1)] == 0) and np.all(np.diag(dep) > 0)


def test_options_off_leave_the_layer_as_it_was():
    """Off: no sink parameter, wq [D, H, Dh], no gate; a fully open gate (logits 100: sigmoid = 1
    in float32) with the same q weights gives the ungated model's logits."""
    tokens = helpers.tokens(2, 8)
    plain = helpers.decoder("rope", bias="qkv", perturb=0.2)
    attn = plain.blocks[0].attn
    assert attn.sinks is None and attn.wq[...].shape == (32, 4, 8) and attn.biases["q"][...].shape == (4, 8)
    gated = helpers.decoder("rope", bias="qkv", attention_gate="headwise", perturb=0.2)
    for a, b in zip(plain.blocks, gated.blocks):
        b.attn.wq[...] = jnp.concatenate([a.attn.wq[...], jnp.zeros((32, 4, 1))], -1)
        b.attn.biases["q"][...] = jnp.concatenate([a.attn.biases["q"][...], jnp.full((4, 1), 100.0)], -1)
    np.testing.assert_allclose(np.asarray(gated(tokens)), np.asarray(plain(tokens)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("field,value,message", [
    ("attention_sinks", "yes", "unknown model.attention_sinks 'yes'; choose one of: learned, none, zero"),
    ("attention_gate", "sigmoid", "unknown model.attention_gate 'sigmoid'; choose one of: elementwise, "
                                  "headwise, none"),
])
def test_bad_values_name_the_field_and_the_choices(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        helpers.spec("rope", **{field: value})


@pytest.mark.parametrize("kind", ["stickbreaking", "path"])
def test_units_with_their_own_weights_refuse_sinks_in_one_line(kind):
    with pytest.raises(ValueError, match=rf"model.attention_sinks='zero' joins the softmax, but layer 0's "
                                         rf"position kind '{kind}' computes its own attention weights") as e:
        ModelSpec.from_config(helpers.model_cfg(kind, attention_sinks="zero"))
    assert "\n" not in str(e.value)
    helpers.spec(kind, attention_gate="headwise")  # the gate acts after attention: any unit
