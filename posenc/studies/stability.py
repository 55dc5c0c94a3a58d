"""The stability study: final loss against learning rate per variant and size (Wortsman et al. 2023).

Each point (size, variant, learning rate, seed) is ``base`` with the size's
and variant's fields (then ``size_variants[size][variant]``, if any), ``train.learning_rate`` and ``train.seed`` set,
trained in ``WORKDIR/runs/<size>_<variant>_lr<lr>_s<seed>/``. A run whose
loss or gradient becomes NaN / Inf is recorded as diverged (its
train_log.jsonl keeps the curve up to there). The loss at initialisation is
evaluated once per (size, variant, seed): the initial parameters do not
depend on the learning rate.

Rows: one per run (fields in :data:`Stability.row_fields`). Report:
``table.md`` (LR sensitivity per variant and size, then the final loss per
learning rate) and the plots of :mod:`~posenc.studies.stability_report`.
"""

from __future__ import annotations

import itertools
import os

from posenc import checks
from posenc.config.schema import Field, Free, Section, Sub
from posenc.studies import engine, grid, stability_report, tables
from posenc.training.schema import Run
from posenc.workdir import files


def _rates(name, value):
    if not isinstance(value, (tuple, list)) or not value:
        raise ValueError(f"{name} must be a non-empty tuple of learning rates; got {value!r}")
    return tuple(checks.number(f"{name} entry", v, positive=True) for v in value)


def _seeds(name, value):
    if not isinstance(value, (tuple, list)) or not value:
        raise ValueError(f"{name} must be a non-empty tuple of seeds; got {value!r}")
    return tuple(checks.integer(f"{name} entry", v, minimum=0) for v in value)


def _names(name, value):
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a tuple of variants entries; got {value!r}")
    return tuple(value)


def _sets(name, value):
    if not value:
        raise ValueError(f"{name} must name at least one entry (name -> dotted fields)")
    return value


class StabilityConfig(Section):
    """The stability grid: sizes x variants x learning rates x seeds of one base run."""

    name = Field("", doc="the study's name (the ARG of --config stability:ARG)")
    base = Sub(Run, "the run config (the default config's fields)")
    learning_rates = Field((1e-3,), _rates, "peak learning rates", type=tuple)
    variants = Free("name -> dotted fields on top of base", dotted=True, check=_sets)
    sizes = Free("name -> dotted fields (width / depth) of each model size", dotted=True, check=_sets)
    size_variants = Free("size -> variant -> dotted fields set after the variant's (fields that depend "
                         "on the size, e.g. MiniCPM's residual and logit multipliers)", dotted=True)
    seeds = Field((0,), _seeds, "train.seed values", type=tuple)
    run_variants = Field((), _names, "the variants entries to run (empty: every one), e.g. the baseline and "
                                     "one method of a larger grid", type=tuple)
    vmap_seeds = Field(True, lambda n, v: checks.boolean(n, v),
                       "the seeds of a (size, variant, learning rate) train together in one vmapped step")


def is_diverged(final_loss, initial_loss, diverged_at_step=None) -> bool:
    """Stopped on a NaN / Inf, or ended no better than at initialisation (the paper's failed runs)."""
    return diverged_at_step is not None or final_loss is None or not final_loss < initial_loss


