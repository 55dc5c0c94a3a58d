"""How an evaluation set is decoded: each row's first error, then the failing rows in groups.

The machinery behind :func:`posenc.training.decode.eval_correctness` (and
``answer_correctness``: one batch), with the answers of step-by-step greedy
decoding (:mod:`posenc.training.decode`):

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
2. The rows with an error (of every batch of the length; or a seeded sample
   of them, ``choose``: :mod:`posenc.training.decode_sample`), sorted by their
   first error, are decoded in groups of at most
   :attr:`~posenc.training.decode_steps.Schedule.group_rows` rows (and at most
   ``eval.batch_size``; a last group of fewer rows runs in a power-of-two
   group): one cache for the group, prefilled in pieces of at most
   ``eval.max_tokens_per_step`` tokens (only the prefill is a full forward)
   up to the group's earliest first error (rounded down to a piece; none
   below :attr:`~posenc.training.decode_steps.Schedule.min_prefill` tokens),
   then one token per row and step up to the group's last answer token (not
   the padded length): :mod:`posenc.training.decode_steps`. Small groups of
   rows with close first errors keep the steps on short caches.

A progress bar per length shows on stderr (``train.progress``; after
:attr:`~posenc.training.decode_steps.Schedule.progress_delay` seconds).

The results are those of decoding each row on its own from its prompt, up
to float32 rounding (a near tie of the argmax may break another way: the
teacher-forced forward, the prefill and the steps are different programs).
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.training import progress as progress_lib
from posenc.training.decode_steps import Schedule, _decode_group, _Group, _jitted, _Pace, _slice


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


def _bucket(rows: int, group: int) -> int:
    """The rows of a group of ``rows`` examples: a power of two up to ``group``."""
    return min(group, 1 << max(rows - 1, 0).bit_length())


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


def _groups(first: np.ndarray, chosen: np.ndarray, data: _Set, *, group: int, block: int, max_tokens: int,
            min_prefill: int) -> list[_Group]:
    """Step 2 (module docstring): the ``chosen`` [M, N] wrong rows of each model, sorted by their first
    error, in groups."""
    length = data.fed.shape[1]
    last = np.where(data.mask, np.arange(length), -1).max(axis=1)  # last answer target of each row
    out = []
    for m, errors in enumerate(first):
        wrong = np.flatnonzero(chosen[m])
        order = wrong[np.argsort(errors[wrong], kind="stable")]
        for i in range(0, len(order), group):
            idx = order[i:i + group]
            size = _bucket(len(idx), group)
            piece = _piece(block, size, max_tokens)
            start = int(errors[idx].min()) // piece * piece
            start = start if start >= min_prefill else 0  # a short prompt: steps from the first token
            out.append(_Group(m, idx, size, piece, start, int(last[idx].max()) + 1))
    return out


class Decoded(NamedTuple):
    """What :func:`_decode_set` found, for ``M`` models and the ``N`` rows of a set of length ``L``."""

    correct: list  # each model's bool [N, L]: answer tokens right decoded; a failing row not chosen:
    #                right up to its first error, False from there (its decoded tokens unknown)
    first: np.ndarray  # int [M, N]: each row's first wrong answer target (L: none, the row is right)
    decoded: np.ndarray  # bool [M, N]: the failing rows decoded (every failing row unless ``choose`` chose)


def _decode_set(graphdef, models: list, forced, data: _Set, *, group: int, rows: int, max_tokens: int,
                schedule: Schedule, choose=None, bar=None, stats=None, first_errors=None) -> Decoded:
    """The answers (:class:`Decoded`) of each model (``models``: each one's state tuple for ``nnx.merge``).

    ``forced(fed, targets, mask, positions, end)`` -> first errors [M, rows] of every model;
    ``group``: rows decoded together; ``rows``: rows per teacher-forced forward; ``max_tokens``:
    tokens per forward (0: no bound); ``schedule``: the steps' pacing (:class:`Schedule`);
    ``choose(first)`` -> bool [M, N]: the failing rows to decode (None: every one); ``stats``: a dict
    to fill with what was done; ``first_errors`` [M, N]: step 1's result, from the evaluation's own
    teacher-forced pass (used where that pass read what decoding reads, ``_Set.fed_is_inputs``; else
    step 1 runs).
    """
    n, length = data.fed.shape
    correct = [data.mask.copy() for _ in models]  # right where not decoded (the shortcut)
    info = stats if stats is not None else {}
    info.clear()
    info.update(rows=n, decoded_rows=0, failing_rows=0, groups=[], segments=0, prefill_pieces=0,
                forced_rows_per_forward=rows, steps=0, cache_sizes=set(),
                seconds={"forced": 0.0, "prefill": 0.0, "steps": 0.0})
    if data.span is None:
        none = np.zeros((len(models), n), bool)
        return Decoded(correct, np.full((len(models), n), length, np.int64), none)
    clock = time.perf_counter()
    reuse = first_errors is not None and data.fed_is_inputs
    info["forced_pass"] = "evaluation" if reuse else "own"
    if reuse:
        first = np.asarray(first_errors, np.int64).reshape(len(models), n)
    else:
        first = _first_wrong(forced, data, len(models), rows, bar)
    info["seconds"]["forced"] = time.perf_counter() - clock
    failing = first < length
    chosen = failing if choose is None else np.asarray(choose(first), bool) & failing
    for m, rows_left in enumerate(failing & ~chosen):  # not decoded: right up to the first error, known
        correct[m][rows_left] &= np.arange(length) < first[m, rows_left, None]
    blocks = nnx.merge(graphdef, *models[0]).blocks
    groups = _groups(first, chosen, data, group=group, block=int(getattr(blocks[0].attn, "block", 512)),
                     max_tokens=max_tokens, min_prefill=schedule.min_prefill)
    info["decoded_rows"], info["failing_rows"] = sum(len(g.rows) for g in groups), int(failing.sum())
    if bar is not None:
        bar.reset(total=sum(g.stop - g.start for g in groups))
        bar.unit = "step"
        sample = f" (a sample of {info['failing_rows']} failing)" if (chosen != failing).any() else ""
        bar.set_description(f"decode {length}: {info['decoded_rows']}/{n * len(models)} rows{sample}")
    pace = _Pace(schedule)
    for i, g in enumerate(groups):
        def progress(k, note, i=i):
            if bar is not None:
                bar.update(k)
                bar.set_postfix_str(f"group {i + 1}/{len(groups)} {note}".strip())

        predicted = _decode_group(graphdef, models[g.model], g, data, pace, info, progress)
        span = data.mask[g.rows, g.start:g.stop]
        correct[g.model][g.rows, g.start:g.stop] = (predicted == data.targets[g.rows, g.start:g.stop]) & span
    return Decoded(correct, first, chosen)


def _bar(config, length: int, delay: float):
    enabled = bool(config.train.get("progress", True)) and jax.process_index() == 0
    return progress_lib.progress(0, 0, enabled, desc=f"decode {length}", delay=delay, leave=False)


def _run(graphdef, models, forced, data, *, group, rows, max_tokens, schedule=None, choose=None, config=None,
         stats=None, first_errors=None) -> Decoded:
    """:func:`_decode_set` with a progress bar (``config``'s ``train.progress``; none without a config)."""
    schedule = schedule or Schedule()
    bar = None if config is None else _bar(config, data.fed.shape[1], schedule.progress_delay)
    try:
        return _decode_set(graphdef, models, forced, data, group=group, rows=rows, max_tokens=max_tokens,
                           schedule=schedule, choose=choose, bar=bar, stats=stats, first_errors=first_errors)
    finally:
        if bar is not None:
            bar.close()


def _single(graphdef, state):
    """``forced`` of :func:`_decode_set` for one model."""
    fn = _jitted(_forced, ("end",))

    def forced(fed, targets, mask, positions, end):
        return fn(graphdef, state, fed, targets, mask, positions, end=end)[None]

    return forced
