"""posenc.stickbreaking against a transcription of the official reference.

Reference (numpy float64): shawntan/stickbreaking-attention @ 3147a38,
``stickbreaking_attention/sb_ref.py`` (``stickbreaking``) and
``tests/test_attn.py`` (``ref_fwd``), layout [B, H, T, D].
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import stickbreaking as sb

RNG = np.random.default_rng(0)
B, L, H, DH = 2, 9, 2, 4


def logsigmoid(x):
    return -np.logaddexp(0.0, -np.asarray(x, np.float64))


def official_stickbreaking(q, k, v, mask, cum_weight):
    """sb_ref.py stickbreaking: q, k, v [B, H, T, D]; returns (att @ v, 1 - att.sum(-1))."""
    logits = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
    log_z = np.where(mask, -1e5, logsigmoid(logits))
    log_beta = np.where(mask, 0.0, logsigmoid(-logits))
    re_cum_log_beta = np.einsum("bhij,jk->bhik", log_beta, cum_weight)
    log_att = log_z + re_cum_log_beta
    att = np.exp(log_att)
    return att @ v, 1 - att.sum(axis=-1), att


def official_ref_fwd(q, k, v, attend_current=False):
    """tests/test_attn.py ref_fwd: cm = ones.tril(-1); mask = ones.triu(1 if attend_current else 0)."""
    length = q.shape[-2]
    cm = np.tril(np.ones((length, length)), -1)
    mask = np.triu(np.ones((length, length)), 1 if attend_current else 0).astype(bool)
    o, rem, att = official_stickbreaking(*(np.asarray(x, np.float64) for x in (q, k, v)), mask, cm)
    return o + rem[..., None] * v, att


def to_heads_first(x):
    return np.swapaxes(np.asarray(x, np.float64), -2, -3)  # [B, T, H, D] -> [B, H, T, D]


def qkv(shape=(B, L, H, DH), dtype=jnp.float32):
    # As the official test: v ~ 0.25 N, q ~ 0.25 (N + 1), k ~ 0.25 (N - 1); scaled up to spread the weights.
    v = 0.25 * RNG.normal(size=shape)
    q = 1.0 * (RNG.normal(size=shape) + 1)
    k = 1.0 * (RNG.normal(size=shape) - 1)
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


@pytest.mark.parametrize("attend_current, want", [
    (False, [[0, 0, 0], [0.5, 0, 0], [0.25, 0.5, 0]]),
    (True, [[0.5, 0, 0], [0.25, 0.5, 0], [0.125, 0.25, 0.5]]),
])
def test_weights_golden_half_sticks(attend_current, want):
    # z = 0: every beta is 1/2, so the k-th visible key back from the query gets 2^-(k+1).
    a = sb.weights(jnp.zeros((3, 3)), attend_current=attend_current)
    np.testing.assert_allclose(a, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("attend_current", [False, True])
def test_weights_match_official_with_batch_dims(attend_current):
    q, k, v = qkv((2, 3, 7, 4))  # official layout [B, H, T, D]
    z = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 2.0
    a = np.asarray(sb.weights(z, attend_current=attend_current))
    _, att = official_ref_fwd(q, k, v, attend_current)
    np.testing.assert_allclose(a, att, rtol=1e-5, atol=1e-6)
    masked = np.triu(np.ones((7, 7), bool), 1 if attend_current else 0)
    assert np.all(a[..., masked] == 0) and np.all(a.sum(-1) <= 1 + 1e-6)


@pytest.mark.parametrize("attend_current", [False, True])
def test_attention_matches_official_ref_fwd(attend_current):
    q, k, v = qkv()
    out = sb.attention(q, k, v, scale=DH ** -0.5, attend_current=attend_current)
    ref, _ = official_ref_fwd(*(to_heads_first(x) for x in (q, k, v)), attend_current)
    assert out.shape == q.shape and out.dtype == jnp.float32
    np.testing.assert_allclose(out, np.swapaxes(ref, 1, 2), rtol=1e-5, atol=1e-6)
    if not attend_current:  # the first query sees no key: all its mass goes to its own value
        np.testing.assert_allclose(out[:, 0], v[:, 0], rtol=1e-6)


def test_attention_bf16_and_grouped_heads():
    q, k, v = qkv((B, L, 4, DH), jnp.bfloat16)
    k, v = k[..., ::2, :], v[..., ::2, :]  # two key heads serve four query heads
    out = sb.attention(q, k, v, scale=DH ** -0.5)
    assert out.dtype == jnp.bfloat16
    f32 = lambda x: np.asarray(x.astype(jnp.float32))
    ref, _ = official_ref_fwd(to_heads_first(f32(q)), to_heads_first(np.repeat(f32(k), 2, -2)),
                              to_heads_first(np.repeat(f32(v), 2, -2)))
    np.testing.assert_allclose(f32(out), np.swapaxes(ref, 1, 2), rtol=2e-2, atol=2e-2)
    blocked = sb.blocked_attention(q, k, v, scale=DH ** -0.5, block=4)
    np.testing.assert_allclose(f32(blocked), f32(out), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("attend_current, block", [(False, 1), (False, 4), (True, 4), (True, 16)])
def test_blocked_equals_dense(attend_current, block):
    q, k, v = qkv((1, 2, L, H, DH))  # two leading dims
    dense = sb.attention(q, k, v, scale=0.5, attend_current=attend_current)
    blocked = sb.blocked_attention(q, k, v, scale=0.5, attend_current=attend_current, block=block)
    np.testing.assert_allclose(blocked, dense, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attend_current", [False, True])
def test_fewer_queries_than_keys_are_the_last_rows(attend_current):
    q, k, v = qkv()
    full = sb.attention(q, k, v, scale=0.5, attend_current=attend_current)
    for lq in (1, 4):
        tail = sb.attention(q[:, -lq:], k, v, scale=0.5, attend_current=attend_current)
        np.testing.assert_allclose(tail, full[:, -lq:], rtol=1e-5, atol=1e-6)
    blocked = sb.blocked_attention(q[:, -1:], k, v, scale=0.5, attend_current=attend_current, block=2)
    np.testing.assert_allclose(blocked, full[:, -1:], rtol=1e-5, atol=1e-6)  # one decoding step
    z = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.5
    np.testing.assert_allclose(sb.weights(z[..., -3:, :], attend_current=attend_current),
                               sb.weights(z, attend_current=attend_current)[..., -3:, :], rtol=1e-6)


def test_traced_q_offset_in_a_fixed_size_cache():
    # Cache of 12 slots holding 6 keys; 3 new queries at slots 3..5; slots 6.. hold garbage.
    q, k, v = qkv((B, 6, H, DH))
    junk = jnp.asarray(RNG.normal(size=(B, 6, H, DH)) * 50, jnp.float32)
    k_buf, v_buf = jnp.concatenate([k, junk], 1), jnp.concatenate([v, junk], 1)
    want = sb.attention(q, k, v, scale=0.5)[:, 3:]
    for fn in (sb.attention, lambda *a, **kw: sb.blocked_attention(*a, block=4, **kw)):
        got = jax.jit(lambda off: fn(q[:, 3:], k_buf, v_buf, scale=0.5, q_offset=off))(3)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sb.attention(q[:, 3:], k_buf, v_buf, scale=0.5, q_offset=3), want,
                               rtol=1e-5, atol=1e-6)


def test_blocked_gradients_equal_dense_gradients():
    q, k, v = qkv((1, 7, H, DH))
    cot = jnp.asarray(RNG.normal(size=q.shape), jnp.float32)
    grads = [jax.grad(lambda *x: jnp.sum(fn(*x) * cot), argnums=(0, 1, 2))(q, k, v)
             for fn in (lambda *x: sb.attention(*x, scale=0.5, attend_current=True),
                        lambda *x: sb.blocked_attention(*x, scale=0.5, attend_current=True, block=3))]
    for gd, gb in zip(*grads):
        np.testing.assert_allclose(gb, gd, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("attend_current", [False, True])
def test_causal_through_gradients(attend_current):
    q, k, v = qkv((1, 6, H, DH))
    for fn in (sb.attention, lambda *a, **kw: sb.blocked_attention(*a, block=2, **kw)):
        @jax.jit
        def grads(q, k, v, t):  # d out[t] / d (q, k, v), one compile for every t
            pick = (jnp.arange(6) == t)[None, :, None, None]
            return jax.grad(lambda q, k, v: jnp.sum(
                fn(q, k, v, scale=0.5, attend_current=attend_current) * pick), argnums=(0, 1, 2))(q, k, v)

        for t in (0, 2, 5):
            gs = grads(q, k, v, t)
            for g in gs:
                assert not np.any(np.asarray(g)[:, t + 1:]), t
            # Every key up to the query carries gradient (stick-breaking never ignores a visible key).
            assert np.all(np.abs(np.asarray(gs[2])[:, :t + 1]).sum(axis=(0, 2, 3)) > 0)


@pytest.mark.parametrize("attend_current", [False, True])
def test_relative_shift_invariance(attend_current):
    # No positions: a key's weight depends only on the keys between it and the query, so keys
    # prepended before the window leave the weights of the window unchanged.
    z = jnp.asarray(RNG.normal(size=(2, 11, 11)) * 2, jnp.float32)
    long = sb.weights(z, attend_current=attend_current)[..., 4:, 4:]
    short = sb.weights(z[..., 4:, 4:], attend_current=attend_current)
    np.testing.assert_allclose(long, short, rtol=1e-5, atol=1e-7)
    # The same queries and keys placed later in a longer sequence give the same output
    # when the earlier keys take no stick (z = -inf is beta = 0).
    q, k, _ = qkv((1, 5, 1, 2))
    pad = jnp.zeros((1, 3, 1, 2))
    k_far = jnp.concatenate([pad, k], 1)
    z_far = jnp.einsum("bqhd,bkhd->bhqk", q, k_far).at[..., :3].set(-jnp.inf)
    a_far = sb.weights(z_far, attend_current=attend_current)
    a = sb.weights(jnp.einsum("bqhd,bkhd->bhqk", q, k), attend_current=attend_current)
    np.testing.assert_allclose(a_far[..., 3:], a, rtol=1e-6)
    assert not np.any(np.asarray(a_far[..., :3]))


def test_jit_and_vmap():
    q, k, v = qkv()
    dense = sb.attention(q, k, v, scale=0.5)
    np.testing.assert_allclose(jax.jit(lambda *x: sb.attention(*x, scale=0.5))(q, k, v), dense, rtol=1e-6)
    vm = jax.vmap(lambda *x: sb.blocked_attention(*x, scale=0.5, block=4))(q, k, v)  # vmapped per sequence
    np.testing.assert_allclose(vm, dense, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda: sb.weights(jnp.zeros(3)), "logits"),
    (lambda: sb.weights(jnp.zeros((3, 3)), attend_current=1), "attend_current"),
    (lambda: sb.weights(jnp.zeros((2, 5)), q_offset=4), "q_offset"),
    (lambda: sb.weights(jnp.zeros((5, 3))), "more queries than keys"),
    (lambda: sb.attention(*qkv(), scale=0.0), "scale"),
    (lambda: sb.attention(*qkv(), scale=0.5, q_offset=-1), "q_offset"),
    (lambda: sb.attention(jnp.zeros((2, 3, 3, 4)), jnp.zeros((2, 3, 2, 4)), jnp.zeros((2, 3, 2, 4)), scale=1.0),
     "multiple"),
    (lambda: sb.attention(jnp.zeros((2, 3, 2, 4)), jnp.zeros((2, 3, 2, 4)), jnp.zeros((2, 4, 2, 4)), scale=1.0),
     "shapes"),
    (lambda: sb.blocked_attention(*qkv(), scale=0.5, block=0), "block"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
