"""posenc.ssd (Mamba-2's SSD scan) against NumPy transcriptions of transformers' pure-torch path.

References (numpy float64, transcribed from transformers 5.18.0,
src/transformers/models/mamba2/modeling_mamba2.py): ``segment_sum``,
``pad_tensor_by_size`` / ``reshape_into_chunks``, ``mamba2_chunk_scan`` (the
chunked scan of ``Mamba2Mixer``), ``mamba2_selective_state_update`` (the
decoding step, with the expanded ``A``, ``dt``, ``dt_bias``, ``D`` the mixer
passes), ``MambaRMSNormGated``; models/zamba2/modeling_zamba2.py
``Zamba2RMSNormGated`` (Nemotron-H's group-wise norm).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import ssd

RNG = np.random.default_rng(0)


def softplus(x):
    return np.logaddexp(0.0, x)


def silu(x):
    return x / (1.0 + np.exp(-x))


def ref_segment_sum(x):
    """modeling_mamba2.py segment_sum: expand, mask strictly lower, cumsum over -2, mask lower with -inf."""
    c = x.shape[-1]
    x = np.broadcast_to(x[..., None], x.shape + (c,)).copy()
    x[..., ~np.tril(np.ones((c, c), bool), -1)] = 0
    out = np.cumsum(x, axis=-2)
    out[..., ~np.tril(np.ones((c, c), bool), 0)] = -np.inf
    return out


def ref_pad(x, pad):
    """pad_tensor_by_size: zeros after the sequence axis (dim 1)."""
    return np.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))


def ref_chunks(x, pad, chunk):
    """reshape_into_chunks: [b, l, ...] -> [b, -1, chunk, ...]."""
    x = ref_pad(x, pad)
    return x.reshape((x.shape[0], -1, chunk) + x.shape[2:])


def ref_chunk_scan(x, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None, dt_softplus=False,
                   dt_limit=(0.0, math.inf)):
    """modeling_mamba2.py mamba2_chunk_scan (return_final_states=True): x [b, l, h, p], dt [b, l, h], A [h],
    B, C [b, l, g, n] -> (y [b, l, h, p], final state [b, h, p, n])."""
    x, dt, A, B, C = (np.asarray(t, np.float64) for t in (x, dt, A, B, C))
    b, seq_len, h, p = x.shape
    g = B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = softplus(dt)
    dt = np.clip(dt, dt_limit[0], dt_limit[1])
    B = np.repeat(B, h // g, axis=2)
    C = np.repeat(C, h // g, axis=2)
    pad = (chunk_size - seq_len % chunk_size) % chunk_size
    d_residual = None if D is None else np.asarray(D, np.float64)[..., None] * ref_pad(x, pad)
    x = x * dt[..., None]
    A = A * dt
    x, A, B, C = (ref_chunks(t, pad, chunk_size) for t in (x, A, B, C))
    A = A.transpose(0, 3, 1, 2)
    a_cumsum = np.cumsum(A, axis=-1)
    L = np.exp(ref_segment_sum(A))
    G = np.einsum("bclhn,bcshn->bclsh", C, B)
    M = G * L.transpose(0, 2, 3, 4, 1)
    y_diag = np.einsum("bclsh,bcshp->bclhp", M, x)
    decay_states = np.exp(a_cumsum[:, :, :, -1:] - a_cumsum)
    b_decay = B * decay_states.transpose(0, 2, 3, 1)[..., None]
    states = np.einsum("bclhn,bclhp->bchpn", b_decay, x)
    previous = (np.zeros_like(states[:, :1]) if initial_states is None
                else np.asarray(initial_states, np.float64)[:, None])
    states = np.concatenate([previous, states], axis=1)
    a_last = np.pad(a_cumsum[:, :, :, -1], [(0, 0), (0, 0), (1, 0)])
    decay_chunk = np.exp(ref_segment_sum(a_last)).transpose(0, 3, 2, 1)
    new_states = np.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final = new_states[:, :-1], new_states[:, -1]
    y_off = np.einsum("bclhn,bchpn->bclhp", C, states) * np.exp(a_cumsum).transpose(0, 2, 3, 1)[..., None]
    y = (y_diag + y_off).reshape(b, -1, h, p)
    if d_residual is not None:
        y = y + d_residual
    return y[:, :seq_len], final


def ref_selective_state_update(state, x, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False):
    """modeling_mamba2.py mamba2_selective_state_update: state [b, h, p, n], x [b, h, p], dt [b, h, p],
    A [h, p, n], B, C [b, g, n], D, dt_bias [h, p] -> (y [b, h, p], new state)."""
    b, h, p = x.shape
    g, n = B.shape[1], B.shape[-1]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = softplus(dt)
    dt = dt[..., None]
    dA = np.exp(dt * A)
    Bh = np.broadcast_to(B.reshape(b, g, 1, n), (b, g, h // g, n)).reshape(b, h, 1, n)
    new = state * dA + dt * Bh * x[..., None]
    Ch = np.broadcast_to(C.reshape(b, g, 1, n), (b, g, h // g, n)).reshape(b, h, n)
    y = np.einsum("bhpn,bhn->bhp", new, Ch)
    if D is not None:
        y = y + x * D
    return y, new


def ref_rms_norm_gated(x, gate, weight, eps, group_size=None):
    """MambaRMSNormGated (group_size None) / Zamba2RMSNormGated: x * silu(gate), RMS over each group, * weight."""
    x = np.asarray(x, np.float64)
    if gate is not None:
        x = x * silu(np.asarray(gate, np.float64))
    group = x.shape[-1] if group_size is None else group_size
    xg = x.reshape(x.shape[:-1] + (-1, group))
    xg = xg / np.sqrt(np.mean(xg ** 2, -1, keepdims=True) + eps)
    return weight * xg.reshape(x.shape)


def inputs(b, length, h, p, g, n, seed=0):
    r = np.random.default_rng(seed)
    x = r.normal(size=(b, length, h, p)).astype(np.float32)
    dt_raw = r.normal(size=(b, length, h)).astype(np.float32)
    dt_bias = r.normal(size=(h,)).astype(np.float32) - 1.0
    a_log = np.log(r.uniform(1.0, 8.0, size=(h,))).astype(np.float32)
    bm = r.normal(size=(b, length, g, n)).astype(np.float32)
    cm = r.normal(size=(b, length, g, n)).astype(np.float32)
    d = r.normal(size=(h,)).astype(np.float32)
    return x, dt_raw, dt_bias, -np.exp(a_log.astype(np.float64)).astype(np.float32), bm, cm, d


@pytest.mark.parametrize("b,length,h,p,g,n,chunk,limit,with_state", [
    (2, 16, 4, 3, 2, 5, 8, (0.0, math.inf), False),
    (1, 13, 4, 2, 1, 4, 5, (0.0, math.inf), True),     # length not a multiple of the chunk, a cache
    (2, 7, 2, 4, 2, 3, 16, (0.01, 0.6), True),         # one padded chunk, time_step_limit clamps
])
def test_chunked_matches_transformers(b, length, h, p, g, n, chunk, limit, with_state):
    x, dt_raw, dt_bias, a, bm, cm, d = inputs(b, length, h, p, g, n)
    s0 = RNG.normal(size=(b, h, p, n)).astype(np.float32) if with_state else None
    y_ref, s_ref = ref_chunk_scan(x, dt_raw, a, bm, cm, chunk, D=d, dt_bias=dt_bias, initial_states=s0,
                                  dt_softplus=True, dt_limit=limit)
    dt = ssd.time_step(dt_raw, dt_bias, limit=limit)
    y, s = ssd.chunked(x, dt, a, bm, cm, chunk_size=chunk, D=d, initial_state=s0)
    assert y.dtype == jnp.float32 and s.dtype == jnp.float32 and s.shape == (b, h, p, n)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5)


def test_step_matches_transformers_selective_state_update():
    b, h, p, g, n = 2, 4, 3, 2, 5
    x, dt_raw, dt_bias, a, bm, cm, d = inputs(b, 1, h, p, g, n, seed=1)
    state = RNG.normal(size=(b, h, p, n))
    # as Mamba2Mixer passes them: dt, dt_bias, D expanded over head_dim, A over (head_dim, state_size)
    y_ref, s_ref = ref_selective_state_update(
        state, x[:, 0].astype(np.float64), np.repeat(dt_raw[:, 0, :, None], p, -1).astype(np.float64),
        np.broadcast_to(a[:, None, None], (h, p, n)).astype(np.float64), bm[:, 0].astype(np.float64),
        cm[:, 0].astype(np.float64), D=np.repeat(d[:, None], p, -1), dt_bias=np.repeat(dt_bias[:, None], p, -1),
        dt_softplus=True)
    y, s = ssd.step(x[:, 0], ssd.time_step(dt_raw[:, 0], dt_bias), a, bm[:, 0], cm[:, 0], state.astype(np.float32),
                    D=d)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3, 32])
def test_chunked_equals_recurrent_at_any_chunk(chunk):
    x, dt_raw, dt_bias, a, bm, cm, d = inputs(2, 11, 4, 2, 2, 3, seed=2)
    dt = ssd.time_step(dt_raw, dt_bias)
    s0 = RNG.normal(size=(2, 4, 2, 3)).astype(np.float32)
    y_r, s_r = ssd.recurrent(x, dt, a, bm, cm, D=d, initial_state=s0)
    y_c, s_c = ssd.chunked(x, dt, a, bm, cm, chunk_size=chunk, D=d, initial_state=s0)
    np.testing.assert_allclose(y_c, y_r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_c, s_r, rtol=1e-5, atol=1e-5)


def test_state_carried_across_calls_equals_one_call():
    x, dt_raw, dt_bias, a, bm, cm, d = inputs(2, 11, 4, 2, 2, 3, seed=3)
    dt = ssd.time_step(dt_raw, dt_bias)
    y_full, s_full = ssd.chunked(x, dt, a, bm, cm, chunk_size=4, D=d)
    # prefill 6 tokens by chunks, 1 decoding step, then the last 4 token by token
    y1, s = ssd.chunked(x[:, :6], dt[:, :6], a, bm[:, :6], cm[:, :6], chunk_size=4, D=d)
    y2, s = ssd.step(x[:, 6], dt[:, 6], a, bm[:, 6], cm[:, 6], s, D=d)
    y3, s = ssd.recurrent(x[:, 7:], dt[:, 7:], a, bm[:, 7:], cm[:, 7:], D=d, initial_state=s)
    np.testing.assert_allclose(jnp.concatenate([y1, y2[:, None], y3], 1), y_full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, s_full, rtol=1e-5, atol=1e-5)


def test_segment_sum_matches_transformers():
    a = RNG.normal(size=(3, 6))
    out = ssd.segment_sum(a.astype(np.float32))
    np.testing.assert_allclose(out, ref_segment_sum(a), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("group_size,dtype", [(None, jnp.float32), (4, jnp.float32), (None, jnp.bfloat16)])
def test_gated_rms_norm_matches_transformers(group_size, dtype):
    x = RNG.normal(size=(2, 3, 8))
    z = RNG.normal(size=(2, 3, 8))
    w = RNG.normal(size=(8,))
    out = ssd.gated_rms_norm(jnp.asarray(x, dtype), jnp.asarray(z, dtype), jnp.asarray(w, jnp.float32),
                             eps=1e-5, group_size=group_size)
    assert out.dtype == dtype
    ref = ref_rms_norm_gated(np.asarray(jnp.asarray(x, dtype), np.float64), np.asarray(jnp.asarray(z, dtype),
                             np.float64), w.astype(np.float32), 1e-5, group_size)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(ssd.gated_rms_norm(x.astype(np.float32), None, w.astype(np.float32)),
                               ref_rms_norm_gated(x, None, w, 1e-6), rtol=1e-5, atol=1e-5)


def test_split_projection_and_xbc_follow_transformers_order():
    h, p, g, n = 4, 3, 2, 5
    zxbcdt = RNG.normal(size=(2, 7, 2 * h * p + 2 * g * n + h)).astype(np.float32)
    gate, xbc, dt = ssd.split_projection(zxbcdt, num_heads=h, head_dim=p, n_groups=g, state_size=n)
    np.testing.assert_array_equal(gate, zxbcdt[..., :h * p])
    np.testing.assert_array_equal(dt, zxbcdt[..., -h:])
    x, bm, cm = ssd.split_xbc(xbc, num_heads=h, head_dim=p, n_groups=g, state_size=n)
    np.testing.assert_array_equal(x, zxbcdt[..., h * p:2 * h * p].reshape(2, 7, h, p))
    np.testing.assert_array_equal(bm, zxbcdt[..., 2 * h * p:2 * h * p + g * n].reshape(2, 7, g, n))
    np.testing.assert_array_equal(cm, zxbcdt[..., 2 * h * p + g * n:-h].reshape(2, 7, g, n))


def test_causal_jit_and_bf16():
    x, dt_raw, dt_bias, a, bm, cm, d = inputs(1, 9, 2, 2, 1, 3, seed=4)
    dt = ssd.time_step(dt_raw, dt_bias)
    f = jax.jit(lambda x: ssd.chunked(x, dt, a, bm, cm, chunk_size=4, D=d)[0][:, 4].sum())
    grad = np.asarray(jax.grad(f)(x))
    assert np.all(grad[:, 5:] == 0) and np.all(np.abs(grad[:, :5]).sum((0, 2, 3)) > 0)
    y, s = ssd.chunked(jnp.asarray(x, jnp.bfloat16), dt, a, bm, cm, chunk_size=4, D=d)
    assert y.dtype == jnp.bfloat16 and s.dtype == jnp.float32


@pytest.mark.parametrize("call,match", [
    (lambda x, dt, a, b, c: ssd.chunked(x, dt, a[:1], b, c), "A must have shape"),
    (lambda x, dt, a, b, c: ssd.chunked(x, dt, a, b[..., :1, :], c[..., :1, :].repeat(3, -2)), "B and C"),
    (lambda x, dt, a, b, c: ssd.chunked(x, dt, a, b, c, chunk_size=0), "chunk_size"),
    (lambda x, dt, a, b, c: ssd.chunked(x, dt, a, b, c, initial_state=np.zeros((1, 4, 2, 2))), "state"),
    (lambda x, dt, a, b, c: ssd.chunked(x[..., :3, :], dt[..., :3], a[:3], b, c), "multiple"),
    (lambda x, dt, a, b, c: ssd.time_step(dt, a, limit=(1.0, 0.5)), "limit"),
])
def test_bad_arguments_are_named(call, match):
    x, dt_raw, dt_bias, a, bm, cm, d = inputs(1, 5, 4, 2, 2, 3, seed=5)
    with pytest.raises(ValueError, match=match):
        call(x, np.abs(dt_raw), a, bm, cm)
