"""Absolute positional encodings: sinusoidal, learned table, randomized positions.

Also holds the two position helpers that every relative encoding uses
(``check_positions`` and ``relative_distances``), so that integer checks and
batch broadcasting behave the same everywhere.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks

LAYOUTS = ("interleaved", "concat")


def check_positions(positions, name: str = "positions") -> jax.Array:
    """Return ``positions`` as an integer array of rank >= 1, else raise ValueError.

    Only the dtype and rank are checked (static under ``jit``). Positions must
    be integers: float positions lose exactness (bf16 cannot hold 257) and a
    float here is almost always a bug.
    """
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {positions.dtype}")
    if positions.ndim < 1:
        raise ValueError(f"{name} must have shape [..., L], got a scalar")
    return positions


def relative_distances(q_positions, k_positions) -> jax.Array:
    """Signed distances ``i - j`` between query and key positions.

    Shapes: q_positions [..., Lq], k_positions [..., Lk] (leading dims
    broadcast) -> int32 [..., Lq, Lk], entry [i, j] = q_pos[i] - k_pos[j].
    """
    q = check_positions(q_positions, "q_positions").astype(jnp.int32)
    k = check_positions(k_positions, "k_positions").astype(jnp.int32)
    return q[..., :, None] - k[..., None, :]


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_dim(dim, name: str = "dim") -> int:
    if not checks.is_int(dim) or dim < 2 or dim % 2:
        raise ValueError(f"{name} must be a positive even integer, got {dim!r}")
    return int(dim)


def sinusoidal(positions, dim: int, *, base: float = 10000.0, layout: str = "interleaved") -> jax.Array:
    """Fixed sinusoidal position embedding.

    Vaswani et al. 2017, "Attention Is All You Need".

    - ``layout="interleaved"`` (paper): ``PE[p, 2i] = sin(p inv_i)``,
      ``PE[p, 2i+1] = cos(p inv_i)``, ``inv_i = base^(-2i/D)``.
    - ``layout="concat"`` (tensor2tensor / fairseq): ``[sin(p inv), cos(p inv)]``
      with ``inv_i = exp(-i ln(base) / max(D/2 - 1, 1))``. For D = 2 the
      denominator D/2 - 1 is 0; like tensor2tensor we use max(., 1), which
      gives ``inv = [1]``.

    Shapes: positions int [..., L] -> float32 [..., L, dim].
    """
    positions = check_positions(positions)
    dim = _check_dim(dim)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
    if not base > 0:
        raise ValueError(f"base must be > 0, got {base!r}")
    half = dim // 2
    i = np.arange(half, dtype=np.float64)
    if layout == "interleaved":
        inv = base ** (-2.0 * i / dim)
    else:
        inv = np.exp(-i * math.log(base) / max(half - 1, 1))
    # Elementwise multiply in float32 (not a matmul: matmul precision is not fp32 on TPU/GPU).
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv, jnp.float32)
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    if layout == "concat":
        return jnp.concatenate([sin, cos], axis=-1)
    return jnp.stack([sin, cos], axis=-1).reshape(*angles.shape[:-1], dim)


def learned(table, positions) -> jax.Array:
    """Rows of a learned absolute position table (GPT-2 style, init N(0, 0.02)).

    Positions outside ``[0, len(table))`` have no row. Concrete (non-traced)
    positions raise ValueError naming the bad position and the table size;
    under ``jit`` the check is impossible, so such rows come back as NaN
    (never a silent clamp to the last row), which poisons the loss visibly.

    Shapes: table float [max_len, D], positions int [..., L] -> [..., L, D]
    in the table dtype.
    """
    table = jnp.asarray(table)
    if table.ndim != 2:
        raise ValueError(f"table must have shape [max_len, D], got {table.shape}")
    if not jnp.issubdtype(table.dtype, jnp.floating):
        raise ValueError(f"table must be a float array, got dtype {table.dtype}")
    positions = check_positions(positions)
    rows = table.shape[0]
    if _is_concrete(positions) and positions.size:
        p = np.asarray(positions)
        if p.min() < 0:
            raise ValueError(f"negative position {int(p.min())}; positions must be in [0, {rows})")
        if p.max() >= rows:
            raise ValueError(
                f"position {int(p.max())} is out of range for a learned table of {rows} rows "
                f"(max position {rows - 1})"
            )
    # jnp.take wraps negative indices even in "fill" mode: send them out of range.
    idx = jnp.where(positions < 0, rows, positions)
    return jnp.take(table, idx, axis=0, mode="fill", fill_value=jnp.nan)


def randomized_positions(key, length: int, *, max_position: int, batch_shape=()) -> jax.Array:
    """Random sorted positions for length generalisation.

    Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
    Generalization of Transformers": draw ``length`` distinct positions
    uniformly without replacement from ``[0, max_position)``, sort them, and
    use them instead of ``arange(length)`` with any encoding.

    Shapes: -> int32 [*batch_shape, length], one independent draw per batch entry.
    """
    for name, value in (("length", length), ("max_position", max_position)):
        checks.integer(name, value, minimum=0)
    if length > max_position:
        raise ValueError(
            f"cannot draw {length} distinct positions from [0, {max_position}); "
            f"need length <= max_position"
        )
    batch_shape = tuple(int(b) for b in batch_shape)
    n = int(np.prod(batch_shape, dtype=np.int64))

    def draw(k):
        picks = jax.random.choice(k, max_position, shape=(length,), replace=False)
        return jnp.sort(picks).astype(jnp.int32)

    keys = jax.random.split(key, max(n, 1))[:n]
    out = jax.vmap(draw)(keys) if n else jnp.zeros((0, length), jnp.int32)
    return out.reshape(*batch_shape, length)
