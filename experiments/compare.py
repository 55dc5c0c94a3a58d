"""Run a comparison grid, then write results.jsonl, table.md and plots.

    python -m experiments.compare --config configs/compare.py:quick --workdir /tmp/compare

Each grid point is ``config.base`` with overrides, trained and evaluated in
WORKDIR/runs/<name>/ (resumable; complete runs are skipped). Then
WORKDIR/results.jsonl holds every row (with ``variant`` and ``run``),
WORKDIR/table.md the mean ± std over seeds per eval length, and
WORKDIR/plots/<task>_<metric>.png the metric vs eval length. A run whose
loss becomes NaN / Inf is recorded as diverged (metrics null,
``diverged_at_step``) and the grid goes on. With ``--config.grid.vmap_seeds=True``
the seeds of a grid point train together in one vmapped step
(posenc.training.multiseed; the same per-run files and rows).

Several devices are used through ``config.base.mesh`` (docs/multidevice.md);
several hosts with ``--distributed`` on every host (only process 0 writes
results, the table and plots):

    python -m experiments.compare --config configs/compare.py:quick --workdir /shared/compare \
        --distributed --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0
"""

from __future__ import annotations

import ast
import itertools
import os
import time

from absl import app, flags, logging
from ml_collections import config_flags

from experiments import runtime

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to configs/compare.py[:ARG].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for all runs, the table and plots.")


def _parse_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_overrides(config, overrides: str) -> None:
    """Apply ``"a.b=1;c.d=x"`` to ``config`` in place; ValueError on an unknown field."""
    for item in filter(None, (s.strip() for s in overrides.split(";"))):
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form dotted.field=value")
        path, value = (s.strip() for s in item.split("=", 1))
        *parents, last = path.split(".")
        node = config
        for p in parents:
            if p not in node:
                raise ValueError(f"unknown config field {path!r} in override {item!r}")
            node = node[p]
        if last not in node:
            raise ValueError(f"unknown config field {path!r} in override {item!r}")
        value = _parse_value(value)
        if isinstance(node[last], float) and isinstance(value, int):
            value = float(value)
        node[last] = value


def expand(config) -> list[tuple[str, str, object]]:
    """Grid points ``(run name, variant, run config)`` in a fixed order."""
    g = config.grid
    points = []
    for task, position, placement, norm, seed in itertools.product(
        g.tasks, g.positions, g.placements, g.norms, g.seeds
    ):
        run = config.base.copy_and_resolve_references()
        run.unlock()
        run.task.name = task
        if position in config.variants:
            apply_overrides(run, config.variants[position])
        else:
            run.model.position.kind = position
        run.model.norm.placement = placement
        run.model.norm.kind = norm
        run.train.seed = int(seed)
        points.append((f"{task}_{position}_{norm}-{placement}_s{seed}", position, run))
    return points


def seed_groups(points) -> list[list[int]]:
    """Indices of ``points`` grouped into runs that differ only in their seed, in grid order."""
    groups, keys = [], {}
    for i, (name, variant, _) in enumerate(points):
        key = (name.rsplit("_s", 1)[0], variant)
        if key in keys:
            groups[keys[key]].append(i)
        else:
            keys[key] = len(groups)
            groups.append([i])
    return groups


def vmap_seeds(config, run_config) -> bool:
    """Whether to train the seeds of a grid cell together: ``grid.vmap_seeds`` (default False), on one device."""
    from posenc.training import sharding

    mode = config.grid.get("vmap_seeds", False)
    if not isinstance(mode, bool):
        raise ValueError(f"grid.vmap_seeds must be True or False, got {mode!r}")
    return mode and sharding.mesh_or_none(run_config) is None


def run_grid(config, workdir: str) -> list[dict]:
    """Train / evaluate every grid point (skipping complete ones), write results, table and plots."""
    from posenc.training import loop, multiseed, report, results

    loop.quiet_libraries()
    points = expand(config)
    all_rows, ran, skipped, t0 = [], 0, 0, time.time()
    groups = []
    for group in seed_groups(points):
        if len(group) > 1 and vmap_seeds(config, points[group[0]][2]):
            groups.append(group)
        else:
            groups += [[i] for i in group]
    for group in groups:
        for i in group:
            name, _, run_config = points[i]
            if loop.completed_rows(run_config, os.path.join(workdir, "runs", name)) is not None:
                skipped += 1
                logging.info("[%d/%d] %s: complete, skipped", i + 1, len(points), name)
            else:
                ran += 1
                logging.info("[%d/%d] %s: training%s", i + 1, len(points), name,
                             " (seeds together)" if len(group) > 1 else "")
        names = [points[i][0] for i in group]
        dirs = [os.path.join(workdir, "runs", n) for n in names]
        if len(group) > 1:
            outs = multiseed.run_seeds([points[i][2] for i in group], dirs, names=names)
        else:
            try:
                outs = [loop.run(points[group[0]][2], dirs[0], name=names[0])]
            except loop.NonFiniteError as e:
                outs = [e]
        for i, run_dir, rows in zip(group, dirs, outs):
            name, variant, run_config = points[i]
            if isinstance(rows, loop.NonFiniteError):  # divergence is a result of the grid, not a crash
                logging.warning("%s diverged: %s", name, rows)
                rows = loop.record_divergence(run_config, run_dir, rows, name=name)
            all_rows += [dict(r, variant=variant, run=name) for r in rows]
    if not loop.is_main_process():  # one writer for the shared workdir
        return all_rows
    results.write_jsonl(os.path.join(workdir, "results.jsonl"), all_rows)
    report.write_table(all_rows, os.path.join(workdir, "table.md"))
    plots = report.write_plots(all_rows, os.path.join(workdir, "plots"))
    logging.info("%d runs trained, %d skipped in %.0fs; wrote %s, %s and %d plots", ran, skipped,
                 time.time() - t0, os.path.join(workdir, "results.jsonl"),
                 os.path.join(workdir, "table.md"), len(plots))
    return all_rows


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    runtime.start()
    from posenc.training import loop, report

    rows = run_grid(_CONFIG.value, _WORKDIR.value)
    if loop.is_main_process():
        print(report.table_markdown(rows))


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)
