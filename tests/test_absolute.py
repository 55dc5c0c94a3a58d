import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import absolute

# /work/shared/reference/positional.md, p = 1, D = 8.
INTERLEAVED_P1 = [0.841471, 0.540302, 0.099833, 0.995004, 0.0099998, 0.99995, 0.001, 0.9999995]
CONCAT_P1 = [0.841471, 0.046399, 0.0021544, 1e-4, 0.540302, 0.998923, 0.9999977, 1.0]


def test_sinusoidal_golden_vectors():
    np.testing.assert_allclose(absolute.sinusoidal(jnp.array([1]), 8)[0], INTERLEAVED_P1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        absolute.sinusoidal(jnp.array([1]), 8, layout="concat")[0], CONCAT_P1, rtol=1e-4, atol=1e-6
    )


def test_sinusoidal_matches_numpy_formula_and_batch_shape():
    pos = jnp.array([[0, 3, 17], [5, 1000, 2]])
    out = absolute.sinusoidal(pos, 6, base=500.0)
    assert out.shape == (2, 3, 6) and out.dtype == jnp.float32
    inv = 500.0 ** (-np.arange(0, 6, 2) / 6)
    ang = np.asarray(pos)[..., None] * inv
    want = np.stack([np.sin(ang), np.cos(ang)], -1).reshape(2, 3, 6)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5)


def test_concat_dim_two_uses_unit_frequency():
    # D/2 - 1 = 0: tensor2tensor's max(D/2 - 1, 1) gives inv = [1].
    out = absolute.sinusoidal(jnp.array([0, 2]), 2, layout="concat")
    np.testing.assert_allclose(out, [[0.0, 1.0], [np.sin(2.0), np.cos(2.0)]], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("layout", ["interleaved", "concat"])
@settings(max_examples=20, deadline=None)
@given(p=st.integers(0, 2000), shift=st.integers(-50, 50))
def test_relative_shift_is_a_fixed_rotation(layout, p, shift):
    # [sin, cos] at p + k equals the rotation by k * inv of [sin, cos] at p.
    dim = 8
    pe = np.asarray(absolute.sinusoidal(jnp.array([p, p + shift]), dim, layout=layout), np.float64)
    if layout == "interleaved":
        inv = 1e4 ** (-np.arange(0, dim, 2) / dim)
        s0, c0, s1, c1 = pe[0, 0::2], pe[0, 1::2], pe[1, 0::2], pe[1, 1::2]
    else:
        inv = np.exp(-np.arange(dim // 2) * np.log(1e4) / (dim // 2 - 1))
        s0, c0, s1, c1 = pe[0, :4], pe[0, 4:], pe[1, :4], pe[1, 4:]
    a = shift * inv
    np.testing.assert_allclose(s1, s0 * np.cos(a) + c0 * np.sin(a), atol=5e-4)
    np.testing.assert_allclose(c1, c0 * np.cos(a) - s0 * np.sin(a), atol=5e-4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=7), "positive even"),
        (dict(dim=0), "positive even"),
        (dict(dim=8, layout="half"), "unknown layout 'half'; choose one of: interleaved, concat"),
        (dict(dim=8, base=0.0), "base"),
    ],
)
def test_sinusoidal_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        absolute.sinusoidal(jnp.arange(3), **kwargs)


def test_float_positions_rejected():
    with pytest.raises(ValueError, match="integer array, got dtype float32"):
        absolute.sinusoidal(jnp.arange(3.0), 8)
    with pytest.raises(ValueError, match="integer"):
        absolute.learned(jnp.zeros((4, 2)), jnp.arange(2.0))


def test_sinusoidal_jit_vmap():
    pos = jnp.arange(12).reshape(3, 4)
    f = jax.jit(lambda p: absolute.sinusoidal(p, 8))
    np.testing.assert_allclose(f(pos), jax.vmap(lambda p: absolute.sinusoidal(p, 8))(pos), rtol=1e-6)


def test_learned_gathers_rows_and_batches():
    table = jnp.arange(12.0).reshape(6, 2)
    out = absolute.learned(table, jnp.array([[0, 5], [3, 3]]))
    np.testing.assert_array_equal(out, [[[0, 1], [10, 11]], [[6, 7], [6, 7]]])


def test_learned_concrete_out_of_range_raises():
    table = jnp.zeros((6, 2))
    with pytest.raises(ValueError, match=r"position 6 is out of range .* 6 rows \(max position 5\)"):
        absolute.learned(table, jnp.array([0, 6]))
    with pytest.raises(ValueError, match="negative position -1"):
        absolute.learned(table, jnp.array([-1, 2]))
    with pytest.raises(ValueError, match=r"shape \[max_len, D\]"):
        absolute.learned(jnp.zeros(6), jnp.array([0]))


def test_learned_traced_out_of_range_is_nan_not_clamped():
    table = jnp.arange(12.0).reshape(6, 2)
    out = jax.jit(absolute.learned)(table, jnp.array([5, 6, 100, -1]))
    np.testing.assert_array_equal(out[0], [10, 11])
    assert np.isnan(np.asarray(out[1:])).all()


def test_learned_grad_reaches_rows():
    table = jnp.ones((5, 3))
    g = jax.grad(lambda t: absolute.learned(t, jnp.array([1, 1, 4])).sum())(table)
    np.testing.assert_array_equal(g[:, 0], [0, 2, 0, 0, 1])


def test_randomized_positions_distinct_sorted_in_range():
    out = absolute.randomized_positions(jax.random.key(0), 16, max_position=40, batch_shape=(3, 2))
    assert out.shape == (3, 2, 16) and out.dtype == jnp.int32
    a = np.asarray(out).reshape(6, 16)
    assert (np.diff(a, axis=-1) > 0).all()  # sorted and distinct
    assert a.min() >= 0 and a.max() < 40
    assert len({tuple(r) for r in a}) == 6  # independent draws per batch entry
    full = absolute.randomized_positions(jax.random.key(1), 7, max_position=7)
    np.testing.assert_array_equal(full, np.arange(7))


def test_randomized_positions_uniform():
    # Each position is picked with probability length / max_position.
    out = absolute.randomized_positions(jax.random.key(2), 5, max_position=10, batch_shape=(2000,))
    freq = np.bincount(np.asarray(out).ravel(), minlength=10) / 2000
    np.testing.assert_allclose(freq, 0.5, atol=0.05)


def test_randomized_positions_errors():
    with pytest.raises(ValueError, match=r"cannot draw 11 distinct positions from \[0, 10\)"):
        absolute.randomized_positions(jax.random.key(0), 11, max_position=10)
    with pytest.raises(ValueError, match="length"):
        absolute.randomized_positions(jax.random.key(0), -1, max_position=10)


def test_relative_distances_broadcasts_batch():
    d = absolute.relative_distances(jnp.array([[2, 3]]), jnp.array([[0, 1, 2], [5, 6, 7]]))
    assert d.shape == (2, 2, 3)
    np.testing.assert_array_equal(d[1], [[-3, -4, -5], [-2, -3, -4]])
