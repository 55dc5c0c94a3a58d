"""Analysis of one trained run (posenc.studies.analyze): where attention looks, what positions learned.

    python -m posenc analyze --workdir RUN_DIR
    python -m posenc analyze --workdir RUN_DIR --out docs/figures --prefix findings_analysis_t5_

RUN_DIR is a finished run (config.json and a checkpoint: posenc train,
or WORKDIR/runs/<run>/ of a study). Writes the figures and analysis.json of
posenc.studies.analyze into --out (default RUN_DIR/analysis).
"""

from __future__ import annotations

from absl import app, flags

from . import runtime


def define_flags() -> None:
    flags.DEFINE_string("workdir", None, "A finished run's directory (config.json + checkpoints).")
    flags.DEFINE_string("out", None, "Output directory (default WORKDIR/analysis).")
    flags.DEFINE_string("prefix", "", "Prefix of every written file name.")
    flags.DEFINE_integer("factor", 4, "Longer evaluation length = factor x the training length.")
    flags.DEFINE_integer("batch_size", 16, "Evaluation examples per length.")
    flags.DEFINE_integer("seed", 1234, "Key of the evaluation examples.")
    flags.mark_flags_as_required(["workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    runtime.start()
    from posenc.studies import analyze
    from posenc.training import loop

    loop.quiet_libraries()
    f = flags.FLAGS
    written = analyze.analyze(f.workdir, f.out, prefix=f.prefix, factor=f.factor, batch_size=f.batch_size,
                              seed=f.seed)
    for what, path in written.items():
        print(f"{what}: {path}")


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
