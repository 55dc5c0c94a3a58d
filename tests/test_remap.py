"""posenc.remap: the Region form shared by the context-extension methods."""

import jax.numpy as jnp
import numpy as np
import pytest

from posenc import remap


def test_from_regions_marks_uncovered_pairs_nan_and_scales_distances():
    q, k = jnp.arange(3, 6), jnp.arange(6)
    d = np.arange(3, 6)[:, None] - np.arange(6)[None, :]
    near = remap.Region(q, k, jnp.asarray((d >= 0) & (d < 2)))
    far = remap.Region(2 * q, 2 * k, jnp.asarray(d >= 4), 0.25)
    rel = np.asarray(remap.from_regions([near, far]))
    assert rel.dtype == np.float32 and rel.shape == (3, 6)
    want = np.where((d >= 0) & (d < 2), d, np.where(d >= 4, 0.5 * d, np.nan))
    np.testing.assert_array_equal(rel, want.astype(np.float32))
    np.testing.assert_array_equal(remap.visible([near, far]), ~np.isnan(want))
    np.testing.assert_array_equal(remap.distances(far), (0.5 * d).astype(np.float32))


def test_positions_broadcast_leading_dims_and_refuse_floats():
    q, k, d = remap.positions(jnp.arange(8).reshape(2, 4), jnp.arange(5))
    assert q.dtype == k.dtype == d.dtype == jnp.int32 and d.shape == (2, 4, 5)
    np.testing.assert_array_equal(d[1], np.arange(4, 8)[:, None] - np.arange(5)[None, :])
    with pytest.raises(ValueError, match="k_positions must be an integer array"):
        remap.positions(jnp.arange(3), jnp.arange(3.0))


def test_from_regions_needs_a_region():
    with pytest.raises(ValueError, match="regions must hold at least one Region; got none"):
        remap.from_regions([])
