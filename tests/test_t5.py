import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from posenc import t5

# /work/shared/reference/positional.md (num_buckets 32, max_distance 128).
RP = [-200, -128, -127, -100, -64, -32, -16, -9, -8, -7, -1, 0, 1, 7, 8, 9, 16, 32, 64, 100, 127, 128, 200]
BIDIRECTIONAL = [15, 15, 15, 15, 14, 12, 10, 8, 8, 7, 1, 0, 17, 23, 24, 24, 26, 28, 30, 31, 31, 31, 31]
CAUSAL = [31, 31, 31, 30, 26, 21, 16, 9, 8, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]


def reference_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """NumPy transcription of HF T5Attention._relative_position_bucket (float32 math)."""
    rp = np.asarray(relative_position, np.int64)
    buckets = np.zeros_like(rp)
    if bidirectional:
        num_buckets //= 2
        buckets += (rp > 0).astype(np.int64) * num_buckets
        rp = np.abs(rp)
    else:
        rp = -np.minimum(rp, 0)
    max_exact = num_buckets // 2
    is_small = rp < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):
        large = max_exact + (
            np.log(rp.astype(np.float32) / np.float32(max_exact))
            / np.float32(math.log(max_distance / max_exact))
            * np.float32(num_buckets - max_exact)
        ).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, rp, large)


def test_golden_vectors():
    rp = jnp.array(RP)
    np.testing.assert_array_equal(t5.relative_position_bucket(rp, bidirectional=True), BIDIRECTIONAL)
    np.testing.assert_array_equal(t5.relative_position_bucket(rp, bidirectional=False), CAUSAL)
    assert t5.relative_position_bucket(rp, bidirectional=True).dtype == jnp.int32


def test_matches_reference_on_a_dense_range():
    rp = np.arange(-600, 601)
    for bidirectional in (True, False):
        got = t5.relative_position_bucket(jnp.asarray(rp), bidirectional=bidirectional)
        np.testing.assert_array_equal(got, reference_bucket(rp, bidirectional, 32, 128))


@settings(max_examples=20, deadline=None)
@given(
    num_buckets=st.integers(8, 64),
    max_distance=st.integers(16, 512),
    bidirectional=st.booleans(),
    rp=st.lists(st.integers(-5000, 5000), min_size=1, max_size=64),
)
def test_matches_reference_for_other_hyper_parameters(num_buckets, max_distance, bidirectional, rp):
    if bidirectional:
        num_buckets -= num_buckets % 2
    exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    assume(max_distance > exact)
    rp = np.array(rp + [0, 1, -1, exact, -exact, max_distance, -max_distance])
    got = t5.relative_position_bucket(
        jnp.asarray(rp), bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    want = reference_bucket(rp, bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert (np.asarray(got) >= 0).all() and (np.asarray(got) < num_buckets).all()


# Configurations where a float32 log on the device (XLA) and the canonical
# float32 log (PyTorch, NumPy) put a boundary distance in different buckets.
@pytest.mark.parametrize("num_buckets, max_distance, bidirectional, rp", [
    (4, 200, False, -20), (6, 100, True, 10), (8, 200, True, -20), (20, 1000, False, -100),
    (64, 50, False, -40), (128, 50, True, 40), (128, 100, False, -80),
])
def test_boundary_distances_match_the_canonical_float32_arithmetic(num_buckets, max_distance, bidirectional, rp):
    rps = np.arange(rp - 3, rp + 4)
    got = t5.relative_position_bucket(jnp.asarray(rps), bidirectional=bidirectional,
                                      num_buckets=num_buckets, max_distance=max_distance)
    np.testing.assert_array_equal(np.asarray(got), reference_bucket(rps, bidirectional, num_buckets, max_distance))


def test_zero_distance_no_nan_or_garbage():
    out = t5.relative_position_bucket(jnp.zeros(3, jnp.int32), bidirectional=False)
    np.testing.assert_array_equal(out, 0)
    huge = t5.relative_position_bucket(jnp.array([-(2**30), 2**30]), bidirectional=True)
    np.testing.assert_array_equal(huge, [15, 31])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(bidirectional=False, num_buckets=1), "num_buckets must be an integer >= 2; got 1"),
        (dict(bidirectional=True, num_buckets=2), "num_buckets must be an integer >= 4; got 2"),
        (dict(bidirectional=True, num_buckets=31), "num_buckets must be even when bidirectional, got 31"),
        (dict(bidirectional=False, max_distance=0), "max_distance must be an integer >= 1; got 0"),
        (dict(bidirectional=False, num_buckets=32, max_distance=16), "max_distance must exceed the 16 exact buckets"),
    ],
)
def test_bucket_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        t5.relative_position_bucket(jnp.arange(3), **kwargs)


def test_float_relative_position_rejected():
    with pytest.raises(ValueError, match="integer array"):
        t5.relative_position_bucket(jnp.arange(3.0), bidirectional=True)


def test_bias_looks_up_table_by_key_minus_query():
    table = jnp.arange(32 * 2, dtype=jnp.float32).reshape(32, 2)
    q, k = jnp.array([5, 6]), jnp.arange(8)
    out = t5.bias(q, k, table)
    assert out.shape == (2, 2, 8) and out.dtype == jnp.float32
    rp = np.asarray(k)[None, :] - np.asarray(q)[:, None]
    b = reference_bucket(rp, False, 32, 128)
    np.testing.assert_array_equal(out[1], np.asarray(table)[b, 1])
    out_bi = t5.bias(q, k, table, bidirectional=True, max_distance=64)
    np.testing.assert_array_equal(out_bi[0], np.asarray(table)[reference_bucket(rp, True, 32, 64), 0])


@settings(max_examples=20, deadline=None)
@given(shift=st.integers(-3000, 3000), bidirectional=st.booleans())
def test_bias_depends_only_on_distance(shift, bidirectional):
    table = jax.random.normal(jax.random.key(0), (16, 3))
    q, k = jnp.array([0, 40, 41]), jnp.array([0, 3, 17, 41, 90])
    np.testing.assert_array_equal(
        t5.bias(q + shift, k + shift, table, bidirectional=bidirectional, max_distance=50),
        t5.bias(q, k, table, bidirectional=bidirectional, max_distance=50),
    )


def test_bias_batch_jit_vmap_grad():
    table = jax.random.normal(jax.random.key(1), (32, 4))
    q = jnp.array([[3, 4], [9, 10]])
    k = jnp.array([[0, 1, 2, 3, 4], [6, 7, 8, 9, 10]])
    out = jax.jit(t5.bias)(q, k, table)
    assert out.shape == (2, 4, 2, 5)
    np.testing.assert_allclose(out[0], out[1])
    np.testing.assert_allclose(jax.vmap(t5.bias, in_axes=(0, 0, None))(q, k, table), out)
    g = jax.grad(lambda t: t5.bias(q[0], k[0], t).sum())(table)
    # 10 (query, key) pairs, each adds 1 to its bucket's row for every head.
    assert float(g.sum()) == 10 * 4
    np.testing.assert_array_equal(g[0], 3.0)  # bucket 0: the 3 pairs with key >= query
    np.testing.assert_array_equal(g[1], 2.0)  # bucket 1: the 2 pairs at distance 1


def test_bias_errors():
    with pytest.raises(ValueError, match=r"table must have shape \[num_buckets, H\]"):
        t5.bias(jnp.arange(2), jnp.arange(2), jnp.ones(32))
    with pytest.raises(ValueError, match="num_buckets must be even"):
        t5.bias(jnp.arange(2), jnp.arange(2), jnp.ones((31, 2)), bidirectional=True)
