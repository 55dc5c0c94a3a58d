"""The study engine: points -> validate -> claim -> run -> rows -> report, for every study.

A study (:class:`Study`) supplies its config declaration, its points, how to
run a group of points and its report; the engine owns everything else, once:

1. the study config is validated against its declaration and expanded into
   points (:class:`Point`), every one validated before anything compiles or
   a workdir is claimed;
2. the workdir is claimed for this study (``study.json``: the study, its
   config and its points; a workdir holding another study config is refused);
   temporary files that killed writers left are removed;
3. points run in order, group by group (a group: points run together, e.g.
   the seeds of a cell in one vmapped step), each group only once the points
   it depends on (``after``) are complete. Every point's directory
   ``runs/<name>/`` is locked while it runs (:mod:`posenc.workdir.lock`), so
   N processes started on one workdir (one host, or many over a shared
   filesystem) split the points between them: a process skips a group
   another live process holds and waits for it when nothing else is left;
4. a point's rows are written atomically to ``runs/<name>/point.jsonl`` when
   it completes; a point with that file is complete and is never run again, so
   a killed process loses at most the points in flight (and those resume
   from their checkpoints);
5. once every point is complete: ``results.jsonl`` (every row, in point
   order) and the study's report. :func:`report` rebuilds the report of any
   workdir from its rows alone, partial grids included.

With several JAX processes (``--distributed``) every process runs every
point in lockstep and only process 0 writes; the claiming above is for
independent processes.
"""

from __future__ import annotations

import dataclasses
import os
import time

from absl import logging

from posenc.config.schema import ConfigError
from posenc.workdir import files, results
from posenc.workdir import lock as lock_lib

STUDY_FILE = lock_lib.STUDY_FILE
ROWS_FILE = "point.jsonl"
POLL_SECONDS = 2.0
CLAIM_WAIT_SECONDS = 5.0  # claim(): how long a process waits for the workdir lock another one holds

STUDIES: dict[str, Study] = {}


@dataclasses.dataclass
class Point:
    """One unit of work of a study: its rows are complete or not at all.

    ``name``: unique in the study and file-safe (its directory ``runs/<name>/``);
    ``fields``: the study's row fields of this point (its identity in tables);
    ``run``: its validated run (:class:`posenc.training.prepare.Resolved`) if it
    trains or evaluates one; ``group``: points with the same group run
    together; ``after``: names of points that must be complete first;
    ``data``: whatever else the study needs to run it (not written to rows).
    """

    name: str
    fields: dict = dataclasses.field(default_factory=dict)
    run: object = None
    group: str | None = None
    after: tuple[str, ...] = ()
    data: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Context:
    """What a study's ``run`` and ``report`` see: the workdir, the config, every point, options."""

    workdir: str
    config: object
    points: list[Point]
    options: dict = dataclasses.field(default_factory=dict)
    study: Study | None = None
    missing: list[Point] = dataclasses.field(default_factory=list)  # points without rows (report)

    def run_dir(self, point: Point | str) -> str:
        return os.path.join(self.workdir, "runs", point if isinstance(point, str) else point.name)

    def point(self, name: str) -> Point:
        return next(p for p in self.points if p.name == name)

    def rows_of(self, name: str) -> list[dict]:
        """The rows of a complete point (e.g. a dependency's)."""
        return files.read_jsonl(os.path.join(self.run_dir(name), ROWS_FILE))


class Study:
    """A study: its config declaration, points, how a group runs, its rows' fields and its report."""

    name: str = ""
    schema = None  # the Section class of the study's config
    row_fields: dict[str, str] = {}  # field -> doc of the fields this study adds to rows

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name:
            STUDIES[cls.name] = cls()

    def points(self, config) -> list[Point]:
        raise NotImplementedError

    def run(self, points: list[Point], ctx: Context) -> list[list[dict]]:
        """Run a group of points; the rows of each, in order."""
        raise NotImplementedError

    def report(self, rows: list[dict], ctx: Context) -> list[str]:
        """Write the study's tables and figures from ``rows``; the paths written."""
        return []

    def complete(self, point: Point, rows: list[dict]) -> bool:
        """Whether a point's written ``rows`` are all it should have (default: any rows are)."""
        return True


def study(name: str) -> Study:
    """The registered study ``name``; ConfigError listing every study."""
    _import_studies()
    if name not in STUDIES:
        raise ConfigError(f"unknown study {name!r}; choose one of: {', '.join(sorted(STUDIES))}")
    return STUDIES[name]


