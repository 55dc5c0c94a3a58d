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
event files, checkpoints (a killed group resumes, as a group or run by run)
and results.jsonl, each row with ``seeds_trained_together`` = S and
``train_seconds`` the wall time of the joint training.

A seed leaves the stack when it diverges (NaN / Inf at a boundary: no
checkpoint after its last good one; returned as its
:class:`~posenc.training.records.NonFiniteError`) or when it fits
(``train.fit_accuracy``: it finishes with its own ``steps_to_fit``); the
others go on (the step recompiles once for the smaller stack).

Seeds that resume from different steps (e.g. one was run alone and killed)
train in groups of equal start step; a group of one runs ``loop.run``. One
device only: several devices train with ``loop.run``'s data parallelism.

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
from posenc.training import loop, records, results, prepare, steploop
from posenc.training import progress as progress_lib
from posenc.training import sharding as sharding_lib
from posenc.training import step as step_lib


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
    :class:`~posenc.training.records.NonFiniteError` of a diverged seed
    (``finish.record_divergence`` turns it into rows).
    """
    if len(configs) != len(workdirs):
        raise ValueError(f"got {len(configs)} configs and {len(workdirs)} workdirs")
    resolved = [prepare.resolve(c) for c in configs]  # every config validated before any claim
    _check([r.config for r in resolved])
    names = list(names) if names is not None else [None] * len(configs)
    main = loop.is_main_process()
    out, runs = [], []
    for i, (rv, w, n) in enumerate(zip(resolved, workdirs, names)):
        done = prepare.claim(rv, w, name=n, main=main)
        out.append(done)  # complete runs: their rows
        if done is None:
            runs.append(SeedRun(index=i, name=n, resolved=rv, workdir=w))
    by_start, graphdef = {}, None
    for r in runs:
        r.model, r.optimizer, graphdef, state = loop.init_state(r.resolved)
        r.book = records.RunLog(r.resolved.config, r.workdir, main=main)
        r.state = r.book.restore(state)
        by_start.setdefault(r.book.start, []).append(r)
    for start, group in sorted(by_start.items()):
        if len(group) == 1:  # nothing to share: the plain loop
            r = group[0]
            r.book.close()
            try:
                out[r.index] = loop.run(r.resolved, workdirs[r.index], name=r.name,
                                        max_steps_this_run=max_steps_this_run)
            except records.NonFiniteError as e:
                out[r.index] = e
            continue
        _train_group(group, graphdef, start, max_steps_this_run, main)
        _finish_group(group)
        for r in group:
            out[r.index] = r.result
    return out


def _finish_group(group) -> None:
    """Evaluate the group's trained seeds together (vmapped, one call per length) and write their rows.

    The stack is padded to the group's size, as in the fit checks, so that
    the evaluation at the training length reuses their compiled program.
    """
    done = [r for r in group if r.result is None and r.state is not None]
    if not done:
        return
    for r in done:
        nnx.update((r.model, r.optimizer), r.state)
    t0 = time.time()
    models = [r.model for r in done] + [done[0].model] * (len(group) - len(done))
    evals = evaluate_lib.evaluate_seeds(models, done[0].resolved)
    seconds = time.time() - t0
    for r, rows in zip(done, evals):
        r.result = finish_lib.finish(r.model, r.resolved, r.workdir, name=r.name, record=r.book.record,
                                     steps_trained=r.steps_trained, evals=rows, eval_seconds=seconds,
                                     seeds_trained_together=len(group))


class _GroupTrainer:
    """The step loop's trainer of a seed group: one stacked state, runs leave it as they end."""

    def __init__(self, group, graphdef, *, bar):
        first = group[0].resolved
        self.active, self.graphdef, self.bar = list(group), graphdef, bar
        self.size = len(group)
        self.state = _stack([r.state for r in self.active])
        for r in self.active:
            r.state = None
        self.roots = jnp.stack([loop.data_root(r.resolved.config) for r in self.active])
        self.chunk = step_lib.seeds_train_chunk_fn(first.task, first.config,
                                                   steploop.buffer_size(first.config))
        self.stats_fn = step_lib.seeds_stats_fn(first.task, first.config)
        self.t0 = time.time()
        self.seconds0 = {r.index: r.book.record.train_seconds for r in group}  # restored time

    def steps(self, t, n):
        self.state, metrics = self.chunk(self.graphdef, self.state, self.roots, np.int32(t), np.int32(n))
        return metrics

    def stats(self, t):
        return self.stats_fn(self.graphdef, self.state, self.roots, jnp.int32(t))

    def _fit_accuracies(self) -> list:
        """Validation accuracy at the training length of every active seed, in one vmapped call.

        The stack is padded to the group's size (repeating its first seed), so
        every check of the group runs the same compiled program.
        """
        resolved = self.active[0].resolved
        model, _ = nnx.merge(self.graphdef, self.state)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        active = len(self.active)
        if active < self.size:
            params = _take(params, list(range(active)) + [0] * (self.size - active))
        rows = evaluate_lib.evaluate_length_seeds(graphdef, params, _take(rest, 0), resolved.task,
                                                  resolved.config, resolved.spec,
                                                  int(resolved.config.task.train_length),
                                                  stream="validation", decoded=False)
        return [row["accuracy"] for row in rows[:active]]

    def boundary(self, s, fetched, at):
        accuracies = self._fit_accuracies() if at.fit else None
        keep = []
        for j, r in enumerate(self.active):
            try:
                r.book.add([(k, {n: float(v[j]) for n, v in m.items()}) for k, m in fetched])
            except records.NonFiniteError as e:
                logging.warning("seed %d diverged: %s", int(r.resolved.config.train.seed), e)
                r.result = e
                continue
            if at.log:
                last = r.book.log(s)
                if self.bar is not None and j == 0:
                    self.bar.set_postfix_str(f"loss={last['loss']:.4f} acc={last['accuracy']:.3f}")
            fitted = at.fit and loop.record_fit(r.resolved, r.book.record.fit, s, accuracies[j])
            mine = _take(self.state, j) if at.checkpoint or fitted else None  # its own state, when kept
            if mine is not None:
                r.book.save(s, mine, self.seconds0[r.index] + time.time() - self.t0)
            if fitted:
                r.state, r.steps_trained = mine, s
            else:
                keep.append(j)
        if len(keep) < len(self.active):
            self.active = [self.active[j] for j in keep]
            if self.active:
                self.state, self.roots = _take((self.state, self.roots), keep)
        return not self.active


def _train_group(group, graphdef, start, max_steps_this_run, main) -> None:
    """Train the runs of ``group`` (equal start step) together; sets each run's final state."""
    config = group[0].resolved.config
    steps = int(config.train.steps)
    end = steps if max_steps_this_run is None else min(steps, start + int(max_steps_this_run))
    bar = progress_lib.progress(steps, start, main and bool(config.train.progress) and end > start)
    trainer = _GroupTrainer(group, graphdef, bar=bar)
    logging.info("training seeds %s together (steps %d to %d)",
                 [int(r.resolved.config.train.seed) for r in group], start, end)
    try:
        last = steploop.train(trainer, start=start, schedule=steploop.Schedule.of(config, end), bar=bar)
    finally:
        if bar is not None:
            bar.close()
        for r in group:
            r.book.close()
    if last < steps and trainer.active:
        logging.info("stopped after step %d of %d; rerun with the same workdirs to resume", last, steps)
        for r in trainer.active:
            r.result = None
            r.state = None
        return
    for j, r in enumerate(trainer.active):
        r.state, r.steps_trained = _take(trainer.state, j), last
