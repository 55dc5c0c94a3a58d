"""Greedy decoding with the KV cache: answers as a user would read them off the model.

    tokens = decode.greedy(model, prompts, answer_length)       # prompts [B, P]: BOS problem SEP
    correct, mask = decode.answer_correctness(model, batch)     # per example, per position [B, L]
    correct, mask = decode.eval_correctness(model, task, config, length)  # the eval set at length
    [(correct, mask), ...] = decode.eval_correctness_seeds(graphdef, params, rest, task, config, length)
    decode.decoded_metrics(correct, mask)  # {"decoded_accuracy": ..., "decoded_exact_match": ...}

:func:`greedy` prefills the cache with the prompts (one ``Decoder.decode``
call over ``P`` tokens), takes the argmax of the last logits, then feeds
each generated token back with ``Decoder.decode`` inside a ``lax.fori_loop``
(one compiled program per prompt length and answer length; no Python per
token). Token ``j`` of the answer is at position ``P + j`` (or
``positions[..., P + j]``).

:func:`answer_correctness` decodes the answers of a task batch (the layout of
:mod:`posenc.tasks.base`: ``targets[:, t]`` follows ``inputs[:, t]``, ``mask``
marks answer targets): the prompt is every token before the first answer
token, and from there each input token is the model's own prediction where
it is an answer token and the given token elsewhere (the queries of recall,
EOS after an answer), so answers of any layout are decoded as a user would
read them off the model. An answer token is right when its prediction
equals the target; the exact match of an example needs all of its answer
tokens right.

How an evaluation set is decoded (:func:`eval_correctness`; the same for one
batch), with the answers of the step-by-step decoding above:

1. Teacher forcing first: one forward per row chunk of at most
   ``eval.max_tokens_per_step`` tokens over the sequence as decoding reads
   it while its answers are right (answer tokens fed back as their targets)
   gives each row's first wrong answer token. The evaluation's own
   teacher-forced pass gives it (``first_errors``) where the task's inputs
   are that sequence (every task whose answer tokens are followed by their
   targets), so an evaluated length runs no second pass. Up to there greedy decoding
   feeds exactly these tokens, so it predicts exactly these; a row that is
   right at every answer token is right decoded too and is not decoded
   (the exact-match shortcut).
2. The rows with an error, of every batch of the length, sorted by their
   first error, are decoded in groups of :data:`GROUP_ROWS` rows (at most
   ``eval.batch_size``; a last group of fewer rows runs in a power-of-two
   group): one cache for the group, prefilled in pieces of at most
   ``eval.max_tokens_per_step`` tokens (only the prefill is a full forward)
   up to the group's earliest first error (rounded down to a piece; none
   below :data:`MIN_PREFILL` tokens), then one token per row and step, every
   row of the group in the same step, up to the group's last answer token
   (not the padded length). A step streams its whole cache, so the cache
   grows with the decoded tokens, through sizes of one grid at every length
   (:func:`_capacity`); small groups of rows with close first errors keep
   the steps on short caches.
3. The steps run in compiled segments of about :data:`SEGMENT_SECONDS` each
   (the loop state carried from one call to the next; one program per group
   size and cache size, shared by every length), so Ctrl-C acts between
   segments, and a progress bar per length shows on stderr
   (``train.progress``; after :data:`PROGRESS_DELAY` seconds).

A step's single query per row attends with dense attention (the blocked path
would pad it to a block of queries), and a step decodes the rows through
``jax.vmap`` of a one-row model, so positions shared by every row (the
default ones, or a batch's randomized ones) are rotated once per step and
not once per row. Per-row positions (randomized per example) stay per row.

The results are those of decoding each row on its own from its prompt, up
to float32 rounding (a near tie of the argmax may break another way: the
teacher-forced forward, the prefill and the steps are different programs).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.training import eval_step as eval_lib
from posenc.training import progress as progress_lib
from posenc.training import specs

_JIT: dict = {}

SEGMENT_SECONDS = 1.0  # target wall time of one compiled segment of decoding steps
PROGRESS_DELAY = 2.0  # a length's progress bar shows once its decoding has taken this long
FIRST_SEGMENT = 8  # steps of the first segment (its time includes the compile)
MIN_PREFILL = 256  # prompts shorter than this are decoded step by step (no prefill program)
GROUP_ROWS = 4  # rows decoded together at most (and at most eval.batch_size): 4 measured fastest of 1-16
CACHE_GRID = 256  # the smallest cache of a grown cache (:func:`_capacity`)


def _argmax(logits):
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)


def _slice(positions, start, size):
    """Tokens ``start .. start + size - 1`` of positions [L], [B, L] or [B, L, A] (several axes)."""
    if positions is None:
        return None
    return jax.lax.dynamic_slice_in_dim(positions, start, size, axis=1 if positions.ndim == 3 else positions.ndim - 1)


def _greedy(graphdef, state, prompts, positions, *, answer_length):
    model = nnx.merge(graphdef, state)
    batch, prompt_length = prompts.shape
    cache = model.init_cache(batch, prompt_length + answer_length - 1)
    logits, cache = model.decode(prompts, cache, _slice(positions, 0, prompt_length))
    token = _argmax(logits)
    out = jnp.zeros((batch, answer_length), jnp.int32).at[:, 0].set(token)

    def body(j, carry):
        cache, token, out = carry
        logits, cache = model.decode(token[:, None], cache, _slice(positions, prompt_length + j - 1, 1))
        token = _argmax(logits)
        return cache, token, out.at[:, j].set(token)

    return jax.lax.fori_loop(1, answer_length, body, (cache, token, out))[2]


def _jitted(fn, static, donate=()):
    if (fn, static, donate) not in _JIT:
        _JIT[(fn, static, donate)] = jax.jit(fn, static_argnames=static, donate_argnames=donate)
    return _JIT[(fn, static, donate)]


def greedy(model, prompts, answer_length: int, *, positions=None):
    """The greedy answers [B, ``answer_length``] (int32) of ``prompts`` [B, P], one compiled loop.

    ``positions`` ([P + answer_length - 1] or [B, ...]): the positions of the
    prompt and answer tokens (default 0, 1, ...).
    """
    answer_length = int(answer_length)
    if answer_length < 1:
        raise ValueError(f"answer_length must be an integer >= 1; got {answer_length}")
    graphdef, state = nnx.split(model)
    prompts = jnp.asarray(prompts, jnp.int32)
    return _jitted(_greedy, ("answer_length",))(graphdef, state, prompts, positions,
                                                answer_length=answer_length)


def answer_span(mask) -> tuple[int, int] | None:
    """``(start, end)``: prompts are ``inputs[:, :start]``, the last answer target is ``end - 1``.

    ``start`` is one past the earliest first answer target of any example,
    ``end`` one past the latest answer target; None if no example has one.
    """
    m = np.asarray(mask) > 0
    rows = m.any(axis=1)
    if not rows.any():
        return None
    first = np.argmax(m[rows], axis=1)
    last = m.shape[1] - 1 - np.argmax(m[rows][:, ::-1], axis=1)
    return int(first.min()) + 1, int(last.max()) + 1


# -- teacher forcing: each row's first wrong answer token -------------------------------------


def _first_errors(model, fed, targets, mask, positions, end):
    """Index of each row's first wrong answer target under teacher forcing on ``fed`` (L where none)."""
    logits = model(fed[:, :end], _slice(positions, 0, end), deterministic=True)
    wrong = (jnp.argmax(logits, axis=-1) != targets[:, :end]) & (mask[:, :end] > 0)
    return jnp.where(wrong.any(axis=1), jnp.argmax(wrong, axis=1), fed.shape[1]).astype(jnp.int32)


