"""Train one config, evaluate it at every eval length, write results.

    python -m posenc train --config default --workdir /tmp/run
    python -m posenc train --config default:alibi \
        --config.train.steps=500 --workdir /tmp/alibi
    python -m posenc train --config default:tiny --plugins=my_encodings \
        --config.model.position.kind=half_alibi --workdir /tmp/mine

Writes WORKDIR/config.json, WORKDIR/checkpoints/ (Orbax, last k kept),
WORKDIR/train_log.jsonl, WORKDIR/results.jsonl (one row per eval length), and
the run's report as a comparison of one: WORKDIR/table.md and WORKDIR/plots/.
Rerunning with other ``--config.eval.*`` fields (lengths, variants) evaluates
the trained run again and adds its rows; nothing is trained again.
Rerunning with the same WORKDIR resumes from the last checkpoint, or only
reports if the run is complete. ``--plugins`` imports modules first (your own
encodings); a bad config field prints one line naming it and exits 2.

All local devices are used (``--config.mesh.data``, ``--config.mesh.fsdp``);
several hosts: the same command on every host with ``--distributed`` (and
the coordinator flags, unless SLURM / a TPU pod lets JAX detect them), a
WORKDIR on a shared filesystem; only process 0 writes results and logs.
See docs/multidevice.md.
"""

from __future__ import annotations

from absl import app, flags, logging

from posenc.workdir import records

from . import runtime


def define_flags() -> None:
    """The command line's flags (defined when run as a program, so that importing
    the module, as the tests do, defines none and modules do not clash)."""
    runtime.define_config_and_workdir("A packaged config by name (default[:ARG]) or a config file "
                                      "(path/to/file.py[:ARG]).", "Directory for checkpoints and results.")
    flags.DEFINE_integer("max_steps_this_run", None, "Stop after this many steps (checkpointed); rerun to resume.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    runtime.start()
    from posenc.studies.compare_report import table_markdown
    from posenc.training import loop
    from posenc.training.schema import Run

    loop.quiet_libraries()
    config = runtime.config(Run)
    try:
        rows = loop.run(config, flags.FLAGS.workdir, max_steps_this_run=flags.FLAGS.max_steps_this_run)
    except records.NonFiniteError as e:
        logging.error("%s", e)
        raise SystemExit(1) from None
    if rows is None or not loop.is_main_process():
        return
    from posenc import studies

    print(table_markdown(rows))
    written = studies.report(flags.FLAGS.workdir)
    logging.info("results: %s/results.jsonl; report: %s", flags.FLAGS.workdir, ", ".join(written))


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
