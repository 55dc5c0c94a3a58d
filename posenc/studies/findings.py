"""Findings of a comparison grid beyond table.md: the randomized-positions gain and PE x norm placement.

    python -m posenc findings --workdir WORKDIR --kind randomized   # from WORKDIR/results.jsonl
    python -m posenc findings --workdir WORKDIR --figures docs/figures --name quick

``python -m posenc compare`` calls :func:`write` after its report, so a grid
whose config sets ``findings`` writes these too; the command above redoes
it from a finished grid's rows, and with ``--figures`` copies the grid's
figures into DIR as ``findings_<name>_<file>.png``.

Every score is per run (:mod:`~posenc.studies.findings_scores`): the mean
over the evaluation lengths beyond the training length of the token accuracy
(``text``: of the log-perplexity over all tokens, lower is better), and the
same at the training length. Runs
that did not fit (``fitted`` False) are left out and counted, as in
table.md; runs that diverged count as diverged. Cells are the mean and the
95% t-interval over seeds (:func:`posenc.studies.stats.interval`); a claim that one
variant beats another is made only when the interval of their per-seed
differences (:func:`posenc.studies.stats.paired`) excludes zero.
With ``--include_unfitted`` (``include_unfitted=True``; ``python -m posenc
compare --include_unfitted`` passes it on) the unfitted runs are scored too and the
cells say ``[k unfitted, included]``.

* ``randomized`` (Ruoss et al. 2023;
  :mod:`~posenc.studies.findings_randomized`): per task and encoding ``k``,
  the gain = OOD accuracy of ``k_randomized`` minus that of ``k``, paired by
  seed (its interval over seeds and a verdict: helps / hurts / unresolved);
  per encoding the mean gain over tasks (the spread over tasks beside it), and
  the mean over every (task, encoding) pair: the paper's +12.0% figure. Writes
  ``findings.md`` and ``plots/findings_randomized.png``.
* ``interaction`` (:mod:`~posenc.studies.findings_interaction`): per task,
  encoding variant (e.g. ``rope``, ``rope_qknorm``) x placement, the OOD score
  and the score at the training length; per variant the best placement, marked
  clear when the per-seed differences from the runner-up exclude zero; whether
  the best placement depends on the encoding. Writes ``findings.md`` and
  ``plots/findings_interaction_<task>.png``.
* ``sizes`` (:mod:`~posenc.studies.findings_sizes`; length generalization in
  problem sizes, e.g. the arithmetic grids): per table (task or task variant)
  and label, the exact match of the main metric (decoded where the rows have
  it) at every problem size; at each size beyond training, each label against
  the best one, paired by seed; with the config's ``targets`` (``{"size": n,
  "at_least": {label: v}, "below": {label: v}}``) a target check at size n:
  each label's mean and interval against its bound, and every at-least label
  minus every below label, paired by seed. Writes ``findings.md`` and
  ``plots/findings_sizes_<table>.png``.
* ``ladder`` (:mod:`~posenc.studies.ladder`; a grid whose rows carry their
  budget, ``train_examples``): per label the exact match at twice the training
  size against the training examples, every seed, a logistic trend in
  log10(examples) with its uncertainty and the examples at which it reaches
  0.9. Writes ``findings.md`` and ``plots/findings_ladder.png``.
"""

from __future__ import annotations

import os
import shutil

from posenc.studies import findings_interaction, findings_randomized, findings_sizes, ladder, tables

# the kinds of findings write() knows ("": none)
KINDS = ("", "randomized", "interaction", "sizes", "ladder")


def check_targets(name: str, value) -> dict:
    """A ``targets`` mapping (``size``, ``at_least``, ``below``), checked: ValueError naming the bad part."""
    value = dict(value or {})
    extra = sorted(set(value) - {"size", "at_least", "below"})
    if extra:
        raise ValueError(f"{name} has unknown keys {extra}; allowed: size, at_least, below")
    if value and not (isinstance(value.get("size"), int) and value["size"] >= 1):
        raise ValueError(f"{name}.size must be a problem size >= 1; got {value.get('size')!r}")
    for key in ("at_least", "below"):
        for label, bound in dict(value.get(key) or {}).items():
            if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 <= bound <= 1:
                raise ValueError(f"{name}.{key}.{label} must be a number in [0, 1]; got {bound!r}")
    return value


def study_targets(workdir: str) -> dict:
    """The ``targets`` of the grid config recorded in ``workdir``'s study.json ({} if none)."""
    from posenc.studies import engine
    from posenc.workdir import files

    ident = files.read_json(os.path.join(workdir, engine.STUDY_FILE)) or {}
    return dict((ident.get("config") or {}).get("targets") or {})


def write(kind: str, rows, workdir: str, include_unfitted: bool = False, targets=None) -> list[str]:
    """Write ``findings.md`` and the figures of ``kind`` (one of KINDS; "" writes nothing)."""
    from posenc import checks

    checks.choice("findings", kind, KINDS)
    if not kind:
        return []
    plots_dir = os.path.join(workdir, "plots")
    os.makedirs(plots_dir, exist_ok=True)
    md = os.path.join(workdir, "findings.md")
    if kind == "ladder":
        return ladder.write(rows, workdir)
    if kind == "sizes":
        tables.write(md, findings_sizes.sizes_markdown(rows, include_unfitted, targets))
        return [md] + findings_sizes.plot_sizes(rows, plots_dir, include_unfitted)
    if kind == "randomized":
        tables.write(md, findings_randomized.randomized_markdown(rows, include_unfitted))
        fig = findings_randomized.plot_randomized(rows, os.path.join(plots_dir, "findings_randomized.png"),
                                                  include_unfitted)
        return [md] + ([fig] if fig else [])
    tables.write(md, findings_interaction.interaction_markdown(rows, include_unfitted))
    return [md] + findings_interaction.plot_interaction(rows, plots_dir, include_unfitted)


def copy_figures(workdir: str, directory: str, name: str, plots=None) -> list[str]:
    """Copy figures of the grid in ``workdir`` into ``directory`` as ``findings_<name>_<file>``.

    ``plots``: the file names (without .png) under WORKDIR/plots to copy;
    None: the main ones (each task's accuracy plot, the text log-perplexity
    plot, the aggregate heat-map and the findings figures).
    """
    plots_dir = os.path.join(workdir, "plots")
    os.makedirs(directory, exist_ok=True)
    if plots is None:
        plots = [f[:-4] for f in sorted(os.listdir(plots_dir)) if f.endswith(".png") and "_sweep_" not in f and (
            f.endswith("_accuracy.png") or f.startswith("findings_")
            or f in ("text_log_perplexity.png", "aggregate_heatmap.png"))]
    out = []
    for stem in plots:
        source = os.path.join(plots_dir, f"{stem}.png")
        if not os.path.exists(source):
            raise ValueError(f"{source} does not exist; the plots of {workdir} are: "
                             f"{', '.join(sorted(f[:-4] for f in os.listdir(plots_dir)))}")
        target = os.path.join(directory, f"findings_{name}_{stem.removeprefix('findings_')}.png")
        shutil.copyfile(source, target)
        out.append(target)
    return out
