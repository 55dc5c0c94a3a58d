"""The compare study: tasks x encodings x placements x norms x seeds, trained then evaluated by length.

Each grid point is ``base`` with the point's fields set: a grid entry is a
field value (``task.name``, ``model.position.kind``, ``model.norm.placement``,
``model.norm.kind``, ``train.seed``) or the name of a ``variants`` entry (a
dict of dotted fields). Its run trains in ``WORKDIR/runs/<task>_<position>_<norm>-<placement>_s<seed>/``;
with ``grid.vmap_seeds`` the seeds of a cell train together in one vmapped
step (:mod:`posenc.training.multiseed`; the same files and rows).

Rows: every row of each run (one per evaluation length, variant and sweep
point; :mod:`posenc.studies.rows`) with ``variant`` (the positions
entry), ``task_variant`` (the tasks entry) and ``run``. Report: ``table.md`` (per
task or task variant, mean and 95% t-interval
over seeds per length), ``aggregate.md`` (OOD accuracy per task x
encoding), ``plots/`` (:mod:`~posenc.studies.compare_plots`) and, when
``findings`` is set, ``findings.md`` (:mod:`~posenc.studies.findings`).
"""

from __future__ import annotations

import itertools
import os

from posenc import checks
from posenc.config.schema import Field, Free, Section, Sub
from posenc.studies import compare_plots, compare_report, engine, findings, grid, tables
from posenc.training import prepare
from posenc.training.schema import Run
from posenc.workdir import results

# grid axis -> the field a plain entry sets
AXES = {"tasks": "task.name", "positions": "model.position.kind", "placements": "model.norm.placement",
        "norms": "model.norm.kind", "seeds": "train.seed"}


def _entries(name, value) -> tuple:
    if not isinstance(value, (tuple, list)) or not value:
        raise ValueError(f"{name} must be a non-empty tuple of grid entries; got {value!r}")
    return tuple(value)


class Grid(Section):
    """grid: the axes of the comparison (each entry a field value or a `variants` name)."""

    tasks = Field(("copy",), _entries, "task.name values or variant names", type=tuple)
    positions = Field(("rope",), _entries, "model.position.kind values or variant names", type=tuple)
    placements = Field(("pre",), _entries, "model.norm.placement values or variant names", type=tuple)
    norms = Field(("rms",), _entries, "model.norm.kind values or variant names", type=tuple)
    seeds = Field((0,), _entries, "train.seed values", type=tuple)
    vmap_seeds = Field(False, checks.boolean, "the seeds of a cell train together in one vmapped step (one device)")


class CompareConfig(Section):
    """A comparison grid: the base run, named variants (dicts of dotted fields) and the grid axes."""

    name = Field("", doc="the grid's name (the ARG of --config compare:ARG)")
    base = Sub(Run, "the run every grid point starts from (the default config's fields)")
    variants = Free("name -> dotted fields set by a grid entry of that name", dotted=True)
    grid = Sub(Grid)
    findings = Field("", checks.one_of(*findings.KINDS), "findings.md written after the report: randomized | "
                                                    "interaction | sizes | ladder ('' = none)")
    targets = Free("findings sizes: a target check, {'size': n, 'at_least': {label: v}, 'below': "
                   "{label: v}} ({} = none)", check=lambda n, v: findings.check_targets(n, v))


class Compare(engine.Study):
    name = "compare"
    schema = CompareConfig
    row_fields = {"variant": "the grid's positions entry (an encoding or a variant name)",
                  "task_variant": "the grid's tasks entry (a task or a variant name; the report's tables)",
                  "run": "the run's directory name under runs/"}

    def points(self, config):
        g, variants = config.grid, overrides_of(config)
        points = []
        for entries in itertools.product(*(g[a] for a in AXES)):
            sets = []
            for axis, entry in zip(AXES, entries):
                fields = variants.get(entry) if isinstance(entry, str) and entry in variants else {
                    AXES[axis]: entry}
                sets.append((f"grid.{axis} entry {entry!r}", fields))
            task, position, placement, norm, seed = entries
            name = f"{task}_{position}_{norm}-{placement}_s{seed}"
            run = grid.run_config(config.base, sets, name=name)
            vmap = checks.boolean("grid.vmap_seeds", g.vmap_seeds) and grid.vmappable(run)
            points.append(engine.Point(name=name, fields={"variant": str(position), "task_variant": str(task)}, run=run,
                                       group=grid.cell_key(run) if vmap else None))
        return points

    def run(self, points, ctx):
        out = []
        for p, rows in zip(points, grid.train(points, ctx)):
            rows = [dict(r, variant=p.fields["variant"], task_variant=p.fields["task_variant"], run=p.name)
                    for r in rows]
            # a point evaluated again keeps its rows at the lengths it does not evaluate now
            out.append(results.merge_rows(ctx.rows_of(p.name) if engine.has_rows(ctx, p) else [],
                                          rows))
        return out

    def complete(self, point, rows):
        # a trained run whose config now asks for other eval lengths or variants is not: it is
        # evaluated again (from its last checkpoint, no training), its new rows added
        return prepare.complete_rows(rows, point.run) is not None

    def report(self, rows, ctx):
        return write_report(rows, ctx.workdir, include_unfitted=bool(ctx.options.get("include_unfitted")),
                            findings_kind=ctx.config.get("findings", ""), notes=tables.missing_note(ctx),
                            targets=_plain(ctx.config.get("targets")))


def overrides_of(config) -> dict:
    """``{variant name: {dotted field: value}}`` of a grid config."""
    from posenc.config import overrides

    return {k: overrides.as_dict(v) for k, v in overrides.as_dict(config.variants).items()}


def _plain(value):
    return value.to_dict() if hasattr(value, "to_dict") else dict(value or {})


def write_report(rows, workdir: str, *, include_unfitted: bool = False, findings_kind: str = "",
                 notes=(), targets=None) -> list[str]:
    """``table.md``, ``aggregate.md`` (if any task has OOD accuracy), ``plots/*.png`` and the findings."""
    paths = [os.path.join(workdir, "table.md")]
    tables.write(paths[0], "\n".join(notes) + compare_report.table_markdown(rows,
                                                                            include_unfitted=include_unfitted))
    if compare_report.write_aggregate(rows, os.path.join(workdir, "aggregate.md"),
                                      include_unfitted=include_unfitted):
        paths.append(os.path.join(workdir, "aggregate.md"))
    paths += compare_plots.write_plots(rows, os.path.join(workdir, "plots"), include_unfitted=include_unfitted)
    return paths + findings.write(findings_kind, rows, workdir, include_unfitted, targets)
