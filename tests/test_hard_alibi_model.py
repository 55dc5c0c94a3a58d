"""The hard_alibi model unit: attention weights of every path equal the official Hard-ALiBi attention
(a transcription in test_hard_alibi: sjelassi/transformers_ssm_copy @ 1188c47,
``GPTHardAlibiAttention._attn``), and the config rules around it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_hard_alibi import official_attn_weights

import helpers
from posenc.model import ENCODINGS, fused
from posenc.model.attention import AttentionCall, attention
from posenc.model.registry import read_options

B, L, H, K, DH = 1, 10, 4, 2, 12  # DH >= L: the one-hot values may not be wider than q, k


@pytest.mark.parametrize("impl", ["dense", "blocked", "pallas"])
def test_attention_weights_are_the_official_ones(impl):
    unit = ENCODINGS["hard_alibi"](read_options("hard_alibi", {"num_windowed": 3}), d_model=32,
                                   num_heads=H, num_kv_heads=K, head_dim=DH, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(B, L, H, DH)) * 2, rng.normal(size=(B, L, K, DH)) * 2
    v = np.broadcast_to(np.eye(L)[None, :, None, :], (B, L, K, L))  # one-hot values: out = weights
    pos = 1000 + jnp.arange(L)[None]  # the windows are relative
    call = AttentionCall(scale=0.5, impl=impl, block=4)
    with fused.force_backend("cpu"):  # pallas: the kernel's term, in the interpreter
        got = jax.jit(lambda q, k, v: attention(q, k, v, pos, pos, unit, call))(
            *(jnp.asarray(x, jnp.float32) for x in (q, k, v)))
    scores = 0.5 * np.einsum("bqhd,bkhd->bhqk", q, np.repeat(k, H // K, axis=2))
    want = official_attn_weights(scores, 3)  # heads 0, 1, 2: windows 1, 2, 3; head 3 NoPE
    np.testing.assert_allclose(np.moveaxis(np.asarray(got), 1, 2), want, rtol=1e-5, atol=1e-6)
    assert (want[0, 2][np.triu(np.ones((L, L), bool), -2) == 0] == 0).all()  # the window held


def test_softcap_is_refused_and_windows_are_counted():
    with pytest.raises(ValueError, match=r"model.norm.attn_softcap=5.0 and model.position.hard_alibi"
                                         r".num_windowed=None cannot be combined.*attn_softcap=0"):
        helpers.spec("hard_alibi", norm=dict(attn_softcap=5.0))
    helpers.spec("hard_alibi", position=dict(num_windowed=0), norm=dict(attn_softcap=5.0))  # all NoPE
    with pytest.raises(ValueError, match=r"hard_alibi.num_windowed=5 exceeds model.num_heads=4"):
        helpers.spec("hard_alibi", position=dict(num_windowed=5))
    unit = helpers.decoder("hard_alibi").blocks[0].attn.encoding
    np.testing.assert_array_equal(unit.windows(), [1, 2, 0, 0])  # the official half of the heads
