"""Fine-tune a finished run's parameters under a new config (context extension), resumable.

    from posenc.training import finetune
    base = finetune.load_run("/tmp/base")            # a finished run: config.json + checkpoints
    rows = finetune.finetune(base, config, "/tmp/ft")  # config: target length, RoPE scaling, steps

What carries over from the base run: the model parameters of its newest
checkpoint. What does not: the optimizer. Adam's moments and step count
start from zero, so the fine-tune runs its own schedule (``config.train``)
from step 0, as the fine-tuning of PI (Chen et al. 2023: 20 warmup steps)
and YaRN (Peng et al. 2023) does. The fine-tune config must build a model
with the base's parameters (same names and shapes): the position options
(e.g. ``model.position.rope.scaling``), ``task.train_length``, ``train.*``
and ``eval.*`` may change; a config whose parameters differ is a
:class:`~posenc.training.prepare.ConfigError` naming the first one.

Fine-tuning is :func:`posenc.training.loop.run` started from those
parameters: the same checkpoints, resumption, NaN guard and results rows,
each with ``base_run``, ``base_hash``, ``finetune_steps`` (= train.steps)
and ``finetune_tokens`` (steps x batch size x training length).

Several budgets of one config: ``continue_from=DIR`` starts from the final
state (parameters, optimizer and step) of a shorter fine-tune of the same
config from the same base. That equals fine-tuning from the base for the
longer budget only when the learning rate of step t does not depend on
``train.steps``: constant after warmup (``train.min_lr_ratio = 1``, warmup no
longer than the shorter budget). Anything else is a ValueError. The data of
step t is the same either way (``fold_in(root, t)``).

Zero-shot (no fine-tuning): :func:`evaluate_params` evaluates parameters
under a config (its evaluation variants too) and writes rows the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from posenc.model import Decoder
from posenc.training import evaluate as evaluate_lib
from posenc.training import finish as finish_lib
from posenc.training import loop, prepare, specs
from posenc.workdir import records, results
from posenc.workdir.checkpoint import Checkpointer


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    """A trained run read back from its workdir: its config and newest parameters."""

    workdir: str
    resolved: prepare.Resolved
    params: object  # nnx.State of the model's nnx.Param leaves
    record: records.CheckpointRecord

    @property
    def step(self) -> int:
        return int(self.record.step)


def _restore(workdir: str, state):
    """``(state, record)`` of ``workdir``'s newest checkpoint, restored into the template ``state``."""
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
    try:
        if ckpt.latest_step() is None:
            raise ValueError(f"{workdir} has no checkpoint (did its training diverge or not start?)")
        state, raw = ckpt.restore(state)
    finally:
        ckpt.close()
    return state, records.CheckpointRecord.from_json(raw)


def load_run(workdir: str, *, finished: bool = True) -> FinishedRun:
    """Read the run in ``workdir`` (config.json and its newest checkpoint).

    ``finished``: ValueError unless it trained all ``train.steps`` (or fitted).
    """
    workdir = os.path.abspath(workdir)
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise ValueError(f"{workdir} holds no run (no config.json); train one with python -m posenc train")
    with open(path) as f:
        saved = json.load(f)
    resolved = prepare.resolve(ml_collections.ConfigDict(saved["config"]))
    model, optimizer, graphdef, state = loop.init_state(resolved)
    state, record = _restore(workdir, state)
    steps = int(resolved.config.train.steps)
    if finished and record.step < steps and not record.fit.fitted:
        raise ValueError(f"{workdir} has trained {record.step} of {steps} steps; finish it first "
                         "(rerun it with the same --workdir)")
    nnx.update((model, optimizer), state)
    return FinishedRun(workdir=workdir, resolved=resolved, params=nnx.state(model, nnx.Param),
                       record=record)


def _shapes(params) -> dict:
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(path): tuple(x.shape) for path, x in flat}


def check_compatible(params, resolved) -> None:
    """ConfigError unless ``resolved``'s model has exactly the parameters (names, shapes) of ``params``."""
    fresh = nnx.state(nnx.eval_shape(lambda: Decoder(resolved.spec, rngs=nnx.Rngs(0))), nnx.Param)
    want, have = _shapes(fresh), _shapes(params)
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            raise prepare.ConfigError(
                f"the fine-tune config's model does not take the base run's parameters: {name} is "
                f"{have.get(name, 'absent')} in the base run and {want.get(name, 'absent')} in the "
                "config; only position options, task.train_length, train.* and eval.* may change")


def _as_run(base) -> FinishedRun:
    return base if isinstance(base, FinishedRun) else load_run(base)


def _without_steps(config) -> str:
    """The canonical JSON of ``config`` without train.steps and the fields that do not change results."""
    d = json.loads(results.canonical_json(config.to_dict()))
    for dotted in ("train.steps", *results.VOLATILE_FIELDS):
        *parents, last = dotted.split(".")
        node = d
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return results.canonical_json(d)


