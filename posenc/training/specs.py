"""What the compiled programs depend on: frozen, hashable specs resolved from a config once.

:func:`posenc.training.prepare.resolve` builds them (with the model's
:class:`~posenc.model.ModelSpec`) after validating the config; the train and
evaluation programs of :mod:`~posenc.training.step` and
:mod:`~posenc.training.eval_step` are ``functools.cache``-d functions of
them, so two runs whose specs are equal share one compiled program and a
field that changes a program is a field of a spec: no cache key is written
by hand. The config fields a compiled program does not read (log and
checkpoint intervals, seeds, which are arguments, ...) are listed in
:data:`HOST_FIELDS` with the reason (``tests/test_specs.py`` holds every
field of ``task``, ``train`` and ``eval`` to one or the other).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from posenc import tasks as tasks_lib


def _hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """A task: its name, data seed and every option as made (defaults filled in, sorted)."""

    name: str
    seed: int
    options: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, task) -> TaskSpec:
        return cls(task.name, int(task.seed), _hashable(task.options()))

    @classmethod
    def from_config(cls, config) -> TaskSpec:
        """The spec of ``config.task`` (ValueError on a bad name or option, from the task)."""
        return cls.of(tasks_lib.make(config.task.name, seed=int(config.task.seed),
                                     **config.task.options.to_dict()))

    def make(self):
        """The task; equal specs give the very same task object."""
        return _make(self)

    @property
    def traced(self) -> dict:
        """``{option: value}`` of the task's ``traced_options`` that are set (not None)."""
        names = getattr(tasks_lib.task_class(self.name), "traced_options", ())
        return {k: v for k, v in self.options if k in names and v is not None}

    def untraced(self) -> TaskSpec:
        """The spec with its traced options unset: what a program taking them as arguments depends on."""
        traced = self.traced
        return dataclasses.replace(self, options=tuple((k, None if k in traced else v) for k, v in self.options))


@functools.cache
def _make(spec: TaskSpec):
    task = tasks_lib.make(spec.name, seed=spec.seed, **dict(spec.options))
    task.name = spec.name
    return task


@dataclasses.dataclass(frozen=True)
class Positions:
    """The positions fed with each batch: 0..L-1, randomized (Ruoss et al. 2023) or PoSE's skips.

    ``pose_length`` > 0 (training batches only, ``train.pose_length``): each example's
    positions skip forward once, so that relative distances up to ``pose_length`` - 1 occur
    (:mod:`posenc.encodings.pose`, Zhu et al. 2024). ``axes`` > 1: the model's units read
    that many position axes (``Encoding.position_axes``: M-RoPE, 2D RoPE), so a task's
    multi-axis ids (``axis_positions``, the grid tasks) are its positions.
    """

    randomized: bool = False
    max_position: int = 0
    per: str = "batch"  # one draw per batch, or per example
    pose_length: int = 0
    axes: int = 1

    @classmethod
    def from_config(cls, config) -> Positions:
        """From a validated config's ``model.position`` section (and the axes its units read)."""
        pos = config.model.position
        axes = _position_axes(config)
        if not pos.randomized:
            return cls(axes=axes)
        return cls(True, int(pos.randomized_max_position), str(pos.get("randomized_per", "batch")), axes=axes)


