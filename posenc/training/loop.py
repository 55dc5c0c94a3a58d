"""Train loop: train, checkpoint, resume, evaluate at every length, write results.

``run(config, workdir)`` is the whole experiment of one config:
  1. resolve the config (vocab size and RoPE ``original_length`` from the
     task), validate it, write ``workdir/config.json`` (refusing a workdir
     that holds a different config);
  2. if ``workdir/results.jsonl`` already has every eval length of this
     config, report and return its rows;
  3. restore the newest checkpoint (parameters, optimizer state, step) if
     any, train to ``train.steps`` with the jitted step; the batch of step
     ``t`` comes from ``fold_in(fold_in(key(seed), DATA_STREAM), t)``, so a
     resumed run sees exactly the data of an uninterrupted one and ends with
     identical parameters and metrics;
  4. evaluate at ``eval.lengths`` and atomically merge one row per length
     into ``workdir/results.jsonl``.

Devices (:mod:`~posenc.training.sharding`): on one device the loop is the
plain single-device loop. On several (``config.mesh``: ``data`` devices,
``fsdp``) the state is replicated or FSDP-sharded over a ``("data",)`` mesh
and every batch is split over it; losses equal the single-device ones to
float32 rounding, and checkpoints restore on any device count. With several
processes (``jax.distributed``) every process runs this same function; only
process 0 writes config.json, train_log.jsonl, results.jsonl and event
files, and Orbax writes checkpoints collectively. ``config.mesh`` is not
part of the config hash: it changes where a run computes, not what.

The pieces (:func:`start_run`, :class:`RunLog`, :func:`finish`) are shared
with :mod:`~posenc.training.multiseed`, which trains the seeds of one config
together in one vmapped step and writes the same files per run.

Metrics are checked for NaN / Inf at every log and checkpoint step (one
host sync per check, not per step): a non-finite loss or gradient norm
stops training with :class:`NonFiniteError` naming the step and metric, and
no checkpoint is written after it, so the last good one stays on disk.
"""

from __future__ import annotations

import json
import logging as py_logging
import math
import os
import sys
import time

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

import posenc
from posenc import registry
from posenc import tasks as tasks_lib
from posenc.model import Decoder, validate_config as validate_model_config
from posenc.training import evaluate as evaluate_lib
from posenc.training import optim, results
from posenc.training import sharding as sharding_lib
from posenc.training import step as step_lib
from posenc.training.checkpoint import Checkpointer

DATA_STREAM = 0x5EED  # folded into key(seed) so data keys never equal nnx.Rngs(seed) init keys
CHECKED = ("loss", "total_loss", "grad_norm")


