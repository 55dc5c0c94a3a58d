"""Run records: what a run remembers across steps, checkpoints and restarts.

:class:`CheckpointRecord` is the JSON stored beside each checkpoint (step,
last logged metrics, the metric window since the last log, train seconds,
the fit state); :class:`RunLog` is one run's bookkeeping: the metric window
with its NaN / Inf guard, train_log.jsonl, TensorBoard event files and the
checkpoints. The window travels in checkpoints, so a resumed run averages
exactly the steps an uninterrupted one does.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
from absl import logging

from posenc.workdir import files
from posenc.workdir.checkpoint import Checkpointer

CHECKED = ("loss", "total_loss", "grad_norm")  # a NaN / Inf in any of these stops the run


class NonFiniteError(FloatingPointError):
    """Training produced a NaN / Inf loss or gradient norm at ``step``."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


@dataclasses.dataclass
class FitState:
    """Fit-then-extrapolate bookkeeping (``train.fit_accuracy``)."""

    fitted: bool = False
    steps_to_fit: int | None = None
    accuracy: float | None = None  # validation accuracy at the training length, last check
    checked_at: int | None = None


@dataclasses.dataclass
class CheckpointRecord:
    """The JSON record saved with checkpoint ``step``."""

    step: int = 0
    metrics: dict = dataclasses.field(default_factory=dict)  # last logged train metrics
    window: list = dataclasses.field(default_factory=list)  # [(step, host metrics)] since the last log
    train_seconds: float = 0.0
    fit: FitState = dataclasses.field(default_factory=FitState)
    # The train.seed values of the seeds trained together in one vmapped stack from the start
    # (posenc.training.multiseed), None for a run trained on its own. A resumed group rebuilds the
    # stack of an uninterrupted one from it (the same compiled program: the same rounding).
    cell: list | None = None
    # The checkpoint chosen so far on the evaluations during training (posenc.training.selection):
    # {"step", "loss", "eval_length"}; None without train.select_length or before the first evaluation.
    selected: dict | None = None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for optional in ("cell", "selected"):  # absent: as before the fields existed
            if d[optional] is None:
                del d[optional]
        return d

    @classmethod
    def from_json(cls, d: dict) -> CheckpointRecord:
        return cls(step=int(d.get("step", 0)), metrics=dict(d.get("metrics", {})),
                   window=[(int(k), dict(m)) for k, m in d.get("window", [])],
                   train_seconds=float(d.get("train_seconds", 0.0)),
                   fit=FitState(**d.get("fit", {})),
                   cell=None if d.get("cell") is None else [int(x) for x in d["cell"]],
                   selected=None if d.get("selected") is None else dict(d["selected"]))


def tensorboard_writer(config, workdir: str):
    """A tensorboardX writer under ``workdir/tensorboard`` when ``train.tensorboard``, else None."""
    if not config.train.tensorboard:
        return None
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        logging.warning("train.tensorboard=True but tensorboardX is not installed; "
                        "pip install 'posenc[tensorboard]'. Continuing without event files.")
        return None
    return SummaryWriter(os.path.join(workdir, "tensorboard"))


class RunLog:
    """One run's bookkeeping: metric window, NaN guard, train_log.jsonl, event files, checkpoints."""

    def __init__(self, config, workdir: str, *, main: bool):
        self.config, self.main = config, main
        self.ckpt = Checkpointer(os.path.join(workdir, "checkpoints"),
                                 max_to_keep=int(config.train.keep_checkpoints))
        self.log_path = os.path.join(workdir, "train_log.jsonl")
        self.writer = tensorboard_writer(config, workdir) if main else None
        self.record = CheckpointRecord()
        self.log_rows: list[dict] = []
        self.last_good: int | None = None

    @property
    def start(self) -> int:
        return self.record.step

    def restore(self, state):
        """``state`` from the newest checkpoint if any (``self.start`` its step), else as given."""
        if self.ckpt.latest_step() is not None:
            state, raw = self.ckpt.restore(state)
            self.record = CheckpointRecord.from_json(raw)
            logging.info("resumed from checkpoint step %d in %s", self.start, self.ckpt.directory)
        self.log_rows = [r for r in files.read_jsonl(self.log_path) if r["step"] <= self.start]
        self.last_good = self.start or None
        return state

    def add(self, checked) -> None:
        """Append ``[(step, host metrics)]`` to the window; NonFiniteError on a NaN / Inf."""
        for step, metrics in checked:
            for name in CHECKED:
                value = float(metrics.get(name, 0.0))
                if not math.isfinite(value):
                    kept = (f"The last good checkpoint is step {self.last_good} in {self.ckpt.directory}"
                            if self.last_good else "No checkpoint had been written yet")
                    if self.main:  # keep the logged curve up to the divergence (e.g. logit growth)
                        files.write_jsonl(self.log_path, self.log_rows)
                    raise NonFiniteError(
                        f"non-finite {name} ({value}) at step {step}; training stopped. {kept} (no "
                        "checkpoint is written after a non-finite step). Try a lower "
                        "train.learning_rate, train.clip_norm, train.z_loss or another "
                        "model.norm.placement.", step)
        self.record.window += list(checked)

    def log(self, s: int) -> dict:
        """Average the window into a train_log row at step ``s`` (metrics absent from a step,
        e.g. attention statistics collected on logging steps only, average over the steps that have them)."""
        window = self.record.window
        names = dict.fromkeys(k for _, m in window for k in m)
        metrics = {k: float(np.mean([m[k] for _, m in window if k in m])) for k in names}
        metrics["lr"] = window[-1][1]["lr"]
        self.record.metrics = metrics
        self.log_rows.append({"step": s, **metrics})
        if self.main:
            logging.info("step %d/%d %s", s, int(self.config.train.steps),
                         " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
        if self.writer is not None:
            for k, v in metrics.items():
                self.writer.add_scalar(f"train/{k}", v, s)
        self.record.window = []
        return metrics

    def save(self, s: int, state, train_seconds: float) -> None:
        """Write train_log.jsonl, then checkpoint ``state`` as step ``s``.

        In this order a kill between the two loses no log row: a resumed run
        keeps the rows up to its checkpoint's step and logs the later ones again.
        """
        self.record.step, self.record.train_seconds = s, train_seconds
        if self.main:
            files.write_jsonl(self.log_path, self.log_rows)
        self.ckpt.save(s, state, self.record.to_json())
        self.last_good = s

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.ckpt.close()