def _import_studies() -> None:
    # Every module of this package is imported once, so a study file registers itself
    # (Study.__init_subclass__) and no list of studies is kept elsewhere.
    import importlib
    import pkgutil

    package = __name__.rsplit(".", 1)[0]
    for m in pkgutil.iter_modules([os.path.dirname(__file__)]):
        importlib.import_module(f"{package}.{m.name}")


def validate(study_: Study, config):
    """``config`` checked against the study's declaration (ConfigError on an unknown or bad field)."""
    from posenc.training import prepare

    try:
        return prepare.plain_copy(study_.schema.validate(prepare.plain_dict(config), ""))
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None


def expand(study_: Study, config) -> tuple[object, list[Point]]:
    """The validated config and its points (ConfigError naming the first bad one)."""
    config = validate(study_, config)
    points = study_.points(config)
    names = [p.name for p in points]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"the study has several points named {dupes[0]!r}; grid entries must differ")
    known = set(names)
    for p in points:
        for dep in p.after:
            if dep not in known:
                raise ConfigError(f"point {p.name} depends on {dep!r}, which is not a point of the study")
    return config, points


def _is_main() -> bool:
    import jax

    return jax.process_index() == 0


def _independent() -> bool:
    import jax

    return jax.process_count() == 1


def _identity(study_: Study, config, points) -> dict:
    keys = [[p.name, p.run.hash if p.run is not None else results.canonical_json(p.fields)] for p in points]
    return {"study": study_.name, "points": [p.name for p in points],
            "points_hash": results.config_hash({"study": study_.name, "points": keys})}


def claim(study_: Study, config, points, workdir: str) -> None:
    """Write ``study.json`` or check that it holds this study (WorkdirHoldsOther if it holds
    another study, another config's, or a run)."""
    lock_lib.check_kind(workdir, "study")  # a run's workdir: refused before anything is written
    os.makedirs(workdir, exist_ok=True)
    ident = _identity(study_, config, points)
    path = os.path.join(workdir, STUDY_FILE)
    # check-and-write by one process at a time; processes started together wait for each other's
    # (milliseconds), a run that holds the workdir is refused after CLAIM_WAIT_SECONDS
    with lock_lib.hold(workdir, wait=CLAIM_WAIT_SECONDS):
        old = files.read_json(path)
        if old is not None and (old.get("study"), old.get("points_hash")) != (ident["study"],
                                                                             ident["points_hash"]):
            raise lock_lib.WorkdirHoldsOther(
                f"{workdir} holds the {old.get('study')} study of another config (points hash "
                f"{str(old.get('points_hash'))[:12]}..., this one {ident['points_hash'][:12]}...); "
                "use another --workdir (or remove this one)")
        if old is None or results.canonical_json(old.get("config")) != results.canonical_json(config.to_dict()):
            # the latest config: the same points, perhaps evaluated at other lengths or variants
            files.write_json(path, {**ident, "config": config.to_dict()})


def has_rows(ctx: Context, point: Point) -> bool:
    """Whether ``point`` has written rows (all it should have now or not: :func:`is_complete`)."""
    return os.path.exists(os.path.join(ctx.run_dir(point), ROWS_FILE))


def is_complete(ctx: Context, point: Point) -> bool:
    if not has_rows(ctx, point):
        return False
    return ctx.study is None or ctx.study.complete(point, ctx.rows_of(point.name))


def groups(points: list[Point]) -> list[list[Point]]:
    """Points grouped by ``group`` (a point without one is its own group), in order of first point."""
    out: dict[str, list[Point]] = {}
    for p in points:
        out.setdefault(p.group or f"\0{p.name}", []).append(p)
    return list(out.values())


def _try_claim(ctx: Context, group: list[Point]) -> list[str] | None:
    held = []
    try:
        for p in group:
            held.append(lock_lib.acquire(ctx.run_dir(p)))
    except lock_lib.WorkdirInUse:
        for path in held:
            lock_lib.release(path)
        return None
    return held


def _write_rows(ctx: Context, point: Point, rows: list[dict]) -> None:
    if _is_main():
        files.write_jsonl(os.path.join(ctx.run_dir(point), ROWS_FILE),
                          [dict(r, point=point.name) for r in rows])


