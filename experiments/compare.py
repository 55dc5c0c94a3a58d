"""Run a comparison grid (posenc.studies.compare), then write results.jsonl, table.md and plots.

    python -m posenc compare --config compare:quick --workdir /tmp/compare

Each grid point trains and evaluates in WORKDIR/runs/<name>/ (resumable;
complete points are skipped, so a killed grid loses only the points in
flight). Several processes may share WORKDIR (on one host, or many over a
shared filesystem): they split the points between them (docs/studies.md).
``--include_unfitted`` keeps runs that did not fit in the report's cells.
"""

from __future__ import annotations

from absl import app, flags

from . import runtime


def define_flags() -> None:
    runtime.define_config_and_workdir("compare[:ARG] (packaged) or a config file path/to/file.py[:ARG].",
                                      "Directory for all runs, the table and plots.")
    flags.DEFINE_bool("include_unfitted", False, "Report cells over every run, not only those that fitted.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from posenc.studies import compare_report
    from posenc.training import loop

    unfitted = flags.FLAGS.include_unfitted
    rows = runtime.run_study("compare", include_unfitted=unfitted)
    if loop.is_main_process():
        print(compare_report.table_markdown(rows, include_unfitted=unfitted))
        print(compare_report.aggregate_markdown(rows, include_unfitted=unfitted))


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
