import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import transformer_xl as txl

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
    inv = 1e4 ** (-np.arange(0, DR, 2) / DR)
    r = np.concatenate([np.sin(d[..., None] * inv), np.cos(d[..., None] * inv)], -1)  # [B, Lq, Lk, DR]
    wr = np.einsum("bqkf,fhd->bqkhd", r, w_r)
    term_c = np.einsum("hd,bkhd->bhk", u, k)[:, :, None, :]
    term_bd = np.einsum("bqhd,bqkhd->bhqk", q + v, wr)
    return term_c + term_bd


def test_relative_embedding_values():
    e = txl.relative_embedding(jnp.array([0, 1, -3]), 4)
    inv = np.array([1.0, 1e-2])
    want = np.concatenate([np.sin(np.array([0, 1, -3])[:, None] * inv), np.cos(np.array([0, 1, -3])[:, None] * inv)], -1)
    np.testing.assert_allclose(e, want, rtol=1e-6, atol=1e-7)
    assert e.shape == (3, 4) and e.dtype == jnp.float32
    with pytest.raises(ValueError, match="dim must be a positive even integer, got 5"):
        txl.relative_embedding(jnp.arange(3), 5)


@pytest.mark.parametrize("contiguous", [False, True])
def test_logits_match_naive(contiguous):
    out = txl.logits(Q, KEYS, QP, KP, u=U, v=V, w_r=WR, contiguous=contiguous)
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


@settings(max_examples=20, deadline=None)
@given(shift=st.integers(-2000, 2000))
def test_position_term_depends_only_on_distance(shift):
    # With q fixed (u = 0 removes the key-content term), shifting every position
    # by the same amount changes nothing.
    zero = jnp.zeros_like(U)
    a = txl.logits(Q, KEYS, QP, KP, u=zero, v=V, w_r=WR)
    b = txl.logits(Q, KEYS, QP + shift, KP + shift, u=zero, v=V, w_r=WR)
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)  # float32 angles of |pos| ~ 2000


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
        g = jax.grad(lambda u, v, w: txl.logits(Q, KEYS, QP, KP, u=u, v=v, w_r=w, contiguous=contiguous).sum(), (0, 1, 2))(
            U, V, WR
        )
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
