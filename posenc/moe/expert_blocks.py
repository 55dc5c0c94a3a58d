"""The routed experts as one batched matmul over blocks of rows sorted by expert: dropless, on any backend.

:func:`posenc.experts.routed` multiplies the (token, slot) pairs sorted by
expert with ``jax.lax.ragged_dot``. XLA:CPU lowers ``ragged_dot`` densely,
every expert on every row and then masked, so it does ``E`` times the work
of the rows it needs (``[16384, 256] x [8, 256, 1024]``: 1965 ms, against
185 ms for the same rows through one matrix, 2-core AMD EPYC, jax 0.12).
Here the ``T k`` pairs, sorted by expert, are laid out in blocks of
``block`` rows: each expert's rows start a new block, and its last block is
padded with zero rows. Every block then multiplies by its own expert's
matrices, one batched matmul (``einsum("bmh,bhn->bmn")`` over the gathered
matrices) per projection::

    rows laid out:  [ e0 e0 e0 0 | e1 e1 e1 e1 | e1 0 0 0 | e3 e3 0 0 | 0 0 0 0 ]   block = 4
    block_expert:        0             1            1           3        (unused)

The work is ``num_blocks * block`` rows: at most ``T k + E (block - 1)``
(:func:`num_blocks`, a bound that holds for every routing), so it grows
with the active experts (``k``), not with ``E``, once ``block`` is small
next to ``T k / E`` (:func:`block_size`: at most a quarter of the rows an
expert gets at an even load, so the padding stays under 25%). A block of 1
(decoding a few tokens) multiplies exactly the ``T k`` pairs' experts.

Same arguments, layouts and value as :func:`posenc.experts.routed` (to
float32 round-off: the sums run in another order); differentiable (the
gathers and scatters transpose into each other). Matmuls in the dtype of
``x``, the activation and the combine in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.moe import experts

_F32 = jnp.float32
LARGEST_BLOCK = 128  # rows per block at most: larger blocks add padding and no speed (measured on CPU)


def block_size(pairs: int, num_experts: int, *, largest: int = LARGEST_BLOCK) -> int:
    """The rows per block for ``pairs`` (token, slot) pairs over ``num_experts``: the largest power of
    two at most ``pairs / (4 E)`` (an expert's quarter at an even load), between 1 and ``largest``."""
    pairs = checks.integer("pairs", pairs, minimum=1)
    num_experts = checks.integer("num_experts", num_experts, minimum=1)
    target = max(1, pairs // (4 * num_experts))
    return min(1 << (target.bit_length() - 1), checks.integer("largest", largest, minimum=1))


def num_blocks(pairs: int, num_experts: int, block: int) -> int:
    """Blocks that hold ``pairs`` sorted rows for every routing: ``sum_e ceil(n_e / block)`` with
    ``sum_e n_e = pairs`` is at most ``(pairs + min(E, pairs) (block - 1)) // block``."""
    return (pairs + min(num_experts, pairs) * (block - 1)) // block


def layout(indices, *, num_experts: int, block: int):
    """Where each (token, slot) pair goes: ``(pair, row, block_expert)``.

    ``pair`` int32 ``[T k]``: the pairs in expert order (pair ``p`` is token
    ``p // k``, slot ``p % k``; a stable sort); ``row`` int32 ``[T k]``: the
    padded row of each sorted pair; ``block_expert`` int32 ``[num_blocks]``:
    each block's expert (blocks past the last used one repeat expert E - 1
    and hold only zero rows).

    Shapes: indices int ``[T, k]`` in ``[0, E)``.
    """
    flat = jnp.asarray(indices).reshape(-1).astype(jnp.int32)
    pairs = flat.shape[0]
    pair = jnp.argsort(flat, stable=True).astype(jnp.int32)
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    padded = (sizes + block - 1) // block * block
    ends = jnp.cumsum(padded)
    first = jnp.cumsum(sizes) - sizes
    expert = flat[pair]
    row = (ends - padded)[expert] + jnp.arange(pairs, dtype=jnp.int32) - first[expert]
    starts = jnp.arange(num_blocks(pairs, num_experts, block), dtype=jnp.int32) * block
    block_expert = jnp.minimum(jnp.searchsorted(ends, starts, side="right"), num_experts - 1).astype(jnp.int32)
    return pair, row, block_expert


def _per_block(bias, block_expert, dtype):
    return 0.0 if bias is None else jnp.asarray(bias).astype(dtype)[block_expert][:, None]


def routed(x, indices, weights, gate_up, down, *, gate_up_bias=None, down_bias=None, glu="swiglu",
           scale="output", block: int | None = None) -> jax.Array:
    """:func:`posenc.experts.routed` as a batched matmul over blocks of ``block`` rows (module docstring).

    ``block``: rows per block (None: :func:`block_size` of the pairs and experts).

    Shapes: x ``[..., H]``, indices int ``[..., k]`` in ``[0, E)``, weights
    ``[..., k]``, gate_up ``[E, H, 2I]``, down ``[E, I, H]``, gate_up_bias
    ``[E, 2I]``, down_bias ``[E, H]`` -> like x.
    """
    x = jnp.asarray(x)
    x2, idx, w, gate_up, down = experts._prepare(x, indices, weights, gate_up, down, scale)
    num_experts, hidden, k = gate_up.shape[0], x2.shape[1], idx.shape[1]
    pairs = idx.size
    block = block_size(pairs, num_experts) if block is None else checks.integer("block", block, minimum=1)
    pair, row, block_expert = layout(idx, num_experts=num_experts, block=block)
    n = block_expert.shape[0]
    token = pair // k
    w_sorted = w.reshape(-1)[pair][:, None]
    rows = x2[token]
    if scale == "input":
        rows = (rows.astype(_F32) * w_sorted).astype(x.dtype)
    rows = jnp.zeros((n * block, hidden), x.dtype).at[row].set(rows, unique_indices=True)
    h = jnp.einsum("bmh,bhn->bmn", rows.reshape(n, block, hidden), gate_up[block_expert])
    h = h + _per_block(gate_up_bias, block_expert, h.dtype)
    a = experts._glu(glu)(h).astype(x.dtype)
    out = jnp.einsum("bmi,bih->bmh", a, down[block_expert]) + _per_block(down_bias, block_expert, x.dtype)
    out = out.reshape(n * block, hidden)[row].astype(_F32)
    if scale == "output":
        out = out * w_sorted
    y = jnp.zeros(x2.shape, _F32).at[token].add(out)
    return y.astype(x.dtype).reshape(x.shape)