class NonFiniteError(FloatingPointError):
    """Training produced a NaN / Inf loss or gradient norm at ``step``."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def validate_config(config) -> None:
    """Raise ValueError naming the first bad field of a training config."""
    if config.task.name not in tasks_lib.TASKS:
        raise ValueError(f"unknown task {config.task.name!r}; choose one of: {', '.join(tasks_lib.TASKS)}")
    registry.check_position_kind(config.model.position.kind)
    registry.check_norm_kind(config.model.norm.kind)
    registry.check_placement(config.model.norm.placement)
    positive = {"task.train_length": config.task.train_length, "train.steps": config.train.steps,
                "train.batch_size": config.train.batch_size, "train.log_every": config.train.log_every,
                "train.checkpoint_every": config.train.checkpoint_every,
                "train.keep_checkpoints": config.train.keep_checkpoints,
                "eval.batch_size": config.eval.batch_size, "eval.num_batches": config.eval.num_batches}
    for name, value in positive.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not config.train.learning_rate > 0:
        raise ValueError(f"train.learning_rate must be > 0, got {config.train.learning_rate!r}")
    optim.learning_rate_schedule(config.train)  # warmup_steps range
    if config.train.z_loss < 0:
        raise ValueError(f"train.z_loss must be >= 0, got {config.train.z_loss!r}")
    lengths = tuple(config.eval.lengths)
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
        raise ValueError(f"eval.lengths must be a non-empty tuple of positive integers, got {lengths!r}")
    pos = config.model.position
    if pos.kind == "learned" and pos.max_length < config.task.train_length:
        raise ValueError(f"model.position.max_length={pos.max_length} is shorter than "
                         f"task.train_length={config.task.train_length}: the learned table needs a row per position")
    if pos.randomized and pos.randomized_max_position < config.task.train_length:
        raise ValueError(f"model.position.randomized_max_position={pos.randomized_max_position} must be >= "
                         f"task.train_length={config.task.train_length}")
    mesh = config.get("mesh")
    if mesh is not None:
        data = mesh.get("data", -1)
        if isinstance(data, bool) or not isinstance(data, int) or not (data == -1 or data >= 1):
            raise ValueError(f"mesh.data must be -1 (all devices) or a positive integer, got {data!r}")
        if not isinstance(mesh.get("fsdp", False), bool):
            raise ValueError(f"mesh.fsdp must be True or False, got {mesh.get('fsdp')!r}")


def make_task(config):
    """The task of ``config.task`` (name, seed, options)."""
    return tasks_lib.make(config.task.name, seed=int(config.task.seed), **config.task.options.to_dict())


def prepare_config(config):
    """A resolved, unlocked copy of ``config`` with the task-dependent model fields filled in."""
    config = ml_collections.ConfigDict(json.loads(results.canonical_json(config.to_dict())))
    pos = config.model.position
    pos.layer_kinds = tuple(pos.layer_kinds)
    if int(pos.max_length) == 0:
        pos.max_length = int(config.task.train_length)
    validate_config(config)
    task = make_task(config)
    config.model.vocab_size = int(task.vocab_size)
    if int(config.model.position.original_length) == 0:
        config.model.position.original_length = int(config.task.train_length)
    config.eval.lengths = tuple(int(n) for n in config.eval.lengths)
    validate_model_config(config.model)
    task.max_size(int(config.task.train_length))  # ValueError if too short for the task
    return config, task


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return _PlainProgress(total, initial)
    return tqdm(total=total, initial=initial, file=sys.stderr, unit="step", dynamic_ncols=True)


class _PlainProgress:
    """A minimal stderr progress line (step, steps/s, ETA) when tqdm is missing."""

    def __init__(self, total, initial):
        self.total, self.n, self.start, self.first = total, initial, time.time(), initial

    def update(self, k):
        self.n += k

    def set_postfix_str(self, s):
        done = self.n - self.first
        rate = done / max(time.time() - self.start, 1e-9)
        eta = (self.total - self.n) / rate if rate > 0 else float("inf")
        print(f"\rstep {self.n}/{self.total} {rate:.1f} step/s ETA {eta:.0f}s {s}", end="",
              file=sys.stderr, flush=True)

    def close(self):
        print(file=sys.stderr, flush=True)


def _tensorboard(config, workdir):
    if not config.train.tensorboard:
        return None
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        logging.warning("train.tensorboard=True but tensorboardX is not installed; "
                        "pip install 'posenc[tensorboard]'. Continuing without event files.")
        return None
    return SummaryWriter(os.path.join(workdir, "tensorboard"))


def _check_finite(window, checkpoint_dir, last_good):
    for step, metrics in window:
        for name in CHECKED:
            value = float(metrics.get(name, 0.0))
            if not math.isfinite(value):
                kept = (f"The last good checkpoint is step {last_good} in {checkpoint_dir}"
                        if last_good else "No checkpoint had been written yet")
                raise NonFiniteError(
                    f"non-finite {name} ({value}) at step {step}; training stopped. {kept} (no "
                    "checkpoint is written after a non-finite step). Try a lower "
                    "train.learning_rate, train.clip_norm, train.z_loss or another model.norm.placement.",
                    step,
                )


def is_main_process() -> bool:
    """True on the process that writes files (process 0; the only one without jax.distributed)."""
    return jax.process_index() == 0


def _complete_rows(rows, h, lengths):
    mine = [r for r in rows if r.get("config_hash") == h]
    return mine if {r["eval_length"] for r in mine} >= set(lengths) else None


def completed_rows(config, workdir: str) -> list[dict] | None:
    """The results rows of ``config`` in ``workdir`` if every eval length is there, else None."""
    config, _ = prepare_config(config)
    rows = results.read_jsonl(os.path.join(workdir, "results.jsonl"))
    return _complete_rows(rows, results.config_hash(config), config.eval.lengths)


def data_root(config):
    """The key the data keys of ``config``'s run fold from: step ``t`` trains on ``fold_in(root, t)``."""
    return jax.random.fold_in(jax.random.key(int(config.train.seed)), DATA_STREAM)


