"""The boundary of a run: validate a config once, resolve what the task decides, claim a workdir.

:func:`resolve` is the one validation of an experiment config (task, model,
train, eval, mesh, evaluation variants). It runs before anything is
compiled or any workdir is claimed and raises :class:`ConfigError` (a
ValueError) naming the field, the bad value and the allowed values. What it
returns is trusted downstream: nothing validates again.

The resolved config is canonical: plain values (tuples, not lists),
``model.vocab_size`` from the task, and only the encoding sections in use
(``model.position.<kind>`` for the kinds the layers use), so its hash does
not change when an unrelated encoding is added to the library.
"""

from __future__ import annotations

import dataclasses
import json
import os

import ml_collections
from absl import logging

from posenc.config import overrides
from posenc.config.schema import ConfigError  # noqa: F401  (re-exported)
from posenc.model import ModelSpec, registry
from posenc.training import schema, specs
from posenc.workdir import files, lock, results


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A validated run: its canonical config, the model and train specs, the task and the config hash."""

    config: ml_collections.ConfigDict
    spec: ModelSpec
    train: specs.TrainSpec  # what the train step compiles from (its task spec: train.task)
    hash: str
    eval_variants: dict  # name -> (config, ModelSpec) of each evaluation variant

    @property
    def task(self):
        """The task object of ``train.task`` (one object per task spec)."""
        return self.train.task.make()

    @property
    def name(self) -> str:
        return self.config.get("name") or ""


def _tuples(x):
    if isinstance(x, list):
        return tuple(_tuples(v) for v in x)
    if isinstance(x, dict):
        return {k: _tuples(v) for k, v in x.items()}
    return x


def plain_dict(config) -> dict:
    """A deep copy of ``config`` (a ConfigDict or mapping) as JSON-plain dicts (lists become tuples)."""
    return _tuples(json.loads(results.canonical_json(config.to_dict() if hasattr(config, "to_dict") else config)))


def plain_copy(config) -> ml_collections.ConfigDict:
    """An unlocked deep copy of ``config`` with JSON-plain values (lists become tuples)."""
    return ml_collections.ConfigDict(plain_dict(config), allow_dotted_keys=True)


def _check_scored_text(task, config) -> None:
    """A text run scores the same eval.tokens held-out targets at every length: they must be there."""
    if not hasattr(task, "scored_windows"):
        return
    ev = config.eval
    stride = int(ev.stride) if ev.text_protocol == "sliding" else None
    for n in ev.lengths:
        if stride is not None and stride > int(n):
            raise ValueError(f"eval.stride={stride} exceeds the evaluation length {n}")
    task.eval_tokens(ev.tokens, ev.lengths, stride)  # "auto": chosen (and logged) here


def _prune_sections(config, spec: ModelSpec) -> None:
    pos = config.model.position
    for name in list(pos.keys()):
        if name in registry.ENCODINGS and name not in spec.position.kinds:
            del pos[name]


def _model_spec(config, where: str, *, validated: bool = False) -> ModelSpec:
    """The model spec of ``config`` (``validated``: its fields passed their checks already, as the
    run's own config after ``schema.validate``; an evaluation variant's changed fields have not)."""
    make = ModelSpec.from_values if validated else ModelSpec.from_config
    spec = make(config.model, train_length=int(config.task.train_length))
    train_length, pose_length = int(config.task.train_length), int(config.train.pose_length)
    # the positions training feeds: 0 .. L - 1, or PoSE's up to train.pose_length - 1
    needed, name = (pose_length, "train.pose_length") if pose_length else (train_length, "task.train_length")
    for kind in spec.position.kinds:
        limit = registry.get(kind).longest_sequence(spec.position.options[kind])
        if limit is not None and limit < needed:
            raise ValueError(f"{where}model.position.{kind} can represent {limit} positions, fewer "
                             f"than {name}={needed}: it needs a row per position")
    pos = spec.position
    if pos.randomized and pos.randomized_max_position < train_length:
        raise ValueError(f"{where}model.position.randomized_max_position={pos.randomized_max_position} "
                         f"must be >= task.train_length={train_length}")
    if pose_length and pose_length < train_length:
        raise ValueError(f"train.pose_length={pose_length} must be 0 (off) or >= task.train_length={train_length}")
    if pose_length and pos.randomized:
        raise ValueError("train.pose_length > 0 and model.position.randomized=True both choose the training "
                         "positions; use one or the other")
    return spec


def _resolve(config) -> Resolved:
    # Every field of every section, from its declaration (posenc.training.schema): an unknown
    # field fails here however the config was built; missing fields take their defaults.
    config = plain_copy(schema.validate(plain_dict(config)))
    task_spec = specs.TaskSpec.from_config(config)
    task = task_spec.make()
    largest = task.max_size(int(config.task.train_length))
    if config.task.min_size > largest:
        raise ValueError(f"task.min_size={config.task.min_size} exceeds the largest problem size "
                         f"{largest} at task.train_length={config.task.train_length}")
    config.model.vocab_size = int(task.vocab_size)
    _check_scored_text(task, config)
    spec = _model_spec(config, "", validated=True)
    variants = {}
    for name, fields in overrides.as_dict(config.eval.variants).items():
        fields = overrides.as_dict(fields)
        bad = [f for f in fields if not f.startswith("model.")]
        if bad:
            raise ValueError(f"eval.variants.{name}: an evaluation variant changes model.* fields "
                             f"(the trained parameters stay); got {bad[0]!r}")
        vc = plain_copy(config)
        overrides.apply(vc, fields, schema=schema.Run, where=f"eval.variants.{name}")
        vspec = _model_spec(vc, f"eval.variants.{name}: ")
        if vspec.position.layer_kinds != spec.position.layer_kinds or vspec.position.kind != spec.position.kind:
            raise ValueError(f"eval.variants.{name}: an evaluation variant cannot change the position "
                             "kinds (the trained parameters belong to them); change their options")
        _prune_sections(vc, vspec)
        variants[name] = (vc, vspec)
    _prune_sections(config, spec)
    return Resolved(config=config, spec=spec, train=specs.TrainSpec.from_config(config, task_spec),
                    hash=results.config_hash(config), eval_variants=variants)


def resolve(config) -> Resolved:
    """Validate ``config`` (everything, once) and resolve it; :class:`ConfigError` on a bad field.

    A :class:`Resolved` is returned as it is (already validated).
    """
    if isinstance(config, Resolved):
        return config
    try:
        return _resolve(config)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    except (KeyError, AttributeError) as e:  # a ConfigDict without a field the run reads
        text = " ".join(str(e.args[0] if e.args else e).split())
        raise ConfigError(f"the config lacks a field the run needs: {text}") from e


def claim(resolved: Resolved, workdir: str, *, name: str | None = None, main: bool = True):
    """Claim ``workdir`` for ``resolved``: write config.json; return its complete rows or None.

    :class:`~posenc.workdir.lock.WorkdirHoldsOther` if the workdir holds a study or
    a run of another config. The main process
    holds the workdir's lock first (:func:`posenc.workdir.lock.ensure_held`;
    :class:`~posenc.workdir.lock.WorkdirInUse` if another process has it).
    """
    workdir = os.path.abspath(workdir)
    lock.check_kind(workdir, "run")  # before the lock file: nothing written into a study's workdir
    if main:
        lock.ensure_held(workdir)
    os.makedirs(workdir, exist_ok=True)
    config_path = os.path.join(workdir, lock.RUN_FILE)
    if os.path.exists(config_path):
        with open(config_path) as f:
            old = json.load(f).get("config_hash")
        if old != resolved.hash:
            raise lock.WorkdirHoldsOther(
                f"{workdir} holds a run of another config (hash {str(old)[:12]}..., this config "
                f"{resolved.hash[:12]}...); use another --workdir (or remove this one)")
    if main:
        files.write_json(config_path, {"config": resolved.config.to_dict(), "config_hash": resolved.hash})
    done = complete_rows(files.read_jsonl(os.path.join(workdir, "results.jsonl")), resolved)
    if done is not None:
        logging.info("run %s is already complete (%d steps); results in %s", name or workdir,
                     resolved.config.train.steps, os.path.join(workdir, "results.jsonl"))
    return done


def expected_keys(resolved: Resolved) -> set:
    """The (eval_variant, eval_length, checkpoint) of every row a complete run of ``resolved`` has
    (checkpoint: None, or last and best_long_val with ``train.select_length``)."""
    from posenc.training import selection

    lengths = tuple(resolved.config.eval.lengths)
    return {(v, n, c) for v in (None, *resolved.eval_variants) for n in lengths
            for c in selection.checkpoints(resolved.config)}


def complete_rows(rows, resolved: Resolved):
    """The rows of ``resolved`` among ``rows`` if every expected one is there, else None."""
    mine = [r for r in rows if r.get("config_hash") == resolved.hash]
    have = {(r.get("eval_variant"), r["eval_length"], r.get("checkpoint")) for r in mine}
    if any(r.get("diverged_at_step") is not None for r in mine):
        return mine  # a diverged run is a finished result
    return mine if have >= expected_keys(resolved) else None


def completed_rows(config, workdir: str):
    """The results rows of ``config`` in ``workdir`` if the run is complete, else None."""
    resolved = resolve(config)
    return complete_rows(files.read_jsonl(os.path.join(workdir, "results.jsonl")), resolved)
