"""Training-stability study: final loss against learning rate per variant and size (Wortsman et al. 2023).

    python -m experiments.stability --config configs/stability.py:quick --workdir /tmp/stability

Each grid point (size, variant, learning rate, seed) is ``config.base`` with
the size's and variant's fields, ``train.learning_rate`` and ``train.seed``
set, trained in WORKDIR/runs/<size>_<variant>_lr<lr>_s<seed>/ (resumable;
complete runs are skipped). A run whose loss or gradient becomes NaN / Inf
is recorded as diverged (its train_log.jsonl keeps the curve up to there).
The loss at initialisation is evaluated once per (size, variant, seed): the
initial parameters do not depend on the learning rate.

Writes WORKDIR/results.jsonl (one row per run: variant, size, learning_rate,
seed, d_model, num_layers, loss = final eval loss at the training length
(null if diverged), final_loss (the same, kept for diverged runs where it is
finite), diverged (training stopped on a NaN / Inf, ``diverged_at_step``, or
ended with an eval loss no lower than at initialisation), initial_loss,
max_attention_logit (last logged) and max_attention_logit_max (over
training), output_logit_mean, log_z), WORKDIR/table.md (LR sensitivity per
variant and size, then the final loss per learning rate) and the plots
WORKDIR/plots/stability_loss_vs_lr.png (the paper's figure 1) and
stability_attention_logit.png (max attention logit against step for a
diverging and a stable run at the same learning rate).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time

from absl import app, flags, logging

from experiments import runtime


def define_flags() -> None:
    """The command line's flags (defined when run as a program, so that importing
    the module, as the tests do, defines none and modules do not clash)."""
    runtime.define_config_and_workdir("Path to configs/stability.py[:ARG].",
                                      "Directory for all runs, the table and plots.")


@dataclasses.dataclass
class Point:
    """One run of the grid."""

    name: str
    size: str
    variant: str
    learning_rate: float
    seed: int
    resolved: object

    @property
    def cell(self) -> str:
        """Its config without the learning rate: the runs of a cell share their initialisation."""
        from posenc.training import results

        d = json.loads(results.canonical_json(self.resolved.config.to_dict()))
        d["train"].pop("learning_rate")
        return results.config_hash(d)


def expand(config) -> list[Point]:
    """Every grid point, validated (ConfigError naming the point), sizes outermost."""
    from posenc import checks
    from posenc.training import overrides, setup

    if not config.learning_rates or not config.seeds:
        raise setup.ConfigError("learning_rates and seeds must be non-empty")
    for lr in config.learning_rates:
        try:
            checks.number("learning_rates entry", lr, positive=True)
        except ValueError as e:
            raise setup.ConfigError(str(e)) from None
    points = []
    sizes, variants = overrides.as_dict(config.sizes), overrides.as_dict(config.variants)
    for size, variant, lr, seed in itertools.product(sizes, variants, config.learning_rates,
                                                     config.seeds):
        run = setup.plain_copy(config.base)
        overrides.apply(run, overrides.as_dict(sizes[size]), where=f"sizes.{size}")
        overrides.apply(run, overrides.as_dict(variants[variant]), where=f"variants.{variant}")
        run.train.learning_rate, run.train.seed = float(lr), int(seed)
        name = f"{size}_{variant}_lr{lr:g}_s{seed}"
        try:
            resolved = setup.resolve(run)
        except setup.ConfigError as e:
            raise setup.ConfigError(f"grid point {name}: {e}") from None
        points.append(Point(name, size, variant, float(lr), int(seed), resolved))
    return points


def initial_loss(point: Point, workdir: str) -> float:
    """Eval loss at the training length of the point's initial parameters (cached per cell)."""
    from posenc.training import evaluate, loop, results

    path = os.path.join(workdir, "initial", f"{point.cell[:16]}.json")
    if os.path.exists(path):
        with open(path) as f:
            return float(json.load(f)["loss"])
    r = point.resolved
    model = loop.init_state(r)[0]
    row = evaluate.evaluate_length(model, r.task, r.config, r.spec, int(r.config.task.train_length))
    results.write_json(path, {"loss": row["loss"], "cell": point.cell, "run": point.name})
    return float(row["loss"])


def train_log(run_dir: str) -> list[dict]:
    from posenc.training import results

    return results.read_jsonl(os.path.join(run_dir, "train_log.jsonl"))


def is_diverged(final_loss, initial_loss, diverged_at_step=None) -> bool:
    """Stopped on a NaN / Inf, or ended no better than at initialisation (the paper's failed runs)."""
    return diverged_at_step is not None or final_loss is None or not final_loss < initial_loss


def run_point(point: Point, workdir: str) -> dict:
    """Train (or read) one point; its study row."""
    from posenc.training import finish, loop

    d = os.path.join(workdir, "runs", point.name)
    init = initial_loss(point, workdir)
    try:
        rows = loop.run(point.resolved, d, name=point.name)
    except loop.NonFiniteError as e:
        logging.warning("%s diverged: %s", point.name, e)
        rows = finish.record_divergence(point.resolved, d, e, name=point.name)
    row = next(r for r in rows if r.get("eval_variant") is None and r.get("sweep") is None)
    log = train_log(d)
    logits = [r["max_attention_logit"] for r in log if r.get("max_attention_logit") is not None]
    last = next((r for r in reversed(log) if "max_attention_logit" in r), {})
    final = row["loss"]
    diverged = is_diverged(final, init, row.get("diverged_at_step"))
    model = point.resolved.config.model
    return dict(variant=point.variant, size=point.size, learning_rate=point.learning_rate,
                seed=point.seed, d_model=int(model.d_model), num_layers=int(model.num_layers),
                loss=None if diverged else final, final_loss=final, diverged=diverged,
                diverged_at_step=row.get("diverged_at_step"), initial_loss=init,
                max_attention_logit=last.get("max_attention_logit"),
                max_attention_logit_max=max(logits) if logits else None,
                output_logit_mean=last.get("logit_mean"), log_z=last.get("log_z"),
                train_loss=row.get("train_loss"), steps=int(point.resolved.config.train.steps),
                train_length=int(point.resolved.config.task.train_length),
                train_seconds=row.get("train_seconds"), run=point.name, config_hash=row["config_hash"])


def run_study(config, workdir: str) -> list[dict]:
    """Every point (skipping complete ones), then results.jsonl, table.md and the plots."""
    from experiments import stability_report
    from posenc.training import loop, results, step

    loop.quiet_libraries()
    points = expand(config)  # every point validated before any run starts
    t0, rows = time.time(), []
    for i, p in enumerate(points):
        if i and (p.size, p.variant) != (points[i - 1].size, points[i - 1].variant):
            step.clear_cache()  # each learning rate compiles its own step: free the last cell's
        logging.info("[%d/%d] %s", i + 1, len(points), p.name)
        rows.append(run_point(p, workdir))
    if not loop.is_main_process():
        return rows
    results.write_jsonl(os.path.join(workdir, "results.jsonl"), rows)
    stability_report.write_table(rows, os.path.join(workdir, "table.md"))
    plots = stability_report.write_plots(rows, os.path.join(workdir, "plots"),
                                         run_dir=os.path.join(workdir, "runs"))
    logging.info("stability study: %d runs in %.0fs; wrote %s and %d plots", len(rows),
                 time.time() - t0, os.path.join(workdir, "table.md"), len(plots))
    return rows


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    runtime.start()
    from experiments import stability_report
    from posenc.training import loop

    rows = run_study(flags.FLAGS.config, flags.FLAGS.workdir)
    if loop.is_main_process():
        print(stability_report.table_markdown(rows))


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
