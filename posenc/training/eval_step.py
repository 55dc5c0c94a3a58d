"""Jitted evaluation programs: one (batch, row chunk) per call, or a whole length per call.

:func:`eval_step_fn` runs the model on rows ``[chunk * rows, (chunk + 1) *
rows)`` of one evaluation batch; :func:`eval_length_fn` runs every batch and
chunk of a length inside one compiled loop (one model, or S models of one
graph vmapped over their stacked parameters). Both return summed
statistics, so chunks, batches and calls add up exactly. Programs are cached
beside the train steps (``step.clear_cache`` forgets both).

A task's ``traced_options`` (e.g. passkey's ``depth``) enter
:func:`eval_length_fn`'s program as arguments, not constants: the points of an
evaluation sweep over them (depth 0, 0.25, ..., 1) share one compiled program
per length, with the batches those of a program compiled for each value.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.training import sharding as sharding_lib
from posenc.training import specs
from posenc.training import step as step_lib
from posenc.training.step import _batch, _token_terms, positions_for


def rows_per_step(batch_size: int, length: int, max_tokens: int, devices: int = 1) -> int:
    """The largest divisor of ``batch_size`` (a multiple of ``devices``) within ``max_tokens`` per step.

    At least ``devices`` rows (one per device) even if that exceeds the budget; 0 = no budget.
    """
    if not max_tokens:
        return batch_size
    fits = [r for r in range(devices, batch_size + 1, devices) if batch_size % r == 0
            and r * length <= max_tokens]
    return max(fits) if fits else devices


def eval_batch(task, positions: specs.Positions, key, batch_size: int, length: int, *, min_size=None):
    """``(batch, positions)``: the evaluation batch of ``key`` (``split="eval"``), as evaluation draws it.

    ``min_size``: the smallest problem size (an evaluation bin; default: exactly the largest).
    """
    return _batch(task, positions, key, int(batch_size), int(length), split="eval", min_size=min_size)


def _eval_parts(p: specs.LengthProgram, mesh):
    """``(batch_of(key, index), rows_of(batch, positions, chunk), sums(model, batch, positions))``.

    ``p.errors``: ``sums`` also gives ``first_error`` [rows], each row's first wrong answer target
    (``length`` where none): where greedy decoding of the row can first differ from its targets.
    """
    task, length, batch_size, rows = p.task.make(), p.length, p.batch_size, p.rows
    count, stride = p.windows if p.windows is not None else (None, None)

    def batch_of(key, index, values=None):
        task_ = task if not values else task.with_traced(values)
        if p.sequential:
            batch = task_.sequential_batch(index, batch_size, length, split="eval", count=count, stride=stride)
            return batch, positions_for(p.positions, jax.random.split(key)[1], batch_size, length)
        return _batch(task_, p.positions, key, batch_size, length, split="eval", min_size=p.min_size)

    def rows_of(batch, positions, chunk):
        if rows < batch_size:
            def take(x):
                return jax.lax.dynamic_slice_in_dim(x, chunk * rows, rows, axis=0)

            batch = jax.tree.map(take, batch)
            if positions is not None and positions.ndim >= 2:  # per example: [B, L] or [B, L, A]
                positions = take(positions)
        if mesh is not None:
            batch, positions = sharding_lib.constrain_batch((batch, positions), mesh)
        return batch, positions

    def sums(model, batch, positions):
        logits = model(batch["inputs"], positions, deterministic=True)
        mask, ce, correct, has_answer, right = _token_terms(logits, batch["targets"], batch["mask"])
        out = {
            "loss_sum": (ce * mask).sum(),
            "correct_sum": (correct * mask).sum(),
            "mask_sum": mask.sum(),
            "exact_sum": right.sum().astype(jnp.float32),
            "examples": has_answer.sum().astype(jnp.float32),
        }
        if p.per_position:
            out["position_loss"] = (ce * mask).sum(0)
            out["position_mask"] = mask.sum(0)
        if p.errors:
            wrong = (correct == 0) & (mask > 0)
            out["first_error"] = jnp.where(wrong.any(-1), jnp.argmax(wrong, -1), length).astype(jnp.int32)
        return out

    return batch_of, rows_of, sums


def _check_rows(batch_size, rows, mesh) -> int:
    rows = int(batch_size if rows is None else rows)
    if batch_size % rows:
        raise ValueError(f"rows {rows} must divide the eval batch size {batch_size}")
    sharding_lib.check_batch_size(rows, mesh, name="eval rows per step")
    return rows


def _program(task, positions, length, batch_size, num_batches, rows, mesh, *, traced=True, **fields):
    """The :class:`~posenc.training.specs.LengthProgram` of these arguments, and the traced values.

    ``traced``: the task's traced option values are arguments (returned), not part of the program.
    """
    spec = specs.TaskSpec.of(task)
    values = spec.traced if traced else {}
    rows = _check_rows(int(batch_size), rows, mesh)
    program = specs.LengthProgram(spec.untraced() if traced else spec, positions, int(length), int(batch_size),
                                  int(num_batches), rows, traced=tuple(sorted(values)), **fields)
    return program, values


def eval_step_fn(task, positions: specs.Positions, length: int, batch_size: int, *, rows: int | None = None,
                 per_position: bool = False, sequential: bool = False, mesh=None, min_size=None,
                 windows=None):
    """``step(graphdef, state, key, chunk) -> sums`` for the model's ``(graphdef, state)``.

    The batch of ``key`` has ``batch_size`` examples; one call runs the model
    on its rows ``[chunk * rows, (chunk + 1) * rows)`` only (``rows`` divides
    ``batch_size``; default all), so evaluation memory follows ``rows *
    length`` while the examples stay those of the whole batch. Returns summed
    statistics (so chunks and batches add up exactly): loss_sum,
    correct_sum, mask_sum, exact_sum, examples; with ``per_position`` also
    ``position_loss`` [L] and ``position_mask`` [L] (sums over the rows).
    With ``mesh`` the rows are sharded over its devices (ValueError if
    ``rows`` does not divide over them). With ``sequential`` (a task with
    ``sequential_batch``, e.g. text) the step is ``step(graphdef, state, key,
    chunk, index)``: the batch is the task's held-out batch ``index``
    (consecutive windows) and ``key`` only draws randomized positions.
    :func:`eval_length_fn` runs every batch and chunk of a length in one call.
    """
    program, _ = _program(task, positions, length, batch_size, 1, rows, mesh, traced=False,
                          per_position=per_position, sequential=sequential, min_size=min_size, windows=windows)
    return _eval_step_program(program, mesh)


@functools.cache
def _eval_step_program(p: specs.LengthProgram, mesh):
    batch_of, rows_of, sums = _eval_parts(p, mesh)

    def step(graphdef, state, key, chunk, index=None):
        batch, positions = rows_of(*batch_of(key, index), chunk)
        return sums(nnx.merge(graphdef, state), batch, positions)

    return jax.jit(step)


def eval_length_fn(task, positions: specs.Positions, length: int, batch_size: int, num_batches: int, *,
                   rows: int | None = None, per_position: bool = False, sequential: bool = False,
                   mesh=None, seeds: bool = False, min_size=None, windows=None, errors: bool = False):
    """``run(graphdef, state, root) -> sums``: every batch and row chunk of one length in one call.

    Batch ``i`` is :func:`eval_step_fn`'s batch of key ``fold_in(root, i)``
    (``sequential``: held-out batch ``i``); its ``batch_size / rows`` chunks
    run one after another inside one compiled loop, and the sums add in the
    order of one call per chunk, so the totals are those of
    :func:`eval_step_fn` called chunk by chunk. Memory is that of one chunk.

    ``seeds``: ``run(graphdef, params, rest, root)`` evaluates S models of
    one graph at once: ``params`` are their ``nnx.Param`` states stacked on a
    leading [S] axis (``jax.vmap``-ed), ``rest`` the other state of one of
    them (RNG streams, unused by the deterministic forward); every sum gains
    a leading [S] axis. The batches are drawn once for all S. One device.

    The task's traced option values (:attr:`~posenc.training.specs.TaskSpec.traced`) are
    arguments of the compiled program (bound in the returned function), so tasks that differ
    only in them share it. The program is a ``functools.cache``-d function of its
    :class:`~posenc.training.specs.LengthProgram`.

    ``errors``: the sums also hold ``first_error`` [num_batches * batch_size] ([S, ...] with
    ``seeds``): each row's first wrong answer target (``length``: none), which
    ``posenc.training.decode`` starts decoding from.
    """
    program, values = _program(task, positions, length, batch_size, num_batches, rows, mesh,
                               per_position=per_position, sequential=sequential, min_size=min_size,
                               windows=windows, seeds=seeds, errors=errors)
    return _Bound(_eval_length_program(program, mesh), values)


class _Bound:
    """A compiled evaluation program with its last argument (the traced option values) bound."""

    def __init__(self, program, values: dict):
        self.program, self.values = program, {o: jnp.float32(v) for o, v in values.items()}

    def __call__(self, *args):
        return self.program(*args, self.values)

    def _cache_size(self) -> int:
        return self.program._cache_size()


@functools.cache
def _eval_length_program(p: specs.LengthProgram, mesh):
    """The jitted program of :func:`eval_length_fn`, its last argument the traced option values."""
    batch_of, rows_of, sums = _eval_parts(p, mesh)
    seeds, errors, num_batches, batch_size = p.seeds, p.errors, p.num_batches, p.batch_size
    chunks = batch_size // p.rows

    def run(graphdef, state, rest, root, values):
        if seeds:
            def forward(batch, positions):
                return jax.vmap(lambda p: sums(nnx.merge(graphdef, p, rest), batch, positions))(state)
        else:
            def forward(batch, positions):
                return sums(nnx.merge(graphdef, state), batch, positions)

        def one_batch(i, carry):
            batch, positions = batch_of(jax.random.fold_in(root, i), i, values)

            def one_chunk(c, carry):
                total, firsts = carry
                out = forward(*rows_of(batch, positions, c))
                if errors:  # rows i * batch_size + c * rows ... of the length's set
                    firsts = jax.lax.dynamic_update_slice_in_dim(firsts, out.pop("first_error"),
                                                                 i * batch_size + c * p.rows, axis=firsts.ndim - 1)
                return jax.tree.map(jnp.add, total, out), firsts

            return jax.lax.fori_loop(0, chunks, one_chunk, carry)

        shapes = jax.eval_shape(lambda: forward(*rows_of(*batch_of(root, jnp.int32(0), values), 0)))
        first = shapes.pop("first_error", None)
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        firsts = None if first is None else jnp.zeros(first.shape[:-1] + (num_batches * batch_size,), jnp.int32)
        total, firsts = jax.lax.fori_loop(0, num_batches, one_batch, (zeros, firsts))
        return total if firsts is None else {**total, "first_error": firsts}

    return jax.jit(run if seeds else lambda graphdef, state, root, values: run(graphdef, state, None, root, values))


step_lib.EVAL_PROGRAMS.extend((_eval_step_program, _eval_length_program))
