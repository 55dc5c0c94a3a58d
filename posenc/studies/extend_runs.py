"""The run configs of the extend study's points and the rows they give.

The zero-shot evaluation of a base with every method as an evaluation
variant (:func:`zero_shot_config`), the fine-tune of a base with one method
at one budget (:func:`finetune_config`), a Hugging Face base as a run
(:func:`hf_base`, :func:`hf_run`) and a results row with the study's
identity (:func:`study_row`).
"""

from __future__ import annotations

from posenc.config import overrides
from posenc.config.schema import ConfigError
from posenc.studies.extend_methods import zero_shot
from posenc.training.schema import Run


def placeholder_longrope(config, factor) -> dict:
    """The YaRN factors the search starts from: a stand-in for validating a LongRoPE fine-tune."""
    from posenc.encodings.rope import rope, rope_search
    from posenc.model import spec as spec_lib

    m = config.model
    rotary = rope.rotary_dim(spec_lib.unit_head_dim(m), m.position.rope.rotary_fraction)  # MLA: its rotary part
    start = rope_search.seed_factors(rotary, factor=float(factor), original_length=int(config.task.train_length))
    return {"short_factor": [1.0] * len(start["yarn"]), "long_factor": [float(v) for v in start["yarn"]],
            "factor": float(factor), "original_length": int(config.task.train_length)}


def _base_config(config):
    """``copy`` of a run config without evaluation variants."""
    from posenc.training import prepare

    c = prepare.plain_copy(config)
    c.eval.variants = overrides.fields({})
    return c


def zero_shot_config(base_config, fields: dict, target: int):
    """The base config evaluated at (L, target) with every method as an evaluation variant."""
    c = _base_config(base_config)
    c.eval.lengths = (int(c.task.train_length), int(target))
    c.eval.variants = overrides.fields({m: f for m, f in fields.items() if m != "default" and zero_shot(m)})
    return c



def finetune_config(config, base_config, fields: dict, target: int, steps: int, *, at_target: bool = True):
    """The fine-tune of the base at length ``target`` with ``fields``, for ``steps`` steps.

    ``at_target`` False: at the base's length L instead (a method that trains for s L at L).
    """
    c = _base_config(base_config)
    length = int(c.task.train_length)
    overrides.apply(c, fields, schema=Run, where="method")
    ft = config.finetune
    trained = int(target) if at_target else length
    batch = int(ft.batch_size) or max(1, int(c.train.batch_size) * length // trained)
    c.task.train_length = trained
    c.train.update(steps=int(steps), batch_size=batch, learning_rate=float(ft.learning_rate),
                   warmup_steps=min(int(ft.warmup_steps), int(steps)),
                   min_lr_ratio=float(ft.min_lr_ratio), weight_decay=float(ft.weight_decay),
                   log_every=min(int(ft.log_every), int(steps)),
                   checkpoint_every=int(ft.checkpoint_every), fit_accuracy=0.0, progress=False)
    c.eval.lengths = (length, int(target))
    return c


_KEEP = ("eval_length", "loss", "accuracy", "exact_match", "perplexity", "loss_last_L", "sweep",
         "finetune_steps", "finetune_tokens", "diverged_at_step", "not_applicable", "train_seconds")


def study_row(row: dict, *, method: str, factor: float, seed: int, length: int, target: int,
              task: str, run: str) -> dict:
    """A results row of the study: the run's metrics with the study's identity."""
    out = {k: row.get(k) for k in _KEEP}
    out.update(method=method, factor=float(factor), seed=int(seed), train_length=int(length),
               target_length=int(target), task=task, run=run)
    out["finetune_steps"] = int(row.get("finetune_steps") or 0)
    out["finetune_tokens"] = int(row.get("finetune_tokens") or 0)
    return out


def hf_base(config):
    """The run of a Hugging Face base (``base_hf``): ``base`` with the checkpoint's model section."""
    from posenc.hf import hf
    from posenc.training import prepare

    c = prepare.plain_copy(config.base)
    model = hf.config(config.base_hf)
    c.model = prepare.plain_copy(model)
    if c.task.name == "text" and c.task.options.get("vocab_size") is None:
        c.task.options["vocab_size"] = int(model.vocab_size)  # the checkpoint's vocabulary, all of it
    return resolve(c, f"base_hf {config.base_hf}")


def hf_run(config):
    """The Hugging Face base as a finished run (its parameters; no checkpoint record of posenc's)."""
    from flax import nnx

    from posenc.hf import hf
    from posenc.training import finetune
    from posenc.workdir import records

    resolved = hf_base(config)
    model = hf.load(config.base_hf)
    return finetune.FinishedRun(workdir=config.base_hf, resolved=resolved, params=nnx.state(model, nnx.Param),
                                record=records.CheckpointRecord())


def resolve(config, where: str):
    """``prepare.resolve(config)``, a ConfigError naming ``where`` (the point) first."""
    from posenc.training import prepare

    try:
        return prepare.resolve(config)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None

