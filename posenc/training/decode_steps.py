"""The compiled steps of the evaluation decoder: a group of rows, a prefilled cache, then one token per row.

Step 3 of :mod:`posenc.training.decode_set` (which plans the groups): one
cache for a group's rows, prefilled in pieces up to the group's start
(:func:`_prefill`, a full forward per piece), then one token per row and step
(:func:`_segment`), every row of the group in the same step. The steps run in
compiled segments of about :attr:`Schedule.segment_seconds` each (the loop
state carried from one call to the next; one program per group size and
cache size, shared by every length), so Ctrl-C acts between segments. A step
streams its whole cache, so the cache grows with the decoded tokens, through
sizes of one grid at every length (:func:`_capacity`).

A step's single query per row attends with dense attention (the blocked path
would pad it to a block of queries), and a step decodes the rows through
``jax.vmap`` of a one-row model, so positions shared by every row (the
default ones, or a batch's randomized ones) are rotated once per step and
not once per row. Per-row positions (randomized per example) stay per row.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

_JIT: dict = {}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the decoder groups and paces its work (frozen: one value per evaluation; the defaults are
    those measured fastest on 2 cores). The answers are the same for every schedule, up to float32
    rounding (other groups and prefills are other programs); the speed and the programs differ.
    """

    group_rows: int = 4  # rows decoded together at most (and at most eval.batch_size): 4 measured fastest of 1-16
    segment_seconds: float = 1.0  # target wall time of one compiled segment of decoding steps
    first_segment: int = 8  # steps of the first segment of a program shape (its time includes the compile)
    min_prefill: int = 256  # prompts shorter than this are decoded step by step (no prefill program)
    cache_grid: int = 256  # the smallest cache of a grown cache (:func:`_capacity`)
    progress_delay: float = 2.0  # a length's progress bar shows once its decoding has taken this long

    def group(self, batch_size: int) -> int:
        """Rows decoded together for batches of ``batch_size`` rows (``group_rows``, at most the batch)."""
        return min(batch_size, self.group_rows) if self.group_rows else batch_size


def _slice(positions, start, size):
    """Tokens ``start .. start + size - 1`` of positions [L], [B, L] or [B, L, A] (several axes)."""
    if positions is None:
        return None
    return jax.lax.dynamic_slice_in_dim(positions, start, size, axis=1 if positions.ndim == 3 else positions.ndim - 1)


def _jitted(fn, static, donate=()):
    if (fn, static, donate) not in _JIT:
        _JIT[(fn, static, donate)] = jax.jit(fn, static_argnames=static, donate_argnames=donate)
    return _JIT[(fn, static, donate)]


def _one_token_attention(model):
    """Dense attention for a step's one query per row (blocked attention pads it to a block)."""
    for block in model.blocks:
        attn = block.attn
        if attn.impl == "blocked" or (attn.impl == "auto" and not _on_accelerator()):
            attn.impl = "dense"


def _on_accelerator() -> bool:
    from posenc.model import fused

    return fused.on_accelerator()


def _row_axes(cache, per_row: bool) -> dict:
    """The ``jax.vmap`` axes of a cache of one row per example: the length is shared, and so are the
    positions unless they differ by example."""
    return {k: None if k == "length" or (k == "positions" and not per_row) else 0 for k in cache}


def _per_row(positions) -> bool:
    """Positions per example: [N, L], or multi-axis [N, L, A] (never shared: see _make_set)."""
    return positions is not None and positions.ndim >= 2


def _one_row(positions):
    """One row's positions as the one-row model takes them: [T], or [1, T, A] for multi-axis ids [T, A]."""
    return positions[None] if positions.ndim == 2 else positions


