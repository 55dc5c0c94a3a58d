"""posenc.transformer_xl: against a float64 reference that materialises W_r R_{i-j}, with
exact and canonical angles and the rel-shift form; precision at large positions, per-block
use, jit / vmap / grad, errors."""

import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import transformer_xl as txl

# pi to 60 digits, for the exact reference of large angles
PI = Fraction("3.14159265358979323846264338327950288419716939937510582097494459")

H, DH, DR = 2, 4, 6
RNG = np.random.default_rng(0)
Q = jnp.asarray(RNG.normal(size=(2, 3, H, DH)), jnp.float32)
KEYS = jnp.asarray(RNG.normal(size=(2, 5, H, DH)), jnp.float32)
U = jnp.asarray(RNG.normal(size=(H, DH)), jnp.float32)
V = jnp.asarray(RNG.normal(size=(H, DH)), jnp.float32)
WR = jnp.asarray(RNG.normal(size=(DR, H, DH)), jnp.float32)
QP = jnp.array([[2, 3, 4], [10, 11, 12]])
KP = jnp.array([[0, 1, 2, 3, 4], [8, 9, 10, 11, 12]])


def naive(q, k, qp, kp, u, v, w_r):
    """Materialises W_r R_{i-j} for every pair: [B, Lq, Lk, H, Dh]."""
    q, k, u, v, w_r = (np.asarray(x, np.float64) for x in (q, k, u, v, w_r))
    d = np.asarray(qp)[..., :, None] - np.asarray(kp)[..., None, :]  # [B, Lq, Lk]
    inv = np.float32(1e4 ** (-np.arange(0, DR, 2) / DR)).astype(np.float64)  # the float32 frequencies
    r = np.concatenate([np.sin(d[..., None] * inv), np.cos(d[..., None] * inv)], -1)  # [B, Lq, Lk, DR]
    wr = np.einsum("bqkf,fhd->bqkhd", r, w_r)
    term_c = np.einsum("hd,bkhd->bhk", u, k)[:, :, None, :]
    term_bd = np.einsum("bqhd,bqkhd->bhqk", q + v, wr)
    return term_c + term_bd


def test_relative_embedding_values():
    e = txl.relative_embedding(jnp.array([0, 1, -3]), 4)
    inv = np.array([1.0, 1e-2])
    want = np.concatenate([np.sin(np.array([0, 1, -3])[:, None] * inv),
                           np.cos(np.array([0, 1, -3])[:, None] * inv)], -1)
    np.testing.assert_allclose(e, want, rtol=1e-6, atol=1e-7)
    assert e.shape == (3, 4) and e.dtype == jnp.float32
    with pytest.raises(ValueError, match="dim must be a positive even integer, got 5"):
        txl.relative_embedding(jnp.arange(3), 5)


@pytest.mark.parametrize("contiguous, angles", [(False, "exact"), (False, "canonical"), (True, "exact")])
def test_logits_match_naive(contiguous, angles):
    out = txl.logits(Q, KEYS, QP, KP, u=U, v=V, w_r=WR, contiguous=contiguous, angles=angles)
    assert out.shape == (2, H, 3, 5) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, naive(Q, KEYS, QP, KP, U, V, WR), rtol=1e-4, atol=1e-4)


def test_general_positions_with_gaps():
    qp, kp = jnp.array([[5, 9, 40], [1, 2, 3]]), jnp.array([[0, 3, 5, 30, 41], [0, 7, 8, 20, 21]])
    np.testing.assert_allclose(
        txl.logits(Q, KEYS, qp, kp, u=U, v=V, w_r=WR), naive(Q, KEYS, qp, kp, U, V, WR), rtol=1e-4, atol=1e-4
    )
    # The rel-shift form has no row for distances outside its range: NaN, never wrong.
    out = np.asarray(txl.logits(Q, KEYS, qp, kp, u=U, v=V, w_r=WR, contiguous=True))
    want = naive(Q, KEYS, qp, kp, U, V, WR)
    finite = np.isfinite(out)
    assert not finite.all()
    np.testing.assert_allclose(out[finite], want[finite], rtol=1e-4, atol=1e-4)


LOGITS = jax.jit(txl.logits, static_argnames=("contiguous", "angles"))


@settings(max_examples=20, deadline=None)
@given(shift=st.one_of(st.integers(-2000, 2000), st.sampled_from([65_536, 10**6, -(10**6), 2**30])))
def test_position_term_depends_only_on_distance(shift):
    # Shifting every position by the same amount changes nothing (the content terms do not
    # depend on positions), at any offset with exact angles.
    a = LOGITS(Q, KEYS, QP, KP, u=U, v=V, w_r=WR)
    b = LOGITS(Q, KEYS, QP + shift, KP + shift, u=U, v=V, w_r=WR)
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("offset", [65_536, 10**6])
def test_error_does_not_grow_with_position(offset):
    # Arbitrary positions (gaps, Lq != Lk) far from 0, against the float64 reference.
    rng = np.random.default_rng(offset)
    qp = offset + np.sort(rng.choice(5000, size=(2, 3), replace=False), -1)
    kp = offset + np.sort(rng.choice(5000, size=(2, 5), replace=False), -1)
    want = naive(Q, KEYS, qp, kp, U, V, WR)
    exact = LOGITS(Q, KEYS, jnp.asarray(qp), jnp.asarray(kp), u=U, v=V, w_r=WR)
    np.testing.assert_allclose(exact, want, rtol=0, atol=2e-5)  # as at offset 0 (float32 rounding)
    canonical = LOGITS(Q, KEYS, jnp.asarray(qp), jnp.asarray(kp), u=U, v=V, w_r=WR, angles="canonical")
    assert np.abs(np.asarray(canonical) - want).max() > 1e-3  # what "exact" fixes


