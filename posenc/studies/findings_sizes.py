"""Findings ``sizes``: exact match per problem size (length generalization in problem sizes).

Per table (task or task variant) and label, the exact match of the main
metric (decoded where the rows have it) at every problem size; at each size
beyond training, each label against the best one, paired by seed; with the
config's ``targets`` (``{"size": n, "at_least": {label: v}, "below": {label:
v}}``, :func:`posenc.studies.findings.check_targets`) a target check at size
n: each label's mean and interval against its bound, and every at-least
label minus every below label, paired by seed; with ``targets["baseline"]`` (``posenc findings
--baseline``) every label's main metric (decoded per-token accuracy, say) minus the baseline's at every
size, paired by seed. ``findings.md`` gets
:func:`sizes_markdown`, ``plots/findings_sizes_<table>.png``
:func:`plot_sizes`.
"""

from __future__ import annotations

import collections
import os

from posenc.studies import compare_report, figures, stats, tables
from posenc.studies.findings_scores import notes


def size_scores(rows, include_unfitted: bool = False, *, exact: bool = True) -> dict:
    """``{table: {"metric", "train": sizes, "cells": {label: {size: cell}}}}``: exact match per problem size
    (``exact`` False: the table's main metric itself, e.g. decoded per-token accuracy).

    A cell is ``{"stat": interval over seeds or None, "by_seed": {seed: value}, "runs", "unfitted",
    "diverged"}``; unfitted runs are left out (``include_unfitted``: kept) and counted.
    """
    out = {}
    for table, rs in compare_report._by_task(
            r for r in rows if not r.get("sweep") and not r.get("eval_variant")).items():
        metric = compare_report.main_metric(table, rs)
        metric = compare_report.exact_of(metric) if exact else metric
        column, train = compare_report.columns(rs, sizes=True)
        vary = compare_report._vary(rs)
        groups = collections.defaultdict(list)
        for r in rs:
            groups[(compare_report._label(r, vary), r[column])].append(r)
        cells = {}
        for (label, size), g in groups.items():
            use = [r for r in g if (include_unfitted or r.get("fitted") is not False)
                   and r.get("diverged_at_step") is None and r.get(metric) is not None]
            cells.setdefault(label, {})[size] = dict(
                stat=stats.interval([r[metric] for r in use]), by_seed={r["seed"]: r[metric] for r in use},
                runs=len(g), unfitted=sum(r.get("fitted") is False for r in g),
                diverged=sum(r.get("diverged_at_step") is not None for r in g), included=include_unfitted)
        out[table] = {"metric": metric, "column": column, "train": sorted(train),
                      "cells": {k: dict(sorted(v.items())) for k, v in sorted(cells.items())}}
    return out

def _pair(a, b) -> str:
    d = stats.paired(a["by_seed"], b["by_seed"])
    if d is None:
        return "n/a"
    if d.half is None:
        return f"{d.mean:+.3f} (1 seed)"
    verdict = "excludes 0" if stats.excludes_zero(d) else "includes 0"
    return f"{d.mean:+.3f} [{d.mean - d.half:+.3f}, {d.mean + d.half:+.3f}] ({verdict}, {d.n} seeds)"


def _against_baseline(table, rows, baseline: str, include_unfitted: bool) -> list[str]:
    """Lines: every label's main metric minus ``baseline``'s at every size, paired by seed."""
    t = size_scores(rows, include_unfitted, exact=False).get(table)
    if t is None or baseline not in t["cells"]:
        return ["", f"(no label {baseline!r} in {table}: no paired differences against it)", ""]
    sizes = sorted({n for c in t["cells"].values() for n in c})
    what = compare_report.DESCRIBE.get(t["metric"], t["metric"])
    lines = ["", f"{table}: {what}, each label minus {baseline}, paired by seed (mean [95% t-interval]):", "",
             "| label | " + " | ".join(f"n={n}{'*' if n in t['train'] else ''}" for n in sizes) + " |",
             "|" + "---|" * (len(sizes) + 1)]
    base = t["cells"][baseline]
    for label, by in t["cells"].items():
        if label != baseline:
            lines.append(f"| {label} | " + " | ".join(_pair(by[n], base[n]) if n in by and n in base else ""
                                                      for n in sizes) + " |")
    return lines + [""]