def _forced(graphdef, state, fed, targets, mask, positions, *, end):
    """The first wrong answer target [B] of each row, teacher-forced up to ``end`` (the span's end)."""
    return _first_errors(nnx.merge(graphdef, state), fed, targets, mask, positions, end)


def _forced_seeds(graphdef, params, rest, fed, targets, mask, positions, *, end):
    """:func:`_forced` of S models of one graph (``params`` stacked [S]): first errors [S, B]."""
    return jax.vmap(lambda p: _first_errors(nnx.merge(graphdef, p, rest), fed, targets, mask, positions,
                                            end))(params)


# -- decoding: a prefilled cache, then every row of a group one token per step ----------------


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


@dataclasses.dataclass
class _Set:
    """An evaluation set on the host: every row [N, L], and its batches (for teacher forcing)."""

    fed: np.ndarray  # int32: the input as decoding reads it while right (answer inputs = targets)
    prevmask: np.ndarray  # bool: the input at t is an answer token (mask[:, t - 1])
    targets: np.ndarray
    mask: np.ndarray  # bool
    positions: np.ndarray | None  # None, [L] (shared), [N, L] or [N, L, A] (multi-axis ids)
    batches: list  # (lo, hi, positions of the batch as drawn)
    span: tuple | None
    fed_is_inputs: bool  # the inputs are what decoding reads while right (answer inputs = targets)


