"""posenc.gated_delta (the gated delta rule of Gated DeltaNet / Qwen3-Next) against NumPy transcriptions.

References (numpy float64):
- transformers 5.18.0, src/transformers/models/qwen3_next/modeling_qwen3_next.py: ``l2norm``,
  ``torch_chunk_gated_delta_rule`` (its forward-substitution UT transform, the path taken when
  exporting; the default path solves the same triangular system), ``torch_recurrent_gated_delta_rule``,
  ``Qwen3NextRMSNormGated``, and the gates of ``Qwen3NextGatedDeltaNet.forward``
  (``beta = b.sigmoid()``, ``g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)``; q and k
  ``repeat_interleave``d to the value heads);
- fla-org/flash-linear-attention @ bc3b101, fla/ops/gated_delta_rule/naive.py
  ``naive_recurrent_gated_delta_rule`` (its ``scale`` argument).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import gated_delta as gd

RNG = np.random.default_rng(0)


def softplus(x):
    return np.logaddexp(0.0, x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def ref_l2norm(x, eps=1e-6):
    """modeling_qwen3_next.py l2norm: x * rsqrt(sum(x * x) + eps)."""
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def ref_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                               use_qk_l2norm_in_kernel=False):
    """torch_chunk_gated_delta_rule: q, k [b, l, h, dk], v [b, l, h, dv], g, beta [b, l, h]
    -> (o [b, l, h, dv], final state [b, h, dk, dv])."""
    query, key, value, g, beta = (np.asarray(t, np.float64) for t in (query, key, value, g, beta))
    if use_qk_l2norm_in_kernel:
        query, key = ref_l2norm(query), ref_l2norm(key)
    query, key, value = (t.transpose(0, 2, 1, 3) for t in (query, key, value))
    beta, decay = beta.transpose(0, 2, 1), g.transpose(0, 2, 1)
    b, h, seq_len, dk = key.shape
    dv = value.shape[-1]
    query = query * dk ** -0.5
    pad = (chunk_size - seq_len % chunk_size) % chunk_size
    query, key, value = (np.pad(t, [(0, 0), (0, 0), (0, pad), (0, 0)]) for t in (query, key, value))
    beta, decay = (np.pad(t, [(0, 0), (0, 0), (0, pad)]) for t in (beta, decay))
    n = (seq_len + pad) // chunk_size
    v_beta = value * beta[..., None]
    k_beta = key * beta[..., None]
    query, key, k_beta, v_beta = (t.reshape(b, h, n, chunk_size, -1) for t in (query, key, k_beta, v_beta))
    decay = decay.reshape(b, h, n, chunk_size)
    upper = np.triu(np.ones((chunk_size, chunk_size), bool), 1)
    cum = np.cumsum(decay, -1)
    pair = cum[..., :, None] - cum[..., None, :]
    pair = np.exp(np.where(upper, -np.inf, pair))
    ut = (k_beta @ np.swapaxes(key, -1, -2)) * pair
    intra = (query @ np.swapaxes(key, -1, -2)) * pair
    decayed_k_beta = k_beta * np.exp(cum)[..., None]
    ut = -np.tril(ut, -1)
    for i in range(1, chunk_size):
        row = ut[..., i, :i].copy()
        sub = ut[..., :i, :i].copy()
        ut[..., i, :i] = row + (row[..., None] * sub).sum(-2)
    ut = ut + np.eye(chunk_size)
    new_values, k_cumdecay = ut @ v_beta, ut @ decayed_k_beta
    state = np.zeros((b, h, dk, dv)) if initial_state is None else np.asarray(initial_state, np.float64)
    out = np.zeros_like(new_values)
    query = query * np.exp(cum)[..., None]
    key = key * np.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = np.exp(cum[..., -1])[..., None, None]
    for i in range(n):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
        out[:, :, i] = query[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + np.swapaxes(key[:, :, i], -1, -2) @ v_new
    out = out.reshape(b, h, -1, dv)[:, :, :seq_len]
    return out.transpose(0, 2, 1, 3), state


def ref_recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=None, use_qk_l2norm_in_kernel=False,
                                   scale=None):
    """torch_recurrent_gated_delta_rule (``scale``: fla naive_recurrent_gated_delta_rule's, default dk^-1/2)."""
    query, key, value, g, beta = (np.asarray(t, np.float64) for t in (query, key, value, g, beta))
    if use_qk_l2norm_in_kernel:
        query, key = ref_l2norm(query), ref_l2norm(key)
    query, key, value = (t.transpose(0, 2, 1, 3) for t in (query, key, value))
    beta, decay = beta.transpose(0, 2, 1), g.transpose(0, 2, 1)
    b, h, seq_len, dk = key.shape
    query = query * (dk ** -0.5 if scale is None else scale)
    state = np.zeros((b, h, dk, value.shape[-1])) if initial_state is None else np.asarray(initial_state, np.float64)
    out = np.zeros_like(value)
    for i in range(seq_len):
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        state = state * np.exp(decay[:, :, i])[..., None, None]
        kv_mem = (state * k_t[..., None]).sum(-2)
        delta = (v_t - kv_mem) * beta[:, :, i][..., None]
        state = state + k_t[..., None] * delta[..., None, :]
        out[:, :, i] = (state * q_t[..., None]).sum(-2)
    return out.transpose(0, 2, 1, 3), state


def ref_rms_norm_gated(x, gate, weight, eps=1e-6):
    """Qwen3NextRMSNormGated: norm before gate: weight * x * rsqrt(mean(x^2) + eps) * silu(gate)."""
    x = x / np.sqrt(np.mean(x ** 2, -1, keepdims=True) + eps)
    return weight * x * gate * sigmoid(gate)


def inputs(b, length, hk, hv, dk, dv, seed=0):
    r = np.random.default_rng(seed)
    q = r.normal(size=(b, length, hk, dk)).astype(np.float32)
    k = r.normal(size=(b, length, hk, dk)).astype(np.float32)
    v = r.normal(size=(b, length, hv, dv)).astype(np.float32)
    a = r.normal(size=(b, length, hv)).astype(np.float32)
    bb = r.normal(size=(b, length, hv)).astype(np.float32)
    a_log = np.log(r.uniform(0.5, 4.0, size=hv)).astype(np.float32)
    dt_bias = r.normal(size=hv).astype(np.float32)
    g, beta = gd.gates(a, bb, a_log, dt_bias)
    g_ref = -np.exp(a_log.astype(np.float64)) * softplus(a.astype(np.float64) + dt_bias)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(beta, sigmoid(bb.astype(np.float64)), rtol=1e-5, atol=1e-6)
    return q, k, v, np.asarray(g), np.asarray(beta)


@pytest.mark.parametrize("b,length,hk,hv,dk,dv,chunk,l2,with_state", [
    (2, 16, 2, 2, 8, 4, 8, True, False),
    (1, 13, 1, 3, 4, 5, 4, True, True),      # grouped value heads, length not a multiple, a cache
    (2, 6, 2, 2, 4, 4, 16, False, True),     # one padded chunk, no L2 norm
])
def test_chunked_and_recurrent_match_transformers(b, length, hk, hv, dk, dv, chunk, l2, with_state):
    q, k, v, g, beta = inputs(b, length, hk, hv, dk, dv)
    if not l2:  # keep the un-normalised delta rule contractive
        k = k / np.sqrt(dk)
    s0 = RNG.normal(size=(b, hv, dk, dv)).astype(np.float32) if with_state else None
    qr, kr = (np.repeat(t, hv // hk, axis=2) for t in (q, k))   # the layer's repeat_interleave
    o_ref, s_ref = ref_chunk_gated_delta_rule(qr, kr, v, g, beta, chunk, s0, l2)
    o_rec, s_rec = ref_recurrent_gated_delta_rule(qr, kr, v, g, beta, s0, l2)
    np.testing.assert_allclose(o_ref, o_rec, rtol=1e-9, atol=1e-9)  # the two references agree
    o, s = gd.chunked(q, k, v, g, beta, chunk_size=chunk, initial_state=s0, qk_l2norm=l2)
    assert o.dtype == jnp.float32 and s.dtype == jnp.float32 and s.shape == (b, hv, dk, dv)
    np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5)
    o, s = gd.recurrent(q, k, v, g, beta, initial_state=s0, qk_l2norm=l2)
    np.testing.assert_allclose(o, o_rec, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_rec, rtol=1e-5, atol=1e-5)


def test_scale_matches_fla():
    q, k, v, g, beta = inputs(1, 5, 2, 2, 4, 3, seed=1)
    o_ref, s_ref = ref_recurrent_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, scale=0.3)
    for o, s in (gd.recurrent(q, k, v, g, beta, scale=0.3, qk_l2norm=True),
                 gd.chunked(q, k, v, g, beta, scale=0.3, qk_l2norm=True, chunk_size=2)):
        np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 5, 32])