def _prefill(graphdef, states, cache, fed, positions, start, *, piece):
    """Append ``fed[:, start:start + piece]`` to the cache of every row (one forward of ``piece`` tokens)."""
    model = nnx.merge(graphdef, *states)
    per_row = _per_row(positions)
    axes = _row_axes(cache, per_row)

    def one(tokens, cache, pos):
        x = jax.lax.dynamic_slice_in_dim(tokens, start, piece)[None]
        p = None if pos is None else _one_row(jax.lax.dynamic_slice_in_dim(pos, start, piece))
        return model.decode(x, cache, p)[1]

    return jax.vmap(one, in_axes=(0, axes, 0 if per_row else None), out_axes=axes)(fed, cache, positions)


def _segment(graphdef, states, cache, token, out, fed, prevmask, positions, start, stop):
    """Decoding steps ``start .. stop - 1`` of every row: step ``t`` reads the model's prediction
    ``token`` where ``prevmask[:, t]`` (the input is an answer token) and ``fed[:, t]`` elsewhere,
    and writes its prediction to ``out[:, t]``. ``start``, ``stop`` are traced: one program."""
    model = nnx.merge(graphdef, *states)
    _one_token_attention(model)
    per_row = _per_row(positions)
    axes = _row_axes(cache, per_row)

    def one(tok, cache, pos, t):
        p = None if pos is None else _one_row(jax.lax.dynamic_slice_in_dim(pos, t, 1))
        logits, cache = model.decode(tok[None, None], cache, p)
        return jnp.argmax(logits[0, -1]).astype(jnp.int32), cache

    step = jax.vmap(one, in_axes=(0, axes, 0 if per_row else None, None), out_axes=(0, axes))

    def body(t, carry):
        cache, token, out = carry
        given = jax.lax.dynamic_index_in_dim(fed, t, axis=1, keepdims=False)
        answer = jax.lax.dynamic_index_in_dim(prevmask, t, axis=1, keepdims=False)
        token, cache = step(jnp.where(answer, token, given), cache, positions, t)
        return cache, token, jax.lax.dynamic_update_index_in_dim(out, token, t, axis=1)

    return jax.lax.fori_loop(start, stop, body, (cache, token, out))


def _empty(graphdef, states, *, rows: int, size: int, per_row: bool):
    """An empty cache of ``rows`` one-row caches (:func:`_row_axes`) for ``size`` tokens."""
    one = nnx.merge(graphdef, *states).init_cache(1, size)
    axes = _row_axes(one, per_row)
    return {k: v if axes[k] is None else jax.tree.map(lambda x: jnp.broadcast_to(x, (rows,) + x.shape), v)
            for k, v in one.items()}