def _bound_check(cell, bound: float, at_least: bool) -> str:
    stat = None if cell is None else cell["stat"]
    if stat is None:
        return "no fitted run" if cell and cell["unfitted"] else "n/a"
    lo, hi = stat.bounds(0.0, 1.0)
    mean_ok = stat.mean >= bound if at_least else stat.mean < bound
    whole = lo >= bound if at_least else hi < bound
    return ("met" if mean_ok else "missed") + (", the whole interval" if whole and mean_ok else
                                               ", not the whole interval" if mean_ok else "")


def sizes_markdown(rows, include_unfitted: bool = False, targets=None) -> str:
    res = size_scores(rows, include_unfitted)
    targets = dict(targets or {})
    lines = ["## Exact match per problem size", "",
             f"Cells: {tables.INTERVAL_NOTE}; * = a training size. "
             + ("Every run is scored, fitted or not." if include_unfitted else
                "Runs that did not fit the training size are left out ([k unfitted]).")
             + " Paired differences: seed s of one label minus seed s of the other, 95% t-interval.", ""]
    for table, t in res.items():
        sizes = sorted({n for c in t["cells"].values() for n in c})
        what = compare_report.DESCRIBE.get(t["metric"], t["metric"])
        lines += [f"### {table}: {what}", "",
                  "| label | " + " | ".join(f"n={n}{'*' if n in t['train'] else ''}" for n in sizes) + " |",
                  "|" + "---|" * (len(sizes) + 1)]
        for label, by in t["cells"].items():
            lines.append(f"| {label} | " + " | ".join(
                (tables.number(by[n]["stat"], metric="exact_match") + notes(by[n]) if by[n]["stat"] else
                 f"not fitted ({by[n]['unfitted']})" if by[n]["unfitted"] else "n/a")
                if n in by else "" for n in sizes) + " |")
        lines.append("")
        for n in sizes:
            if n in t["train"] or (t["column"] == "eval_length"):
                continue
            ranked = sorted(((by[n]["stat"].mean, label) for label, by in t["cells"].items()
                             if n in by and by[n]["stat"]), reverse=True)
            if len(ranked) < 2:
                continue
            best = ranked[0][1]
            lines.append(f"At n={n}, best: {best}; each label minus it, paired by seed: "
                         + "; ".join(f"{label} {_pair(t['cells'][label][n], t['cells'][best][n])}"
                                     for _, label in ranked[1:]) + ".")
        if targets.get("baseline"):
            lines += _against_baseline(table, rows, str(targets["baseline"]), include_unfitted)
        if targets.get("size") is not None:
            n = int(targets["size"])
            high, low = dict(targets.get("at_least", {})), dict(targets.get("below", {}))
            lines += ["", f"Target at n={n}:", "", "| label | target | mean [95% t-interval] | check |",
                      "|---|---|---|---|"]
            for label, bound in [*((k, (v, True)) for k, v in high.items()),
                                 *((k, (v, False)) for k, v in low.items())]:
                cell = t["cells"].get(label, {}).get(n)
                lines.append(f"| {label} | {'>=' if bound[1] else '<'} {bound[0]} | "
                             f"{tables.number(cell['stat'], metric='exact_match') if cell else 'n/a'}"
                             f"{notes(cell) if cell else ''} | {_bound_check(cell, *bound)} |")
            lines += ["", "Paired differences at the target size:", ""]
            for a in high:
                for b in low:
                    ca, cb = t["cells"].get(a, {}).get(n), t["cells"].get(b, {}).get(n)
                    if ca and cb:
                        lines.append(f"- {a} - {b}: {_pair(ca, cb)}")
        lines.append("")
    return "\n".join(lines)


def plot_sizes(rows, directory: str, include_unfitted: bool = False) -> list[str]:
    res, paths = size_scores(rows, include_unfitted), []
    plt = figures.pyplot()
    for table, t in res.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for i, (label, by) in enumerate(t["cells"].items()):
            pts = [(n, c["stat"]) for n, c in by.items() if c["stat"] is not None]
            if pts:
                figures.errorbar(ax, [n for n, _ in pts], [s for _, s in pts], marker="o", color=f"C{i % 10}",
                                 label=label)
        for n in t["train"]:
            ax.axvline(n, color="gray", linestyle=":", linewidth=1)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("problem size" if t["column"] == "problem_size" else "evaluation length (tokens)")
        ax.set_ylabel(t["metric"])
        ax.set_title(f"{table}: {t['metric']} (mean, 95% t-interval; dotted: training size)", fontsize=9)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(figures.save(fig, os.path.join(directory, f"findings_sizes_{table}.png")))
    return paths