def check_continuable(shorter, longer) -> None:
    """ValueError unless fine-tuning ``longer`` from ``shorter``'s final state equals fine-tuning
    ``longer`` from the base: configs equal but for ``train.steps`` (shorter first), and a
    learning rate constant after a warmup that ends within the shorter budget."""
    s, t = shorter.config.train, longer.config.train
    if _without_steps(shorter.config) != _without_steps(longer.config):
        raise ValueError("continue_from: the shorter fine-tune's config differs from this one in "
                         "more than train.steps")
    if not int(s.steps) < int(t.steps):
        raise ValueError(f"continue_from: its train.steps={s.steps} must be below this one's {t.steps}")
    if float(t.min_lr_ratio) != 1.0 or int(t.warmup_steps) > int(s.steps):
        raise ValueError(
            "continue_from needs a learning rate that does not depend on train.steps: "
            f"train.min_lr_ratio=1.0 (got {t.min_lr_ratio}) and train.warmup_steps <= the shorter "
            f"budget {s.steps} (got {t.warmup_steps}); otherwise fine-tune each budget from the base")


def _fields(base: FinishedRun, resolved, row_fields) -> dict:
    c = resolved.config
    steps = int(c.train.steps)
    return dict(base_run=base.workdir, base_hash=base.resolved.hash, finetune_steps=steps,
                finetune_tokens=steps * int(c.train.batch_size) * int(c.task.train_length),
                **(row_fields or {}))


def finetune(base, config, workdir: str, *, continue_from: str | None = None,
             name: str | None = None, max_steps_this_run: int | None = None,
             row_fields: dict | None = None):
    """Fine-tune ``base`` (a :class:`FinishedRun` or its workdir) under ``config`` in ``workdir``.

    Returns the results rows (None if stopped by ``max_steps_this_run``; a
    rerun resumes). ``continue_from``: a finished shorter fine-tune of the
    same config and base to start from (module docstring). ``row_fields``
    are added to every row.
    """
    base = _as_run(base)
    resolved = prepare.resolve(config)
    check_compatible(base.params, resolved)
    previous = None
    if continue_from is not None:
        with open(os.path.join(continue_from, "config.json")) as f:
            shorter = prepare.resolve(ml_collections.ConfigDict(json.load(f)["config"]))
        check_continuable(shorter, resolved)
        rows = prepare.completed_rows(shorter, continue_from)
        if not rows or any(r.get("base_hash") != base.resolved.hash for r in rows):
            raise ValueError(f"continue_from: {continue_from} is not a finished fine-tune of "
                             f"{base.workdir}")
        previous = continue_from

    def init(graphdef, state):
        if previous is not None:
            return _restore(previous, state)
        model, optimizer = nnx.merge(graphdef, state)
        # Parameters only (the optimizer starts afresh), copied: the train step donates its state.
        nnx.update(model, jax.tree.map(jnp.copy, base.params))
        return nnx.state((model, optimizer)), None

    return loop.run(resolved, workdir, init=init, name=name, max_steps_this_run=max_steps_this_run,
                    row_fields=_fields(base, resolved, row_fields))


def model_with(params, spec):
    """A model of ``spec`` holding ``params``."""
    model = Decoder(spec, rngs=nnx.Rngs(0))
    nnx.update(model, params)
    return model


def evaluate_params(base, config, workdir: str, *, name: str | None = None,
                    row_fields: dict | None = None) -> list[dict]:
    """Evaluate ``base``'s parameters under ``config`` (and its evaluation variants), no training.

    Rows as a run's (``steps_trained`` = the base's steps), with
    ``finetune_steps`` = ``finetune_tokens`` = 0, written to
    ``workdir/results.jsonl``; a workdir that has them all returns them.
    """
    base = _as_run(base)
    resolved = prepare.resolve(config)
    check_compatible(base.params, resolved)
    done = prepare.claim(resolved, workdir, name=name, main=loop.is_main_process())
    if done is not None:
        return done
    fields = dict(_fields(base, resolved, row_fields), finetune_steps=0, finetune_tokens=0)
    return finish_lib.finish(model_with(base.params, resolved.spec), resolved, workdir, name=name,
                             record=base.record, steps_trained=base.step, **fields)


def evaluate_on(params, resolved, task_name: str, lengths, *, options=None, spec=None,
                eval_fields=None) -> list[dict]:
    """Metrics of ``params`` on another task of the same vocabulary (e.g. passkey for a
    byte-level LM) at ``lengths``: :func:`~posenc.training.evaluate.evaluate_length` rows.

    ``resolved`` gives the model (``spec`` overrides it, e.g. an evaluation
    variant's) and ``eval.*`` (``eval_fields`` update it, e.g. num_batches);
    ``task.name`` / ``task.options`` and ``eval.lengths`` (which the size bins follow) are
    replaced for this evaluation only.
    """
    config = prepare.plain_copy(resolved.config)
    config.eval.update(dict(eval_fields or {}))
    config.eval.lengths = tuple(int(n) for n in lengths)  # the size bins follow these lengths
    config.task.name = task_name
    config.task.options = ml_collections.ConfigDict(dict(options or {}))
    task = specs.TaskSpec.from_config(config).make()
    spec = resolved.spec if spec is None else spec
    if int(task.vocab_size) != int(spec.vocab_size):
        raise ValueError(f"task {task_name!r} has {task.vocab_size} tokens, the model "
                         f"{spec.vocab_size}: evaluate on a task of the same vocabulary")
    model = model_with(params, spec)
    return [dict(evaluate_lib.evaluate_length(model, task, config, spec, int(n)), task=task_name)
            for n in lengths]
