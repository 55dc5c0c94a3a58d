"""Findings of a finished comparison grid (posenc.studies.findings), and its figures for the docs.

    python -m posenc findings --workdir WORKDIR --kind randomized
    python -m posenc findings --workdir WORKDIR --kind sizes --baseline rope
    python -m posenc findings --workdir WORKDIR --figures docs/figures --name quick

Writes WORKDIR/findings.md and its figures from the grid's rows (a grid
whose config sets ``findings`` writes them already); ``--figures`` copies the
grid's main figures into DIR as ``findings_<name>_<file>.png``.
"""

from __future__ import annotations

from absl import app, flags

from . import runtime


def define_flags() -> None:
    from posenc.studies import findings

    flags.DEFINE_string("workdir", None, "A comparison grid's workdir.")
    flags.DEFINE_enum("kind", "", findings.KINDS, "Findings to write (the grid config's `findings`; '' = none).")
    flags.DEFINE_string("figures", None, "Copy the grid's main figures into this directory.")
    flags.DEFINE_string("name", None, "File name part of the copied figures (with --figures).")
    flags.DEFINE_bool("include_unfitted", False, "Score every run, not only those that fitted.")
    flags.DEFINE_string("baseline", None, "With --kind sizes: also every label's main metric minus this "
                        "label's at every size, paired by seed.")
    flags.DEFINE_list("plots", None, "With --figures: the plots to copy (file names without .png; "
                      "default: the main ones).")
    flags.mark_flags_as_required(["workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from posenc import studies
    from posenc.studies import findings

    f = flags.FLAGS
    rows = studies.load_rows(f.workdir)
    targets = findings.study_targets(f.workdir) if f.kind == "sizes" else None
    if f.baseline:
        if f.kind != "sizes":
            raise app.UsageError(f"--baseline {f.baseline} is for --kind sizes; got --kind {f.kind!r}")
        targets = {**(targets or {}), "baseline": f.baseline}
    for path in findings.write(f.kind, rows, f.workdir, f.include_unfitted, targets):
        print(path)
    if f.figures:
        if not f.name:
            raise app.UsageError("--figures needs --name")
        for path in findings.copy_figures(f.workdir, f.figures, f.name, f.plots):
            print(path)


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
