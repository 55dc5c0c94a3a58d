"""Train the seeds of one config together: one jitted step, ``jax.vmap``-ed over the seeds.

``run_seeds(configs, workdirs)`` does what ``loop.run(config, workdir)``
does for each config, for configs that differ only in ``train.seed``: the S
``(model, optimizer)`` states (same graph) are stacked on a leading axis and
trained by one ``jax.vmap`` of the train step (``step.seeds_train_chunk_fn``:
``train.steps_per_call`` vmapped steps per compiled call) through the same
step loop as a single run (:mod:`~posenc.training.steploop`). Fit checks and
the final evaluation run the seeds together too
(``evaluate.evaluate_length_seeds``, ``evaluate.evaluate_seeds``: one
vmapped call per length), the stack padded to the group's size so that a
seed leaving it does not recompile them.
Seed ``i`` starts from ``nnx.Rngs(seed_i)`` and trains on the data keys of
its own run, so its metrics, checkpoints and results equal those of
``loop.run`` up to float32 rounding (batched matmuls may sum in another
order). Every run keeps its own workdir: config.json, train_log.jsonl,
event files, checkpoints (their records name the cell: the seeds stacked
together) and results.jsonl, each row with ``seeds_trained_together`` = S
and ``train_seconds`` the wall time of the joint training.

Evaluations during training (``train.eval_every``, :mod:`~posenc.training.selection`)
run the seeds together too (one vmapped call per length), each seed logging its
rows and keeping its own selected state; the final evaluation scores the
selected states together as well.

A seed leaves the stack when it diverges (NaN / Inf at a boundary: no
checkpoint after its last good one; returned as its
:class:`~posenc.workdir.records.NonFiniteError`) or when it fits
(``train.fit_accuracy``: it finishes with its own ``steps_to_fit``); the
others go on (the step recompiles once for the smaller stack).

A killed cell resumes bit-identical to an uninterrupted one, wherever the
kill fell: the rows of a vmapped step are independent, but the compiled
program (the stack's size, vmapped or not) changes the float32 rounding, so
a resumed cell runs the programs of the uninterrupted one. Seeds that
resume from different steps (a kill between the seeds' checkpoints) train
from the earliest in the stack of the whole cell, each seed that resumes
later (or has finished, or fitted) holding its row until it joins (or
until the step it left at); seeds evaluated in an earlier process keep
their rows in the stack of the final evaluation; a seed restored fitted
trains no more. Seeds whose checkpoints were written outside a cell
(``loop.run``) train in groups of equal start step; a group of one runs
``loop.run``. One device only: several devices train with ``loop.run``'s
data parallelism.

Speed (docs/performance.md), on 2 CPU cores: the quick grid's model
(batch 32, length 16, d_model 64) steps about 14% faster vmapped (3
seeds) and a grid cell finishes 4-8% sooner; larger models (length 32
and up, or d_model 256) step 5-45% slower.
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from posenc.training import evaluate as evaluate_lib
from posenc.training import finish as finish_lib
from posenc.training import loop, prepare, selection, steploop
from posenc.training import progress as progress_lib
from posenc.training import sharding as sharding_lib
from posenc.training import step as step_lib
from posenc.workdir import records, results


@dataclasses.dataclass
class SeedRun:
    """One run of a seed group: its resolved config, workdir, model and bookkeeping."""

    index: int  # position in the caller's lists
    name: str | None
    resolved: prepare.Resolved
    workdir: str
    model: object = None
    optimizer: object = None
    book: records.RunLog | None = None
    evals: selection.Evaluations | None = None  # its evaluations during training (train.eval_every)
    state: object = None  # its own (unstacked) state once it leaves the stack
    result: object = None  # rows, a NonFiniteError, or None (stopped early)
    steps_trained: int = 0


def _without_seed(config) -> str:
    d = json.loads(results.canonical_json(config.to_dict()))
    d["train"].pop("seed", None)
    return results.canonical_json(d)


def _check(configs) -> None:
    if not configs:
        raise ValueError("run_seeds needs at least one config")
    seeds = [int(c.train.seed) for c in configs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"run_seeds needs distinct train.seed values, got {seeds}")
    first = _without_seed(configs[0])
    for c in configs[1:]:
        if _without_seed(c) != first:
            raise ValueError(f"run_seeds trains configs that differ only in train.seed; the config of "
                             f"seed {int(c.train.seed)} differs from that of seed {seeds[0]} elsewhere")
    if sharding_lib.mesh_or_none(configs[0]) is not None:
        raise ValueError("run_seeds runs on one device; with several devices (mesh.data != 1) use loop.run")


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


@jax.jit
def _take_compiled(tree, index):
    return jax.tree.map(lambda x: x[index], tree)


def _take(tree, index):
    """Row ``index`` (an int) or rows (a sequence) of every leaf of ``tree``: one compiled call
    instead of an eager gather per leaf (a state has about 60)."""
    return _take_compiled(tree, jnp.asarray(index, jnp.int32))


def run_seeds(configs, workdirs, *, names=None, max_steps_this_run: int | None = None) -> list:
    """``loop.run`` of each ``configs[i]`` in ``workdirs[i]``, the seeds trained together.

    The configs must differ only in ``train.seed`` (ValueError otherwise, before
    any workdir is claimed). Returns, per config, its results rows, None if
    stopped by ``max_steps_this_run`` before the end, or the
    :class:`~posenc.workdir.records.NonFiniteError` of a diverged seed
    (``finish.record_divergence`` turns it into rows).
    """
    if len(configs) != len(workdirs):
        raise ValueError(f"got {len(configs)} configs and {len(workdirs)} workdirs")
    resolved = [prepare.resolve(c) for c in configs]  # every config validated before any claim
    _check([r.config for r in resolved])
    names = list(names) if names is not None else [None] * len(configs)
    main = loop.is_main_process()
    out, runs = [], {}
    for i, (rv, w, n) in enumerate(zip(resolved, workdirs, names)):
        done = prepare.claim(rv, w, name=n, main=main)
        out.append(done)  # complete runs: their rows
        if done is None:
            runs[i] = SeedRun(index=i, name=n, resolved=rv, workdir=w)
    graphdef = None
    for r in runs.values():
        r.model, r.optimizer, graphdef, state = loop.init_state(r.resolved)
        r.book = records.RunLog(r.resolved.config, r.workdir, main=main)
        r.state = r.book.restore(state)
        if selection.enabled(r.resolved.config):
            r.evals = selection.Evaluations(r.resolved.config, r.workdir, main=main)
            r.evals.restore(r.book.start)
    seeds = [int(rv.config.train.seed) for rv in resolved]
    # The cell: the seeds that started together in one stack (as their checkpoints record), else
    # the seeds that start now. The others (checkpoints written outside a stack, by loop.run or
    # before records named the cell; seeds new to a cell) train in groups of equal start step.
    listed = {s for r in runs.values() if r.book.start > 0 for s in (r.book.record.cell or ())}
    if listed:
        cell = [i for i in range(len(configs)) if seeds[i] in listed]
    else:
        cell = [i for i in runs if runs[i].book.start == 0]
    by_start = {}
    for r in runs.values():
        if r.index not in cell:
            by_start.setdefault(r.book.start, []).append(r.index)
    groups = ([cell] if any(i in runs for i in cell) else []) + [g for _, g in sorted(by_start.items())]
    for group in groups:
        if len(group) == 1:  # nothing to share: the plain loop
            r = runs[group[0]]
            r.book.close()
            if r.evals is not None:
                r.evals.close()
            try:
                out[r.index] = loop.run(r.resolved, workdirs[r.index], name=r.name,
                                        max_steps_this_run=max_steps_this_run)
            except records.NonFiniteError as e:
                out[r.index] = e
            continue
        members = [runs[i] for i in group if i in runs]
        complete = {i: out[i] for i in group if i not in runs}
        try:
            try:
                _train_cell(group, runs, complete, graphdef, [r.config for r in resolved], max_steps_this_run,
                            main)
            finally:
                for r in members:
                    r.book.close()
            _finish_cell(group, runs, complete)
        finally:
            for r in members:
                if r.evals is not None:
                    r.evals.close()
        for r in members:
            out[r.index] = r.result
    return out


def _left_at(rows, config) -> int:
    """The step after whose boundary a complete run of a cell left its stack (from its rows)."""
    row = rows[0]
    if row.get("diverged_at_step") is not None:  # found at the first boundary from that step
        return steploop.Schedule.of(config, int(config.train.steps)).next_stop(int(row["diverged_at_step"]) - 1)
    return int(row.get("steps_trained") or config.train.steps)


def _diverged(i, runs, complete) -> bool:
    if i in complete:
        return any(r.get("diverged_at_step") is not None for r in complete[i])
    return isinstance(runs[i].result, records.NonFiniteError)


def _finish_cell(cell, runs, complete) -> None:
    """Evaluate the cell's trained seeds together (vmapped, one call per length) and write their rows.

    The stack is that of the cell's uninterrupted evaluation: its seeds that
    did not diverge, in order, padded to the cell's size (as in the fit
    checks, so that the evaluation at the training length reuses their
    compiled program). A seed evaluated in another process (complete) keeps
    its place, filled by another model: each seed's rows are those of an
    uninterrupted run, bit for bit.
    """
    done = [i for i in cell if i in runs and runs[i].result is None and runs[i].state is not None]
    if not done:
        return
    for i in done:
        nnx.update((runs[i].model, runs[i].optimizer), runs[i].state)
    order = [i for i in cell if not _diverged(i, runs, complete)]
    order += [done[0]] * (len(cell) - len(order))
    models = [runs[i].model if i in done else runs[done[0]].model for i in order]
    first = runs[done[0]]
    t0 = time.time()
    evals = evaluate_lib.evaluate_seeds(models, first.resolved)
    seconds = time.time() - t0
    selects = selection.selects(first.resolved.config)
    for i in done:
        r = runs[i]
        r.result = finish_lib.finish(r.model, r.resolved, r.workdir, name=r.name, record=r.book.record,
                                     steps_trained=r.steps_trained, evals=evals[order.index(i)],
                                     eval_seconds=seconds, seeds_trained_together=len(cell),
                                     **({"checkpoint": selection.LAST} if selects else {}))
    if selects:
        _finish_selected(done, order, runs)


def _finish_selected(done, order, runs) -> None:
    """The rows of every seed's selected state (``train.select_length``), evaluated together in the
    stack of the last states' evaluation (a seed without one stands in with its last state)."""
    for i in done:
        r = runs[i]
        chosen = r.evals.selected(jax.tree.map(lambda x: x, r.state), r.book.record)
        if chosen is not None:
            nnx.update((r.model, r.optimizer), chosen)
    models = [runs[i].model if i in done else runs[done[0]].model for i in order]
    first = runs[done[0]]
    t0 = time.time()
    evals = evaluate_lib.evaluate_seeds(models, first.resolved)
    seconds = time.time() - t0
    for i in done:
        r = runs[i]
        r.result = r.result + finish_lib.finish(
            r.model, r.resolved, r.workdir, name=r.name, record=r.book.record, steps_trained=r.steps_trained,
            evals=evals[order.index(i)], eval_seconds=seconds, seeds_trained_together=len(order),
            **selection.row_fields(r.book.record, r.steps_trained))


