"""Studies and their engine: every study runs through :func:`run`, and its rows come back as data.

    from posenc import studies
    rows = studies.run("compare", config, "/tmp/grid")   # validate, claim, run, rows, report
    rows = studies.load_rows("/tmp/grid")                 # every row of any study, plain dicts
    studies.report("/tmp/grid")                           # the report again, from the rows alone

A study (:class:`~posenc.studies.engine.Study`: ``compare``, ``extend``,
``stability``, or one of your own) supplies its config declaration, its
points, how a group of points runs and its report; the engine
(:mod:`~posenc.studies.engine`) owns validation, claiming, resumption,
atomic rows, sharing a workdir between processes and the report. The rows'
fields are documented in :mod:`~posenc.studies.rows`.
"""

from posenc.studies.engine import STUDIES, Point, Study, load_rows, report, run, study

__all__ = ["STUDIES", "Point", "Study", "load_rows", "report", "run", "study"]