def test_chunked_equals_recurrent_at_any_chunk(chunk):
    q, k, v, g, beta = inputs(2, 11, 1, 2, 4, 3, seed=2)
    s0 = RNG.normal(size=(2, 2, 4, 3)).astype(np.float32)
    o_r, s_r = gd.recurrent(q, k, v, g, beta, initial_state=s0, qk_l2norm=True)
    o_c, s_c = gd.chunked(q, k, v, g, beta, chunk_size=chunk, initial_state=s0, qk_l2norm=True)
    np.testing.assert_allclose(o_c, o_r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_c, s_r, rtol=1e-5, atol=1e-5)


def test_state_carried_across_calls_equals_one_call():
    q, k, v, g, beta = inputs(2, 11, 1, 2, 4, 3, seed=3)
    o_full, s_full = gd.chunked(q, k, v, g, beta, chunk_size=4, qk_l2norm=True)
    o1, s = gd.chunked(q[:, :6], k[:, :6], v[:, :6], g[:, :6], beta[:, :6], chunk_size=4, qk_l2norm=True)
    o2, s = gd.recurrent(q[:, 6:7], k[:, 6:7], v[:, 6:7], g[:, 6:7], beta[:, 6:7], initial_state=s, qk_l2norm=True)
    o3, s = gd.chunked(q[:, 7:], k[:, 7:], v[:, 7:], g[:, 7:], beta[:, 7:], chunk_size=4, initial_state=s,
                       qk_l2norm=True)
    np.testing.assert_allclose(jnp.concatenate([o1, o2, o3], 1), o_full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gated_rms_norm_matches_transformers(dtype):
    x, z = RNG.normal(size=(2, 3, 8)), RNG.normal(size=(2, 3, 8))
    w = RNG.normal(size=(8,))
    out = gd.gated_rms_norm(jnp.asarray(x, dtype), jnp.asarray(z, dtype), jnp.asarray(w, jnp.float32), eps=1e-6)
    assert out.dtype == dtype
    xr, zr = (np.asarray(jnp.asarray(t, dtype), np.float64) for t in (x, z))
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(out, np.float64), ref_rms_norm_gated(xr, zr, w.astype(np.float32)),
                               rtol=tol, atol=tol)