def _make_set(parts) -> _Set:
    """The :class:`_Set` of ``[(batch, positions)]`` (batches of one length)."""
    feds, prevs, targets, masks, batches, lo, same = [], [], [], [], [], 0, True
    for batch, positions in parts:
        inputs = np.asarray(batch["inputs"], np.int32)
        target = np.asarray(batch["targets"], np.int32)
        mask = np.asarray(batch["mask"]) > 0
        prev = np.zeros_like(mask)
        prev[:, 1:] = mask[:, :-1]
        fed = inputs.copy()
        fed[:, 1:] = np.where(prev[:, 1:], target[:, :-1], inputs[:, 1:])
        same = same and bool((fed == inputs).all())
        feds.append(fed), prevs.append(prev), targets.append(target), masks.append(mask)
        batches.append((lo, lo + len(inputs), None if positions is None else np.asarray(positions, np.int32)))
        lo += len(inputs)
    fed, mask = np.concatenate(feds), np.concatenate(masks)
    positions = None
    if any(p is not None for *_, p in batches):
        length = fed.shape[1]
        axes = next((p.shape[2:] for *_, p in batches if p is not None and p.ndim == 3), ())
        positions = np.concatenate([_rows(p, hi - lo, length, axes) for lo, hi, p in batches])
        if positions.ndim == 2 and (positions == positions[:1]).all():
            positions = positions[0]  # shared by every row: rotated once per step
    return _Set(fed, np.concatenate(prevs), np.concatenate(targets), mask, positions, batches,
                answer_span(mask), same)


def _rows(positions, n: int, length: int, axes: tuple) -> np.ndarray:
    """A batch's positions as ``n`` rows [n, length] (+ ``axes``: one-axis positions then the same on
    every axis); None: 0 .. length - 1."""
    if positions is None:
        positions = np.arange(length, dtype=np.int32)
    if axes and positions.ndim < 3:
        positions = positions[..., None]
    return np.broadcast_to(positions, (n, length) + axes)


class _Pace:
    """How many steps a segment runs: about :data:`SEGMENT_SECONDS`, from the rate of the segments so far
    (per step, row and cache slot: a step streams every row's whole cache). The first segment of a
    program shape ``(rows, slots)`` is short: its time may hold the compile, and is not a rate."""

    def __init__(self):
        self.per_slot = None
        self.last = FIRST_SEGMENT
        self.seen = set()

    def steps(self, shape) -> int:
        if self.per_slot is None or shape not in self.seen:
            return FIRST_SEGMENT
        want = int(SEGMENT_SECONDS / max(self.per_slot * shape[0] * shape[1], 1e-12))
        self.last = max(1, min(want, 4 * self.last, 1 << 16))  # grow at most 4x a segment
        return self.last

    def record(self, shape, steps: int, seconds: float):
        if shape in self.seen:
            self.per_slot = seconds / max(steps * shape[0] * shape[1], 1)
        self.seen.add(shape)


def _bucket(rows: int, group: int) -> int:
    """The rows of a group of ``rows`` examples: a power of two up to ``group``."""
    return min(group, 1 << max(rows - 1, 0).bit_length())


