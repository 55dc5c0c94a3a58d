"""Grid tasks: copy or transpose a k x k grid of symbols, posed row by row, with 2D position ids.

The problem size is the side k. The grid's k^2 cells are read row by row
(the vision-token order of Qwen2-VL), then SEP, then the answer grid, row by
row (``.`` is PAD; ``a b / c d`` a 2 x 2 grid)::

    grid_copy (k=2):       BOS a b c d SEP a b c d      seq_len(k) = 2 k^2 + 2
    grid_transpose (k=2):  BOS a b c d SEP a c b d      answer (r, c) = input (c, r)
    mask (on targets):     1 on each answer cell

Multi-axis position ids (``axis_positions`` int32 [B, length, 3]: (t, h, w)),
built like Qwen2-VL's ``get_rope_index`` (:func:`posenc.mrope.position_ids`)
for the segments ``[1, (1, k, k), 1, (1, k, k)]``: a text token (BOS, SEP,
the PAD after the answer) has the next id on every axis; a grid's cell (r, c)
has ``s + (0, r, c)``, s the next id before the grid; the next id is always
the largest so far + 1. For k = 2::

    BOS (0, 0, 0); input cells (1, 1..2, 1..2); SEP (3, 3, 3); answer cells (4, 4..5, 4..5); then 6, 7, ...

Input cell (r, c) and answer cell (r, c) are k + 1 apart on every axis, an
offset that changes with k: no id makes the answer aligned with the input
unless the encoding learns it. Training gives these ids to a model whose
units read several axes (M-RoPE reads (t, h, w), 2D RoPE the last two,
(h, w)); one-axis encodings read the sequence index 0 .. L-1 as on every task
(``posenc.training.step``), so that every encoding runs the task. Training
on small k and evaluating at larger k is a 2D extrapolation study
(``compare:grid_quick``).
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc.tasks.base import BOS, FIRST_SYMBOL, PAD, SEP, Task, check_int, gather, segment


class _Grid(Task):
    """``BOS grid SEP f(grid)`` of a k x k grid of ``alphabet`` symbols, row by row."""

    smallest = 1
    position_axes = 3  # emits axis_positions (t, h, w)

    def __init__(self, *, alphabet: int = 8, seed: int = 0):
        self.alphabet = check_int("alphabet", alphabet, minimum=2)
        self.symbols = tuple(str(i) for i in range(self.alphabet))
        super().__init__(seed=seed)

    @property
    def law(self) -> str:
        return "2 * n^2 + 2"

    def seq_len(self, n: int) -> int:
        return 2 * n * n + 2

    def _source(self, r, c, k):
        """The input cell the answer cell (r, c) shows."""
        raise NotImplementedError

    def _bounds(self, max_n):
        return [self.alphabet] * (max_n * max_n)

    def _example(self, draws, n, max_n, width):
        pos = jnp.arange(width)
        cells = n * n
        in_x, ix = segment(pos, 1, cells)
        in_y, iy = segment(pos, cells + 2, cells)
        # the input grid is draws[r * k + c]; answer cell (r, c) shows input cell _source(r, c)
        y = gather(draws, self._source(iy // jnp.maximum(n, 1), iy % jnp.maximum(n, 1), n))
        tokens = jnp.full((width,), PAD, jnp.int32)
        tokens = jnp.where(pos == 0, BOS, tokens)
        tokens = jnp.where(in_x, FIRST_SYMBOL + gather(draws, ix), tokens)
        tokens = jnp.where(pos == cells + 1, SEP, tokens)
        tokens = jnp.where(in_y, FIRST_SYMBOL + y, tokens)
        return tokens, in_y, axis_ids(pos, n)


def axis_ids(pos, k):
    """(t, h, w) ids [width, 3] of the positions ``pos`` of a size-k example (module docstring)."""
    cells = k * k
    in_x, ix = segment(pos, 1, cells)
    in_y, iy = segment(pos, cells + 2, cells)
    after = pos - (2 * cells + 2) + 2 * k + 2  # text after the answer: ids 2k + 2, 2k + 3, ...
    text = jnp.where(pos == 0, 0, jnp.where(pos == cells + 1, k + 1, after))
    text = jnp.stack([text] * 3, axis=-1)
    side = jnp.maximum(k, 1)

    def grid(start, i):
        return jnp.stack([start + 0 * i, start + i // side, start + i % side], axis=-1)

    ids = jnp.where(in_x[:, None], grid(1, ix), text)
    return jnp.where(in_y[:, None], grid(k + 2, iy), ids)


class GridCopy(_Grid):
    """grid_copy: ``BOS grid SEP grid``."""

    names = ("grid_copy",)
    source = "2D extrapolation as rope-vit (Heo et al. 2024); ids of Qwen2-VL's get_rope_index (Wang et al. 2024)"
    description = "copy a k x k grid of symbols posed row by row: BOS grid SEP grid, with (t, h, w) ids"

    def _source(self, r, c, k):
        return r * k + c


class GridTranspose(_Grid):
    """grid_transpose: ``BOS grid SEP transpose(grid)``."""

    names = ("grid_transpose",)
    source = "2D extrapolation as rope-vit (Heo et al. 2024); ids of Qwen2-VL's get_rope_index (Wang et al. 2024)"
    description = ("transpose a k x k grid of symbols posed row by row: BOS grid SEP grid^T, with "
                   "(t, h, w) ids")

    def _source(self, r, c, k):
        return c * k + r
