"""Train one config: validate, claim the workdir, train (resumable), evaluate, write results.

``run(config, workdir)`` is the whole experiment of one config:
  1. :func:`posenc.training.prepare.resolve` validates the config once (a
     :class:`~posenc.training.prepare.ConfigError` names any bad field) before
     anything compiles; batch sizes are checked against the devices; then
     the workdir is locked (a second process on it is refused, naming this
     one: :mod:`~posenc.workdir.lock`) and claimed (``workdir/config.json``;
     a workdir holding another config is refused);
  2. if ``workdir/results.jsonl`` already has every row of this config, its
     rows are returned;
  3. the newest checkpoint (parameters, optimizer state, step, record) is
     restored if any, and :func:`posenc.training.steploop.train` runs the
     jitted steps to ``train.steps``, ``train.steps_per_call`` of them per
     compiled call (bit-identical to one per call); the batch of step ``t`` comes from
     ``fold_in(fold_in(key(seed), DATA_STREAM), t)``, so a resumed run sees
     exactly the data of an uninterrupted one and ends with identical
     parameters and metrics;
  4. with ``train.fit_accuracy`` > 0 the run stops early once the validation
     token accuracy at the training length reaches it (checked every
     ``train.fit_check_every`` steps): fit, then extrapolate; rows record
     ``fitted`` and ``steps_to_fit``;
  5. with ``train.eval_every`` > 0 the model is evaluated on validation
     examples at every ``eval.lengths`` during training (``eval_log.jsonl``),
     and with ``train.select_length`` the state of the lowest validation loss
     there is kept (:mod:`~posenc.training.selection`);
  6. the model is evaluated at ``eval.lengths`` (and each evaluation variant)
     and one row per length is merged atomically into ``workdir/results.jsonl``;
     with a selected state, its rows too (``checkpoint``: last, best_long_val).

Devices (:mod:`~posenc.training.sharding`): on several (``config.mesh``)
the state is replicated or FSDP-sharded over a ``("data",)`` mesh and every
batch is split over it; losses equal the single-device ones to float32
rounding, and checkpoints restore on any device count. With several
processes every process runs this function; only process 0 writes files,
and Orbax writes checkpoints collectively.

Metrics are checked for NaN / Inf at every boundary (one host sync per log,
checkpoint or fit step): a non-finite loss or gradient norm stops training
with :class:`~posenc.workdir.records.NonFiniteError` naming the step, and no
checkpoint is written after it, so the last good one stays on disk.
"""

from __future__ import annotations

import logging as py_logging
import time

import jax
import numpy as np
from absl import logging
from flax import nnx

from posenc.model import Decoder
from posenc.training import evaluate as evaluate_lib
from posenc.training import finish as finish_lib
from posenc.training import optim, prepare, selection, steploop
from posenc.training import progress as progress_lib
from posenc.training import sharding as sharding_lib
from posenc.training import step as step_lib
from posenc.workdir import lock as lock_lib
from posenc.workdir import records

DATA_STREAM = 0x5EED  # folded into key(seed) so data keys never equal nnx.Rngs(seed) init keys


def is_main_process() -> bool:
    """True on the process that writes files (process 0; the only one without jax.distributed)."""
    return jax.process_index() == 0


def data_root(config):
    """The key the data keys of ``config``'s run fold from: step ``t`` trains on ``fold_in(root, t)``."""
    return jax.random.fold_in(jax.random.key(int(config.train.seed)), DATA_STREAM)