def test_blocks_of_a_long_sequence_equal_the_full_call():
    # Blocked attention calls logits per (query block, key block) with position slices.
    q = jnp.asarray(RNG.normal(size=(1, 12, H, DH)), jnp.float32)
    pos = (10**6 + 3 * jnp.arange(12))[None]  # non-contiguous, far from 0
    full = LOGITS(q, q, pos, pos, u=U, v=V, w_r=WR)
    for i in range(0, 12, 4):
        for j in range(0, 12, 4):
            blk = LOGITS(q[:, i:i + 4], q[:, j:j + 4], pos[:, i:i + 4], pos[:, j:j + 4], u=U, v=V, w_r=WR)
            np.testing.assert_allclose(blk, full[..., i:i + 4, j:j + 4], rtol=0, atol=2e-5)


def test_relative_embedding_exact_at_large_distances():
    d = np.array([0, 7, -3, 65_536, 10**6, 2**31 - 1])
    inv = np.float32(1e4 ** (-np.arange(0, 8, 2) / 8)).astype(np.float64)
    theta = [[float((Fraction(int(x)) * Fraction(f)) % (2 * PI)) for f in inv] for x in d]
    want = np.concatenate([np.sin(theta), np.cos(theta)], -1)
    np.testing.assert_allclose(txl.relative_embedding(jnp.asarray(d), 8), want, rtol=0, atol=5e-7)
    canonical = txl.relative_embedding(jnp.asarray(d), 8, angles="canonical")
    assert np.abs(np.asarray(canonical) - want).max() > 1e-2
    # float distances: the float32 product either way
    np.testing.assert_array_equal(txl.relative_embedding(jnp.asarray(d[:3], jnp.float32), 8),
                                  txl.relative_embedding(jnp.asarray(d[:3]), 8, angles="canonical"))


def test_position_term_is_a_function_of_i_minus_j():
    # Same query vector at every position: entries with equal i - j are equal.
    q = jnp.broadcast_to(Q[:1, :1], (1, 4, H, DH))
    qp, kp = jnp.arange(4)[None], jnp.arange(4)[None]
    out = np.asarray(txl.logits(q, KEYS[:1, :4], qp, kp, u=jnp.zeros_like(U), v=V, w_r=WR))[0]
    for i in range(1, 4):
        for j in range(1, 4):
            np.testing.assert_allclose(out[:, i, j], out[:, i - 1, j - 1], rtol=1e-5, atol=1e-5)


def test_jit_vmap_grad():
    f = jax.jit(lambda q, k, u, v, w: txl.logits(q, k, QP, KP, u=u, v=v, w_r=w, contiguous=True))
    np.testing.assert_allclose(f(Q, KEYS, U, V, WR), naive(Q, KEYS, QP, KP, U, V, WR), rtol=1e-4, atol=1e-4)
    vm = jax.vmap(lambda q, k, qp, kp: txl.logits(q, k, qp, kp, u=U, v=V, w_r=WR))(Q, KEYS, QP, KP)
    np.testing.assert_allclose(vm, naive(Q, KEYS, QP, KP, U, V, WR), rtol=1e-4, atol=1e-4)
    for contiguous in (False, True):
        g = jax.grad(lambda u, v, w: txl.logits(Q, KEYS, QP, KP, u=u, v=v, w_r=w, contiguous=contiguous).sum(),
                     (0, 1, 2))(U, V, WR)
        d = np.asarray(QP)[..., :, None] - np.asarray(KP)[..., None, :]
        inv = 1e4 ** (-np.arange(0, DR, 2) / DR)
        r = np.concatenate([np.sin(d[..., None] * inv), np.cos(d[..., None] * inv)], -1)
        # d/dv sum = sum_{b,i,j} W_r R_{i-j}; d/du sum = Lq * sum_{b,j} k_j.
        np.testing.assert_allclose(g[1], np.einsum("bqkf,fhd->hd", r, np.asarray(WR)), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(g[0], 3 * np.asarray(KEYS).sum((0, 1)), rtol=1e-5, atol=1e-5)
        assert np.isfinite(np.asarray(g[2])).all()


def test_shape_errors():
    with pytest.raises(ValueError, match=r"u and v must have shape \[H, Dh\] = \[2, 4\]"):
        txl.logits(Q, KEYS, QP, KP, u=U[:1], v=V, w_r=WR)
    with pytest.raises(ValueError, match=r"w_r must have shape \[D_r, H, Dh\]"):
        txl.logits(Q, KEYS, QP, KP, u=U, v=V, w_r=WR[:5])
    with pytest.raises(ValueError, match="q and k must have shape"):
        txl.logits(Q, KEYS[..., :3], QP, KP, u=U, v=V, w_r=WR)
    with pytest.raises(ValueError, match="integer array"):
        txl.logits(Q, KEYS, QP.astype(jnp.float32), KP, u=U, v=V, w_r=WR)
    with pytest.raises(ValueError, match=re.escape("unknown angles 'fp64'; choose one of: canonical, exact")):
        txl.logits(Q, KEYS, QP, KP, u=U, v=V, w_r=WR, angles="fp64")
    with pytest.raises(ValueError, match="contiguous must be True or False; got 1"):
        txl.logits(Q, KEYS, QP, KP, u=U, v=V, w_r=WR, contiguous=1)
