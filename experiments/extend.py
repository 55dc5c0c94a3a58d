"""Context extension study (posenc.studies.extend): every RoPE scaling, zero-shot and fine-tuned.

    python -m posenc extend --config extend:quick --workdir /tmp/extend
    python -m posenc extend --config extend:quick --workdir /tmp/ext2 \\
        --config.base_run=/tmp/run      # extend a finished run of posenc train

Writes WORKDIR/results.jsonl, WORKDIR/table.md and WORKDIR/plots/; every
point is resumable (rerun the same command to continue) and several
processes may share WORKDIR.
"""

from __future__ import annotations

from absl import app

from . import runtime


def define_flags() -> None:
    runtime.define_config_and_workdir("extend[:ARG] (packaged) or a config file path/to/file.py[:ARG].",
                                      "Directory for the base runs, fine-tunes, table and plots.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from posenc.studies import extend_report
    from posenc.training import loop

    rows = runtime.run_study("extend")
    if loop.is_main_process():
        print(extend_report.table_markdown(rows))


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
