import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import cope

H, DH, NPOS = 2, 4, 5
RNG = np.random.default_rng(0)
Q = jnp.asarray(RNG.normal(size=(2, 6, H, DH)), jnp.float32)
K = jnp.asarray(RNG.normal(size=(2, 6, H, DH)), jnp.float32)
E = jnp.asarray(RNG.normal(size=(NPOS, DH)), jnp.float32)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def naive_positions(g, npos, causal):
    """Loop form of p_ij = sum_{t=j..i} sigmoid(g_it), queries aligned to the end of the keys."""
    g = np.asarray(g, np.float64)
    lq, lk = g.shape[-2:]
    out = np.zeros(g.shape)
    for i in range(lq):
        last = i + lk - lq if causal else lk - 1
        for j in range(lk):
            out[..., i, j] = sum(sigmoid(g[..., i, t]) for t in range(j, last + 1))
    return np.minimum(out, npos - 1)


def naive_logits(q, k, e, causal):
    q, k, e = (np.asarray(x, np.float64) for x in (q, k, e))
    g = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    p = naive_positions(g, e.shape[0], causal)
    out = np.zeros(p.shape)
    for b, h, i, j in np.ndindex(*p.shape):
        lo, hi = math.floor(p[b, h, i, j]), math.ceil(p[b, h, i, j])
        w = p[b, h, i, j] - lo
        # q_i . e[p] with e linearly interpolated between floor and ceil.
        e_p = (1 - w) * e[lo] + w * e[hi]
        out[b, h, i, j] = q[b, i, h] @ e_p
    return out


def test_positions_simple_gates():
    # Gates all 0.5 (logit 0): p_ij = 0.5 * (i - j + 1) for j <= i, 0 after.
    p = cope.positions(jnp.zeros((3, 3)), npos=10)
    np.testing.assert_allclose(p, [[0.5, 0, 0], [1.0, 0.5, 0], [1.5, 1.0, 0.5]], rtol=1e-6)
    p = cope.positions(jnp.zeros((3, 3)), npos=10, causal=False)
    np.testing.assert_allclose(p, [[1.5, 1.0, 0.5]] * 3, rtol=1e-6)
    # Clamped to npos - 1.
    p = cope.positions(jnp.full((1, 8), 30.0), npos=4, causal=False)
    np.testing.assert_allclose(p, [[3, 3, 3, 3, 3, 3, 2, 1]], rtol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_positions_match_loop(causal):
    g = RNG.normal(size=(2, 3, 4, 6)).astype(np.float32)  # Lq < Lk: decoding with a cache
    out = cope.positions(jnp.asarray(g), npos=4, causal=causal)
    assert out.shape == g.shape and out.dtype == jnp.float32
    np.testing.assert_allclose(out, naive_positions(g, 4, causal), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_logits_match_paper_formula(causal):
    out = cope.logits(Q, K, E, causal=causal)
    assert out.shape == (2, H, 6, 6) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, naive_logits(Q, K, E, causal), rtol=1e-4, atol=1e-5)


def test_causal_future_keys_do_not_matter():
    # Changing keys after position i leaves p_ij and the logits for j <= i unchanged.
    k2 = K.at[:, 4:].set(jnp.asarray(RNG.normal(size=(2, 2, H, DH)), jnp.float32))
    a, b = cope.logits(Q, K, E), cope.logits(Q, k2, E)
    np.testing.assert_allclose(a[:, :, :4, :4], b[:, :, :4, :4], rtol=1e-6)
    assert not np.allclose(a[:, :, 4:, :4], b[:, :, 4:, :4])
    # Gradient form of the same property.
    g = jax.grad(lambda k: cope.logits(Q, k, E)[:, :, 2].sum())(K)
    np.testing.assert_array_equal(g[:, 3:], 0.0)
    assert np.abs(np.asarray(g[:, :3])).sum() > 0


def test_cached_decode_matches_full():
    # Last query against all keys equals the last row of the full computation.
    full = cope.logits(Q, K, E)
    last = cope.logits(Q[:, -2:], K, E)
    np.testing.assert_allclose(last, full[:, :, -2:], rtol=1e-5, atol=1e-6)


def test_jit_vmap_grad():
    out = jax.jit(cope.logits)(Q, K, E)
    np.testing.assert_allclose(out, naive_logits(Q, K, E, True), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(jax.vmap(cope.logits, in_axes=(0, 0, None))(Q, K, E), out, rtol=1e-5, atol=1e-6)
    gq, gk, ge = jax.grad(lambda q, k, e: (cope.logits(q, k, e) ** 2).sum(), (0, 1, 2))(Q, K, E)
    for g in (gq, gk, ge):
        assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).sum() > 0

    # Compare the embedding gradient with the naive form differentiated by JAX.
    def naive_jax(e):
        g = jnp.einsum("bqhd,bkhd->bhqk", Q, K) / math.sqrt(DH)
        p = cope.positions(g, npos=NPOS)
        lo, w = jnp.floor(p).astype(jnp.int32), p - jnp.floor(p)
        hi = jnp.ceil(p).astype(jnp.int32)
        e_p = (1 - w)[..., None] * e[lo] + w[..., None] * e[hi]  # [B, H, Lq, Lk, Dh]
        return (jnp.einsum("bqhd,bhqkd->bhqk", Q, e_p) ** 2).sum()

    np.testing.assert_allclose(ge, jax.grad(naive_jax)(E), rtol=1e-4, atol=1e-4)


def test_errors():
    with pytest.raises(ValueError, match="npos must be a positive integer, got 0"):
        cope.positions(jnp.zeros((2, 2)), npos=0)
    with pytest.raises(ValueError, match=r"embeddings must have shape \[npos, Dh\] with Dh = 4"):
        cope.logits(Q, K, E[:, :3])
    with pytest.raises(ValueError, match="q and k must have shape"):
        cope.logits(Q, K[..., :3], E)
