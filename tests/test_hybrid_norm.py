"""posenc.hybrid_norm against Gemma 4's value norm and HybridNorm's OLMo block (numpy transcriptions)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import hybrid_norm, norms

D, H, DH = 8, 2, 4


# transformers models/gemma4/modeling_gemma4.py (commit c308a309e651a7e033f683353f3f75aa66d29502), Gemma4RMSNorm
# with with_scale=False: mean_squared = x.pow(2).mean(-1, keepdim=True) + eps; x * torch.pow(mean_squared, -0.5)
# (on x.float(), cast back with type_as); eps = Gemma4TextConfig.rms_norm_eps = 1e-6.
def _gemma4_rmsnorm(x, eps=1e-6, weight=None):
    x = np.asarray(x, np.float64)
    out = x * np.power((x**2).mean(-1, keepdims=True) + eps, -0.5)
    return out if weight is None else out * weight


def test_value_norm_matches_gemma4():
    v = np.random.default_rng(0).normal(0, 3.0, (2, 5, 2, DH)).astype(np.float32)
    np.testing.assert_allclose(hybrid_norm.value_norm(jnp.asarray(v)), _gemma4_rmsnorm(v), rtol=1e-5, atol=1e-6)
    tiny = np.full((1, DH), 1e-4, np.float32)  # eps matters for small values: 1e-6 against mean 1e-8
    np.testing.assert_allclose(hybrid_norm.value_norm(tiny), _gemma4_rmsnorm(tiny), rtol=1e-5)
    assert float(hybrid_norm.value_norm(tiny)[0, 0]) < 0.1
    vb = hybrid_norm.value_norm(jnp.asarray(v, jnp.bfloat16))
    assert vb.dtype == jnp.bfloat16


# BryceZhuo/HybridNorm at f0dd60589c4cafcbd5496d60884d2745ff340805, dense_model/olmo/model.py:
# RMSLayerNorm.forward (x.float() * rsqrt(mean(x^2) + eps), cast back, times weight), OLMoSequentialBlock.attention
# (q_norm, k_norm, v_norm per head before RoPE) and OLMoSequentialBlock.forward with attn_norm False,
# ffn_norm True, ffn_residual_after_norm True (HybridNorm); layer 0 of HybridNorm* sets attn_norm True and
# ffn_residual False. RoPE is left out (it acts after the q / k norms and does not move them); the attention
# core is a plain causal softmax attention.
def _olmo_rms(x, w, eps=1e-5):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


def _olmo_block(x, p, *, attn_norm, ffn_residual, act=np.tanh):  # act: the MLP's (a toy tanh here)
    h = _olmo_rms(x, p["attn_norm"]) if attn_norm else x   # attn_residual_after_norm False: x stays
    q, k, v = (h @ p[n] for n in ("wq", "wk", "wv"))
    q, k, v = (t.reshape(*t.shape[:-1], H, DH) for t in (q, k, v))
    q, k, v = _olmo_rms(q, p["q_norm"]), _olmo_rms(k, p["k_norm"]), _olmo_rms(v, p["v_norm"])
    s = np.einsum("lhd,mhd->hlm", q, k) / np.sqrt(DH)
    s = np.where(np.tril(np.ones((len(x), len(x)), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    att = np.einsum("hlm,mhd->lhd", w / w.sum(-1, keepdims=True), v).reshape(len(x), D) @ p["wo"]
    x = x + att
    if not ffn_residual:
        og_x = x
    x = _olmo_rms(x, p["ff_norm"])
    if ffn_residual:
        og_x = x
    return og_x + act(x @ p["w1"]) @ p["w2"]


def _jax_attention(p):
    def attention(h):
        q, k, v = (h @ p[n] for n in ("wq", "wk", "wv"))
        q, k, v = (t.reshape(*t.shape[:-1], H, DH) for t in (q, k, v))
        q, k, v = hybrid_norm.qkv_norm(q, k, v, p["q_norm"], p["k_norm"], p["v_norm"])
        s = jnp.einsum("lhd,mhd->hlm", q, k) / np.sqrt(DH)
        s = jnp.where(jnp.tril(jnp.ones((h.shape[0],) * 2, bool)), s, -jnp.inf)
        out = jnp.einsum("hlm,mhd->lhd", jax.nn.softmax(s, axis=-1), v).reshape(h.shape[0], D)
        return out @ p["wo"]
    return attention


@pytest.mark.parametrize("first", [False, True])
def test_block_matches_hybridnorm_olmo_block(first):
    rng = np.random.default_rng(int(first))
    p = {n: rng.normal(0, 0.5, s).astype(np.float32) for n, s in (
        ("wq", (D, D)), ("wk", (D, D)), ("wv", (D, D)), ("wo", (D, D)), ("w1", (D, 2 * D)), ("w2", (2 * D, D)))}
    for n, s in (("attn_norm", D), ("ff_norm", D), ("q_norm", DH), ("k_norm", DH), ("v_norm", DH)):
        p[n] = rng.uniform(0.5, 1.5, s).astype(np.float32)
    x = rng.normal(0, 2.0, (6, D)).astype(np.float32)
    ref = _olmo_block(x.astype(np.float64), p, attn_norm=first, ffn_residual=not first)
    got = hybrid_norm.block(
        jnp.asarray(x), _jax_attention(p), lambda h: jnp.tanh(h @ p["w1"]) @ p["w2"],
        lambda h: norms.rms_norm(h, p["ff_norm"], eps=1e-5),
        attention_norm=(lambda h: norms.rms_norm(h, p["attn_norm"], eps=1e-5)) if first else None)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_qkv_norm_rejects_a_wrong_gain():
    q = jnp.ones((3, H, DH))
    with pytest.raises(ValueError, match="v_scale"):
        hybrid_norm.qkv_norm(q, q, q, jnp.ones(DH), jnp.ones(DH), jnp.ones(DH + 1))
    with pytest.raises(ValueError, match="eps"):
        hybrid_norm.value_norm(q, eps=0.0)