def host_metrics(metrics) -> dict:
    """Device metrics (scalars) as Python floats."""
    return {n: float(v) for n, v in jax.device_get(metrics).items()}


def start_run(config, workdir: str, *, name: str | None = None):
    """Resolve ``config`` and claim ``workdir``: ``(config, task, hash, workdir, complete rows or None)``.

    Writes ``workdir/config.json`` (ValueError if it holds another config).
    """
    config, task = prepare_config(config)
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    h = results.config_hash(config)
    config_path = os.path.join(workdir, "config.json")
    if os.path.exists(config_path):
        with open(config_path) as f:
            old = json.load(f).get("config_hash")
        if old != h:
            raise ValueError(f"{workdir} holds a run with a different config (hash {old[:12]}..., this "
                             f"config {h[:12]}...); use a new --workdir or remove the old one")
    if is_main_process():
        results.write_json(config_path, {"config": config.to_dict(), "config_hash": h})
    done = _complete_rows(results.read_jsonl(os.path.join(workdir, "results.jsonl")), h, config.eval.lengths)
    if done is not None:
        logging.info("run %s is already complete (%d steps); results in %s", name or workdir,
                     config.train.steps, os.path.join(workdir, "results.jsonl"))
    return config, task, h, workdir, done


class RunLog:
    """The bookkeeping of one run's training: metric window, train_log.jsonl, event files, checkpoints.

    ``window`` holds the host metrics since the last log boundary and is
    stored in checkpoints, so a resumed run averages exactly the steps an
    uninterrupted one does.
    """

    def __init__(self, config, workdir: str, *, main: bool):
        self.config, self.main = config, main
        self.ckpt = Checkpointer(os.path.join(workdir, "checkpoints"),
                                 max_to_keep=int(config.train.keep_checkpoints))
        self.log_path = os.path.join(workdir, "train_log.jsonl")
        self.writer = _tensorboard(config, workdir) if main else None
        self.start, self.record = 0, {"train_seconds": 0.0, "metrics": {}}

    def restore(self, state):
        """``state`` from the newest checkpoint if any (``self.start`` its step), else as given."""
        if self.ckpt.latest_step() is not None:
            state, self.record = self.ckpt.restore(state)
            self.start = int(self.record["step"])
            logging.info("resumed from checkpoint step %d in %s", self.start, self.ckpt.directory)
        record, start = self.record, self.start
        self.log_rows = [r for r in results.read_jsonl(self.log_path) if r["step"] <= start]
        self.window = [(int(k), m) for k, m in record.get("window", [])]
        self.last_good = start if start else None
        self.last_metrics = record.get("metrics", {})
        self.seconds = float(record.get("train_seconds", 0.0))
        return state

    def add(self, checked) -> None:
        """Append ``[(step, host metrics)]`` to the window; NonFiniteError on a NaN / Inf."""
        _check_finite(checked, self.ckpt.directory, self.last_good)
        self.window += checked

    def log(self, s: int) -> dict:
        """Average the window into a train_log row at step ``s``; returns it (``last_metrics``)."""
        window = self.window
        self.last_metrics = {k: float(np.mean([m[k] for _, m in window])) for k in window[-1][1]}
        self.last_metrics["lr"] = window[-1][1]["lr"]
        self.log_rows.append({"step": s, **self.last_metrics})
        if self.main:
            logging.info("step %d/%d %s", s, int(self.config.train.steps),
                         " ".join(f"{k}={v:.4g}" for k, v in sorted(self.last_metrics.items())))
        if self.writer is not None:
            for k, v in self.last_metrics.items():
                self.writer.add_scalar(f"train/{k}", v, s)
        self.window = []
        return self.last_metrics

    def save(self, s: int, state, train_seconds: float) -> None:
        """Checkpoint ``state`` as step ``s`` and write train_log.jsonl."""
        self.ckpt.save(s, state, {"step": s, "metrics": self.last_metrics, "window": self.window,
                                  "train_seconds": train_seconds})
        if self.main:
            results.write_jsonl(self.log_path, self.log_rows)
        self.last_good = s

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.ckpt.close()