def run(study_: Study | str, config, workdir: str, *, poll: float = POLL_SECONDS, **options) -> list[dict]:
    """Run every point of the study (skipping complete ones), then write results.jsonl and the report.

    ``options`` reach the study's ``run`` and ``report`` (e.g. ``include_unfitted``).
    Returns every row.
    """
    study_ = study(study_) if isinstance(study_, str) else study_
    config, points = expand(study_, config)
    workdir = os.path.abspath(workdir)
    main = _is_main()
    if main:
        claim(study_, config, points, workdir)
        for path in files.remove_stale_temps(workdir):
            logging.info("removed %s (left by a killed writer)", path)
    ctx = Context(workdir=workdir, config=config, points=points, options=dict(options), study=study_)
    t0, ran = time.time(), 0
    todo = groups(points)
    while todo:
        waiting, progressed = [], False
        for group in todo:
            if all(is_complete(ctx, p) for p in group):
                progressed = True
                continue
            if not all(is_complete(ctx, ctx.point(d)) for p in group for d in p.after):
                waiting.append(group)
                continue
            held = _try_claim(ctx, group) if _independent() else []
            if held is None:  # another process runs it
                waiting.append(group)
                continue
            try:
                pending = [p for p in group if not is_complete(ctx, p)]  # it may have finished meanwhile
                if pending:
                    logging.info("[%d/%d] %s", points.index(pending[0]) + 1, len(points),
                                 ", ".join(p.name for p in pending))
                    for p, rows in zip(pending, study_.run(pending, ctx)):
                        _write_rows(ctx, p, rows)
                    ran += len(pending)
            finally:
                for path in held:
                    lock_lib.release(path)
            progressed = True
        todo = waiting
        if todo and not progressed:
            time.sleep(poll)  # what is left runs in other processes (or waits on what they run)
    rows = load_rows(workdir, points=points)
    logging.info("%s: %d points run here, %d in all, in %.0fs", study_.name, ran, len(points), time.time() - t0)
    if main:
        files.write_jsonl(os.path.join(workdir, "results.jsonl"), rows)
        study_.report(rows, ctx)
    return rows


def load_rows(workdir: str, *, points=None) -> list[dict]:
    """Every row of the study in ``workdir``, as plain dicts, in point order (complete points only);
    of a run's workdir, its rows as a study of one (:func:`run_rows`).

    The fields are those of :data:`posenc.studies.rows.FIELDS` plus the
    study's own (``Study.row_fields``); ``pandas.DataFrame(load_rows(w))``
    gives a table of them.
    """
    if points is None:
        if _held(workdir) == "run":
            return run_rows(workdir)
        names = files.read_json(os.path.join(workdir, STUDY_FILE))["points"]
    else:
        names = [p.name if isinstance(p, Point) else p for p in points]
    out = []
    for name in names:
        out += files.read_jsonl(os.path.join(workdir, "runs", name, ROWS_FILE))
    return out


def _held(workdir: str) -> str:
    """"run" or "study": what ``workdir`` holds; WorkdirHoldsOther (one line) if neither."""
    kind = lock_lib.held_kind(workdir)
    if kind is None:
        raise lock_lib.WorkdirHoldsOther(
            f"{workdir} holds no run or study ({lock_lib.RUN_FILE} or {STUDY_FILE}): give the --workdir "
            "of a run (python -m posenc train) or a study (python -m posenc compare, extend, stability)")
    return kind


def run_rows(workdir: str) -> list[dict]:
    """The rows of the run in ``workdir`` as those of a comparison of one point: ``variant`` its
    encoding, ``task_variant`` its task, ``run`` and ``point`` the workdir's name."""
    name = os.path.basename(os.path.abspath(workdir))
    return [dict(r, variant=r.get("position"), task_variant=r.get("task"), run=name, point=name)
            for r in files.read_jsonl(os.path.join(workdir, "results.jsonl"))]


def report(workdir: str, **options) -> list[str]:
    """Rebuild the report of the study in ``workdir`` from its rows (a partial grid says what is missing).

    A run's workdir is reported as a comparison of one point: its table.md and plots.
    """
    if _held(workdir) == "run":
        return study("compare").report(run_rows(workdir), Context(
            workdir=os.path.abspath(workdir), config={"findings": "", "targets": {}}, points=[],
            options=dict(options)))
    ident = files.read_json(os.path.join(workdir, STUDY_FILE))
    study_ = study(ident["study"])
    config, points = expand(study_, ident["config"])
    ctx = Context(workdir=os.path.abspath(workdir), config=config, points=points, options=dict(options),
                  study=study_)
    ctx.missing = [p for p in points if not is_complete(ctx, p)]
    rows = load_rows(workdir, points=points)
    files.write_jsonl(os.path.join(workdir, "results.jsonl"), rows)
    return study_.report(rows, ctx)
