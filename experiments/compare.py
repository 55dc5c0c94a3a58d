"""Run a comparison grid, then write results.jsonl, table.md and plots.

    python -m experiments.compare --config configs/compare.py:quick --workdir /tmp/compare

Each grid point is ``config.base`` with the point's fields set (a grid entry
is a field value or a ``variants`` name: a dict of dotted fields), trained
and evaluated in WORKDIR/runs/<name>/ (resumable; complete runs are
skipped, so a killed grid loses no finished run). Every point is validated
before the first one trains; a second grid process on the same WORKDIR is
refused (posenc.training.lock). Then
WORKDIR/results.jsonl holds every row (with ``variant`` and ``run``),
WORKDIR/table.md the mean and 95% t-interval over seeds per eval length
(per task, level in the heading; sweep tables), WORKDIR/aggregate.md the
accuracy over the lengths beyond training per task x encoding, and
WORKDIR/plots/ the metric vs eval length, sweeps, the text log-perplexity
and the aggregate heat-map (posenc.training.report, posenc.training.plots);
a grid whose config sets ``findings`` also writes WORKDIR/findings.md and its
figures (the randomized-positions gain, the best norm placement per encoding:
experiments.findings).
Runs that did not fit (train.fit_accuracy) are left out of the cells and
counted; ``--include_unfitted`` keeps them in. A run whose
loss becomes NaN / Inf is recorded as diverged (metrics null,
``diverged_at_step``) and the grid goes on. With ``--config.grid.vmap_seeds=True``
the seeds of a grid point train together in one vmapped step
(posenc.training.multiseed; the same per-run files and rows).

Several devices are used through ``config.base.mesh`` (docs/multidevice.md);
several hosts with ``--distributed`` on every host (only process 0 writes
results, the table and plots):

    python -m experiments.compare --config configs/compare.py:quick --workdir /shared/compare \\
        --distributed --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0
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
    runtime.define_config_and_workdir("Path to configs/compare.py[:ARG].",
                                      "Directory for all runs, the table and plots.")
    flags.DEFINE_bool("include_unfitted", False, "Report cells over every run, not only those that fitted.")

# grid axis -> the field a plain entry sets
AXES = {"tasks": "task.name", "positions": "model.position.kind", "placements": "model.norm.placement",
        "norms": "model.norm.kind", "seeds": "train.seed"}


@dataclasses.dataclass
class Point:
    """One grid point: its run name, the label of its positions entry, and its resolved run."""

    name: str
    variant: str
    resolved: object

    @property
    def cell(self) -> str:
        """The point's config without its seed: points of one cell differ only in train.seed."""
        from posenc.training import results

        d = json.loads(results.canonical_json(self.resolved.config.to_dict()))
        d["train"].pop("seed")
        return results.canonical_json(d)


def _fields(config, axis: str, entry) -> dict:
    from posenc.training import overrides

    if isinstance(entry, str) and entry in config.variants:
        return overrides.as_dict(config.variants[entry])
    return {AXES[axis]: entry}


def expand(config) -> list[Point]:
    """Every grid point, validated (ConfigError on a bad one), in a fixed order."""
    from posenc.training import overrides, setup

    g = config.grid
    points = []
    for entries in itertools.product(*(g[a] for a in AXES)):
        run = setup.plain_copy(config.base)
        for axis, entry in zip(AXES, entries):
            overrides.apply(run, _fields(config, axis, entry), where=f"grid.{axis} entry {entry!r}")
        task, position, placement, norm, seed = entries
        name = f"{task}_{position}_{norm}-{placement}_s{seed}"
        try:
            resolved = setup.resolve(run)
        except setup.ConfigError as e:
            raise setup.ConfigError(f"grid point {name}: {e}") from None
        points.append(Point(name=name, variant=str(position), resolved=resolved))
    return points


def cells(points) -> list[list[int]]:
    """Indices of ``points`` grouped into cells (configs equal but for the seed), in grid order."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault(p.cell, []).append(i)
    return list(groups.values())


def vmap_seeds(config, resolved) -> bool:
    """Whether to train the seeds of a grid cell together: ``grid.vmap_seeds``, on one device."""
    from posenc import checks
    from posenc.training import sharding

    mode = checks.boolean("grid.vmap_seeds", config.grid.get("vmap_seeds", False))
    return mode and sharding.mesh_or_none(resolved.config) is None


def run_grid(config, workdir: str, *, include_unfitted: bool = False) -> list[dict]:
    """Train / evaluate every grid point (skipping complete ones), write results, tables and plots."""
    from posenc.training import lock, loop

    loop.quiet_libraries()
    points = expand(config)  # every point validated before any run starts
    # One grid process per workdir (its runs lock their own directories too).
    with lock.hold(workdir, enabled=loop.is_main_process()):
        return _run_points(config, workdir, points, include_unfitted)


def _run_points(config, workdir: str, points, include_unfitted: bool = False) -> list[dict]:
    from posenc.training import finish, loop, multiseed, report, results, setup

    all_rows, ran, skipped, t0 = [], 0, 0, time.time()
    groups = []
    for group in cells(points):
        if len(group) > 1 and vmap_seeds(config, points[group[0]].resolved):
            groups.append(group)
        else:
            groups += [[i] for i in group]
    for group in groups:
        dirs = [os.path.join(workdir, "runs", points[i].name) for i in group]
        for i, d in zip(group, dirs):
            done = setup.completed_rows(points[i].resolved, d) is not None
            skipped, ran = skipped + done, ran + (not done)
            logging.info("[%d/%d] %s: %s", i + 1, len(points), points[i].name,
                         "complete, skipped" if done else "training")
        runs = [points[i].resolved for i in group]
        names = [points[i].name for i in group]
        if len(group) > 1:
            outs = multiseed.run_seeds(runs, dirs, names=names)
        else:
            try:
                outs = [loop.run(runs[0], dirs[0], name=names[0])]
            except loop.NonFiniteError as e:
                outs = [e]
        for i, run_dir, rows in zip(group, dirs, outs):
            p = points[i]
            if isinstance(rows, loop.NonFiniteError):  # divergence is a result of the grid, not a crash
                logging.warning("%s diverged: %s", p.name, rows)
                rows = finish.record_divergence(p.resolved, run_dir, rows, name=p.name)
            all_rows += [dict(r, variant=p.variant, run=p.name) for r in rows]
    if not loop.is_main_process():  # one writer for the shared workdir
        return all_rows
    results.write_jsonl(os.path.join(workdir, "results.jsonl"), all_rows)
    written = report.write_report(all_rows, workdir, include_unfitted=include_unfitted)
    from experiments import findings  # the grid's own findings (config.findings), e.g. randomized gain

    written += findings.write(config.get("findings", ""), all_rows, workdir, include_unfitted)
    logging.info("%d runs trained, %d skipped in %.0fs; wrote %s, %s", ran, skipped, time.time() - t0,
                 os.path.join(workdir, "results.jsonl"), ", ".join(written))
    return all_rows


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    runtime.start()
    from posenc.training import loop, report

    rows = run_grid(flags.FLAGS.config, flags.FLAGS.workdir, include_unfitted=flags.FLAGS.include_unfitted)
    if loop.is_main_process():
        print(report.table_markdown(rows, include_unfitted=flags.FLAGS.include_unfitted))
        print(report.aggregate_markdown(rows, include_unfitted=flags.FLAGS.include_unfitted))


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
