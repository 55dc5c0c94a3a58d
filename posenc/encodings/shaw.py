"""Shaw et al. relative position representations (clipped key and value tables).

Shaw, Uszkoreit & Vaswani 2018, "Self-Attention with Relative Position
Representations". One table of 2k + 1 vectors for keys and one for values,
shared by all heads, indexed by the clipped distance ``j - i``::

    idx(i, j) = clip(j - i, -k, k) + k
    logits[h, i, j] = q_i . k_j / sqrt(dh) + q_i . aK[idx(i, j)]
    out[i, h]       = sum_j w[h, i, j] (v_j + aV[idx(i, j)])

Neither function materialises an [Lq, Lk, Dh] tensor: queries meet the
2k + 1 table rows once, then a gather (logits) or a scatter-add into
2k + 1 buckets followed by a matmul (values).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.encodings.absolute import relative_distances


def _check_max_distance(max_distance) -> int:
    return checks.integer("max_distance", max_distance, minimum=1)


def _check_table(name: str, table, max_distance: int, head_dim: int) -> jax.Array:
    table = jnp.asarray(table)
    want = (2 * max_distance + 1, head_dim)
    if table.shape != want:
        raise ValueError(
            f"{name} must have shape [2 * max_distance + 1, Dh] = {list(want)}, got {list(table.shape)}"
        )
    return table


def gather_last(table, idx):
    """``out[..., i, j] = table[..., i, idx[..., i, j]]`` with leading dims broadcast."""
    shape = jnp.broadcast_shapes(table.shape[:-1], idx.shape[:-1])
    table = jnp.broadcast_to(table, (*shape, table.shape[-1]))
    idx = jnp.broadcast_to(idx, (*shape, idx.shape[-1]))
    return jnp.take_along_axis(table, idx, axis=-1)


def relative_index(q_positions, k_positions, *, max_distance: int) -> jax.Array:
    """Table row of each (query, key) pair: ``clip(j - i, -k, k) + k``.

    Shapes: q_positions int [..., Lq], k_positions int [..., Lk] -> int32
    [..., Lq, Lk] with values in [0, 2k].
    """
    k = _check_max_distance(max_distance)
    return jnp.clip(-relative_distances(q_positions, k_positions), -k, k) + k


def logits(q, table_k, q_positions, k_positions, *, max_distance: int) -> jax.Array:
    """Relative key term ``q_i . aK[idx(i, j)]`` to add to the content logits.

    Scale ``q`` beforehand if the content term is scaled (tensor2tensor
    scales q by 1/sqrt(dh) before both terms).

    Shapes: q [..., Lq, H, Dh], table_k [2k + 1, Dh] -> float32 [..., H, Lq, Lk].
    """
    q = jnp.asarray(q)
    table_k = _check_table("table_k", table_k, _check_max_distance(max_distance), q.shape[-1])
    idx = relative_index(q_positions, k_positions, max_distance=max_distance)
    # [..., H, Lq, 2k+1]: every query against every table row, once.
    qt = jnp.einsum("...qhd,rd->...hqr", q.astype(jnp.float32), table_k.astype(jnp.float32))
    return gather_last(qt, idx[..., None, :, :])


def values(weights, table_v, q_positions, k_positions, *, max_distance: int) -> jax.Array:
    """Relative value term ``sum_j w[h, i, j] aV[idx(i, j)]`` to add to ``w @ v``.

    The weights are summed into the 2k + 1 buckets per (head, query) with one
    scatter-add, then multiplied by the table.

    Shapes: weights [..., H, Lq, Lk] (softmax output), table_v [2k + 1, Dh]
    -> [..., Lq, H, Dh] in the weights' dtype.
    """
    weights = jnp.asarray(weights)
    k = _check_max_distance(max_distance)
    table_v = jnp.asarray(table_v)
    if table_v.ndim != 2:
        raise ValueError(f"table_v must have shape [2 * max_distance + 1, Dh], got {list(table_v.shape)}")
    table_v = _check_table("table_v", table_v, k, table_v.shape[-1])
    idx = relative_index(q_positions, k_positions, max_distance=k)
    if weights.ndim < 3:
        raise ValueError(f"weights must have shape [..., H, Lq, Lk], got {weights.shape}")
    shape = jnp.broadcast_shapes(weights.shape, idx[..., None, :, :].shape)
    w = jnp.broadcast_to(weights.astype(jnp.float32), shape)
    idx = jnp.broadcast_to(idx[..., None, :, :], shape)
    nrows = int(np.prod(shape[:-1], dtype=np.int64))
    nb = 2 * k + 1
    # Row r's buckets live at [r * nb, (r + 1) * nb): one flat segment-sum.
    seg = idx.reshape(nrows, shape[-1]) + (jnp.arange(nrows, dtype=jnp.int32) * nb)[:, None]
    buckets = jax.ops.segment_sum(w.reshape(-1), seg.reshape(-1), num_segments=nrows * nb)
    buckets = buckets.reshape(*shape[:-1], nb)  # [..., H, Lq, 2k+1]
    out = jnp.einsum("...hqr,rd->...qhd", buckets, table_v.astype(jnp.float32))
    return out.astype(weights.dtype)