def _position_axes(config) -> int:
    """The position axes the model of ``config`` reads (1 unless a unit reads several)."""
    from posenc.model import ENCODINGS, ModelSpec
    from posenc.model.encoding import overrides

    pos = config.model.position
    kinds = {pos.kind, *(pos.get("layer_kinds") or ()), *(r.get("kind") for r in (pos.get("layers") or ()))}
    if not any(k in ENCODINGS and overrides(ENCODINGS[k], "position_axes") for k in kinds if k):
        return 1  # the common case, without resolving the model's spec
    return ModelSpec.from_values(config.model, train_length=int(config.task.train_length)).position.axes


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """``config.train``'s optimizer and schedule fields (:mod:`posenc.training.optim`)."""

    steps: int
    warmup_steps: int
    learning_rate: float
    min_lr_ratio: float
    weight_decay: float
    weight_decay_mode: str
    clip_norm: float
    b1: float
    b2: float
    eps: float

    @classmethod
    def from_train(cls, train) -> OptimizerSpec:
        """From ``config.train`` (a ConfigDict or a dict of its validated values)."""
        return cls(int(train["steps"]), int(train["warmup_steps"]), float(train["learning_rate"]),
                   float(train["min_lr_ratio"]), float(train["weight_decay"]),
                   str(train.get("weight_decay_mode", "coupled")), float(train["clip_norm"]),
                   float(train["b1"]), float(train["b2"]), float(train["eps"]))


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """Everything the train step reads: the task and its batches, positions, optimizer, losses, sharding."""

    task: TaskSpec
    train_length: int
    min_size: int | None  # smallest training problem size (None: the task's)
    batch_size: int
    positions: Positions
    optimizer: OptimizerSpec
    z_loss: float
    fsdp: bool  # shard parameters and moments (with a mesh)
    qk_clip: float = 0.0  # QK-Clip threshold (0: off)
    dataset_size: int = 0  # a fixed training set of this many examples (0: a fresh batch every step)

    @classmethod
    def from_config(cls, config, task_spec: TaskSpec | None = None) -> TrainSpec:
        """The spec of a validated ``config`` (``task_spec``: its task's, if made already)."""
        train, mesh = config.train, config.get("mesh")
        positions = dataclasses.replace(Positions.from_config(config), pose_length=int(train.get("pose_length", 0)))
        return cls(task=task_spec or TaskSpec.from_config(config), train_length=int(config.task.train_length),
                   min_size=int(config.task.min_size) or None, batch_size=int(train.batch_size),
                   positions=positions, optimizer=OptimizerSpec.from_train(train),
                   z_loss=float(train.z_loss), fsdp=bool(mesh is not None and mesh.get("fsdp", False)),
                   qk_clip=float(train.get("qk_clip", 0.0)), dataset_size=int(train.get("dataset_size", 0)))


@dataclasses.dataclass(frozen=True)
class LengthProgram:
    """One evaluation length's program (:func:`posenc.training.eval_step.eval_length_fn`).

    ``task`` without its traced option values (they are arguments, named in ``traced``); ``rows`` of the batch per
    forward; ``sequential``: the task's held-out windows (text), ``windows`` their (count, stride);
    ``min_size``: the size bin's smallest problem; ``seeds``: S stacked models at once;
    ``errors``: also each row's first wrong answer (what decoding starts from).
    """

    task: TaskSpec
    positions: Positions
    length: int
    batch_size: int
    num_batches: int
    rows: int
    per_position: bool = False
    sequential: bool = False
    min_size: int | None = None
    windows: tuple[int, int | None] | None = None
    seeds: bool = False
    errors: bool = False
    traced: tuple[str, ...] = ()


# The run fields no compiled program reads, and why: the test of the specs holds every field of
# task, train and eval to a spec field or to this table.
HOST_FIELDS = {
    "train.seed": "the model's initialization and the data keys: arguments of the step",
    "train.steps_per_call": "steps per call are an argument of the chunk program (its buffer comes from the loop)",
    "train.fit_accuracy": "the loop's stopping rule",
    "train.fit_check_every": "the loop's stopping rule",
    "train.log_every": "the loop's logging",
    "train.checkpoint_every": "the loop's checkpoints",
    "train.keep_checkpoints": "the loop's checkpoints",
    "train.tensorboard": "the loop's logging",
    "train.progress": "the progress bar",
    "train.eval_every": "the loop's evaluations during training",
    "train.select_length": "the loop's choice of the checkpoint kept beside the last",
    "eval.lengths": "each length is its own program (its LengthProgram)",
    "eval.seed": "the evaluation keys: arguments of the program",
    "eval.position_buckets": "text rows: buckets of the per-position sums, on the host",
    "eval.decode_rows": "which failing rows are decoded: a seeded sample drawn on the host",
    "eval.variants": "model fields: each variant's ModelSpec is the model's own graph",
}
