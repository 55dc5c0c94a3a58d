import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import shaw

K = 2  # max_distance
RNG = np.random.default_rng(0)
Q = jnp.asarray(RNG.normal(size=(2, 4, 3, 5)), jnp.float32)  # [B, Lq, H, Dh]
TK = jnp.asarray(RNG.normal(size=(2 * K + 1, 5)), jnp.float32)
TV = jnp.asarray(RNG.normal(size=(2 * K + 1, 5)), jnp.float32)
W = jax.nn.softmax(jnp.asarray(RNG.normal(size=(2, 3, 4, 6)), jnp.float32), axis=-1)  # [B, H, Lq, Lk]
QP = jnp.array([[2, 3, 4, 5], [6, 7, 8, 9]])
KP = jnp.array([[0, 1, 2, 3, 4, 5], [4, 5, 6, 7, 8, 9]])


def naive_index(qp, kp, k):
    return np.clip(np.asarray(kp)[..., None, :] - np.asarray(qp)[..., :, None], -k, k) + k


def naive_logits(q, table_k, qp, kp, k):
    a = np.asarray(table_k)[naive_index(qp, kp, k)]  # [B, Lq, Lk, Dh] materialised
    return np.einsum("bqhd,bqkd->bhqk", np.asarray(q), a)


def naive_values(w, table_v, qp, kp, k):
    a = np.asarray(table_v)[naive_index(qp, kp, k)]  # [B, Lq, Lk, Dh]
    return np.einsum("bhqk,bqkd->bqhd", np.asarray(w), a)


def test_relative_index_values():
    idx = shaw.relative_index(jnp.array([3]), jnp.arange(7), max_distance=2)
    np.testing.assert_array_equal(idx, [[0, 0, 1, 2, 3, 4, 4]])
    assert idx.dtype == jnp.int32


@settings(max_examples=25, deadline=None)
@given(shift=st.integers(-1000, 1000), k=st.integers(1, 6))
def test_relative_index_depends_only_on_distance(shift, k):
    qp, kp = jnp.array([0, 5, 9]), jnp.array([1, 2, 8, 20])
    np.testing.assert_array_equal(
        shaw.relative_index(qp + shift, kp + shift, max_distance=k), shaw.relative_index(qp, kp, max_distance=k)
    )


def test_logits_match_naive():
    out = shaw.logits(Q, TK, QP, KP, max_distance=K)
    assert out.shape == (2, 3, 4, 6) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, naive_logits(Q, TK, QP, KP, K), rtol=1e-5, atol=1e-5)


def test_values_match_naive():
    out = shaw.values(W, TV, QP, KP, max_distance=K)
    assert out.shape == (2, 4, 3, 5)
    np.testing.assert_allclose(out, naive_values(W, TV, QP, KP, K), rtol=1e-5, atol=1e-6)


def test_shared_positions_broadcast_over_batch():
    qp, kp = jnp.arange(2, 6), jnp.arange(6)
    np.testing.assert_allclose(
        shaw.logits(Q, TK, qp, kp, max_distance=K), naive_logits(Q, TK, qp[None], kp[None], K), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        shaw.values(W, TV, qp, kp, max_distance=K), naive_values(W, TV, qp[None], kp[None], K), rtol=1e-5, atol=1e-6
    )


def test_values_keep_weight_dtype():
    out = shaw.values(W.astype(jnp.bfloat16), TV, QP, KP, max_distance=K)
    assert out.dtype == jnp.bfloat16


def test_jit_vmap_grad():
    f = jax.jit(lambda q, t, w, tv: (shaw.logits(q, t, QP, KP, max_distance=K),
                                     shaw.values(w, tv, QP, KP, max_distance=K)))
    lo, va = f(Q, TK, W, TV)
    np.testing.assert_allclose(lo, naive_logits(Q, TK, QP, KP, K), rtol=1e-5, atol=1e-5)
    vm = jax.vmap(lambda q, qp, kp: shaw.logits(q, TK, qp, kp, max_distance=K))(Q, QP, KP)
    np.testing.assert_allclose(vm, lo, rtol=1e-5, atol=1e-5)

    def loss(q, t, w, tv):
        return ((shaw.logits(q, t, QP, KP, max_distance=K) ** 2).sum()
                + (shaw.values(w, tv, QP, KP, max_distance=K) ** 2).sum())

    def naive_loss(q, t, w, tv):
        idx = naive_index(QP, KP, K)
        lo = jnp.einsum("bqhd,bqkd->bhqk", q, t[idx])
        va = jnp.einsum("bhqk,bqkd->bqhd", w, tv[idx])
        return (lo**2).sum() + (va**2).sum()

    for got, want in zip(jax.grad(loss, (0, 1, 2, 3))(Q, TK, W, TV), jax.grad(naive_loss, (0, 1, 2, 3))(Q, TK, W, TV)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", [0, -1, 1.5])
def test_bad_max_distance(k):
    with pytest.raises(ValueError, match="max_distance must be an integer >= 1; got"):
        shaw.relative_index(QP, KP, max_distance=k)


def test_wrong_table_shapes():
    with pytest.raises(ValueError,
                       match=r"table_k must have shape \[2 \* max_distance \+ 1, Dh\] = \[5, 5\], got \[4, 5\]"):
        shaw.logits(Q, TK[:4], QP, KP, max_distance=K)
    with pytest.raises(ValueError, match=r"table_k .* = \[5, 5\], got \[5, 4\]"):
        shaw.logits(Q, TK[:, :4], QP, KP, max_distance=K)
    with pytest.raises(ValueError, match="table_v"):
        shaw.values(W, TV[:3], QP, KP, max_distance=K)
    with pytest.raises(ValueError, match="integer array"):
        shaw.logits(Q, TK, QP.astype(jnp.float32), KP, max_distance=K)
