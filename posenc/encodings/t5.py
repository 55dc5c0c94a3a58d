"""T5 relative position bias: log-spaced buckets, one learned scalar per bucket and head.

Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer". Same bucketing as mesh-tensorflow and
Hugging Face ``T5Attention._relative_position_bucket``. T5 does not scale
logits by 1/sqrt(d); in T5 only the first layer owns the table.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.encodings.absolute import relative_distances


def _check_buckets(bidirectional: bool, num_buckets, max_distance) -> tuple[int, int]:
    """Return (buckets per direction, exact buckets) after validating the hyper-parameters."""
    num_buckets = checks.integer("num_buckets", num_buckets, minimum=4 if bidirectional else 2)
    max_distance = checks.integer("max_distance", max_distance, minimum=1)
    if bidirectional and num_buckets % 2:
        raise ValueError(f"num_buckets must be even when bidirectional, got {num_buckets}")
    nb = num_buckets // 2 if bidirectional else num_buckets
    exact = nb // 2
    if max_distance <= exact:
        # log(max_distance / exact) would be <= 0: the log-spaced range is empty.
        raise ValueError(
            f"max_distance must exceed the {exact} exact buckets "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional}), got {max_distance}"
        )
    return nb, exact


def _log_bucket(rp, nb: int, exact: int, max_distance: int):
    """Float32 log-bucket offset of integer distances ``rp >= exact`` (NumPy).

    The canonical order of operations: ``floor(log(f32(rp) / exact) /
    f32(ln(max_distance / exact)) * (nb - exact))``; NumPy's float32 log
    agrees with PyTorch's on every tested configuration.
    """
    rp = np.asarray(rp, np.float32)
    value = np.log(rp / np.float32(exact)) / np.float32(math.log(max_distance / exact)) * np.float32(nb - exact)
    return np.floor(value)


@functools.lru_cache(maxsize=256)
def _thresholds(nb: int, exact: int, max_distance: int) -> np.ndarray:
    """Smallest distance that reaches each log bucket ``exact + 1 .. nb - 1``.

    The float32 expression is a nondecreasing step function of the integer
    distance, so the bucket of ``rp`` is ``exact + #(thresholds <= rp)``.
    Finding the steps once on the host (bisection with the canonical float32
    arithmetic) makes the result bit-identical to the reference
    implementations at every boundary, where XLA's float32 log can differ
    from theirs by an ulp and flip a bucket.
    """
    out = []
    for k in range(1, nb - exact):
        lo, hi = exact, max(2 * max_distance, exact + 1)
        while _log_bucket(hi, nb, exact, max_distance) < k:
            hi *= 2
        while lo < hi:  # smallest rp in [lo, hi] with offset >= k
            mid = (lo + hi) // 2
            if _log_bucket(mid, nb, exact, max_distance) >= k:
                hi = mid
            else:
                lo = mid + 1
        out.append(lo)
    return np.asarray(out, np.int32)


def relative_position_bucket(
    relative_position, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> jax.Array:
    """Bucket of each relative position ``rp = key_pos - query_pos``.

    ::

        bidirectional: nb = num_buckets // 2; bucket = (rp > 0) * nb; rp = |rp|
        causal:        nb = num_buckets;      bucket = 0;            rp = max(-rp, 0)
        exact = nb // 2
        large = exact + floor(ln(rp / exact) / ln(max_distance / exact) * (nb - exact))
        bucket += rp if rp < exact else min(large, nb - 1)

    ``large`` is the float32 value of the canonical implementations
    (mesh-tensorflow, HF ``T5Attention``), bit for bit: the distances where
    it steps up are found once on the host and looked up here, so no log is
    evaluated on the device and ln(0) never appears.

    Shapes: int [...] -> int32 [...].
    """
    rp = jnp.asarray(relative_position)
    if not jnp.issubdtype(rp.dtype, jnp.integer):
        raise ValueError(f"relative_position must be an integer array, got dtype {rp.dtype}")
    nb, exact = _check_buckets(bidirectional, num_buckets, max_distance)
    rp = rp.astype(jnp.int32)
    if bidirectional:
        bucket = (rp > 0).astype(jnp.int32) * nb
        rp = jnp.abs(rp)
    else:
        bucket = jnp.zeros_like(rp)
        rp = jnp.maximum(-rp, 0)
    thresholds = jnp.asarray(_thresholds(nb, exact, int(max_distance)))
    large = exact + jnp.searchsorted(thresholds, rp, side="right").astype(jnp.int32)
    return bucket + jnp.where(rp < exact, rp, large)


def bias(q_positions, k_positions, table, *, bidirectional: bool = False, max_distance: int = 128) -> jax.Array:
    """T5 attention bias ``bias[h, i, j] = table[bucket(k_pos[j] - q_pos[i]), h]``.

    Shapes: q_positions int [..., Lq], k_positions int [..., Lk], table
    [num_buckets, H] (num_buckets is read from the table) -> float32
    [..., H, Lq, Lk].
    """
    table = jnp.asarray(table)
    if table.ndim != 2:
        raise ValueError(f"table must have shape [num_buckets, H], got {table.shape}")
    rp = -relative_distances(q_positions, k_positions)  # key_pos - query_pos
    buckets = relative_position_bucket(
        rp, bidirectional=bidirectional, num_buckets=table.shape[0], max_distance=max_distance
    )
    values = jnp.take(table.astype(jnp.float32), buckets, axis=0)  # [..., Lq, Lk, H]
    return jnp.moveaxis(values, -1, -3)
