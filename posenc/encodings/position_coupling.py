"""Position coupling: position ids assigned by the task's structure, and their learned embedding.

Cho et al. 2024, "Position Coupling: Improving Length Generalization of
Arithmetic Transformers Using Task Structure" (NeurIPS); multi-level
coupling: Cho et al. 2025, "Arithmetic Transformers Can Length-Generalize in
Both Operand Length and Count" (ICLR). Official code:
HanseulJo/position-coupling (``src/data/*.py`` assign the ids; the model adds
one learned table per level, ``wpe``, summed over levels).

Tokens of equal significance (the i-th digit of both operands and of the
answer) share one id, so ids carry the task's structure instead of the
token index; at training the ids start at a random offset (the tasks draw
it), at evaluation at 1. The tasks of ``posenc.tasks`` that support
coupling emit the ids in the batch as ``position_ids``, which the model uses
as its positions: any encoding (this learned table, RoPE, FIRE, ...) reads
them as it reads plain positions.

Multi-level ids (several ids per token, e.g. digit significance and
operand index) travel as one int32 per token, ``level_0 + STRIDE *
level_1 + STRIDE**2 * level_2``, so that they fit the model's positions
int32 [B, L] and the KV cache unchanged. :func:`pack` and :func:`unpack`
convert; only the learned table of the ``position_coupling`` unit reads
the levels one by one (other encodings see the packed integer). With one
level the id is the position itself.
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc import checks
from posenc.encodings import absolute

STRIDE_BITS = 10
STRIDE = 1 << STRIDE_BITS  # ids of one level are in [0, STRIDE) when there are several levels
MAX_LEVELS = 3  # 3 * 10 bits fit an int32


def _levels(levels) -> int:
    return checks.integer("levels", levels, minimum=1, maximum=MAX_LEVELS)


def pack(levels):
    """Several levels of ids -> one int32 per token: ``sum_d levels[d] * STRIDE**d``.

    ``levels``: a sequence of D int arrays of one shape (each in [0, STRIDE)
    when D > 1). Returns int32 of that shape.
    """
    levels = [jnp.asarray(x, jnp.int32) for x in levels]
    _levels(len(levels))
    out = levels[0]
    for d, ids in enumerate(levels[1:], start=1):
        out = out + (ids << (STRIDE_BITS * d))
    return out


def unpack(positions, levels: int):
    """The D levels of packed ids: int [..., L] -> int32 [D, ..., L] (the inverse of :func:`pack`).

    With one level the positions are returned as they are (any int32 value);
    with several, every level but the last is ``STRIDE_BITS`` bits wide.
    """
    levels = _levels(levels)
    positions = absolute.check_positions(positions).astype(jnp.int32)
    out = []
    for d in range(levels):
        ids = positions >> (STRIDE_BITS * d)
        out.append(ids if d == levels - 1 else ids & (STRIDE - 1))
    return jnp.stack(out)


def embed(tables, positions):
    """Sum over levels of each level's learned row: tables [D, rows, dim], positions int [..., L].

    Returns [..., L, dim] in the tables' dtype; an id outside ``[0, rows)``
    has no row (NaN under jit, ValueError on concrete ids: see
    :func:`posenc.absolute.learned`).
    """
    tables = jnp.asarray(tables)
    if tables.ndim != 3:
        raise ValueError(f"tables must have shape [levels, rows, dim]; got {tables.shape}")
    ids = unpack(positions, tables.shape[0])
    out = absolute.learned(tables[0], ids[0])
    for d in range(1, tables.shape[0]):
        out = out + absolute.learned(tables[d], ids[d])
    return out


__all__ = ["MAX_LEVELS", "STRIDE", "STRIDE_BITS", "embed", "pack", "unpack"]
