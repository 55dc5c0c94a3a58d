"""posenc.xpos: scale values, parity with torchscale's XPOS (transcribed in
NumPy), relative-position decay property, bf16, jit / grad, errors."""

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


def torchscale_xpos(x, downscale, scale_base=512.0):
    """NumPy transcription of torchscale XPOS.forward(x, offset=0, downscale) for x [L, d]."""
    length, d = x.shape
    zeta = (np.arange(0, d, 2) + 0.4 * d) / (1.4 * d)
    min_pos = -length // 2  # torchscale centres the scale exponent
    scale = zeta ** (np.arange(min_pos, min_pos + length)[:, None] / scale_base)
    inv = 1.0 / (10000 ** (np.arange(0, d // 2) / (d // 2)))
    theta = np.arange(length)[:, None] * inv  # rotation uses 0..L-1
    if downscale:
        scale = 1 / scale
    sin, cos = np.repeat(np.sin(theta) * scale, 2, -1), np.repeat(np.cos(theta) * scale, 2, -1)
    rot = np.stack([-x[:, 1::2], x[:, 0::2]], axis=-1).reshape(x.shape)  # rotate_every_two
    return x * cos + rot * sin


@pytest.mark.parametrize("length", [7, 64])
def test_logits_match_torchscale(length):
    # torchscale centres positions, this module does not; the logits must agree anyway.
    q, k = np.asarray(jax.random.normal(jax.random.key(0), (2, length, 16)), np.float64)
    ref = torchscale_xpos(q, False, scale_base=32.0) @ torchscale_xpos(k, True, scale_base=32.0).T
    inv, _ = rope.frequencies("default", 16)
    pos = jnp.arange(length)
    qx = xpos.apply(jnp.asarray(q, jnp.float32)[:, None], pos, inv, is_key=False, scale_base=32.0)
    kx = xpos.apply(jnp.asarray(k, jnp.float32)[:, None], pos, inv, is_key=True, scale_base=32.0)
    ours = jnp.einsum("qd,kd->qk", qx[:, 0], kx[:, 0], precision="highest")
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


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


def test_shifted_positions_stay_finite_at_long_lengths():
    # Unshifted, keys at 60K overflow float32 (zeta_0^(-60000/512) ~ e^147);
    # subtracting a common offset (the documented convention) keeps them finite.
    inv, _ = rope.frequencies("default", 8)
    x = jnp.ones((2, 1, 8))
    far = jnp.array([0, 60_000])
    assert not np.all(np.isfinite(xpos.apply(x, far, inv, is_key=True)))
    centred = far - 30_000
    assert np.all(np.isfinite(xpos.apply(x, centred, inv, is_key=True)))
    assert np.all(np.isfinite(xpos.apply(x, centred, inv, is_key=False)))


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
    (lambda: xpos.scale(jnp.arange(2), 8, gamma=0.0), "gamma must be a positive number; got 0.0"),
    (lambda: xpos.scale(jnp.arange(2), 8, scale_base=-1.0), "scale_base must be a positive number; got -1.0"),
    (lambda: xpos.apply(jnp.ones((2, 1, 8)), jnp.arange(2), jnp.ones(4), is_key=True, layout="x"),
     "unknown layout 'x'; choose one of: half, interleaved"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        call()