def _capacity(slots: int, end: int) -> int:
    """The cache size for ``slots`` written slots: the next size of the grid 256 * {1, 1.5} * 2**k,
    at most ``end``. A step streams the whole cache, so the cache grows with the tokens; the grid
    is the same at every length, so are the programs of each size."""
    size = CACHE_GRID
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


def _piece(block: int, rows: int, max_tokens: int) -> int:
    """Tokens per prefill forward: the attention block, at most ``max_tokens`` over ``rows`` rows."""
    if not max_tokens:
        return block
    budget = max(max_tokens // rows, 1)
    return min(block, 1 << (budget.bit_length() - 1))


def _first_wrong(forced, data: _Set, models: int, rows: int, bar) -> np.ndarray:
    """Step 1 (module docstring): each model's first wrong answer target of each row [M, N] (L: none)."""
    n, length = data.fed.shape
    end = data.span[1]
    if bar is not None:
        bar.reset(total=n)
        bar.unit = "row"
        bar.set_description(f"decode {length}: teacher-forced")
    first = np.full((models, n), length, np.int64)
    for lo, hi, positions in data.batches:
        for a in range(lo, hi, rows):
            b = min(a + rows, hi)
            pos = positions if positions is None or positions.ndim == 1 else positions[a - lo:b - lo]
            first[:, a:b] = np.asarray(forced(jnp.asarray(data.fed[a:b]), jnp.asarray(data.targets[a:b]),
                                              jnp.asarray(data.mask[a:b].astype(np.int32)), pos, end))
            if bar is not None:
                bar.update(b - a)
                bar.set_postfix_str("")
    return first


@dataclasses.dataclass(frozen=True)
class _Group:
    """Rows of one model decoded together: from ``start`` (a prefill up to there) to ``stop``."""

    model: int
    rows: np.ndarray  # the set's rows
    size: int  # rows of the programs (``rows`` padded with copies of its last)
    piece: int  # tokens per prefill forward
    start: int
    stop: int


def _groups(first: np.ndarray, data: _Set, *, group: int, block: int, max_tokens: int) -> list[_Group]:
    """Step 2 (module docstring): the wrong rows of each model, sorted by their first error, in groups."""
    length = data.fed.shape[1]
    last = np.where(data.mask, np.arange(length), -1).max(axis=1)  # last answer target of each row
    out = []
    for m, errors in enumerate(first):
        wrong = np.flatnonzero(errors < length)
        order = wrong[np.argsort(errors[wrong], kind="stable")]
        for i in range(0, len(order), group):
            idx = order[i:i + group]
            size = _bucket(len(idx), group)
            piece = _piece(block, size, max_tokens)
            start = int(errors[idx].min()) // piece * piece
            start = start if start >= MIN_PREFILL else 0  # a short prompt: steps from the first token
            out.append(_Group(m, idx, size, piece, start, int(last[idx].max()) + 1))
    return out


def _decode_group(graphdef, states, g: _Group, data: _Set, pace: _Pace, info: dict, progress) -> np.ndarray:
    """Step 3 (module docstring): the predictions [rows, stop - start] of the group's rows."""
    end = data.span[1]
    per_row = _per_row(data.positions)
    rows = np.concatenate([g.rows, np.full(g.size - len(g.rows), g.rows[-1])])

    def inputs(slots):  # what a program over ``slots`` cache slots reads (shapes of that size only)
        positions = None if data.positions is None else jnp.asarray(
            data.positions[rows, :slots] if per_row else data.positions[:slots])
        return jnp.asarray(data.fed[rows, :slots]), jnp.asarray(data.prevmask[rows, :slots]), positions

    clock = time.perf_counter()
    slots = _capacity(g.start + 1, end)
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
            slots = _capacity(t + 1, end)
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


def _decode_set(graphdef, models: list, forced, data: _Set, *, group: int, rows: int, max_tokens: int,
                bar=None, stats=None, first_errors=None) -> list:
    """The ``correct`` [N, L] of each model (``models``: each one's state tuple for ``nnx.merge``).

    ``forced(fed, targets, mask, positions, end)`` -> first errors [M, rows] of every model;
    ``group``: rows decoded together; ``rows``: rows per teacher-forced forward; ``max_tokens``:
    tokens per forward (0: no bound); ``stats``: a dict to fill with what was done;
    ``first_errors`` [M, N]: step 1's result, from the evaluation's own teacher-forced pass (used
    where that pass read what decoding reads, ``_Set.fed_is_inputs``; else step 1 runs).
    """
    n, length = data.fed.shape
    correct = [data.mask.copy() for _ in models]  # right where not decoded (the shortcut)
    info = stats if stats is not None else {}
    info.clear()
    info.update(rows=n, decoded_rows=0, groups=[], segments=0, prefill_pieces=0, forced_rows_per_forward=rows,
                steps=0, cache_sizes=set(), seconds={"forced": 0.0, "prefill": 0.0, "steps": 0.0})
    if data.span is None:
        return correct
    clock = time.perf_counter()
    reuse = first_errors is not None and data.fed_is_inputs
    info["forced_pass"] = "evaluation" if reuse else "own"
    if reuse:
        first = np.asarray(first_errors, np.int64).reshape(len(models), n)
    else:
        first = _first_wrong(forced, data, len(models), rows, bar)
    info["seconds"]["forced"] = time.perf_counter() - clock
    blocks = nnx.merge(graphdef, *models[0]).blocks
    groups = _groups(first, data, group=group, block=int(getattr(blocks[0].attn, "block", 512)),
                     max_tokens=max_tokens)
    info["decoded_rows"] = sum(len(g.rows) for g in groups)
    if bar is not None:
        bar.reset(total=sum(g.stop - g.start for g in groups))
        bar.unit = "step"
        bar.set_description(f"decode {length}: {info['decoded_rows']}/{n * len(models)} rows")
    pace = _Pace()
    for i, g in enumerate(groups):
        def progress(k, note, i=i):
            if bar is not None:
                bar.update(k)
                bar.set_postfix_str(f"group {i + 1}/{len(groups)} {note}".strip())

        predicted = _decode_group(graphdef, models[g.model], g, data, pace, info, progress)
        span = data.mask[g.rows, g.start:g.stop]
        correct[g.model][g.rows, g.start:g.stop] = (predicted == data.targets[g.rows, g.start:g.stop]) & span
    return correct


def _bar(config, length: int):
    enabled = bool(config.train.get("progress", True)) and jax.process_index() == 0
    return progress_lib.progress(0, 0, enabled, desc=f"decode {length}", delay=PROGRESS_DELAY, leave=False)


def _run(graphdef, models, forced, data, *, group, rows, max_tokens, config=None, stats=None,
         first_errors=None):
    bar = None if config is None else _bar(config, data.fed.shape[1])
    try:
        return _decode_set(graphdef, models, forced, data, group=group, rows=rows, max_tokens=max_tokens,
                           bar=bar, stats=stats, first_errors=first_errors)
    finally:
        if bar is not None:
            bar.close()


def _single(graphdef, state):
    """``forced`` of :func:`_decode_set` for one model."""
    fn = _jitted(_forced, ("end",))

    def forced(fed, targets, mask, positions, end):
        return fn(graphdef, state, fed, targets, mask, positions, end=end)[None]

    return forced


def answer_correctness(model, batch, *, positions=None, stats=None):
    """``(correct, mask)``, both bool [B, L]: which answer tokens greedy decoding gets right.

    ``batch``: ``inputs``, ``targets``, ``mask`` of a task (module docstring);
    ``positions``: the model's positions ([L] or [B, L]; default 0..L-1);
    ``stats``: a dict to fill with what was decoded (rows, groups, segments, steps).
    ``correct`` is False wherever ``mask`` is.
    """
    data = _make_set([(batch, positions)])
    graphdef, state = nnx.split(model)
    size = data.fed.shape[0]
    group = min(size, GROUP_ROWS) if GROUP_ROWS else size
    (correct,) = _run(graphdef, [(state,)], _single(graphdef, state), data, group=group, rows=size,
                      max_tokens=0, stats=stats)
    return correct, data.mask


def _eval_set(task, config, length: int, root, min_size) -> _Set:
    """The evaluation set at ``length``: ``eval.num_batches`` batches of ``eval.batch_size``."""
    batch_size, positions = int(config.eval.batch_size), specs.Positions.from_config(config)
    if root is None:
        root = jax.random.fold_in(jax.random.key(int(config.eval.seed)), int(length))
    parts = [eval_lib.eval_batch(task, positions, jax.random.fold_in(root, i), batch_size, int(length),
                                 min_size=min_size) for i in range(int(config.eval.num_batches))]
    return _make_set(parts)


def _budget(config, length: int) -> tuple[int, int, int]:
    """``(group, rows, max_tokens)``: rows decoded together, rows per teacher-forced forward, the bound."""
    batch_size = int(config.eval.batch_size)
    max_tokens = int(config.eval.get("max_tokens_per_step", 0))
    group = min(batch_size, GROUP_ROWS) if GROUP_ROWS else batch_size
    return group, eval_lib.rows_per_step(batch_size, int(length), max_tokens), max_tokens


def eval_correctness(model, task, config, length: int, *, root=None, min_size=None, stats=None,
                     first_errors=None):
    """``(correct, mask)`` [N, L] of greedy decoding over the evaluation set at ``length``.

    The examples (and randomized positions) of :func:`posenc.training.evaluate.evaluate_length`
    (``root``: its key; ``min_size``: its size bin): ``eval.num_batches`` batches of
    ``eval.batch_size``, decoded as the module docstring says (no forward over more than
    ``eval.max_tokens_per_step`` tokens). ``stats``: a dict to fill with what was decoded.
    ``first_errors`` [N]: each row's first wrong answer target under the evaluation's teacher
    forcing (``eval_step.eval_length_fn(..., errors=True)``), which then replaces step 1.
    """
    data = _eval_set(task, config, length, root, min_size)
    graphdef, state = nnx.split(model)
    group, rows, max_tokens = _budget(config, length)
    (correct,) = _run(graphdef, [(state,)], _single(graphdef, state), data, group=group, rows=rows,
                      max_tokens=max_tokens, config=config, stats=stats, first_errors=first_errors)
    return correct, data.mask


def eval_correctness_seeds(graphdef, params, rest, task, config, length: int, *, root=None,
                           min_size=None, stats=None, first_errors=None) -> list[tuple]:
    """:func:`eval_correctness` of S models of one graph at once: ``[(correct, mask)]``, one per model.

    ``params``: their ``nnx.Param`` states stacked [S]; ``rest``: the other state of one of them.
    The examples are drawn once; the teacher-forced pass runs the S models in one ``jax.vmap``-ed
    call per row chunk, and each model decodes its own wrong rows (one program for all of them).
    Each model's answers are its own :func:`eval_correctness`'s up to float32 rounding.
    ``first_errors`` [S, N]: as :func:`eval_correctness`'s, one row per model.
    """
    size = jax.tree.leaves(params)[0].shape[0]
    data = _eval_set(task, config, length, root, min_size)
    fn = _jitted(_forced_seeds, ("end",))

    def forced(fed, targets, mask, positions, end):
        return fn(graphdef, params, rest, fed, targets, mask, positions, end=end)

    models = [(jax.tree.map(lambda x: x[j], params), rest) for j in range(size)]
    group, rows, max_tokens = _budget(config, length)
    corrects = _run(graphdef, models, forced, data, group=group, rows=rows, max_tokens=max_tokens,
                    config=config, stats=stats, first_errors=first_errors)
    return [(c, data.mask) for c in corrects]


def decoded_metrics(correct, mask) -> dict:
    """``decoded_accuracy`` (answer tokens right) and ``decoded_exact_match`` (examples all right).

    None where there is nothing to score (no answer tokens / no example with one).
    """
    correct, mask = np.asarray(correct, bool), np.asarray(mask, bool)
    has = mask.any(axis=1)
    tokens = int(mask.sum())
    exact = (correct | ~mask).all(axis=1) & has
    return {"decoded_accuracy": float(correct.sum() / tokens) if tokens else None,
            "decoded_exact_match": float(exact.sum() / has.sum()) if has.any() else None}