def boundaries(s: int, *, steps: int, end: int, log_every: int, ckpt_every: int) -> tuple[bool, bool]:
    """Whether step ``s`` (1-based) logs and whether it checkpoints (always the last step and ``end``)."""
    return (s % log_every == 0 or s == steps), (s % ckpt_every == 0 or s == steps or s == end)


def run(config, workdir: str, *, max_steps_this_run: int | None = None, name: str | None = None):
    """Train, checkpoint, evaluate and write results for ``config`` in ``workdir``.

    ``max_steps_this_run`` stops after that many steps (after checkpointing),
    as if the process had been killed; the next call resumes. Returns the
    results rows, or None if stopped before the end.
    """
    # batch sizes that do not split over the devices fail before the workdir is claimed
    mesh, fsdp = sharding_lib.mesh_or_none(config), sharding_lib.fsdp_enabled(config)
    sharding_lib.check_batch_size(int(config.train.batch_size), mesh, name="train.batch_size")
    sharding_lib.check_batch_size(int(config.eval.batch_size), mesh, name="eval.batch_size")
    config, task, h, workdir, done = start_run(config, workdir, name=name)
    if done is not None:
        return done
    main = is_main_process()

    model = Decoder(config.model, rngs=nnx.Rngs(int(config.train.seed)))
    optimizer = nnx.Optimizer(model, optim.make_optimizer(config.train), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    if mesh is not None:  # restore (below) lands in these shardings too
        state = sharding_lib.shard_state(state, mesh, fsdp=fsdp)
    book = RunLog(config, workdir, main=main)
    state = book.restore(state)
    start, steps = book.start, int(config.train.steps)
    end = steps if max_steps_this_run is None else min(steps, start + int(max_steps_this_run))
    # one device: the call (and the step) of a single-device run, untouched
    train_step = (step_lib.train_step_fn(task, config) if mesh is None
                  else step_lib.train_step_fn(task, config, mesh=mesh))
    root = data_root(config)
    log_every, ckpt_every = int(config.train.log_every), int(config.train.checkpoint_every)
    bar = _progress(steps, start, main and bool(config.train.progress) and end > start)
    unchecked = []  # device metrics not yet checked for NaN / Inf (one host sync per check)
    t0 = time.time()
    try:
        for t in range(start, end):
            key = jax.random.fold_in(root, t)
            if mesh is not None:
                key = sharding_lib.replicate(key, mesh)
            state, metrics = train_step(graphdef, state, key)
            s = t + 1
            unchecked.append((s, metrics))
            is_log, is_ckpt = boundaries(s, steps=steps, end=end, log_every=log_every,
                                         ckpt_every=ckpt_every)
            if not (is_log or is_ckpt):
                continue
            book.add([(k, host_metrics(m)) for k, m in unchecked])
            if bar is not None:
                bar.update(len(unchecked))
            unchecked = []
            if is_log:
                last = book.log(s)
                if bar is not None:
                    bar.set_postfix_str(f"loss={last['loss']:.4f} acc={last['accuracy']:.3f}")
            if is_ckpt:
                book.save(s, state, book.seconds + time.time() - t0)
    finally:
        if bar is not None:
            bar.close()
        book.close()
    seconds = book.seconds + time.time() - t0
    if end < steps:
        logging.info("stopped after step %d of %d; rerun with the same --workdir to resume", end, steps)
        return None
    nnx.update((model, optimizer), state)
    return finish(model, task, config, workdir, h=h, name=name, train_metrics=book.last_metrics,
                  train_seconds=seconds, mesh=mesh)


def finish(model, task, config, workdir: str, *, h: str, name: str | None, train_metrics: dict,
           train_seconds: float, mesh=None, **extra) -> list[dict]:
    """Evaluate the trained ``model`` at every eval length and merge its rows into results.jsonl.

    ``extra`` fields are added to every row.
    """
    main = is_main_process()
    t1 = time.time()
    evals = (evaluate_lib.evaluate(model, task, config) if mesh is None
             else evaluate_lib.evaluate(model, task, config, mesh=mesh))
    eval_seconds = time.time() - t1
    pos, norm = config.model.position, config.model.norm
    rows, writer = [], _tensorboard(config, workdir) if main else None
    for ev in evals:
        rows.append(results.make_row(
            name=name or os.path.basename(workdir), task=config.task.name, position=pos.kind,
            scaling=pos.scaling if pos.kind in ("rope", "irope") else None,
            randomized=bool(pos.randomized), norm=norm.kind, placement=norm.placement,
            eval_position_overrides=config.eval.get("position_overrides", "") or None,
            seed=int(config.train.seed), train_length=int(config.task.train_length),
            steps=int(config.train.steps), config_hash=h, train_loss=train_metrics.get("loss"),
            train_accuracy=train_metrics.get("accuracy"), train_seconds=train_seconds,
            eval_seconds=eval_seconds, wall_time=train_seconds + eval_seconds,
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            jax_version=jax.__version__, posenc_version=posenc.__version__,
            task_metadata=task.metadata(), **extra, **ev))
        if writer is not None:
            for k in results.METRICS:
                if ev[k] is not None:
                    writer.add_scalar(f"eval/{k}", ev[k], ev["eval_length"])
    if writer is not None:
        writer.close()
    results_path = os.path.join(workdir, "results.jsonl")
    if main:
        results.write_jsonl(results_path, results.merge_rows(results.read_jsonl(results_path), rows))
    for r in rows if main else ():
        logging.info("eval length %d: loss=%s accuracy=%s exact_match=%s", r["eval_length"],
                     _fmt(r["loss"]), _fmt(r["accuracy"]), _fmt(r["exact_match"]))
    return rows


def record_divergence(config, workdir: str, error: NonFiniteError, *, name: str | None = None) -> list[dict]:
    """Write (and return) rows marking ``config`` as diverged: metrics null, ``diverged_at_step``.

    For grids where divergence is a result (e.g. norm placements at high
    learning rates): the run then counts as complete and is not retrained.
    """
    config, task = prepare_config(config)
    pos, norm = config.model.position, config.model.norm
    rows = [results.make_row(
        name=name or os.path.basename(os.path.abspath(workdir)), task=config.task.name,
        position=pos.kind, norm=norm.kind, placement=norm.placement, seed=int(config.train.seed),
        train_length=int(config.task.train_length), eval_length=int(n), steps=int(config.train.steps),
        config_hash=results.config_hash(config), loss=None, accuracy=None, exact_match=None,
        diverged_at_step=int(error.step), not_applicable=f"training diverged: {error}",
        jax_version=jax.__version__, posenc_version=posenc.__version__, task_metadata=task.metadata(),
    ) for n in config.eval.lengths]
    path = os.path.join(workdir, "results.jsonl")
    if is_main_process():
        results.write_jsonl(path, results.merge_rows(results.read_jsonl(path), rows))
    return rows


def _fmt(v):
    return "n/a" if v is None else f"{v:.4f}"


def quiet_libraries() -> None:
    """Silence Orbax / absl chatter below WARNING in library loggers."""
    for name in ("orbax", "absl.orbax", "jax._src"):
        py_logging.getLogger(name).setLevel(py_logging.WARNING)
