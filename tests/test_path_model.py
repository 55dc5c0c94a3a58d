"""The PaTH and PaTH-FoX units in the model against the official fla layer.

Reference: fla-org/flash-linear-attention @ bc3b101, fla/layers/path_attn.py
``PaTHAttention.forward`` (training branch: ``w_proj`` full rank under GQA or low rank, ``ShortConvolution`` with SiLU,
``l2_norm``, ``beta = 2 sigmoid(bt_proj(x))``, ``g = logsigmoid(g_proj(x))``, then
``parallel_path_attn``), in numpy float64 with the transcriptions of tests/test_path.py
(``naive_path_attn``, ``causal_conv1d_ref``). Registry-wide tests cover training, cached decoding,
blocked == dense and causality through gradients.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_path import causal_conv1d_ref, naive_path_attn

import helpers

B, L, D, H, K = 2, 10, 32, 4, 2
DH = D // H


def _layer(kind, **model):
    model = helpers.decoder(kind, num_layers=1, num_kv_heads=K, perturb=0.05, **model)
    return model, model.blocks[0].attn


def _np(p):
    return np.asarray(p[...], np.float64)


def official_layer(attn, x, softcap=0.0):
    """PaTHAttention.forward (training branch) on x [B, T, D] in float64 -> o_proj output.

    ``softcap`` caps the scaled logits A of naive_path_attn before its softmax."""
    enc = attn.encoding
    x = np.asarray(x, np.float64)
    heads = lambda y, n: y.reshape(y.shape[:2] + (n, DH))  # noqa: E731
    q = heads(x @ _np(attn.wq).reshape(D, -1), H)
    k = heads(x @ _np(attn.wk).reshape(D, -1), K)
    v = heads(x @ _np(attn.wv).reshape(D, -1), K)
    w = x @ _np(enc.w_down)  # use_low_rank_w=False (the default here under GQA): Linear(D, kv_dim)
    if enc.w_up is not None:  # use_low_rank_w: nn.Sequential(Linear(D, 32), Linear(32, kv_dim))
        w = w @ _np(enc.w_up)
    w, _ = causal_conv1d_ref(np.swapaxes(w, 1, 2), _np(enc.conv), activation="silu")
    w = heads(np.swapaxes(w, 1, 2), K)
    w = w / np.sqrt((w * w).sum(-1, keepdims=True) + 1e-6)  # l2_norm
    beta = 2.0 / (1.0 + np.exp(-(x @ _np(enc.w_beta) + _np(enc.b_beta))))
    if enc.forget_gate:
        z = x @ _np(enc.w_g) + _np(enc.b_g)
        g = -np.logaddexp(0.0, -z)  # logsigmoid
    else:
        g = np.zeros((B, x.shape[1], H))
    o, logits = naive_path_attn(q, k, v, w, beta, g, 1 / math.sqrt(DH))
    if softcap:
        a = softcap * np.tanh(np.where(np.isfinite(logits), logits, 0.0) / softcap)
        a = np.where(np.isfinite(logits), a, -np.inf)
        p = np.exp(a - a.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        o = np.swapaxes(p @ np.repeat(np.swapaxes(v, 1, 2), H // K, axis=1), 1, 2)
    return o.reshape(x.shape) @ _np(attn.wo).reshape(D, D)


@pytest.mark.parametrize("kind", ["path", "path_fox"])
def test_layer_matches_the_official_path_layer(kind):
    x = jax.random.normal(jax.random.key(1), (B, L, D))
    for rank in (None, 32):  # full rank (the GQA default), then fla's low-rank use_low_rank_w
        _, attn = _layer(kind, position=dict(w_rank=rank))
        assert (attn.encoding.w_up is None) == (rank is None)
        y = jax.jit(lambda x: attn.forward(x, jnp.arange(L)[None], seq_len=L))(x)
        np.testing.assert_allclose(np.asarray(y), official_layer(attn, x), rtol=2e-5, atol=2e-5)


def test_soft_capped_logits_in_prefill_blocks_match_the_reference():
    """Blocked PaTH with a soft-cap runs as a prefill in query blocks (keys moved through the
    block's transforms as a decoding cache); it equals the capped reference."""
    _, attn = _layer("path_fox", norm=dict(attn_softcap=0.8), attention_impl="blocked",
                     attention_block=4)
    x = 2.0 * jax.random.normal(jax.random.key(2), (B, L, D))
    y = jax.jit(lambda x: attn.forward(x, jnp.arange(L)[None], seq_len=L))(x)
    want = official_layer(attn, x, softcap=0.8)
    np.testing.assert_allclose(np.asarray(y), want, rtol=2e-5, atol=2e-5)
    assert float(np.abs(want - official_layer(attn, x)).max()) > 1e-3  # the cap acts


def test_bf16_layer_and_chunked_prefill_from_the_cache():
    _, attn = _layer("path", dtype="bfloat16")
    x = jax.random.normal(jax.random.key(3), (B, L, D)).astype(jnp.bfloat16)
    y = jax.jit(lambda x: attn.forward(x, jnp.arange(L)[None], seq_len=L))(x)
    assert y.dtype == jnp.bfloat16
    want = official_layer(attn, x.astype(jnp.float32))
    err = float(np.abs(np.asarray(y, np.float32) - want).max())
    assert err < 0.05 * float(np.abs(want).max()) + 0.02, err
    # Queries fewer than keys: 4 tokens, then 6 against the 4 cached (moved) keys and themselves.
    model, _ = _layer("path_fox")
    tokens = helpers.tokens(B, L)
    full, a, b, cache, shifted = helpers.decode_in_pieces(model, tokens, 4, L + 2)
    np.testing.assert_allclose(np.concatenate([a, b], 1), full, rtol=2e-5, atol=2e-5)
    assert set(cache["state"][0]) == {"conv", "c"} and cache["state"][0]["conv"].shape == (B, 2, K * DH)
    # No position input: shifted positions give the same logits.
    np.testing.assert_allclose(np.asarray(shifted), np.asarray(full), rtol=1e-6, atol=1e-6)