def test_l2norm_causality_and_dtype():
    x = RNG.normal(size=(3, 5))
    np.testing.assert_allclose(gd.l2norm(x.astype(np.float32)), ref_l2norm(x), rtol=1e-5, atol=1e-6)
    q, k, v, g, beta = inputs(1, 7, 1, 1, 4, 3, seed=4)
    f = jax.jit(lambda v: gd.chunked(q, k, v, g, beta, chunk_size=4, qk_l2norm=True)[0][:, 3].sum())
    grad = np.asarray(jax.grad(f)(v))
    assert np.all(grad[:, 4:] == 0) and np.all(np.abs(grad[:, :4]).sum((0, 2, 3)) > 0)
    o, s = gd.chunked(q, k, jnp.asarray(v, jnp.bfloat16), g, beta, chunk_size=4)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32


@pytest.mark.parametrize("call,match", [
    (lambda q, k, v, g, b: gd.chunked(q, k[..., :2], v, g, b), "same shape"),
    (lambda q, k, v, g, b: gd.chunked(q, k, v[:, :3], g, b), "length"),
    (lambda q, k, v, g, b: gd.chunked(q[:, :, :1].repeat(3, 2), k[:, :, :1].repeat(3, 2), v, g, b), "multiple"),
    (lambda q, k, v, g, b: gd.chunked(q, k, v, g[..., None], b), "g must have shape"),
    (lambda q, k, v, g, b: gd.recurrent(q, k, v, g, b[:, :2]), "beta"),
    (lambda q, k, v, g, b: gd.recurrent(q, k, v, g, b, initial_state=np.zeros((1, 2, 3, 3))), "initial_state"),
    (lambda q, k, v, g, b: gd.chunked(q, k, v, g, b, chunk_size=0), "chunk_size"),
    (lambda q, k, v, g, b: gd.chunked(q, k, v, g, b, scale=-1.0), "scale"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call(*inputs(1, 5, 2, 2, 4, 3, seed=5))