class _Pace:
    """How many steps a segment runs: about ``schedule.segment_seconds``, from the rate of the segments so
    far (per step, row and cache slot: a step streams every row's whole cache). The first segment of a
    program shape ``(rows, slots)`` is short: its time may hold the compile, and is not a rate."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.per_slot = None
        self.last = schedule.first_segment
        self.seen = set()

    def steps(self, shape) -> int:
        if self.per_slot is None or shape not in self.seen:
            return self.schedule.first_segment
        want = int(self.schedule.segment_seconds / max(self.per_slot * shape[0] * shape[1], 1e-12))
        self.last = max(1, min(want, 4 * self.last, 1 << 16))  # grow at most 4x a segment
        return self.last

    def record(self, shape, steps: int, seconds: float):
        if shape in self.seen:
            self.per_slot = seconds / max(steps * shape[0] * shape[1], 1)
        self.seen.add(shape)


def _capacity(slots: int, end: int, grid: int = Schedule.cache_grid) -> int:
    """The cache size for ``slots`` written slots: the next size of the grid ``grid`` * {1, 1.5} * 2**k
    (``Schedule.cache_grid``), at most ``end``. A step streams the whole cache, so the cache grows with the
    tokens; the grid is the same at every length, so are the programs of each size."""
    size = grid
    while size < slots:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return min(size, end)


def _grow(cache, out, *, size, per_row):
    """``cache`` (one-row caches, :func:`_row_axes`) and ``out`` [R, S] with room for ``size`` tokens."""

    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, size - x.shape[axis])
        return jnp.pad(x, widths)

    return dict(cache, k=tuple(pad(x, 2) for x in cache["k"]), v=tuple(pad(x, 2) for x in cache["v"]),
                features=tuple({n: pad(f, 2) for n, f in layer.items()} for layer in cache["features"]),
                positions=pad(cache["positions"], 2 if per_row else 1)), pad(out, 1)


@dataclasses.dataclass(frozen=True)
class _Group:
    """Rows of one model decoded together: from ``start`` (a prefill up to there) to ``stop``."""

    model: int
    rows: np.ndarray  # the set's rows
    size: int  # rows of the programs (``rows`` padded with copies of its last)
    piece: int  # tokens per prefill forward
    start: int
    stop: int


def _decode_group(graphdef, states, g: _Group, data, pace: _Pace, info: dict, progress) -> np.ndarray:
    """The predictions [rows, stop - start] of the group's rows (``data``: the set, a
    :class:`posenc.training.decode_set._Set`; ``info``: the statistics to add to)."""
    grid = pace.schedule.cache_grid
    end = data.span[1]
    per_row = _per_row(data.positions)
    rows = np.concatenate([g.rows, np.full(g.size - len(g.rows), g.rows[-1])])

    def inputs(slots):  # what a program over ``slots`` cache slots reads (shapes of that size only)
        positions = None if data.positions is None else jnp.asarray(
            data.positions[rows, :slots] if per_row else data.positions[:slots])
        return jnp.asarray(data.fed[rows, :slots]), jnp.asarray(data.prevmask[rows, :slots]), positions

    clock = time.perf_counter()
    slots = _capacity(g.start + 1, end, grid)
    fed, prevmask, positions = inputs(slots)
    cache = _jitted(_empty, ("rows", "size", "per_row"))(graphdef, states, rows=g.size, size=slots,
                                                           per_row=per_row)
    prefill = _jitted(_prefill, ("piece",), ("cache",))
    for a in range(0, g.start, g.piece):
        cache = prefill(graphdef, states, cache, fed, positions, np.int32(a), piece=g.piece)
        jax.block_until_ready(cache["length"])
        info["prefill_pieces"] += 1
        progress(0, f"prefill {a + g.piece}/{g.start}")
    jax.block_until_ready(cache["length"])
    info["seconds"]["prefill"] += time.perf_counter() - clock
    clock = time.perf_counter()
    segment = _jitted(_segment, (), ("cache", "out"))
    token = jnp.asarray(data.fed[rows, g.start])
    out = jnp.asarray(np.zeros((g.size, slots), np.int32))
    t, sizes = g.start, []
    while t < g.stop:
        if t == slots:
            slots = _capacity(t + 1, end, grid)
            cache, out = _jitted(_grow, ("size", "per_row"))(cache, out, size=slots, per_row=per_row)
            fed, prevmask, positions = inputs(slots)
        sizes += [slots] if slots not in sizes else []
        shape = (g.size, slots)
        k = min(pace.steps(shape), g.stop - t, slots - t)
        began = time.perf_counter()
        cache, token, out = segment(graphdef, states, cache, token, out, fed, prevmask, positions,
                                    np.int32(t), np.int32(t + k))
        jax.block_until_ready(token)  # Ctrl-C acts here, between segments
        pace.record(shape, k, time.perf_counter() - began)
        info["segments"] += 1
        t += k
        progress(k, "")
    predicted = np.asarray(out)[:len(g.rows), g.start:g.stop]
    info["seconds"]["steps"] += time.perf_counter() - clock
    info["cache_sizes"] |= set(sizes)
    info["groups"].append({"rows": len(g.rows), "size": g.size, "start": g.start, "stop": g.stop,
                           "piece": g.piece, "cache_sizes": sizes})
    info["steps"] += g.stop - g.start
    return predicted
