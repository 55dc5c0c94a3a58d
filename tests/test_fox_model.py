"""The FoX unit in the model against the official ForgettingAttentionLayer, and FoX (Pro).

Reference: zhixuan-lin/forgetting-transformer @ 883f260,
src/forgetting_transformer/model/forgetting_transformer/modeling_forgetting_transformer.py,
``ForgettingAttentionLayer.forward`` (fgate_type "full", no RoPE) transcribed in numpy float64
with the official pieces of tests/test_fox.py: ``ShiftLinear`` (official_token_shift),
``GroupNorm`` q/k norm (group_norm_ref), ``FusedGroupNormGated`` (group_norm_gated_ref) and
fla's ``naive_forgetting_attn`` for ``forgetting_attention``. The registry-wide tests
(test_model, test_decode, test_attention, test_causality) cover training, cached decoding,
blocked == dense and causality through gradients.
"""

import math

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_fox import (group_norm_gated_ref, group_norm_ref, logsigmoid, naive_forgetting_attn,
                      official_token_shift, sigmoid)

B, L, D, H = 2, 10, 32, 4
DH = D // H


def _layer(pro, **model):
    model = helpers.decoder("fox", position=dict(pro=pro), num_layers=1, perturb=0.05, **model)
    return model, model.blocks[0].attn


def _np(p):
    return np.asarray(p[...], np.float64)


def official_layer(attn, x):
    """ForgettingAttentionLayer.forward on x [B, T, D] (numpy float64) -> (o_proj output, o before it)."""
    enc = attn.encoding
    x = np.asarray(x, np.float64)
    wq, wk, wv = (_np(w).reshape(D, -1) for w in (attn.wq, attn.wk, attn.wv))
    q, k, v = x @ wq, x @ wk, x @ wv
    if enc.pro:  # ShiftLinear: alpha = sigmoid(shift_proj(x)); token_shift(out_per_head, alpha, 1 - alpha)
        heads = lambda y: y.reshape(y.shape[:2] + (H, DH))  # noqa: E731
        k = official_token_shift(heads(k), sigmoid(x @ _np(enc.w_k_shift))).reshape(k.shape)
        v = official_token_shift(heads(v), sigmoid(x @ _np(enc.w_v_shift))).reshape(v.shape)
        q = group_norm_ref(q, _np(enc.q_norm).reshape(-1), H, 1e-5)  # q_norm / k_norm: GroupNorm
        k = group_norm_ref(k, _np(enc.k_norm).reshape(-1), H, 1e-5)
    log_fgate = logsigmoid(x @ _np(enc.w_f) + _np(enc.b_f))  # fgate_proj, logsigmoid(.float())
    q, k, v = (y.reshape(y.shape[:2] + (H, DH)) for y in (q, k, v))
    o = naive_forgetting_attn(q, k, v, log_fgate, 1 / math.sqrt(DH)).reshape(x.shape[:2] + (D,))
    if enc.pro:  # output_norm(o, g=ogate_proj(hidden_states)), norm_eps 1e-6
        o = group_norm_gated_ref(o, x @ _np(enc.w_gate), _np(enc.out_norm).reshape(-1), H, 1e-6)
    return o @ _np(attn.wo).reshape(D, D), o


@pytest.mark.parametrize("pro", [False, True])
def test_layer_matches_the_official_forgetting_attention_layer(pro):
    model, attn = _layer(pro)
    x = jax.random.normal(jax.random.key(1), (B, L, D))
    positions = jnp.arange(L)[None]
    y = jax.jit(lambda x: attn.forward(x, positions, seq_len=L))(x)
    want, _ = official_layer(attn, x)
    np.testing.assert_allclose(np.asarray(y), want, rtol=2e-5, atol=2e-5)
    # The gate matters: the same layer with open gates (f = 1) gives other outputs.
    assert float(np.abs(want - official_layer_open_gates(attn, x)).max()) > 1e-3


def official_layer_open_gates(attn, x):
    b_f = attn.encoding.b_f[...]
    attn.encoding.b_f[...] = jnp.full_like(b_f, 30.0)  # sigmoid(30 + w.x) ~ 1: no decay
    try:
        return official_layer(attn, x)[0]
    finally:
        attn.encoding.b_f[...] = b_f


def test_bf16_layer_and_prefill_in_pieces():
    """bf16 compute stays near the float64 reference; a prefill in two pieces (queries fewer than
    keys: the cached c and the running sum carry over) equals the full pass."""
    model, attn = _layer(True, dtype="bfloat16", num_kv_heads=H)
    x = jax.random.normal(jax.random.key(2), (B, L, D))
    y = jax.jit(lambda x: attn.forward(x, jnp.arange(L)[None], seq_len=L))(x.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    want, _ = official_layer(attn, x.astype(jnp.bfloat16).astype(jnp.float32))
    err = float(np.abs(np.asarray(y, np.float32) - want).max())
    assert err < 0.05 * float(np.abs(want).max()) + 0.02, err
    # Pieces through the decoder's cache, float32 model.
    model, _ = _layer(True)
    tokens = helpers.tokens(B, L)
    full, a, b, cache, shifted = helpers.decode_in_pieces(model, tokens, 4, L + 2)
    np.testing.assert_allclose(np.concatenate([a, b], 1), full, rtol=2e-5, atol=2e-5)
    assert set(cache["state"][0]) == {"c", "k_prev", "v_prev"}
    assert cache["features"][0]["c"].shape == (B, L + 2, H)


def test_logits_ignore_positions_and_the_bias_stays_blocked():
    """FoX reads no position (relative-shift invariance is exact), and the blocked path equals the
    dense one at a block that splits the sequence (no [L, L] bias is needed)."""
    model, _ = _layer(False)
    tokens = helpers.tokens(B, L)
    a = model(tokens, jnp.arange(L))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(model(tokens, 1000 + 3 * jnp.arange(L))))
    blocked = helpers.decoder("fox", num_layers=1, perturb=0.05, attention_impl="blocked",
                              attention_block=3)
    np.testing.assert_allclose(np.asarray(blocked(tokens)), np.asarray(a), rtol=2e-5, atol=2e-5)
