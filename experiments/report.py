"""Rebuild the report of any study or run from its rows: a finished or partial grid, one run.

    python -m posenc report --workdir /tmp/compare
    python -m posenc report --workdir /tmp/compare --include_unfitted
    python -m posenc report --workdir /tmp/run          # a run: a comparison of one

Reads WORKDIR/study.json and every point's rows (or a run's results.jsonl);
cells of points without rows yet say so. Runs nothing. A workdir that holds
neither is refused in one line (exit 2).
"""

from __future__ import annotations

from absl import app, flags

from . import runtime


def define_flags() -> None:
    flags.DEFINE_string("workdir", None, "A study's workdir (study.json) or a run's (config.json).")
    flags.DEFINE_bool("include_unfitted", False, "compare: report cells over every run.")
    flags.mark_flags_as_required(["workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from posenc import studies

    for path in studies.report(flags.FLAGS.workdir, include_unfitted=flags.FLAGS.include_unfitted):
        print(path)


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