class Stability(engine.Study):
    name = "stability"
    schema = StabilityConfig
    row_fields = {
        "variant": "the variants entry", "size": "the sizes entry", "learning_rate": "peak learning rate",
        "final_loss": "eval loss at the training length at the end (kept for diverged runs where finite)",
        "loss": "final_loss, null if diverged", "diverged": "stopped on a NaN / Inf, or no better than at init",
        "initial_loss": "eval loss of the initial parameters", "max_attention_logit": "last logged",
        "max_attention_logit_max": "over training", "output_logit_mean": "last logged", "log_z": "last logged"}

    def points(self, config):
        from posenc.config import overrides

        sizes, variants = overrides.as_dict(config.sizes), overrides.as_dict(config.variants)
        unknown = [v for v in config.run_variants if v not in variants]
        if unknown:
            raise ValueError(f"run_variants names {unknown[0]!r}, not a variants entry; choose from "
                             f"{', '.join(variants)}")
        sized = overrides.as_dict(config.size_variants)
        for size, by_variant in sized.items():
            if size not in sizes or not isinstance(by_variant, dict) or not set(by_variant) <= set(variants):
                raise ValueError(f"size_variants.{size} must be a sizes entry mapping variants entries to "
                                 f"dotted fields; got {by_variant!r} (sizes {sorted(sizes)}, variants "
                                 f"{sorted(variants)})")
        points = []
        chosen = [v for v in variants if not config.run_variants or v in config.run_variants]
        for size, variant, lr, seed in itertools.product(sizes, chosen, config.learning_rates, config.seeds):
            name = f"{size}_{variant}_lr{lr:g}_s{seed}"
            run = grid.run_config(config.base, [
                (f"sizes.{size}", sizes[size]), (f"variants.{variant}", variants[variant]),
                (f"size_variants.{size}.{variant}", sized.get(size, {}).get(variant, {})),
                ("grid point", {"train.learning_rate": float(lr), "train.seed": int(seed)})], name=name)
            group = grid.cell_key(run) if config.vmap_seeds and grid.vmappable(run) else None
            points.append(engine.Point(name, dict(size=size, variant=variant, learning_rate=float(lr),
                                                  seed=int(seed)), run=run, group=group))
        return points

    def run(self, points, ctx):
        return [[self._row(p, rows, ctx)] for p, rows in zip(points, grid.train(points, ctx))]

    def _initial_loss(self, point, ctx) -> float:
        """Eval loss at the training length of the point's initial parameters (cached per cell)."""
        from posenc.training import evaluate, loop

        cell = grid.cell_key(point.run, without=("train.learning_rate",))
        path = os.path.join(ctx.workdir, "initial", f"{cell[:16]}.json")
        cached = files.read_json(path)
        if cached is not None:
            return float(cached["loss"])
        r = point.run
        model = loop.init_state(r)[0]
        row = evaluate.evaluate_length(model, r.task, r.config, r.spec, int(r.config.task.train_length))
        files.write_json(path, {"loss": row["loss"], "cell": cell, "run": point.name})
        return float(row["loss"])

    def _row(self, point, run_rows, ctx) -> dict:
        from posenc.training import step

        row = next(r for r in run_rows if r.get("eval_variant") is None and r.get("sweep") is None)
        init = self._initial_loss(point, ctx)
        log = files.read_jsonl(os.path.join(ctx.run_dir(point), "train_log.jsonl"))
        logits = [r["max_attention_logit"] for r in log if r.get("max_attention_logit") is not None]
        last = next((r for r in reversed(log) if "max_attention_logit" in r), {})
        final = row["loss"]
        diverged = is_diverged(final, init, row.get("diverged_at_step"))
        model = point.run.config.model
        i = ctx.points.index(point)
        if i + 1 < len(ctx.points) and (ctx.points[i + 1].fields["size"], ctx.points[i + 1].fields["variant"]) != (
                point.fields["size"], point.fields["variant"]):
            step.clear_cache()  # each learning rate compiles its own step: free the cell's
        return dict(**point.fields, d_model=int(model.d_model), num_layers=int(model.num_layers),
                    loss=None if diverged else final, final_loss=final, diverged=diverged,
                    diverged_at_step=row.get("diverged_at_step"), initial_loss=init,
                    max_attention_logit=last.get("max_attention_logit"),
                    max_attention_logit_max=max(logits) if logits else None,
                    output_logit_mean=last.get("logit_mean"), log_z=last.get("log_z"),
                    train_loss=row.get("train_loss"), steps=int(point.run.config.train.steps),
                    train_length=int(point.run.config.task.train_length),
                    train_seconds=row.get("train_seconds"), run=point.name, config_hash=row["config_hash"])

    def report(self, rows, ctx):
        path = os.path.join(ctx.workdir, "table.md")
        tables.write(path, "\n".join(tables.missing_note(ctx)) + stability_report.table_markdown(rows))
        return [path] + stability_report.write_plots(rows, os.path.join(ctx.workdir, "plots"),
                                                     run_dir=os.path.join(ctx.workdir, "runs"))
