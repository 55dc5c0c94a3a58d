"""The stick-breaking unit in the model against the official reference.

Reference: shawntan/stickbreaking-attention @ 3147a38, tests/test_attn.py ``ref_fwd`` and
stickbreaking_attention/sb_ref.py ``stickbreaking`` (transcribed in tests/test_stickbreaking.py),
applied to the layer's q, k, v projections; the soft-capped variant caps the logits of the same
transcription. Registry-wide tests cover training, decoding, blocked == dense and causality.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_stickbreaking import logsigmoid, official_ref_fwd

import helpers

B, L, D, H = 2, 9, 32, 4
DH = D // H


def _layer(attend_current=False, **model):
    model = helpers.decoder("stickbreaking", position=dict(attend_current=attend_current),
                            num_layers=1, **model)
    return model, model.blocks[0].attn


def _heads_first(y):
    return np.swapaxes(y.reshape(y.shape[:2] + (H, DH)), 1, 2)


def official_layer(attn, x, attend_current, softcap=0.0):
    """o_proj(ref_fwd(q, k, v)) with q, k, v = x W (numpy float64); softcap caps sb_ref's logits."""
    x = np.asarray(x, np.float64)
    q, k, v = (_heads_first(x @ np.asarray(w[...], np.float64).reshape(D, -1))
               for w in (attn.wq, attn.wk, attn.wv))
    if softcap:
        o = capped_ref_fwd(q, k, v, attend_current, softcap)
    else:
        o, _ = official_ref_fwd(q, k, v, attend_current=attend_current)
    o = np.swapaxes(o, 1, 2).reshape(x.shape)
    return o @ np.asarray(attn.wo[...], np.float64).reshape(D, D)


def capped_ref_fwd(q, k, v, attend_current, cap):
    """sb_ref.py stickbreaking and ref_fwd with the logits soft-capped: cap * tanh(logits / cap)."""
    length = q.shape[-2]
    cm = np.tril(np.ones((length, length)), -1)
    mask = np.triu(np.ones((length, length)), 1 if attend_current else 0).astype(bool)
    logits = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
    logits = cap * np.tanh(logits / cap)
    log_z = np.where(mask, -1e5, logsigmoid(logits))
    log_beta = np.where(mask, 0.0, logsigmoid(-logits))
    att = np.exp(log_z + np.einsum("bhij,jk->bhik", log_beta, cm))
    return att @ v + (1 - att.sum(-1))[..., None] * v


@pytest.mark.parametrize("attend_current", [False, True])
def test_layer_matches_the_official_reference(attend_current):
    _, attn = _layer(attend_current)
    x = 2.0 * jax.random.normal(jax.random.key(1), (B, L, D))
    y = jax.jit(lambda x: attn.forward(x, jnp.arange(L)[None], seq_len=L))(x)
    np.testing.assert_allclose(np.asarray(y), official_layer(attn, x, attend_current),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("impl", ["dense", "blocked"])
def test_soft_capped_logits_dense_and_in_query_blocks(impl):
    _, attn = _layer(True, norm=dict(attn_softcap=1.5), attention_impl=impl, attention_block=4)
    x = 3.0 * jax.random.normal(jax.random.key(2), (B, L, D))
    y = attn.forward(x, jnp.arange(L)[None], seq_len=L)
    want = official_layer(attn, x, True, softcap=1.5)
    np.testing.assert_allclose(np.asarray(y), want, rtol=2e-5, atol=2e-5)
    assert float(np.abs(want - official_layer(attn, x, True)).max()) > 1e-3  # the cap acts


def test_bf16_layer_and_decoding_in_pieces():
    _, attn = _layer(False, dtype="bfloat16")
    x = jax.random.normal(jax.random.key(3), (B, L, D)).astype(jnp.bfloat16)
    y = jax.jit(lambda x: attn.forward(x, jnp.arange(L)[None], seq_len=L))(x)
    assert y.dtype == jnp.bfloat16
    want = official_layer(attn, x.astype(jnp.float32), False)
    err = float(np.abs(np.asarray(y, np.float32) - want).max())
    assert err < 0.05 * float(np.abs(want).max()) + 0.02, err
    model, _ = _layer(True)
    tokens = helpers.tokens(B, L)
    # 4 queries against 4 keys, then 5 against 9 (a cache of 12 slots: 3 unused)
    full, a, b, _, shifted = helpers.decode_in_pieces(model, tokens, 4, L + 3)
    np.testing.assert_allclose(np.concatenate([a, b], 1), full, rtol=2e-5, atol=2e-5)
    # No position term: shifted positions give the same logits.
    np.testing.assert_allclose(np.asarray(shifted), np.asarray(full), rtol=1e-6, atol=1e-6)
