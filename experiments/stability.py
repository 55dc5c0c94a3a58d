"""Training-stability study (posenc.studies.stability): final loss against learning rate.

    python -m posenc stability --config stability:quick --workdir /tmp/stability

Writes WORKDIR/results.jsonl, WORKDIR/table.md (LR sensitivity per variant
and size, the final loss per learning rate) and WORKDIR/plots/; resumable,
and several processes may share WORKDIR.
"""

from __future__ import annotations

from absl import app

from . import runtime


def define_flags() -> None:
    runtime.define_config_and_workdir("stability[:ARG] (packaged) or a config file path/to/file.py[:ARG].",
                                      "Directory for all runs, the table and plots.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from posenc.studies import stability_report
    from posenc.training import loop

    rows = runtime.run_study("stability")
    if loop.is_main_process():
        print(stability_report.table_markdown(rows))


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
