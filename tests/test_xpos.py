"""posenc.xpos: scale values, parity with torchscale's XPOS (transcribed in
NumPy) in the full forward and in decoding after 100K keys, the float32
range (ValueError / NaN), relative-position decay property, bf16, jit / grad,
errors."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc import rope, xpos


def test_scale_values():
    # d = 8, gamma 0.4: zeta_i = (2i + 3.2) / 11.2
    zeta = np.array([3.2, 5.2, 7.2, 9.2]) / 11.2
    s = xpos.scale(jnp.array([0, 512, -512, 256]), 8)
    assert s.shape == (4, 4) and s.dtype == jnp.float32
    np.testing.assert_allclose(s, np.stack([np.ones(4), zeta, 1 / zeta, np.sqrt(zeta)]), rtol=1e-6)
    # gamma and scale_base enter as in the paper
    # d = 4, gamma 1: zeta = (2i + 4) / 8; p / scale_base = 2
    np.testing.assert_allclose(xpos.scale(jnp.array([[100]]), 4, scale_base=50.0, gamma=1.0)[0, 0],
                               (np.array([4.0, 6.0]) / 8.0) ** 2, rtol=1e-6)


# ---------------------------------------------------------------------------
# torchscale, transcribed literally in NumPy (float64) from microsoft/torchscale,
# torchscale/component/xpos_relative_position.py (fixed_pos_embedding,
# rotate_every_two, duplicate_interleave, apply_rotary_pos_emb, XPOS.forward),
# and the call in torchscale/component/multihead_attention.py:
#     offset = src_len - 1 if decoding (incremental_state, not first step) else 0
#     k = self.xpos(k, offset=0, downscale=True)
#     q = self.xpos(q, offset=offset, downscale=False)
# x is [(batch * heads), length, head_dim].
# ---------------------------------------------------------------------------


def ts_fixed_pos_embedding(x):
    seq_len, dim = x.shape
    inv_freq = 1.0 / (10000 ** (np.arange(0, dim) / dim))
    sinusoid_inp = np.einsum("i , j -> i j", np.arange(0, seq_len, dtype=np.float64), inv_freq)
    return np.sin(sinusoid_inp), np.cos(sinusoid_inp)


def ts_rotate_every_two(x):
    x1 = x[:, :, ::2]
    x2 = x[:, :, 1::2]
    x = np.stack((-x2, x1), axis=-1)
    return x.reshape(*x.shape[:-2], -1)


def ts_duplicate_interleave(m):
    dim0 = m.shape[0]
    m = m.reshape(-1, 1)
    m = np.tile(m, (1, 2))
    return m.reshape(dim0, -1)


def ts_apply_rotary_pos_emb(x, sin, cos, scale=1):
    sin, cos = map(lambda t: ts_duplicate_interleave(t * scale), (sin, cos))
    return (x * cos) + (ts_rotate_every_two(x) * sin)


class TsXPOS:
    def __init__(self, head_dim, scale_base=512):
        self.head_dim = head_dim
        self.scale_base = scale_base
        self.scale = (np.arange(0, head_dim, 2) + 0.4 * head_dim) / (1.4 * head_dim)

    def forward(self, x, offset=0, downscale=False):
        length = x.shape[1]
        min_pos = -(length + offset) // 2
        max_pos = length + offset + min_pos
        scale = self.scale ** (np.arange(min_pos, max_pos, 1) / self.scale_base)[:, None]
        sin, cos = ts_fixed_pos_embedding(scale)
        if scale.shape[0] > length:
            scale = scale[-length:]
            sin = sin[-length:]
            cos = cos[-length:]
        if downscale:
            scale = 1 / scale
        return ts_apply_rotary_pos_emb(x, sin, cos, scale)


def ours_logits(q, k, qp, kp, scale_base, **kw):
    inv, _ = rope.frequencies("default", q.shape[-1])
    qx, kx = xpos.apply_pair(jnp.asarray(q, jnp.float32)[:, None], jnp.asarray(k, jnp.float32)[:, None],
                             jnp.asarray(qp), jnp.asarray(kp), inv, scale_base=scale_base, **kw)
    return np.asarray(jnp.einsum("qd,kd->qk", qx[:, 0], kx[:, 0], precision="highest"), np.float64)


@pytest.mark.parametrize("length", [7, 64])
def test_full_forward_logits_match_torchscale(length):
    q, k = np.asarray(jax.random.normal(jax.random.key(0), (2, length, 16)), np.float64)
    ts = TsXPOS(16, scale_base=32)
    ref = ts.forward(q[None], downscale=False)[0] @ ts.forward(k[None], downscale=True)[0].T
    pos = np.arange(length)
    tol = dict(rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_allclose(ours_logits(q, k, pos, pos, 32.0), ref, **tol)
    # Any common offset gives the same logits (here: none, the old convention).
    inv, _ = rope.frequencies("default", 16)
    qx = xpos.apply(jnp.asarray(q, jnp.float32)[:, None], pos, inv, is_key=False, scale_base=32.0)
    kx = xpos.apply(jnp.asarray(k, jnp.float32)[:, None], pos, inv, is_key=True, scale_base=32.0)
    np.testing.assert_allclose(jnp.einsum("qd,kd->qk", qx[:, 0], kx[:, 0], precision="highest"), ref, **tol)


def test_full_forward_near_the_span_limit_matches_torchscale():
    # 50,000 positions in one call (the limit is 2 * 27,195 at the defaults); rows checked sparsely.
    length = 50_000
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, length, 8))
    ts = TsXPOS(8)
    tq, tk = ts.forward(q[None])[0], ts.forward(k[None], downscale=True)[0]
    rows = np.array([0, 1, 9_999, 25_000, 49_998, 49_999])
    cols = np.concatenate([np.arange(0, 50), np.arange(24_990, 25_010), np.arange(49_950, 50_000)])
    ref = tq[rows] @ tk[cols].T
    inv, _ = rope.frequencies("default", 8)
    qx, kx = xpos.apply_pair(jnp.asarray(q, jnp.float32)[:, None], jnp.asarray(k, jnp.float32)[:, None],
                             jnp.arange(length), jnp.arange(length), inv)
    ours = np.asarray(qx[rows, 0], np.float64) @ np.asarray(kx[cols, 0], np.float64).T
    causal = rows[:, None] >= cols[None, :]  # future pairs reach 1e30 and more: masked in attention
    np.testing.assert_allclose(ours[causal], ref[causal], rtol=1e-4, atol=1e-5)


def test_decoding_after_100k_cached_keys_matches_torchscale():
    # One query after 100,000 keys: torchscale centres both on -src_len // 2, which float32 cannot
    # hold (3.5^97 overflows); the pair offset (the query position) keeps every factor <= 1.
    src_len = 100_000
    rng = np.random.default_rng(1)
    q_new, k_all = rng.normal(size=(1, 8)), rng.normal(size=(src_len, 8))
    ts = TsXPOS(8)
    ref = ts.forward(q_new[None], offset=src_len - 1)[0] @ ts.forward(k_all[None], offset=0, downscale=True)[0].T
    ours = ours_logits(q_new, k_all, np.array([src_len - 1]), np.arange(src_len), 512.0)
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-6)
    assert float(xpos.pair_offset(jnp.array([src_len - 1]), jnp.arange(src_len))) == src_len - 1


def test_pair_offset_and_max_distance():
    # (5 + 3) // 2, (12 + 10) // 2
    np.testing.assert_array_equal(xpos.pair_offset(jnp.array([[3, 4, 5], [10, 11, 12]]),
                                                   jnp.array([[0, 1, 5], [0, 2, 12]])), [4, 11])
    assert xpos.pair_offset(jnp.arange(64), jnp.arange(64)) == 31  # torchscale: -(-64 // 2) = 32
    big = 2**30 + 5
    assert int(xpos.pair_offset(jnp.array([big]), jnp.array([big + 8]))) == big + 4  # no int32 overflow
    assert xpos.max_distance() == 27_195
    for sb, g in ((512.0, 0.4), (64.0, 0.4), (512.0, 1.5)):
        d = xpos.max_distance(scale_base=sb, gamma=g)
        zeta0 = g / (1 + g)  # the smallest zeta, the same for every rotary dim
        assert zeta0 ** (-d / sb) <= 2.0**96 < zeta0 ** (-(d + 1) / sb)


@functools.partial(jax.jit, static_argnames="layout")
def score(q, k, m, n, inv_freq, layout):
    qx = xpos.apply(q[None, None], m[None], inv_freq, is_key=False, scale_base=64.0, layout=layout)
    kx = xpos.apply(k[None, None], n[None], inv_freq, is_key=True, scale_base=64.0, layout=layout)
    return jnp.sum(qx * kx)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@given(m=st.integers(0, 256), n=st.integers(0, 256), shift=st.integers(-256, 512),
       seed=st.integers(0, 2**16))
def test_score_is_decayed_relative_rope(layout, m, n, shift, seed):
    inv, _ = rope.frequencies("default", 8)
    q, k = jax.random.normal(jax.random.key(seed), (2, 8))
    s = score(q, k, jnp.int32(m), jnp.int32(n), inv, layout)
    s_shift = score(q, k, jnp.int32(m + shift), jnp.int32(n + shift), inv, layout)
    # Explicit form: sum_i zeta_i^((m - n) / scale_base) * (pair i of R_m q . R_n k).
    qr = rope.apply(q[None, None], jnp.array([m]), inv, layout=layout)[0, 0]
    kr = rope.apply(k[None, None], jnp.array([n]), inv, layout=layout)[0, 0]
    prod = np.asarray(qr * kr, np.float64)
    per_pair = prod[:4] + prod[4:] if layout == "half" else prod[0::2] + prod[1::2]
    zeta = (np.arange(0, 8, 2) + 3.2) / 11.2
    expected = np.sum(zeta ** ((m - n) / 64.0) * per_pair)
    # Exponents |m - n| / 64 <= 4 keep factors within 150x; angle rounding as in RoPE.
    tol = 2e-3 * float(jnp.linalg.norm(q) * jnp.linalg.norm(k)) * np.max(zeta ** (-abs(m - n) / 64.0))
    assert abs(float(s) - expected) <= tol
    assert abs(float(s) - float(s_shift)) <= tol


def test_keys_use_inverse_scale_and_tail_passes_through():
    x = jax.random.normal(jax.random.key(1), (3, 2, 10))
    pos = jnp.array([5, 600, 2000])
    inv, _ = rope.frequencies("default", 8)
    q = xpos.apply(x, pos, inv, is_key=False)
    k = xpos.apply(x, pos, inv, is_key=True)
    r = rope.apply(x, pos, inv, layout="interleaved")
    s = xpos.scale(pos, 8)[:, None, :]
    np.testing.assert_allclose(q[..., :8].reshape(3, 2, 4, 2), r[..., :8].reshape(3, 2, 4, 2) * s[..., None],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(k[..., :8].reshape(3, 2, 4, 2), r[..., :8].reshape(3, 2, 4, 2) / s[..., None],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(q[..., 8:], x[..., 8:])
    np.testing.assert_array_equal(k[..., 8:], x[..., 8:])


def test_range_is_checked_on_concrete_inputs():
    inv, _ = rope.frequencies("default", 8)
    x = jnp.ones((2, 1, 8))
    # offset 0 (the old convention): keys at 30K would need zeta_0^(-30000/512) ~ 2^106.
    with pytest.raises(ValueError, match=re.escape(
            "xPos key position 30000 after the offset exceeds max_distance = 27195 (scale_base=512.0, "
            "gamma=0.4: zeta^(distance / scale_base) must stay <= 2^96 in float32); use apply_pair")):
        xpos.apply(x, jnp.array([0, 30_000]), inv, is_key=True)
    with pytest.raises(ValueError, match="xPos query position 30000 before the offset exceeds max_distance"):
        xpos.apply(x, jnp.array([0, 5]), inv, is_key=False, offset=30_000)
    # The shrinking side is unlimited: a query 1e6 after the offset, keys 1e6 before it.
    assert np.isfinite(xpos.apply(x, jnp.array([0, 10**6]), inv, is_key=False)).all()
    assert np.isfinite(xpos.apply(x, jnp.array([0, 5]), inv, is_key=True, offset=10**6)).all()
    with pytest.raises(ValueError, match=re.escape(
            "xPos keys end 60000 positions after the first query, more than 2 * max_distance = 54390")):
        xpos.apply_pair(x, x, jnp.array([0, 1]), jnp.array([0, 60_000]), inv)
    q, k = xpos.apply_pair(x, x, jnp.array([0, 54_390]), jnp.array([0, 54_390]), inv)  # at the limit
    assert np.isfinite(q).all() and np.isfinite(k).all()


def test_traced_out_of_range_factors_are_nan_never_wrong():
    inv, _ = rope.frequencies("default", 8)
    x = jax.random.normal(jax.random.key(0), (2, 1, 8))
    pos = jnp.array([0, 60_000])
    q, k = jax.jit(xpos.apply_pair)(x, x, pos, pos, inv)  # offset 30,000 > max_distance from both ends
    assert np.isnan(q[0]).all() and np.isfinite(q[1]).all()
    assert np.isnan(k[1]).all() and np.isfinite(k[0]).all()
    # the in-range pair (query 60,000, key 0) is right: sum_i zeta_i^(60000/512) (R_m x_1)_i . (R_0 x_0)_i
    xs = np.asarray(x[:, 0], np.float64)
    t = 60_000 * np.asarray(inv, np.float64)
    rq = np.stack([xs[1, 0::2] * np.cos(t) - xs[1, 1::2] * np.sin(t),
                   xs[1, 1::2] * np.cos(t) + xs[1, 0::2] * np.sin(t)])
    zeta = (np.arange(0, 8, 2) + 3.2) / 11.2
    want = np.sum(zeta ** (60_000 / 512) * (rq[0] * xs[0, 0::2] + rq[1] * xs[0, 1::2]))
    np.testing.assert_allclose(float(jnp.sum(q[1] * k[0])), want, rtol=1e-4)
    kk = jax.jit(functools.partial(xpos.apply, is_key=True))(x, pos, inv)
    assert np.isnan(kk[1]).all() and np.isfinite(kk[0]).all()


def test_offset_keyword():
    inv, _ = rope.frequencies("default", 8)
    x = jax.random.normal(jax.random.key(1), (2, 3, 1, 8))
    pos = jnp.array([[5, 6, 7], [100, 101, 102]])
    # a per-row offset equals shifting that row's scale exponent
    off = jnp.array([5, 100])
    np.testing.assert_allclose(xpos.scale(pos, 8, offset=off), xpos.scale(pos - off[:, None], 8), rtol=1e-6)
    a = xpos.apply(x, pos, inv, is_key=False, offset=off)
    s = xpos.scale(pos - off[:, None], 8)[..., None, :, None]
    r = rope.apply(x, pos, inv, layout="interleaved")
    np.testing.assert_allclose(a.reshape(2, 3, 1, 4, 2), r.reshape(2, 3, 1, 4, 2) * s, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="offset must be an integer or an integer array"):
        xpos.apply(x, pos, inv, is_key=False, offset=1.5)


def test_bf16_jit_grad_batch():
    inv, _ = rope.frequencies("default", 8)
    x = jax.random.normal(jax.random.key(2), (2, 5, 3, 8))
    pos = jnp.array([[0, 1, 2, 3, 4], [10, 20, 30, 40, 50]])
    f = jax.jit(functools.partial(xpos.apply, is_key=False))
    out = f(x, pos, inv)
    np.testing.assert_allclose(out, xpos.apply(x, pos, inv, is_key=False), rtol=1e-6, atol=1e-6)
    xb = x.astype(jnp.bfloat16)
    ob = xpos.apply(xb, pos, inv, is_key=True)
    assert ob.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        ob.astype(jnp.float32),
        xpos.apply(xb.astype(jnp.float32), pos, inv, is_key=True).astype(jnp.bfloat16).astype(jnp.float32))
    # d/dx <c, S_p R_p x> = R_p^T (S_p c) = R_{-p} (S_p c), S_p the per-pair scale.
    c = jax.random.normal(jax.random.key(3), x.shape)
    grad = jax.grad(lambda y: jnp.sum(c * xpos.apply(y, pos, inv, is_key=False)))(x)
    s = xpos.scale(pos, 8)[:, :, None, :]
    sc = (c.reshape(2, 5, 3, 4, 2) * s[..., None]).reshape(x.shape)
    expected = rope.apply(sc, -pos, inv, layout="interleaved")
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call, match", [
    (lambda: xpos.apply(jnp.ones((2, 1, 8)), jnp.arange(2), jnp.ones(4), is_key=1),
     "is_key must be True (keys) or False (queries); got 1"),
    (lambda: xpos.apply(jnp.ones((2, 1, 8)), jnp.arange(2.0), jnp.ones(4), is_key=True),
     "positions must be an integer array (never float or bf16); got dtype float32"),
    (lambda: xpos.scale(jnp.arange(2.0), 8), "positions must be an integer array; got dtype float32"),
    (lambda: xpos.scale(jnp.arange(2), 7), "rotary_dim must be a positive even integer; got 7"),
    (lambda: xpos.scale(jnp.arange(2), 8, gamma=0.0), "gamma must be a finite number > 0; got 0.0"),
    (lambda: xpos.scale(jnp.arange(2), 8, scale_base=-1.0), "scale_base must be a finite number > 0; got -1.0"),
    (lambda: xpos.max_distance(gamma=-1.0), "gamma must be a finite number > 0; got -1.0"),
    (lambda: xpos.apply(jnp.ones((2, 1, 8)), jnp.arange(2), jnp.ones(4), is_key=True, angles="x"),
     "unknown angles 'x'; choose one of: canonical, exact"),
    (lambda: xpos.apply(jnp.ones((2, 1, 8)), jnp.arange(2), jnp.ones(4), is_key=True, layout="x"),
     "unknown layout 'x'; choose one of: half, interleaved"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        call()
