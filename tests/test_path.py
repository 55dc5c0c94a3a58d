"""posenc.path against transcriptions of the official PaTH code.

References (numpy float64), fla-org/flash-linear-attention @ bc3b101:
- ``naive_path_attn`` (fla/ops/path_attn/naive.py, the reference of
  tests/ops/test_path_attn.py), transcribed line by line;
- the decoding recurrence of ``PaTHAttention.forward`` (fla/layers/path_attn.py
  ``rank_one_update``, L148-L157);
- ``causal_conv1d_ref_torch`` / ``causal_conv1d_update_ref_torch``
  (tests/modules/test_conv.py), the reference of ``ShortConvolution``;
- ``l2norm_fwd`` (fla/modules/l2norm.py): ``x / sqrt(sum x^2 + eps)``.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import fox
from posenc import path as pa

RNG = np.random.default_rng(0)
B, L, HQ, HKV, D = 2, 11, 4, 2, 4


def T(x):
    return np.swapaxes(x, -1, -2)


def naive_path_attn(q, k, v, w, beta, g, scale, chunk_size=64):
    """fla/ops/path_attn/naive.py naive_path_attn; q [B,T,HQ,D], k, v, w [B,T,H,D], beta [B,T,H], g [B,T,HQ].

    Returns (output [B,T,HQ,D], the scaled logits A [B,HQ,T,T] before the softmax)."""
    HQ_, H_ = q.shape[2], k.shape[2]
    BT = chunk_size
    q, k, v, w, beta, g = (np.swapaxes(np.asarray(x, np.float64), 1, 2) for x in (q, k, v, w, beta, g))
    g_cumsum = np.cumsum(g, -1)
    k, v, w, beta = (np.repeat(x, HQ_ // H_, axis=1) for x in (k, v, w, beta))  # expand(..).flatten(1, 2)
    b, h, l, _ = q.shape
    if l % BT != 0:
        padding_size = BT - l % BT
        q, k, w = (np.pad(x, [(0, 0), (0, 0), (0, padding_size), (0, 0)]) for x in (q, k, w))
        beta = np.pad(beta, [(0, 0), (0, 0), (0, padding_size)])
    seq_len = q.shape[2]
    w_beta = w * beta[..., None]
    chunk = lambda x: x.reshape(b, h, seq_len // BT, BT, x.shape[-1])  # 'b h (n c) d -> b h n c d'
    q, k, w, w_beta = chunk(q), chunk(k), chunk(w), chunk(w_beta)
    mask = np.triu(np.ones((BT, BT), bool), 0)
    T_mat = np.where(mask, 0.0, -(w_beta @ T(w)))
    for i in range(1, BT):
        T_mat[..., i, :i] = T_mat[..., i, :i].copy() + (
            T_mat[..., i, :, None].copy() * T_mat[..., :, :i].copy()).sum(-2)
    T_mat = T_mat + np.eye(BT)
    Twbk = T_mat @ np.where(mask, 0.0, w_beta @ T(k))
    qw = np.tril(q @ T(w))
    Twb = T_mat @ w_beta
    A_local = np.tril(q @ T(k)) - qw @ Twbk
    q = q - qw @ Twb
    k = k - T(Twbk) @ w
    H_mat = T(w) @ Twb
    A = np.zeros((b, h, seq_len, seq_len))
    flat = lambda x: x.reshape(b, h, seq_len, x.shape[-1])
    q, k = flat(q), flat(k)
    for i in range(0, seq_len, BT):
        q_i = q[:, :, i:i + BT].copy()
        for j in range(i - BT, -BT, -BT):
            A[:, :, i:i + BT, j:j + BT] = q_i @ T(k[:, :, j:j + BT])
            q_i = q_i - q_i @ H_mat[:, :, j // BT]
    for i in range(0, seq_len // BT):
        A[:, :, i * BT:i * BT + BT, i * BT:i * BT + BT] = A_local[:, :, i]
    A = np.where(np.tril(np.ones((seq_len, seq_len), bool)), A, -np.inf)
    A = A[:, :, :l, :l]
    A = (A + g_cumsum[..., None] - g_cumsum[..., None, :]) * scale
    p = np.exp(A - A.max(-1, keepdims=True))
    ref_o = (p / p.sum(-1, keepdims=True)) @ v
    return np.swapaxes(ref_o, 1, 2), A


def rank_one_update(k, w, beta):
    """fla/layers/path_attn.py decoding: k - beta[..., None] * (k * w).sum(-1, keepdim=True) * w."""
    return k - beta[..., None] * (k * w).sum(-1, keepdims=True) * w


def causal_conv1d_ref(x, weight, bias=None, initial_state=None, activation=None):
    """tests/modules/test_conv.py causal_conv1d_ref_torch; x [B, D, T], weight [D, W], initial_state [B, D, W-1].

    F.conv1d(groups=D) is a cross-correlation; returns (out, final_states)."""
    x = np.asarray(x, np.float64)
    seqlen = x.shape[-1]
    dim, width = weight.shape
    if initial_state is None:
        x_full = x
        xp = np.pad(x_full, [(0, 0), (0, 0), (width - 1, width - 1)])  # padding=width - 1
    else:
        x_full = np.concatenate([initial_state, x], axis=-1)
        xp = x_full
    n_out = xp.shape[-1] - width + 1
    out = np.stack([(xp[..., t:t + width] * weight).sum(-1) for t in range(n_out)], axis=-1)
    if bias is not None:
        out = out + bias[:, None]
    out = out[..., :seqlen]
    final_states = x_full[..., x_full.shape[-1] - (width - 1):]  # F.pad(x_full, (width - 1 - T_full, 0))
    out = out if activation is None else out / (1 + np.exp(-out))
    return out, final_states


def causal_conv1d_update_ref(x, conv_state, weight, activation=None):
    """tests/modules/test_conv.py causal_conv1d_update_ref_torch (no cache_seqlens); x [B, D, T]."""
    width = weight.shape[1]
    state_len = conv_state.shape[-1]
    x_new = np.concatenate([conv_state, x], axis=-1)
    new_state = x_new[:, :, -state_len:]
    n_out = x_new.shape[-1] - width + 1
    out = np.stack([(x_new[..., t:t + width] * weight).sum(-1) for t in range(n_out)], axis=-1)
    out = out[:, :, -x.shape[-1]:]
    return (out if activation is None else out / (1 + np.exp(-out))), new_state


def householder_product_logits(q, k, w, beta):
    """Brute force ``q_i^T H_i H_{i-1} ... H_{j+1} k_j`` for one head, [L, d] inputs."""
    n, d = q.shape
    out = np.full((n, n), -np.inf)
    for i in range(n):
        prod = np.eye(d)
        for j in range(i, -1, -1):
            out[i, j] = q[i] @ prod @ k[j]
            prod = prod @ (np.eye(d) - beta[j] * np.outer(w[j], w[j]))
    return out


def inputs(b=B, n=L, hq=HQ, hkv=HKV, d=D, gate=True):
    q = RNG.normal(size=(b, n, hq, d))
    k, v = RNG.normal(size=(b, n, hkv, d)), RNG.normal(size=(b, n, hkv, d))
    w = RNG.normal(size=(b, n, hkv, d))
    w = w / np.linalg.norm(w, axis=-1, keepdims=True)
    beta = RNG.uniform(0.0, 2.0, size=(b, n, hkv))
    g = np.log(RNG.uniform(0.8, 1.0, size=(b, n, hq))) if gate else np.zeros((b, n, hq))
    return q, k, v, w, beta, g


def f32(*xs):
    return tuple(jnp.asarray(x, jnp.float32) for x in xs)


def cumsum_heads_first(g):
    """c [B, H, T] from log gates g [B, T, H] (fox.cumulative takes pre-sigmoid logits)."""
    return jnp.swapaxes(jnp.cumsum(jnp.asarray(g, jnp.float32), axis=1), 1, 2)


def assert_logits_close(got, want, tol=1e-5):
    got = np.asarray(got)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- logits


def test_golden_plain_attention_and_reflections():
    q, k = RNG.normal(size=(1, L, 1, D)), RNG.normal(size=(1, L, 1, D))
    plain = np.einsum("bqhd,bkhd->bhqk", q, k) * 0.5
    causal = np.tril(np.ones((L, L), bool))
    w = np.zeros((1, L, 1, D))
    w[..., 0] = 1.0
    # beta = 0: every H is the identity, the logits are scaled dot products.
    s = pa.logits(*f32(q, k, w, np.zeros((1, L, 1))), scale=0.5, chunk=4)
    assert_logits_close(s, np.where(causal, plain, -np.inf))
    # beta = 2, w = e_0: each H flips the first coordinate, so q_i . k_j's first term gets (-1)^(i-j).
    sign = (-1.0) ** (np.arange(L)[:, None] - np.arange(L)[None, :])
    want = 0.5 * (np.einsum("bqhd,bkhd->bhqk", q[..., 1:], k[..., 1:])
                  + sign * np.einsum("bqh,bkh->bhqk", q[..., 0], k[..., 0]))
    s = pa.logits(*f32(q, k, w, np.full((1, L, 1), 2.0)), scale=0.5, chunk=4)
    assert_logits_close(s, np.where(causal, want, -np.inf))


def test_product_order_is_h_i_down_to_h_j_plus_one():
    q, k, _, w, beta, _ = inputs(b=1, hq=1, hkv=1)
    s = np.asarray(pa.logits(*f32(q, k, w, beta), scale=1.0, chunk=4))[0, 0]
    want = householder_product_logits(q[0, :, 0], k[0, :, 0], w[0, :, 0], beta[0, :, 0])
    assert_logits_close(s, want)


@pytest.mark.parametrize("chunk, naive_chunk", [(4, 4), (3, 64), (64, 5), (1, 2)])
def test_logits_match_naive_reference(chunk, naive_chunk):
    q, k, v, w, beta, g = inputs()
    _, want = naive_path_attn(q, k, v, w, beta, g, D ** -0.5, chunk_size=naive_chunk)
    c = cumsum_heads_first(g)
    s = pa.logits(*f32(q, k, w, beta), c_q=c, c_k=c, chunk=chunk)  # default scale 1 / sqrt(D)
    assert s.shape == (B, HQ, L, L) and s.dtype == jnp.float32
    assert_logits_close(s, want)


def test_forget_gate_from_fox_cumulative_and_batch_dims():
    q, k, v, w, beta, _ = inputs()
    f = RNG.normal(size=(B, L, HQ)) + 3.0  # pre-sigmoid forget logits, as the layer's g_proj
    _, want = naive_path_attn(q, k, v, w, beta, -np.logaddexp(0, -f), 0.3, chunk_size=4)
    lead = lambda x: x.reshape((1, B) + x.shape[1:])  # two leading dims
    c = fox.cumulative(jnp.asarray(lead(f), jnp.float32))
    s = pa.logits(*f32(*(lead(x) for x in (q, k, w, beta))), scale=0.3, c_q=c, c_k=c, chunk=4)
    assert s.shape == (1, B, HQ, L, L)
    assert_logits_close(np.asarray(s).reshape(want.shape), want)


def test_attention_matches_naive_with_bf16_inputs():
    # As the official test: q, k, v in bf16, w and beta in float32, beta in (1.5, 2).
    q, k, v, w, beta, g = inputs()
    beta = RNG.uniform(1.5, 2.0, size=beta.shape)
    qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    c = cumsum_heads_first(g)
    out = pa.attention(qb, kb, vb, *f32(w, beta), c_q=c, c_k=c, chunk=4)
    assert out.dtype == jnp.bfloat16 and out.shape == q.shape
    up = lambda x: np.asarray(x.astype(jnp.float32))
    want, _ = naive_path_attn(up(qb), up(kb), up(vb), w, beta, g, D ** -0.5)
    np.testing.assert_allclose(up(out), want, rtol=2e-2, atol=2e-2)
    out32 = pa.attention(*f32(q, k, v, w, beta), c_q=c, c_k=c, chunk=4)
    want32, _ = naive_path_attn(q, k, v, w, beta, g, D ** -0.5)
    np.testing.assert_allclose(out32, want32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk, gate, dtype", [(3, True, jnp.float32), (4, False, jnp.float32),
                                                 (16, True, jnp.bfloat16)])
def test_blocked_attention_equals_dense(chunk, gate, dtype):
    q, k, v, w, beta, g = inputs(gate=gate)
    v = RNG.normal(size=(B, L, HKV, 3))  # value width may differ from the key width
    c = cumsum_heads_first(g) if gate else None
    qkv = tuple(jnp.asarray(x, dtype) for x in (q, k, v))
    dense = pa.attention(*qkv, *f32(w, beta), c_q=c, c_k=c, chunk=4)
    blocked = pa.blocked_attention(*qkv, *f32(w, beta), c_q=c, c_k=c, chunk=chunk)
    assert blocked.dtype == dtype and blocked.shape == (B, L, HQ, 3)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(blocked.astype(jnp.float32)), np.asarray(dense.astype(jnp.float32)),
                               rtol=tol, atol=tol)


def test_blocked_attention_gradients_equal_dense_and_are_causal():
    q, k, v, w, beta, g = inputs(b=1, n=7)
    args = f32(q, k, v, w, beta, np.swapaxes(np.cumsum(g, 1), 1, 2))
    cot = jnp.asarray(RNG.normal(size=q.shape), jnp.float32).at[:, 4:].set(0.0)  # outputs 0..3 only
    loss = lambda fn: (lambda q, k, v, w, b, c: jnp.sum(fn(q, k, v, w, b, c_q=c, c_k=c, chunk=3) * cot))
    dense = jax.jit(jax.grad(loss(pa.attention), argnums=tuple(range(6))))(*args)
    blocked = jax.jit(jax.grad(loss(pa.blocked_attention), argnums=tuple(range(6))))(*args)
    for gd, gb in zip(dense, blocked):
        np.testing.assert_allclose(gb, gd, rtol=1e-4, atol=1e-6)
        assert not np.any(np.asarray(gb)[..., 4:, :, :] if gb.ndim == 4 else np.asarray(gb)[:, 4:])


# ----------------------------------------------------------------------------- decoding


def test_cached_keys_follow_the_official_rank_one_recurrence():
    _, k, _, w, beta, _ = inputs()
    cache = k[:, :1].copy()  # official prefill of one token, then one rank-one update per step
    for t in range(1, L):
        cache = np.concatenate([rank_one_update(cache, w[:, t:t + 1], beta[:, t:t + 1]), k[:, t:t + 1]], 1)
    np.testing.assert_allclose(pa.transform_keys(*f32(k, w, beta), chunk=4), cache, rtol=1e-5, atol=1e-5)
    step = pa.update_keys(*f32(k[:, :6], w[:, 6:7], beta[:, 6:7]))
    np.testing.assert_allclose(step, rank_one_update(k[:, :6], w[:, 6:7], beta[:, 6:7]), rtol=1e-6, atol=1e-6)
    many = pa.update_keys(*f32(k[:, :4], w[:, 4:], beta[:, 4:]), chunk=3)
    want = k[:, :4]
    for t in range(4, L):
        want = rank_one_update(want, w[:, t:t + 1], beta[:, t:t + 1])
    np.testing.assert_allclose(many, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [1, 6])
def test_decoding_with_a_transformed_key_cache_equals_the_full_forward(p):
    q, k, v, w, beta, g = inputs()
    _, want = naive_path_attn(q, k, v, w, beta, g, 0.5, chunk_size=4)
    c = cumsum_heads_first(g)
    cache = pa.transform_keys(*f32(k[:, :p], w[:, :p], beta[:, :p]), chunk=4)
    s = pa.logits(*f32(q[:, p:], k[:, p:], w[:, p:], beta[:, p:]), scale=0.5,
                  c_q=c[..., p:], c_k=c, prefix=cache, chunk=4)
    assert s.shape == (B, HQ, L - p, L)
    assert_logits_close(s, want[:, :, p:])
    # The cache after the step: the old keys moved through the new tokens, then the new keys.
    new_cache = jnp.concatenate([pa.update_keys(cache, *f32(w[:, p:], beta[:, p:]), chunk=4),
                                 pa.transform_keys(*f32(k[:, p:], w[:, p:], beta[:, p:]), chunk=4)], 1)
    np.testing.assert_allclose(new_cache, pa.transform_keys(*f32(k, w, beta)), rtol=1e-5, atol=1e-5)


def test_bf16_cache_keeps_its_dtype():
    _, k, _, w, beta, _ = inputs()
    cache = pa.transform_keys(jnp.asarray(k, jnp.bfloat16), *f32(w, beta))
    assert cache.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(cache.astype(jnp.float32)), pa.transform_keys(*f32(k, w, beta)),
                               rtol=3e-2, atol=3e-2)


# ----------------------------------------------------------------------------- properties


def test_causal_through_gradients():
    q, k, _, w, beta, g = inputs(b=1, n=7)
    args = f32(q, k, w, beta, np.swapaxes(np.cumsum(g, 1), 1, 2))

    @jax.jit
    def grads(args, t):
        def row(q, k, w, beta, c):
            s = pa.logits(q, k, w, beta, c_q=c, c_k=c, chunk=3)[:, :, t]
            return jnp.sum(jnp.where(jnp.isfinite(s), s, 0.0))
        return jax.grad(row, argnums=(0, 1, 2, 3, 4))(*args)

    for t in (0, 3, 6):
        gq, gk, gw, gb, gc = (np.asarray(x) for x in grads(args, t))
        for x in (gq, gk, gw, gb):
            assert not np.any(x[:, t + 1:]), t
        assert not np.any(gc[..., t + 1:])
        assert np.all(np.abs(gk[:, :t + 1]).sum(axis=(0, 2, 3)) > 0)
        if t:  # the H of every token after the key and up to the query shapes the logits
            assert np.all(np.abs(gw[:, 1:t + 1]).sum(axis=(0, 2, 3)) > 0)


def test_relative_shift_invariance():
    # Logits among the last tokens depend only on the tokens between key and query:
    # a prefix changes nothing there (PaTH has no absolute position).
    q, k, _, w, beta, g = inputs(n=9)
    c = cumsum_heads_first(g)
    full = np.asarray(pa.logits(*f32(q, k, w, beta), c_q=c, c_k=c, chunk=4))[..., 4:, 4:]
    c_tail = cumsum_heads_first(g[:, 4:])
    tail = pa.logits(*f32(q[:, 4:], k[:, 4:], w[:, 4:], beta[:, 4:]), c_q=c_tail, c_k=c_tail, chunk=4)
    assert_logits_close(tail, full)


def _largest_intermediate(jaxpr):
    size = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            size = max(size, int(np.prod(getattr(var.aval, "shape", ()))))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    size = max(size, _largest_intermediate(inner))
    return size


def test_memory_is_not_quadratic_in_length_times_head_dim_squared():
    n, d = 64, 16
    x = jnp.zeros((1, n, 1, d))
    beta = jnp.ones((1, n, 1))
    for fn in (lambda *a: pa.logits(*a, chunk=16),
               lambda *a: jax.grad(lambda *b: jnp.sum(jnp.tanh(pa.logits(*b, chunk=16))), argnums=(0, 1, 2, 3))(*a)):
        biggest = _largest_intermediate(jax.make_jaxpr(fn)(x, x, x, beta).jaxpr)
        assert biggest <= 4 * n * n * d < n * n * d * d, biggest
    # The blocked form never holds an [L, L] tile: its largest array is O(L (chunk + Dh)).
    biggest = _largest_intermediate(jax.make_jaxpr(
        lambda *a: pa.blocked_attention(*a, chunk=8))(x, x, x, x, beta).jaxpr)
    assert biggest <= 2 * n * d < n * n, biggest


def test_vmap():  # (jit: the gradient tests run jitted)
    q, k, _, w, beta, _ = inputs()
    s = pa.logits(*f32(q, k, w, beta), chunk=4)
    vm = jax.vmap(lambda *a: pa.logits(*a, chunk=4))(*(x[:, None] for x in f32(q, k, w, beta)))
    np.testing.assert_allclose(vm[:, 0], s, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- layer pieces


@pytest.mark.parametrize("use_bias, activation, dtype", [
    (False, "silu", jnp.float32), (True, None, jnp.float32), (False, "swish", jnp.bfloat16)])
def test_short_conv_matches_official_reference(use_bias, activation, dtype):
    b, n, dim, width = 2, 7, 5, 3
    x = jnp.asarray(RNG.normal(size=(b, n, dim)), dtype)
    weight = RNG.normal(size=(dim, width))
    bias = RNG.normal(size=dim) if use_bias else None
    y = pa.short_conv(x, jnp.asarray(weight, jnp.float32), bias=None if bias is None else jnp.asarray(bias),
                      activation=activation)
    assert y.dtype == dtype
    xt = np.swapaxes(np.asarray(x.astype(jnp.float32)), 1, 2)  # [B, D, T]
    want, final = causal_conv1d_ref(xt, weight, bias, activation=activation)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(y.astype(jnp.float32)), np.swapaxes(want, 1, 2), rtol=tol, atol=tol)
    np.testing.assert_array_equal(pa.short_conv_state(x, width=width), np.swapaxes(final, 1, 2).astype(dtype))


def test_short_conv_decoding_with_state_equals_the_full_pass():
    b, n, dim, width = 2, 8, 4, 3
    x = jnp.asarray(RNG.normal(size=(b, n, dim)), jnp.float32)
    weight = jnp.asarray(RNG.normal(size=(dim, width)), jnp.float32)
    full = pa.short_conv(x, weight)
    state = pa.short_conv_state(x[:, :5], width=width)
    np.testing.assert_allclose(pa.short_conv(x[:, 5:], weight, state=state), full[:, 5:], rtol=1e-6)
    # One step against the official update reference ([B, D, W-1] state).
    xt = np.swapaxes(np.asarray(x), 1, 2)
    y_ref, s_ref = causal_conv1d_update_ref(xt[:, :, 5:6], xt[:, :, 3:5], np.asarray(weight), activation="silu")
    np.testing.assert_allclose(pa.short_conv(x[:, 5:6], weight, state=state), np.swapaxes(y_ref, 1, 2), rtol=1e-5)
    np.testing.assert_array_equal(pa.short_conv_state(x[:, 5:6], width=width, state=state), np.swapaxes(s_ref, 1, 2))
    # Causal through gradients.
    g = jax.grad(lambda x: pa.short_conv(x, weight)[:, 4].sum())(x)
    touched = np.abs(np.asarray(g)).sum(axis=(0, 2)) > 0
    np.testing.assert_array_equal(touched, (np.arange(n) <= 4) & (np.arange(n) >= 4 - width + 1))


def test_beta_and_normalize_w():
    x = jnp.asarray([-30.0, 0.0, 30.0])
    np.testing.assert_allclose(pa.beta(x), [0.0, 1.0, 2.0], atol=1e-6)
    assert pa.beta(x.astype(jnp.bfloat16)).dtype == jnp.float32
    w = RNG.normal(size=(3, 4, 2, 5))
    got = pa.normalize_w(jnp.asarray(w, jnp.bfloat16))
    assert got.dtype == jnp.float32
    wb = np.asarray(jnp.asarray(w, jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_allclose(got, wb / np.sqrt((wb * wb).sum(-1, keepdims=True) + 1e-6), rtol=1e-6)
    np.testing.assert_allclose(pa.normalize_w(jnp.zeros((2, 3))), 0.0)


@pytest.mark.parametrize("call, match", [
    (lambda: pa.logits(*f32(*inputs()[:2]), *f32(inputs()[3][:, :3], inputs()[4])), "k, w"),
    (lambda: pa.logits(*f32(np.zeros((2, 5, 3, 4)), np.zeros((2, 5, 2, 4)), np.zeros((2, 5, 2, 4)),
                            np.zeros((2, 5, 2)))), "multiple"),
    (lambda: pa.logits(*f32(*(x for i, x in enumerate(inputs()) if i in (0, 1, 3, 4))), scale=-1.0), "scale"),
    (lambda: pa.logits(*f32(*(x for i, x in enumerate(inputs()) if i in (0, 1, 3, 4))), chunk=0), "chunk"),
    (lambda: pa.logits(*f32(*(x for i, x in enumerate(inputs()) if i in (0, 1, 3, 4))),
                       c_q=jnp.zeros((B, HQ, L))), "c_q and c_k"),
    (lambda: pa.logits(*f32(*(x for i, x in enumerate(inputs()) if i in (0, 1, 3, 4))),
                       prefix=jnp.zeros((B, 3, HKV, D + 1))), "prefix"),
    (lambda: pa.update_keys(jnp.zeros((B, 3, HKV, D + 1)), *f32(inputs()[3], inputs()[4])), "keys"),
    (lambda: pa.short_conv(jnp.zeros((2, 5, 4)), jnp.zeros((3, 3))), "weight"),
    (lambda: pa.short_conv(jnp.zeros((2, 5, 4)), jnp.zeros((4, 3)), activation="relu"), "activation"),
    (lambda: pa.short_conv(jnp.zeros((2, 5, 4)), jnp.zeros((4, 3)), state=jnp.zeros((2, 3, 4))), "state"),
    (lambda: pa.short_conv_state(jnp.zeros((2, 5, 4)), width=0), "width"),
    (lambda: pa.normalize_w(jnp.zeros(3), eps=0.0), "eps"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_scale_default_is_inverse_sqrt_head_dim():
    q, k, _, w, beta, _ = inputs()
    np.testing.assert_allclose(pa.logits(*f32(q, k, w, beta), chunk=4),
                               pa.logits(*f32(q, k, w, beta), scale=1 / math.sqrt(D), chunk=4), rtol=1e-6)