@dataclasses.dataclass
class _Slot:
    """One row of the stack: a seed of the cell, trained (``live``) or holding its place."""

    index: int
    run: SeedRun | None
    live: bool


@dataclasses.dataclass(frozen=True)
class _Phase(steploop.Schedule):
    """The schedule up to the step where a resumed seed joins (``end``); ``stop``: where this
    process stops (checkpointed there), so that a joining step adds no checkpoint."""

    stop: int = 0

    def at(self, s: int) -> steploop.Boundary:
        b = super().at(s)
        return dataclasses.replace(b, checkpoint=s % self.checkpoint_every == 0 or s == self.steps
                                   or s == self.stop)


def _phase(config, end: int, stop: int) -> _Phase:
    return _Phase(**dataclasses.asdict(steploop.Schedule.of(config, end)), stop=stop)


class _GroupTrainer:
    """The step loop's trainer of a seed cell: one stacked state, runs leave it as they end.

    The stack holds every seed of the cell that an uninterrupted run of the cell
    holds at that step, in the cell's order: a seed that resumes from a later
    step than the others (or has finished) keeps its row with its own (or
    another) state until it joins (or until the step it left at), so the step
    runs the same compiled program as the uninterrupted run and each trained
    row is bit-identical to it (the rows of a vmapped step are independent).
    """

    def __init__(self, cell, runs, graphdef, left, *, bar):
        self.cell, self.runs, self.graphdef, self.bar = cell, runs, graphdef, bar
        self.left = dict(left)  # index -> the step after whose boundary it left the stack
        first = next(r for r in runs.values() if r.index in cell).resolved
        self.size = len(cell)
        self.chunk = step_lib.seeds_train_chunk_fn(first.train, steploop.buffer_size(first.config))
        self.stats_fn = step_lib.seeds_stats_fn(first.train)
        self.t0 = {}  # index -> when it joined the stack in this process
        self.slots, self.state, self.roots = [], None, None

    def arrange(self, t: int, configs) -> None:
        """(Re)build the stack for the steps after ``t``: the cell's seeds that have not left,
        those that resume at ``t`` or earlier trained, the others holding their places."""
        for j, slot in enumerate(self.slots):
            if slot.live:
                slot.run.state = _take(self.state, j)
        slots, states, roots = [], [], []
        filler = next(r.state for r in self.runs.values() if r.index in self.cell and r.state is not None)
        for i in self.cell:
            if i in self.left and self.left[i] <= t:
                continue
            r = self.runs.get(i)
            live = r is not None and i not in self.left and r.book.start <= t
            if live and i not in self.t0:
                self.t0[i] = time.time()
            slots.append(_Slot(i, r if live else None, live))
            states.append(r.state if r is not None and r.state is not None else filler)
            roots.append(loop.data_root(configs[i]))
        self.slots, self.state, self.roots = slots, _stack(states), jnp.stack(roots)
        for slot in slots:
            if slot.live:
                slot.run.state = None

    def steps(self, t, n):
        self.state, metrics = self.chunk(self.graphdef, self.state, self.roots, np.int32(t), np.int32(n))
        return metrics

    def stats(self, t):
        return self.stats_fn(self.graphdef, self.state, self.roots, jnp.int32(t))

    def _validation_rows(self, length: int) -> list[dict]:
        """Teacher-forced validation rows at ``length`` of every row of the stack, in one vmapped call.

        The stack is padded to the cell's size (repeating its first row), so
        every check of the cell runs the same compiled program.
        """
        resolved = next(r for r in self.runs.values() if r.index in self.cell).resolved
        model, _ = nnx.merge(self.graphdef, self.state)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        active = len(self.slots)
        if active < self.size:
            params = _take(params, list(range(active)) + [0] * (self.size - active))
        rows = evaluate_lib.evaluate_length_seeds(graphdef, params, _take(rest, 0), resolved.task,
                                                  resolved.config, resolved.spec, int(length),
                                                  stream="validation", decoded=False)
        return rows[:active]

    def _fit_accuracies(self) -> list:
        """Validation accuracy at the training length of every row of the stack."""
        resolved = next(r for r in self.runs.values() if r.index in self.cell).resolved
        return [row["accuracy"] for row in self._validation_rows(int(resolved.config.task.train_length))]

    def _evaluations(self) -> list[list[dict]]:
        """Per row of the stack, its validation rows at every ``eval.lengths`` (train.eval_every)."""
        resolved = next(r for r in self.runs.values() if r.index in self.cell).resolved
        by_length = [self._validation_rows(int(n)) for n in resolved.config.eval.lengths]
        return [list(rows) for rows in zip(*by_length)]

    def boundary(self, s, fetched, at):
        accuracies = self._fit_accuracies() if at.fit else None
        evaluations = self._evaluations() if at.evaluate else None
        keep, shown = [], False
        for j, slot in enumerate(self.slots):
            if not slot.live:  # holds a place until the step it left the cell's stack at
                if not (slot.index in self.left and self.left[slot.index] <= s):
                    keep.append(j)
                continue
            r = slot.run
            try:
                r.book.add([(k, {n: float(v[j]) for n, v in m.items()}) for k, m in fetched])
            except records.NonFiniteError as e:
                logging.warning("seed %d diverged: %s", int(r.resolved.config.train.seed), e)
                r.result, self.left[slot.index] = e, s
                continue
            if at.log:
                last = r.book.log(s)
                if self.bar is not None and not shown:
                    self.bar.set_postfix_str(loop.train_postfix(last))
                    shown = True
            fitted = at.fit and loop.record_fit(r.resolved, r.book.record.fit, s, accuracies[j])
            if evaluations is not None:  # before the checkpoint: its record holds this step's selection
                r.evals.add(s, evaluations[j], r.book.record, lambda j=j: _take(self.state, j))
            mine = _take(self.state, j) if at.checkpoint or fitted else None  # its own state, when kept
            if mine is not None:
                r.book.save(s, mine, r.book.record.train_seconds + time.time() - self.t0[slot.index])
                self.t0[slot.index] = time.time()
            if fitted:
                r.state, r.steps_trained, self.left[slot.index] = mine, s, s
            else:
                keep.append(j)
        if len(keep) < len(self.slots):
            self.slots = [self.slots[j] for j in keep]
            if self.slots:
                self.state, self.roots = _take((self.state, self.roots), keep)
        return not any(slot.live for slot in self.slots)


