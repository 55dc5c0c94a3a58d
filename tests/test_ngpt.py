"""posenc.ngpt against NVIDIA/ngpt's Block.forward, GPT.forward and normalize_matrices (numpy transcriptions)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import ngpt

D, H, V = 8, 2, 11
DH = D // H
B, T = 2, 5


def _justnorm(x, idim=-1):  # model.py Block.justnorm / train.py justnorm
    return x / np.linalg.norm(x, axis=idim, keepdims=True)


def _silu(x):
    return x / (1 + np.exp(-x))


# NVIDIA/ngpt at ed19eb232380d41a9d71024b58d2403937d8f2c9, model.py, Block.forward with use_nGPT == 1, weights in
# torch's [out, in] layout, base_scale = 1 / sqrt(n_embd). RoPE (applied to q and k before sqk) is left out:
# it is posenc's rope.apply and the scales here do not depend on it. flash_attn_func(causal=True) is written out.
def _official_block(h, p):
    q, k, v = (h @ p[n].T for n in ("query", "key", "value"))
    q, k, v = (t.reshape(B, T, H, DH) for t in (q, k, v))
    sqk = (p["sqk"] * (1.0 / p["base_scale"])).reshape(1, 1, H, DH)
    q = sqk * _justnorm(q)
    k = sqk * _justnorm(k)
    softmax_scale = (D / H) ** 0.5
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    y = np.einsum("bhqk,bkhd->bqhd", w, v).reshape(B, T, D)
    h_att = y @ p["att_c_proj"].T
    lr = np.abs(p["attn_alpha"] * (0.05 / p["base_scale"]))
    a_norm, b_norm = _justnorm(h), _justnorm(h_att)
    h = _justnorm(a_norm + lr * (b_norm - a_norm))
    uv = h @ p["c_fc"].T
    suv = p["suv"] * ((1.0 / 1.0) * (D ** 0.5))
    uv = suv * uv
    u, v = np.split(uv, 2, axis=-1)
    h_mlp = (u * _silu(v)) @ p["mlp_c_proj"].T
    lr = np.abs(p["mlp_alpha"] * (0.05 / p["base_scale"]))
    a_norm, b_norm = _justnorm(h), _justnorm(h_mlp)
    return _justnorm(a_norm + lr * (b_norm - a_norm))


def _params(seed):
    rng = np.random.default_rng(seed)
    bs = 1.0 / D ** 0.5
    p = {n: rng.normal(0, bs, shape) for n, shape in (
        ("query", (D, D)), ("key", (D, D)), ("value", (D, D)), ("att_c_proj", (D, D)),
        ("c_fc", (2 * 4 * D, D)), ("mlp_c_proj", (D, 4 * D)))}
    # learned scales moved away from their init so that a wrong factor shows
    p.update(base_scale=bs, attn_alpha=bs * rng.uniform(0.5, 3.0, D), mlp_alpha=bs * rng.uniform(-3, 3, D),
             sqk=bs * rng.uniform(0.5, 2.0, D), suv=rng.uniform(0.5, 2.0, 8 * D))
    return p


def _posenc_block(h, p):
    bs = ngpt.base_scale(D)
    wq, wk, wv = (jnp.asarray(p[n].T.reshape(D, H, DH)) for n in ("query", "key", "value"))
    q, k, v = (jnp.einsum("bld,dhk->blhk", h, w) for w in (wq, wk, wv))
    q, k = ngpt.scale_qk(q, k, p["sqk"], sqk_scaling=bs)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * ngpt.softmax_scale(DH)
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(B, T, D)
    h = ngpt.residual_update(h, y @ p["att_c_proj"].T, p["attn_alpha"], alpha_scaling=bs)
    uv = ngpt.scale_uv(h @ p["c_fc"].T, p["suv"], dim=D)
    return ngpt.residual_update(h, ngpt.swiglu(uv) @ p["mlp_c_proj"].T, p["mlp_alpha"], alpha_scaling=bs)


def test_block_matches_official():
    p = _params(0)
    h = _justnorm(np.random.default_rng(1).normal(size=(B, T, D)))
    ref = _official_block(h, p)
    p32 = {n: np.asarray(v, np.float32) if isinstance(v, np.ndarray) else v for n, v in p.items()}
    got = _posenc_block(jnp.asarray(h, jnp.float32), p32)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(got), axis=-1), 1.0, rtol=1e-5)


# model.py GPT.forward: sz = self.sz * (self.sz_init_value / self.sz_init_scaling); logits = sz * lm_head(x)
def test_scale_logits_matches_official():
    rng = np.random.default_rng(2)
    bs = 1.0 / D ** 0.5
    x, head, sz = rng.normal(size=(B, T, D)), rng.normal(size=(V, D)), bs * rng.uniform(0.5, 2, V)
    ref = (sz * (1.0 / bs)) * (x @ head.T)
    got = ngpt.scale_logits(jnp.asarray(x @ head.T, jnp.float32), sz, sz_scaling=bs)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


# train.py normalize_matrices: wte, lm_head, query, key, value, c_fc along dim 1; att_c_proj, mlp_c_proj along dim 0
# (torch layout). posenc's layout transposes them: the model-width axis is the one normalised in both.
def test_renormalize_matches_normalize_matrices():
    p = _params(3)
    for name, torch_dim in (("query", 1), ("c_fc", 1), ("att_c_proj", 0), ("mlp_c_proj", 0)):
        ref = _justnorm(p[name], torch_dim)
        w = p[name].T  # posenc [in, out]
        got = ngpt.renormalize(jnp.asarray(w, jnp.float32), axis=1 - torch_dim)
        np.testing.assert_allclose(np.asarray(got).T, ref, rtol=1e-5, atol=1e-6)
    wq = p["query"].T.reshape(D, H, DH)  # posenc [D, H, Dh]: axis 0 is the width
    np.testing.assert_allclose(ngpt.renormalize(jnp.asarray(wq), axis=0),
                               _justnorm(p["query"], 1).T.reshape(D, H, DH), rtol=1e-5, atol=1e-6)


def test_init_params_give_the_official_effective_values():
    p = ngpt.init_params(D, V)
    bs = ngpt.base_scale(D)
    assert {k: v.shape for k, v in p.items()} == {
        "alpha_attn": (D,), "alpha_mlp": (D,), "sqk": (D,), "suv": (8 * D,), "sz": (V,)}
    np.testing.assert_allclose(ngpt.effective(p["alpha_attn"], init_value=0.05, init_scaling=bs), 0.05, rtol=1e-6)
    np.testing.assert_allclose(ngpt.effective(p["sqk"], init_value=1.0, init_scaling=bs), 1.0, rtol=1e-6)
    np.testing.assert_allclose(ngpt.effective(p["sz"], init_value=1.0, init_scaling=bs), 1.0, rtol=1e-6)
    np.testing.assert_allclose(ngpt.scale_uv(jnp.ones(8 * D), p["suv"], dim=D), np.sqrt(D), rtol=1e-6)


def test_residual_update_endpoints_and_dtype():
    rng = np.random.default_rng(4)
    h, out = (jnp.asarray(rng.normal(size=(3, D)), jnp.float32) for _ in range(2))
    bs = ngpt.base_scale(D)
    stay = ngpt.residual_update(h, out, jnp.zeros(D), alpha_scaling=bs)
    np.testing.assert_allclose(stay, ngpt.normalize(h), rtol=1e-6)
    # an effective step of -1 is a step of 1 (|alpha|): the block's direction
    jump = ngpt.residual_update(h, out, jnp.full(D, -bs / 0.05), alpha_scaling=bs)
    np.testing.assert_allclose(jump, ngpt.normalize(out), rtol=1e-5, atol=1e-6)
    hb = ngpt.residual_update(h.astype(jnp.bfloat16), out, jnp.full(D, bs), alpha_scaling=bs)
    assert hb.dtype == jnp.bfloat16


def test_swiglu_order_is_u_times_silu_v():
    uv = jnp.array([2.0, -1.0])
    np.testing.assert_allclose(ngpt.swiglu(uv), [2.0 * float(jax.nn.silu(-1.0))], rtol=1e-6)


def test_bad_inputs():
    q = jnp.ones((1, T, H, DH))
    with pytest.raises(ValueError, match="sqk"):
        ngpt.scale_qk(q, q, jnp.ones(D + 1), sqk_scaling=0.5)
    with pytest.raises(ValueError, match="same H"):
        ngpt.scale_qk(q, jnp.ones((1, T, 1, DH)), jnp.ones(D), sqk_scaling=0.5)
    with pytest.raises(ValueError, match="init_scaling"):
        ngpt.effective(jnp.ones(3), init_value=1.0, init_scaling=0.0)
    with pytest.raises(ValueError, match="suv"):
        ngpt.scale_uv(jnp.ones((2, 6)), jnp.ones(5), dim=D)
    with pytest.raises(ValueError, match="axis"):
        ngpt.renormalize(jnp.ones((3, 4)), axis=2)
