"""The pope model unit: attention over its polar queries and keys gives the paper's scores times
1 / sqrt(head_dim) (a transcription in test_pope: Gopalakrishnan et al. 2025) on every path, with
the learned phase bias per key head; the cache holds the wider keys; the config rules around it."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_pope import paper_scores

import helpers
from posenc import pope
from posenc.model import fused
from posenc.model.attention import AttentionCall, attention

B, L, H, K = 1, 10, 4, 2


@pytest.mark.parametrize("impl", ["dense", "blocked", "pallas"])
def test_attention_weights_are_the_paper_scores_over_sqrt_head_dim(impl):
    layer = helpers.decoder("pope", num_kv_heads=K).blocks[0].attn
    unit, dh = layer.encoding, layer.head_dim
    assert layer.scale == 1.0 / math.sqrt(dh) and unit.qk_dim == 2 * dh  # not 1 / sqrt(Dh + r)
    rng = np.random.default_rng(2)
    delta = rng.uniform(-2 * np.pi, 0.0, size=(K, dh))
    unit.delta[...] = jnp.asarray(delta, jnp.float32)
    q, k = rng.normal(size=(L, H, dh)), rng.normal(size=(L, K, dh))
    v = np.broadcast_to(np.eye(L)[None, :, None, :], (B, L, K, L))  # one-hot values: out = weights
    pos = jnp.asarray([[3, 4, 6, 7, 8, 12, 13, 20, 21, 22]])

    @jax.jit
    def weights(q, k, v):
        qp, kp = unit.qk(q, k, pos, pos, seq_len=None)
        return attention(qp, kp, v, pos, pos, unit, AttentionCall(scale=layer.scale, impl=impl, block=4))

    with fused.force_backend("cpu"):  # pallas: v narrower than q, k through the interpreter
        got = weights(*(jnp.asarray(x, jnp.float32) for x in (q[None], k[None], v)))
    g = H // K
    s = np.stack([paper_scores(q[:, h:h + 1], k[:, h // g:h // g + 1], np.asarray(pos[0]), np.asarray(pos[0]),
                               np.asarray(pope.frequencies(dh), np.float64), delta[h // g])[0]
                  for h in range(H)]) / math.sqrt(dh)
    s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
    want = np.exp(s - s.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.moveaxis(np.asarray(got)[0], 0, 1), want, rtol=1e-5, atol=1e-6)


def test_cache_holds_polar_keys_and_constrain_clamps_the_bias():
    model = helpers.decoder("pope", position=dict(fraction=0.5), num_kv_heads=K)
    dh = model.head_dim
    cache = model.init_cache(2, 6)
    assert cache["k"][0].shape == (2, 6, K, dh + dh // 2) and cache["v"][0].shape == (2, 6, K, dh)
    unit = model.blocks[1].attn.encoding
    raw = jnp.linspace(-9.0, 3.0, K * unit.r).reshape(K, unit.r)
    unit.delta[...] = raw
    model.constrain()
    np.testing.assert_array_equal(unit.delta[...], np.clip(raw, -2 * np.float32(np.pi), 0.0))


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match=r"qk_norm_after_rope=True cannot follow position kind 'pope' "
                                         r"\(layer 0\): its queries and keys are 16 wide"):
        helpers.spec("pope", norm=dict(qk_norm="rms", qk_norm_after_rope=True))
    helpers.spec("pope", norm=dict(qk_norm="rms"))  # QK-norm before the transform: fine
    with pytest.raises(ValueError, match=r"pope.fraction=0.05 encodes no component of head_dim 8"):
        helpers.spec("pope", position=dict(fraction=0.05))
    with pytest.raises(ValueError, match=r"model.position.pope.fraction"):
        helpers.spec("pope", position=dict(fraction=1.5))
