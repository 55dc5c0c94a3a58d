"""posenc.kda (Kimi Delta Attention) against NumPy transcriptions of transformers' and fla's torch code.

References (numpy float64):
- transformers 5.18.0, src/transformers/models/kimi_linear/modeling_kimi_linear.py:
  ``chunk_kimi_delta_attention``, ``recurrent_kimi_delta_attention`` (the fallbacks of fla's
  ``chunk_kda`` / ``fused_recurrent_kda``), ``l2norm``, ``KimiLinearForgetGate``,
  ``KimiLinearRMSNormGated``;
- fla-org/flash-linear-attention @ bc3b101, fla/ops/kda/naive.py ``naive_recurrent_kda`` (grouped
  value heads, ``scale``) and fla/ops/kda/gate.py ``naive_kda_gate``, ``naive_kda_lowerbound_gate``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import kda

RNG = np.random.default_rng(0)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def ref_l2norm(x, eps=1e-6):
    """modeling_kimi_linear.py l2norm: x / sqrt(sum(x * x) + eps)."""
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def ref_chunk_kda(query, key, value, g, beta, chunk_size=64, initial_state=None, use_qk_l2norm_in_kernel=False):
    """chunk_kimi_delta_attention: q, k [b, l, h, dk], v [b, l, h, dv], g [b, l, h, dk], beta [b, l, h]
    -> (o [b, l, h, dv], final state [b, h, dk, dv])."""
    query, key, value, beta, g = (np.asarray(t, np.float64).swapaxes(1, 2) for t in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query, key = ref_l2norm(query), ref_l2norm(key)
    b, h, seq_len, dk = key.shape
    dv = value.shape[-1]
    pad = (chunk_size - seq_len % chunk_size) % chunk_size
    query = np.pad(query, [(0, 0), (0, 0), (0, pad), (0, 0)]) * dk ** -0.5
    key, value, g = (np.pad(t, [(0, 0), (0, 0), (0, pad), (0, 0)]) for t in (key, value, g))
    beta = np.pad(beta, [(0, 0), (0, 0), (0, pad)])
    v_beta = value * beta[..., None]
    k_beta = key * beta[..., None]
    query, key, value, g, k_beta, v_beta = (t.reshape(b, h, -1, chunk_size, t.shape[-1])
                                            for t in (query, key, value, g, k_beta, v_beta))
    g = np.cumsum(g, axis=-2)
    mask = np.triu(np.ones((chunk_size, chunk_size), bool), 0)
    strict = np.triu(np.ones((chunk_size, chunk_size), bool), 1)
    decay_mask = np.exp(np.where(strict[..., None], -np.inf, g[..., :, None, :] - g[..., None, :, :]))
    attn = -(k_beta[..., :, None, :] * key[..., None, :, :] * decay_mask).sum(-1)
    attn = np.where(mask, 0.0, attn)
    for i in range(1, chunk_size):
        row = attn[..., i, :i].copy()
        sub = attn[..., :i, :i].copy()
        attn[..., i, :i] = row + (row[..., None] * sub).sum(-2)
    attn = attn + np.eye(chunk_size)
    value = attn @ v_beta
    k_cumdecay = attn @ (k_beta * np.exp(g))
    state = np.zeros((b, h, dk, dv)) if initial_state is None else np.asarray(initial_state, np.float64)
    out = np.zeros_like(value)
    for i in range(value.shape[2]):
        q_i, k_i, v_i, g_i = query[:, :, i], key[:, :, i], value[:, :, i], g[:, :, i]
        attn_inter = (q_i * np.exp(g_i)) @ state
        attn_intra = np.where(strict, 0.0, (q_i[..., :, None, :] * k_i[..., None, :, :] * decay_mask[:, :, i]).sum(-1))
        v_new = v_i - k_cumdecay[:, :, i] @ state
        out[:, :, i] = attn_inter + attn_intra @ v_new
        key_decay = np.exp(g_i[:, :, -1:] - g_i)
        state = state * np.exp(g_i[:, :, -1])[..., None] + np.swapaxes(k_i * key_decay, -1, -2) @ v_new
    return out.reshape(b, h, -1, dv)[:, :, :seq_len].swapaxes(1, 2), state


def ref_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False):
    """fla naive_recurrent_kda (== transformers' recurrent_kimi_delta_attention when HV == H and scale is
    None; the L2 norm as transformers applies it first): q, k [b, l, h, dk], v [b, l, hv, dv], g [b, l, hv, dk]."""
    q, k, v, g, beta = (np.asarray(t, np.float64) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = ref_l2norm(q), ref_l2norm(k)
    b, t, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[-1]
    scale = dk ** -0.5 if scale is None else scale
    q = np.repeat(q, hv // h, axis=2) * scale
    k = np.repeat(k, hv // h, axis=2)
    state = np.zeros((b, hv, dk, dv)) if initial_state is None else np.asarray(initial_state, np.float64).copy()
    o = np.zeros_like(v)
    for i in range(t):
        q_i, k_i, v_i, g_i, b_i = q[:, i], k[:, i], v[:, i], g[:, i], beta[:, i]
        state = state * np.exp(g_i)[..., None]
        state = state + np.einsum("bhk,bhv->bhkv", b_i[..., None] * k_i, v_i - (k_i[..., None] * state).sum(-2))
        o[:, i] = np.einsum("bhk,bhkv->bhv", q_i, state)
    return o, state


def ref_forget_gate(f, a_log, dt_bias):
    """KimiLinearForgetGate after f_b_proj: g = -exp(A_log) * softplus(f + dt_bias) (its softplus passes x > 20)."""
    x = f + dt_bias.reshape(f.shape[-2:])
    return -np.exp(a_log.reshape(-1, 1)) * np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def ref_lowerbound_gate(f, a_log, dt_bias, lower_bound):
    """fla naive_kda_lowerbound_gate: lower_bound * sigmoid(exp(A_log) * (g + dt_bias))."""
    return lower_bound * sigmoid(np.exp(a_log.reshape(-1, 1)) * (f + dt_bias.reshape(f.shape[-2:])))


def ref_rms_norm_gated(x, gate, weight, eps=1e-6):
    """KimiLinearRMSNormGated: weight * x * rsqrt(mean(x^2) + eps) * sigmoid(gate)."""
    return weight * x / np.sqrt(np.mean(x ** 2, -1, keepdims=True) + eps) * sigmoid(gate)


def inputs(b, length, hk, hv, dk, dv, seed=0):
    r = np.random.default_rng(seed)
    q = r.normal(size=(b, length, hk, dk)).astype(np.float32)
    k = r.normal(size=(b, length, hk, dk)).astype(np.float32)
    v = r.normal(size=(b, length, hv, dv)).astype(np.float32)
    f = r.normal(size=(b, length, hv, dk)).astype(np.float32)
    a_log = np.log(r.uniform(0.5, 4.0, size=(1, 1, hv, 1))).astype(np.float32)   # KimiLinearForgetGate's shape
    dt_bias = r.normal(size=hv * dk).astype(np.float32)
    g = kda.gate(f, a_log, dt_bias)
    np.testing.assert_allclose(g, ref_forget_gate(f.astype(np.float64), a_log.astype(np.float64), dt_bias),
                               rtol=1e-5, atol=1e-6)
    beta = sigmoid(r.normal(size=(b, length, hv))).astype(np.float32)
    return q, k, v, np.asarray(g), beta


@pytest.mark.parametrize("b,length,hk,hv,dk,dv,chunk,with_state", [
    (2, 16, 2, 2, 8, 4, 8, False),
    (1, 13, 2, 2, 4, 5, 4, True),     # length not a multiple of the chunk, a cache
    (2, 6, 1, 1, 4, 4, 16, True),     # one padded chunk
])
def test_chunked_and_recurrent_match_transformers(b, length, hk, hv, dk, dv, chunk, with_state):
    q, k, v, g, beta = inputs(b, length, hk, hv, dk, dv)
    s0 = RNG.normal(size=(b, hv, dk, dv)).astype(np.float32) if with_state else None
    o_ref, s_ref = ref_chunk_kda(q, k, v, g, beta, chunk, s0, True)
    o_rec, s_rec = ref_recurrent_kda(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True)
    np.testing.assert_allclose(o_ref, o_rec, rtol=1e-9, atol=1e-9)  # the two references agree
    o, s = kda.chunked(q, k, v, g, beta, chunk_size=chunk, initial_state=s0, qk_l2norm=True)
    assert o.dtype == jnp.float32 and s.dtype == jnp.float32 and s.shape == (b, hv, dk, dv)
    np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5)
    o, s = kda.recurrent(q, k, v, g, beta, initial_state=s0, qk_l2norm=True)
    np.testing.assert_allclose(o, o_rec, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_rec, rtol=1e-5, atol=1e-5)


def test_grouped_value_heads_and_scale_match_fla():
    q, k, v, g, beta = inputs(1, 7, 1, 2, 4, 3, seed=1)
    k = k / 2.0  # without the L2 norm: keep the delta rule contractive
    o_ref, s_ref = ref_recurrent_kda(q, k, v, g, beta, scale=0.3)
    for o, s in (kda.recurrent(q, k, v, g, beta, scale=0.3), kda.chunked(q, k, v, g, beta, scale=0.3, chunk_size=4)):
        np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 5, 32])
def test_chunked_equals_recurrent_at_any_chunk(chunk):
    q, k, v, g, beta = inputs(2, 11, 1, 2, 4, 3, seed=2)
    s0 = RNG.normal(size=(2, 2, 4, 3)).astype(np.float32)
    o_r, s_r = kda.recurrent(q, k, v, g, beta, initial_state=s0, qk_l2norm=True)
    o_c, s_c = kda.chunked(q, k, v, g, beta, chunk_size=chunk, initial_state=s0, qk_l2norm=True)
    np.testing.assert_allclose(o_c, o_r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_c, s_r, rtol=1e-5, atol=1e-5)


def test_state_carried_across_calls_equals_one_call():
    q, k, v, g, beta = inputs(2, 11, 1, 2, 4, 3, seed=3)
    o_full, s_full = kda.chunked(q, k, v, g, beta, chunk_size=4, qk_l2norm=True)
    cut = [(0, 6), (6, 7), (7, 11)]
    outs, s = [], None
    for i, (lo, hi) in enumerate(cut):
        part = (t[:, lo:hi] for t in (q, k, v, g, beta))
        o, s = (kda.recurrent(*part, initial_state=s, qk_l2norm=True) if i == 1
                else kda.chunked(*part, chunk_size=4, initial_state=s, qk_l2norm=True))
        outs.append(o)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), o_full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_full, rtol=1e-5, atol=1e-5)


def test_gates_and_gated_rms_norm():
    f = RNG.normal(size=(2, 3, 2, 4)) * 10.0   # past softplus' linear threshold too
    a_log, dt_bias = RNG.normal(size=(2,)), RNG.normal(size=(2, 4))
    np.testing.assert_allclose(kda.gate(f.astype(np.float32), a_log.astype(np.float32), dt_bias.astype(np.float32)),
                               ref_forget_gate(f, a_log, dt_bias), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kda.gate(f.astype(np.float32), a_log.astype(np.float32), dt_bias.astype(np.float32),
                                        lower_bound=-5.0),
                               ref_lowerbound_gate(f, a_log, dt_bias, -5.0), rtol=1e-5, atol=1e-5)
    x, z, w = RNG.normal(size=(2, 3, 8)), RNG.normal(size=(2, 3, 8)), RNG.normal(size=(8,))
    out = kda.gated_rms_norm(jnp.asarray(x, jnp.bfloat16), jnp.asarray(z, jnp.bfloat16), w.astype(np.float32))
    assert out.dtype == jnp.bfloat16
    xr, zr = (np.asarray(jnp.asarray(t, jnp.bfloat16), np.float64) for t in (x, z))
    np.testing.assert_allclose(np.asarray(out, np.float64), ref_rms_norm_gated(xr, zr, w.astype(np.float32)),
                               rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(kda.gated_rms_norm(x.astype(np.float32), z.astype(np.float32), w.astype(np.float32),
                                                  eps=1e-5),
                               ref_rms_norm_gated(x, z, w.astype(np.float32), 1e-5), rtol=1e-5, atol=1e-5)


def test_causal_under_jit_and_bf16():
    q, k, v, g, beta = inputs(1, 7, 1, 1, 4, 3, seed=4)
    f = jax.jit(lambda v: kda.chunked(q, k, v, g, beta, chunk_size=4, qk_l2norm=True)[0][:, 3].sum())
    grad = np.asarray(jax.grad(f)(v))
    assert np.all(grad[:, 4:] == 0) and np.all(np.abs(grad[:, :4]).sum((0, 2, 3)) > 0)
    o, s = kda.chunked(q, k, jnp.asarray(v, jnp.bfloat16), g, beta, chunk_size=4, qk_l2norm=True)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32


@pytest.mark.parametrize("call,match", [
    (lambda q, k, v, g, b: kda.chunked(q, k, v, g[..., 0], b), "g must have shape"),
    (lambda q, k, v, g, b: kda.recurrent(q, k, v, g, b, initial_state=np.zeros((1, 2, 4, 4))), "initial_state"),
    (lambda q, k, v, g, b: kda.gate(g, np.zeros(3), None), "A_log"),
    (lambda q, k, v, g, b: kda.gate(g, np.zeros(2), np.zeros(3)), "dt_bias"),
    (lambda q, k, v, g, b: kda.gate(g, np.zeros(2), None, lower_bound=1.0), "lower_bound"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call(*inputs(1, 5, 2, 2, 4, 3, seed=5))
