"""Position remapping: the shared form of the training-free context-extension methods.

Self-Extend, ReRoPE, Dual Chunk Attention, STRING, StreamingLLM and
LM-Infinite (``posenc.self_extend``, ``rerope``, ``dual_chunk``,
``string_shift``, ``sinks``) keep the trained RoPE model and change only
which relative distance each (query, key) pair sees, and which keys a query
sees at all. Each method offers two views of the same thing:

- ``relative_positions(q_positions, k_positions, *, ...)``: the effective
  relative distance, float32 [..., Lq, Lk]; **NaN marks every pair the query
  does not attend to** (future keys, and keys the method drops).
- ``regions(q_positions, k_positions, *, ...)``: at most three
  :class:`Region` s, how attention computes it. In region r, queries are
  rotated at ``scale_r * q_positions_r`` and keys at ``scale_r *
  k_positions_r`` (``posenc.rope.apply(q, a, inv_freq * scale)``), so that
  the logit of (i, j) sees the distance ``scale_r * (a_r[i] - b_r[j])``;
  ``mask_r`` says where region r holds. The masks are disjoint and their
  union is the set of visible pairs (the official implementations compute one
  set of logits per region and merge them by these masks).

:func:`from_regions` rebuilds the first view from the second; the tests check
that the two agree for every method. Positions are integer arrays with any
leading batch shape (``posenc.absolute.check_positions``); region maps are
int32 with the leading dims of their own positions, masks broadcast both.
Float32 holds every integer distance exactly below 2^24.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from posenc.encodings.absolute import check_positions

__all__ = ["Region", "distances", "from_regions", "positions", "visible"]


class Region(NamedTuple):
    """One set of logits: RoPE positions for queries and keys, where it holds, and a position scale.

    q_positions: int32 [..., Lq]; k_positions: int32 [..., Lk]; mask: bool
    [..., Lq, Lk]; scale: Python float, the factor on both position maps
    (1.0 except where a method makes fractional distances: rotate with
    ``inv_freq * scale``, as Hugging Face's linear scaling rotates p / k).
    """

    q_positions: jax.Array
    k_positions: jax.Array
    mask: jax.Array
    scale: float = 1.0


def positions(q_positions, k_positions):
    """``(q, k, d)``: both position arrays as int32 and the signed distances d = q[..., :, None] - k[..., None, :]."""
    q = check_positions(q_positions, "q_positions").astype(jnp.int32)
    k = check_positions(k_positions, "k_positions").astype(jnp.int32)
    return q, k, q[..., :, None] - k[..., None, :]


def distances(region: Region) -> jax.Array:
    """The distance region r gives every pair (valid where its mask holds): float32 scale * (a[i] - b[j])."""
    d = (region.q_positions[..., :, None] - region.k_positions[..., None, :]).astype(jnp.float32)
    return d if region.scale == 1.0 else d * jnp.float32(region.scale)


def visible(regions: Sequence[Region]) -> jax.Array:
    """bool [..., Lq, Lk]: the pairs some region holds (the method's attention mask)."""
    out = regions[0].mask
    for r in regions[1:]:
        out = out | r.mask
    return out


def from_regions(regions: Sequence[Region]) -> jax.Array:
    """Effective relative positions float32 [..., Lq, Lk] from regions: NaN where no region holds.

    Where several regions hold (an invalid decomposition), the last one wins.
    """
    if not regions:
        raise ValueError("regions must hold at least one Region; got none")
    shape = jnp.broadcast_shapes(*(jnp.shape(r.mask) for r in regions),
                                 *(jnp.shape(distances(r)) for r in regions))
    out = jnp.full(shape, jnp.nan, jnp.float32)
    for r in regions:
        out = jnp.where(r.mask, distances(r), out)
    return out
