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
    with pytest.raises(ValueError, match="npos must be an integer >= 1; got 0"):
        cope.positions(jnp.zeros((2, 2)), npos=0)
    with pytest.raises(ValueError, match=r"embeddings must have shape \[npos, Dh\] with Dh = 4"):
        cope.logits(Q, K, E[:, :3])
    with pytest.raises(ValueError, match="q and k must have shape"):
        cope.logits(Q, K[..., :3], E)


def reference_logits(q, k, e, causal):
    """The formula as plain jnp (lax.cumsum, take_along_axis), differentiated by JAX."""
    gate_logits = jnp.einsum("...qhd,...khd->...hqk", q, k) / math.sqrt(q.shape[-1])
    gates = jax.nn.sigmoid(gate_logits)
    if causal:
        lq, lk = gate_logits.shape[-2:]
        gates = jnp.where(jnp.arange(lk)[None, :] <= jnp.arange(lq)[:, None] + lk - lq, gates, 0.0)
    pos = jnp.minimum(jax.lax.cumsum(gates, axis=gates.ndim - 1, reverse=True), e.shape[0] - 1.0)
    per_pos = jnp.einsum("...qhd,nd->...hqn", q, e)
    lo = jnp.floor(pos)
    w = pos - lo
    at_lo = jnp.take_along_axis(per_pos, lo.astype(jnp.int32), axis=-1)
    at_hi = jnp.take_along_axis(per_pos, jnp.ceil(pos).astype(jnp.int32), axis=-1)
    return at_hi * w + at_lo * (1.0 - w)


# (q batch, k batch, Lq, Lk, H, Dh, npos, causal): Lk = 32, 48 take the blocked
# cumulative sum, Lk = 6 the plain one; Lq < Lk is decoding with a cache; npos = 3
# clamps most positions; (3, 1) vs (1,) broadcasts the batch shapes.
FAST_CASES = [
    ((2,), (2,), 32, 32, 2, 8, 8, True),
    ((2,), (2,), 20, 48, 2, 8, 16, True),
    ((3, 1), (1,), 32, 32, 1, 4, 3, False),
    ((), (), 5, 6, 3, 4, 5, True),
]


@pytest.mark.parametrize("qb, kb, lq, lk, h, dh, npos, causal", FAST_CASES)
def test_fast_path_matches_reference_values_and_gradients(qb, kb, lq, lk, h, dh, npos, causal):
    rng = np.random.default_rng(lq * 100 + lk)
    q = jnp.asarray(rng.normal(size=qb + (lq, h, dh)), jnp.float32)
    k = jnp.asarray(rng.normal(size=kb + (lk, h, dh)), jnp.float32)
    e = jnp.asarray(rng.normal(size=(npos, dh)), jnp.float32)
    out = cope.logits(q, k, e, causal=causal)
    want = reference_logits(q, k, e, causal)
    assert out.shape == want.shape == jnp.broadcast_shapes(qb, kb) + (h, lq, lk)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)

    ct = jnp.asarray(rng.normal(size=out.shape), jnp.float32)
    grads = jax.grad(lambda *a: (cope.logits(*a, causal=causal) * ct).sum(), (0, 1, 2))(q, k, e)
    want_grads = jax.grad(lambda *a: (reference_logits(*a, causal) * ct).sum(), (0, 1, 2))(q, k, e)
    for got, ref, name in zip(grads, want_grads, "qke"):
        assert got.shape == ref.shape, name
        # Sums of up to Lk products of O(1) terms: float32 error ~1e-5 absolute.
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"d/d{name}")
        assert np.abs(np.asarray(ref)).sum() > 0


def test_forward_mode_matches_reference():
    # The custom derivative is a JVP, so jax.jvp (and jacfwd) work as well as grad.
    rng = np.random.default_rng(3)
    q, k = (jnp.asarray(rng.normal(size=(2, 32, 2, 4)), jnp.float32) for _ in range(2))
    e = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
    tangents = tuple(jnp.asarray(rng.normal(size=x.shape), jnp.float32) for x in (q, k, e))
    out, d_out = jax.jvp(cope.logits, (q, k, e), tangents)
    want, d_want = jax.jvp(lambda *a: reference_logits(*a, True), (q, k, e), tangents)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_out, d_want, rtol=1e-4, atol=1e-4)


def test_blocked_positions_match_loop_and_cumsum():
    # Lk = 48: three blocks of 16 keys summed by matmul, then across blocks.
    g = RNG.normal(size=(2, 5, 48)).astype(np.float32) * 3
    for causal in (True, False):
        out = cope.positions(jnp.asarray(g), npos=20, causal=causal)
        np.testing.assert_allclose(out, naive_positions(g, 20, causal), rtol=1e-5, atol=1e-5)
    # Its gradient is the forward cumulative sum of the cotangent times sigmoid'.
    ct = RNG.normal(size=g.shape).astype(np.float32)
    got = jax.grad(lambda x: (cope.positions(x, npos=100, causal=False) * ct).sum())(jnp.asarray(g))
    s = sigmoid(g)
    np.testing.assert_allclose(got, np.cumsum(ct, -1) * s * (1 - s), rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_and_nan_rows():
    q16, k16, e16 = (x.astype(jnp.bfloat16) for x in (Q, K, E))
    out = cope.logits(q16, k16, e16)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, cope.logits(*(x.astype(jnp.float32) for x in (q16, k16, e16))), rtol=1e-6)
    g = jax.grad(lambda q: cope.logits(q, k16, e16).sum())(q16)
    assert g.dtype == jnp.bfloat16 and np.isfinite(np.asarray(g, np.float32)).all()
    # A NaN query gives NaN in its own row only (its indices are clipped, never out of bounds).
    out = cope.logits(Q.at[0, 2, 1].set(jnp.nan), K, E)
    assert np.isnan(np.asarray(out[0, 1, 2])).all()
    assert np.isfinite(np.asarray(out[0, 1, :2])).all() and np.isfinite(np.asarray(out[1])).all()


def test_take_along_axis_fallback_for_huge_tables(monkeypatch):
    # Tables of 2^31+ entries cannot use int32 flat indices; the fallback gives the same.
    out, grads = jax.value_and_grad(lambda q, k, e: (cope.logits(q, k, e) ** 2).sum(), (0, 1, 2))(Q, K, E)
    monkeypatch.setattr(cope, "_MAX_FLAT", 0)
    out2, grads2 = jax.value_and_grad(lambda q, k, e: (cope.logits(q, k, e) ** 2).sum(), (0, 1, 2))(Q, K, E)
    np.testing.assert_allclose(out2, out, rtol=1e-6)
    for a, b in zip(grads2, grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