def _train_cell(cell, runs, complete, graphdef, configs, max_steps_this_run, main) -> None:
    """Train the runs of ``cell`` (config indices, in stack order) together; sets each run's final
    state (``state``, ``steps_trained``), ``result`` None when stopped early or its NonFiniteError.

    Runs that resume from different steps train from the earliest one in the
    stack of the uninterrupted cell (see :class:`_GroupTrainer`): the others
    join it at their own steps. ``complete``: ``{index: rows}`` of the cell's
    runs finished before (they hold their places until the step they left at).
    """
    members = [runs[i] for i in cell if i in runs]
    config = members[0].resolved.config
    steps = int(config.train.steps)
    for r in members:
        r.book.record.cell = [int(configs[i].train.seed) for i in cell]
    left = {i: _left_at(rows, config) for i, rows in complete.items()}
    for r in members:
        if r.book.record.fit.fitted:  # fitted before: trains no more, leaves where it fitted
            left[r.index] = r.book.start
        r.steps_trained = r.book.start
    trainees = [r for r in members if r.index not in left and r.book.start < steps]
    if not trainees:
        return
    start = min(r.book.start for r in trainees)
    end = steps if max_steps_this_run is None else min(steps, start + int(max_steps_this_run))
    joins = sorted({r.book.start for r in trainees if start < r.book.start < end})
    bar = progress_lib.progress(steps, start, main and bool(config.train.progress) and end > start)
    trainer = _GroupTrainer(cell, runs, graphdef, left, bar=bar)
    logging.info("training seeds %s together (steps %d to %d)", [int(r.resolved.config.train.seed)
                                                                 for r in trainees], start, end)
    t = start
    try:
        while t < end:
            trainer.arrange(t, configs)
            phase_end = min([j for j in joins if j > t] + [end])
            last = steploop.train(trainer, start=t, schedule=_phase(config, phase_end, end), bar=bar)
            if last < phase_end:  # every trained seed left the stack: on at the next one's start
                t = min([j for j in joins if j > last] + [end])
                if t == end:
                    t = last
                    break
            else:
                t = phase_end
    finally:
        if bar is not None:
            bar.close()
    live = [(j, slot.run) for j, slot in enumerate(trainer.slots) if slot.live]
    if t < steps and live:
        logging.info("stopped after step %d of %d; rerun with the same workdirs to resume", t, steps)
    for j, r in live:
        if t < steps:
            r.result, r.state = None, None
        else:
            r.state, r.steps_trained = _take(trainer.state, j), t
    for r in trainees:
        if r.book.start >= end and r.book.start < steps:  # did not reach its start in this process
            r.result, r.state = None, None