def init_state(resolved):
    """``(model, optimizer, graphdef, state)`` of a fresh run of ``resolved`` (seed ``train.seed``)."""
    config = resolved.config
    model = Decoder(resolved.spec, rngs=nnx.Rngs(int(config.train.seed)))
    optimizer = nnx.Optimizer(model, optim.make_optimizer(resolved.train.optimizer), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    return model, optimizer, graphdef, state


def check_fit(resolved, graphdef, state, fit: records.FitState, s: int, *, mesh=None) -> bool:
    """Evaluate at the training length; mark ``fit`` fitted at step ``s`` if accuracy reaches the target."""
    config = resolved.config
    model, _ = nnx.merge(graphdef, state)
    # Validation examples, not the reported ones: the fit check must not pick the evaluation set.
    row = evaluate_lib.evaluate_length(model, resolved.task, config, resolved.spec,
                                       int(config.task.train_length), mesh=mesh, stream="validation",
                                       decoded=False)
    return record_fit(resolved, fit, s, row["accuracy"])


def record_fit(resolved, fit: records.FitState, s: int, accuracy) -> bool:
    """Note the fit check of step ``s`` (validation ``accuracy`` at the training length) in ``fit``."""
    target = float(resolved.config.train.fit_accuracy)
    fit.accuracy, fit.checked_at = accuracy, s
    if accuracy is not None and accuracy >= target:
        fit.fitted, fit.steps_to_fit = True, s
        logging.info("fitted at step %d: validation accuracy %.4f >= train.fit_accuracy %.4f", s,
                     accuracy, target)
    return fit.fitted


def train_postfix(metrics: dict) -> str:
    """The progress bar's training metrics, named as what they are: the training batch's loss and
    teacher-forced token accuracy (not the evaluation's decoded accuracy)."""
    return f"train loss={metrics['loss']:.4f} teacher-forced acc={metrics['accuracy']:.3f}"


def evaluate_during(resolved, graphdef, state, *, mesh=None) -> list[dict]:
    """Teacher-forced rows of the validation stream at every ``eval.lengths`` (the evaluations
    during training, :mod:`~posenc.training.selection`)."""
    config = resolved.config
    model, _ = nnx.merge(graphdef, state)
    return [evaluate_lib.evaluate_length(model, resolved.task, config, resolved.spec, int(n), mesh=mesh,
                                         stream="validation", decoded=False)
            for n in config.eval.lengths]


class _Trainer:
    """The step loop's trainer of one run (see :mod:`posenc.training.steploop`)."""

    def __init__(self, resolved, graphdef, state, book, *, mesh, bar, evals=None):
        self.resolved, self.graphdef, self.state, self.book = resolved, graphdef, state, book
        self.evals = evals
        self.mesh, self.bar = mesh, bar
        self.root = self._placed(data_root(resolved.config))
        self.chunk = step_lib.train_chunk_fn(resolved.train, steploop.buffer_size(resolved.config), mesh=mesh)
        self.stats_fn = step_lib.stats_fn(resolved.train, mesh=mesh)
        self.t0, self.seconds0 = time.time(), book.record.train_seconds

    def _placed(self, x):
        return x if self.mesh is None else sharding_lib.replicate(x, self.mesh)

    def seconds(self) -> float:
        return self.seconds0 + time.time() - self.t0

    def steps(self, t, n):
        self.state, metrics = self.chunk(self.graphdef, self.state, self.root,
                                         self._placed(np.int32(t)), self._placed(np.int32(n)))
        return metrics

    def stats(self, t):
        key = jax.random.fold_in(self.root, t)
        at = (self.root, self._placed(np.int32(t))) if self.resolved.train.dataset_size else None
        return self.stats_fn(self.graphdef, self.state, self._placed(key), at)

    def boundary(self, s, fetched, at):
        book = self.book
        book.add([(k, {n: float(v) for n, v in m.items()}) for k, m in fetched])
        if at.log:
            last = book.log(s)
            if self.bar is not None:
                self.bar.set_postfix_str(train_postfix(last))
        fitted = at.fit and check_fit(self.resolved, self.graphdef, self.state, book.record.fit, s,
                                      mesh=self.mesh)
        if at.evaluate:  # before the checkpoint: its record holds the selection of this step
            rows = evaluate_during(self.resolved, self.graphdef, self.state, mesh=self.mesh)
            self.evals.add(s, rows, book.record, lambda: self.state)
        if at.checkpoint or fitted:
            book.save(s, self.state, self.seconds())
        return fitted


def run(config, workdir: str, *, max_steps_this_run: int | None = None, name: str | None = None,
        init=None, row_fields: dict | None = None):
    """Train, checkpoint, evaluate and write results for ``config`` in ``workdir``.

    ``max_steps_this_run`` stops after that many steps (after checkpointing),
    as if the process had been killed; the next call resumes. Returns the
    results rows, or None if stopped before the end.

    ``init(graphdef, state) -> (state, record)`` replaces the fresh state of
    a run that has no checkpoint of its own yet (fine-tuning starts from
    another run's parameters, :mod:`~posenc.training.finetune`); ``record``
    (a :class:`~posenc.workdir.records.CheckpointRecord`, or None for step
    0) is where training continues. Once the run has checkpointed, a restart
    resumes from its own checkpoints. ``row_fields`` are added to every row.
    """
    resolved = prepare.resolve(config)
    config = resolved.config
    mesh, fsdp = sharding_lib.mesh_or_none(config), sharding_lib.fsdp_enabled(config)
    sharding_lib.check_batch_size(int(config.train.batch_size), mesh, name="train.batch_size")
    sharding_lib.check_batch_size(int(config.eval.batch_size), mesh, name="eval.batch_size")
    main = is_main_process()
    with lock_lib.hold(workdir, enabled=main):  # one process per workdir (posenc.workdir.lock)
        return _locked_run(resolved, workdir, main=main, mesh=mesh, fsdp=fsdp,
                           max_steps_this_run=max_steps_this_run, name=name, init=init,
                           row_fields=row_fields)


def _locked_run(resolved, workdir: str, *, main, mesh, fsdp, max_steps_this_run, name, init,
                row_fields):
    config = resolved.config
    done = prepare.claim(resolved, workdir, name=name, main=main)
    if done is not None:
        return done
    model, optimizer, graphdef, state = init_state(resolved)
    book = records.RunLog(config, workdir, main=main)
    if init is not None and book.ckpt.latest_step() is None:
        state, record = init(graphdef, state)
        book.record = record if record is not None else book.record
    if mesh is not None:  # restore (below) lands in these shardings too
        state = sharding_lib.shard_state(state, mesh, fsdp=fsdp)
    state = book.restore(state)
    evals = selection.Evaluations(config, workdir, main=main) if selection.enabled(config) else None
    if evals is not None:
        evals.restore(book.start)
    start, steps = book.start, int(config.train.steps)
    end = steps if max_steps_this_run is None else min(steps, start + int(max_steps_this_run))
    if book.record.fit.fitted:  # a run that already fitted has finished training
        end = start
    bar = progress_lib.progress(steps, start, main and bool(config.train.progress) and end > start)
    trainer = _Trainer(resolved, graphdef, state, book, mesh=mesh, bar=bar, evals=evals)
    try:
        try:
            last = steploop.train(trainer, start=start, schedule=steploop.Schedule.of(config, end),
                                  bar=bar)
        finally:
            if bar is not None:
                bar.close()
            book.close()
        if last < steps and not book.record.fit.fitted:
            logging.info("stopped after step %d of %d; rerun with the same --workdir to resume", last, steps)
            return None
        nnx.update((model, optimizer), trainer.state)
        if not selection.selects(config):
            return finish_lib.finish(model, resolved, workdir, name=name, record=book.record,
                                     steps_trained=last, mesh=mesh, **(row_fields or {}))
        return _finish_both(model, optimizer, trainer.state, evals, resolved, workdir, name=name,
                            record=book.record, steps_trained=last, mesh=mesh, **(row_fields or {}))
    finally:
        if evals is not None:
            evals.close()


def _finish_both(model, optimizer, state, evals, resolved, workdir, *, record, steps_trained, **kw):
    """The rows of the last state and of the selected one (``train.select_length``), each labelled."""
    rows = finish_lib.finish(model, resolved, workdir, record=record, steps_trained=steps_trained,
                             checkpoint=selection.LAST, **kw)
    chosen = evals.selected(jax.tree.map(lambda x: x, state), record)
    if chosen is not None:
        nnx.update((model, optimizer), chosen)
    return rows + finish_lib.finish(model, resolved, workdir, record=record, steps_trained=steps_trained,
                                    **selection.row_fields(record, steps_trained), **kw)


class _LibraryInfo(py_logging.Filter):
    """Drops records below WARNING that a library logs through absl's logger (Orbax's
    checkpoint threads: "Cleaning up existing temporary directories")."""

    LIBRARIES = ("/orbax/",)

    def filter(self, record: py_logging.LogRecord) -> bool:
        path = record.pathname.replace("\\", "/")
        return record.levelno >= py_logging.WARNING or not any(lib in path for lib in self.LIBRARIES)


def quiet_libraries() -> None:
    """Silence library chatter below WARNING (Orbax, absl, JAX's backend probes, matplotlib's
    font cache), so that a command's log holds posenc's own lines."""
    for name in ("orbax", "absl.orbax", "jax._src", "matplotlib"):
        py_logging.getLogger(name).setLevel(py_logging.WARNING)
    absl_logger = py_logging.getLogger("absl")
    if not any(isinstance(f, _LibraryInfo) for f in absl_logger.filters):
        absl_logger.addFilter(_LibraryInfo())
