"""Plots of a comparison (PNG, written atomically): metric vs length, sweeps, LM log-perplexity, heat-map.

Every figure reads the statistics of :mod:`posenc.training.report` (mean
over seeds, 95% t-interval error bars). Runs that did not fit (``fitted``
False) are left out of the solid lines by default and drawn apart, dashed
with ``x`` markers, no interval ("k not fitted"); ``include_unfitted=True`` draws one
line over every run. Files:

* ``<task>_<metric>.png``: accuracy, exact match and loss vs eval length
  (log2 x), a line per label, dotted lines at the training lengths;
* ``text_log_perplexity.png``: the ALiBi paper's figure, log-perplexity vs
  eval length, one line per label; left all tokens, right the last L;
* ``<task>_sweep_<option>.png``: the main metric vs the sweep value (e.g.
  passkey depth), a panel per eval length;
* ``aggregate_heatmap.png``: OOD accuracy (``report.aggregate``), tasks as
  rows grouped by level, labels as columns, ``†`` where unfitted runs were
  left out.
"""

from __future__ import annotations

import os

import numpy as np

from posenc.studies import compare_report as report
from posenc.studies import figures


def _lines(ax, table: dict, unfitted: dict, metric: str, include_unfitted: bool) -> None:
    """One line per label of ``{label: {x: cell_stats}}``; unfitted runs dashed (from ``unfitted``)."""
    for i, label in enumerate(sorted(table)):
        color = f"C{i % 10}"
        pts = [(x, s[metric]) for x, s in table[label].items() if s[metric] is not None]
        k = max((s["unfitted"] for s in table[label].values()), default=0)
        name = label + (f" [{k} unfitted]" if k and include_unfitted else "")
        if pts:
            figures.errorbar(ax, [x for x, _ in pts], [v for _, v in pts], marker="o", color=color, label=name)
        apart = unfitted.get(label, {})
        upts = [(x, s[metric]) for x, s in apart.items() if s[metric] is not None]
        if upts and not include_unfitted:  # the mean of the unfitted runs, no interval
            ax.plot([x for x, _ in upts], [v[0] for _, v in upts], marker="x", linestyle="--",
                    color=color, alpha=0.6, label=f"{label} ({k} not fitted)")


def _unit_range(ax, metric: str) -> None:
    if metric != "loss":  # accuracies: a t-interval of few seeds may reach past [0, 1]
        ax.set_ylim(-0.03, 1.03)


def _length_axes(ax, train_lengths, ylabel: str, title: str, xlabel: str = "evaluation length (tokens)") -> None:
    for n in train_lengths:
        ax.axvline(n, color="gray", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _length_plots(rows, directory, include_unfitted) -> list[str]:
    summary = report.summarize(rows, include_unfitted=include_unfitted)
    apart = report.summarize(rows, only_unfitted=True)
    plt, paths = figures.pyplot(), []
    for task, table in sorted(summary.items()):
        mine = [r for r in rows if report.table_key(r) == task]
        column, marked = report.columns([r for r in mine if not r.get("sweep")])
        train_lengths = sorted(marked)
        xlabel = "problem size" if column == "problem_size" else "evaluation length (tokens)"
        if report.main_metric(task, rows) == "loss":
            fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
            last = sorted({r["last_L"] for r in mine if r.get("last_L")})
            for ax, metric, where in ((axes[0], "loss", "all tokens"),
                                      (axes[1], "loss_last_L", f"last L = {', '.join(map(str, last))} tokens")):
                _lines(ax, table, apart.get(task, {}), metric, include_unfitted)
                _length_axes(ax, train_lengths, "log-perplexity (nats per token)",
                             f"text: {where} of each window (dotted: training length)")
            fig.tight_layout()
            paths.append(figures.save(fig, os.path.join(directory, "text_log_perplexity.png")))
            continue
        decoded = any(r.get("decoded_accuracy") is not None for r in mine)
        what = "size" if column == "problem_size" else "length"
        for metric in ("decoded_accuracy", "decoded_exact_match") * decoded + ("accuracy", "exact_match", "loss"):
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            _lines(ax, table, apart.get(task, {}), metric, include_unfitted)
            _length_axes(ax, train_lengths, metric,
                         f"{task}: {metric} vs {what} (mean, 95% t-interval; dotted: training {what})", xlabel)
            _unit_range(ax, metric)
            fig.tight_layout()
            paths.append(figures.save(fig, os.path.join(directory, f"{task}_{metric}.png")))
    return paths


def _sweep_plots(rows, directory, include_unfitted) -> list[str]:
    sweeps = report.summarize_sweeps(rows, include_unfitted=include_unfitted)
    apart = report.summarize_sweeps(rows, only_unfitted=True)
    plt, paths = figures.pyplot(), []
    for task, options in sorted(sweeps.items()):
        metric = report.main_metric(task, rows)
        for option, by_label in options.items():
            lengths = sorted({n for v in by_label.values() for c in v.values() for n in c})
            cols = min(len(lengths), 3)
            rows_n = -(-len(lengths) // cols)
            fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.4 * rows_n), squeeze=False, sharey=True)
            for ax, n in zip(axes.flat, lengths):
                def at(table, n=n):
                    return {label: {v: cells[n] for v, cells in values.items() if n in cells}
                            for label, values in table.items()}

                _lines(ax, at(by_label), at(apart.get(task, {}).get(option, {})), metric, include_unfitted)
                ax.set_xlabel(option)
                ax.set_ylabel(metric)
                ax.set_title(f"{task}, length {n}", fontsize=10)
                _unit_range(ax, metric)
                ax.grid(True, alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=7)
            for ax in list(axes.flat)[len(lengths):]:
                ax.axis("off")
            fig.suptitle(f"{task}: {metric} vs {option} (mean, 95% t-interval)", fontsize=11)
            fig.tight_layout()
            paths.append(figures.save(fig, os.path.join(directory, f"{task}_sweep_{option}.png")))
    return paths


def write_heatmap(rows, path: str, *, include_unfitted: bool = False) -> str | None:
    """The aggregate table as a heat-map (tasks x labels); None (nothing written) if it is empty."""
    agg = report.aggregate(rows, include_unfitted=include_unfitted)
    if not agg:
        return None
    tasks = report.ordered_tasks(agg, rows)
    labels = sorted({label for t in agg.values() for label in t})
    values = np.full((len(tasks), len(labels)), np.nan)
    texts = np.full(values.shape, "", dtype=object)
    for i, task in enumerate(tasks):
        for j, label in enumerate(labels):
            cell = agg[task].get(label)
            if cell is None or cell["stat"] is None:
                texts[i, j] = "" if cell is None else (
                    "div." if cell["diverged"] else "unfit" if cell["unfitted"] else "n/a")
            else:
                values[i, j] = cell["stat"][0]
                texts[i, j] = f"{values[i, j]:.2f}" + ("†" if cell["unfitted"] and not include_unfitted else "")
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(3.0 + 0.9 * len(labels), 1.8 + 0.38 * len(tasks)))
    image = ax.imshow(np.ma.masked_invalid(values), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for (i, j), text in np.ndenumerate(texts):
        dark = np.isfinite(values[i, j]) and values[i, j] <= 0.6  # empty cells are white
        ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    levels = [report.task_level(t, rows) for t in tasks]
    ax.set_yticks(range(len(tasks)), [f"{t} [{lv}]" if lv else t for t, lv in zip(tasks, levels)], fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    for i in range(1, len(tasks)):
        if levels[i] != levels[i - 1]:  # a line between level groups
            ax.axhline(i - 0.5, color="white", linewidth=2)
    fig.colorbar(image, ax=ax, label="OOD accuracy")
    ax.set_title("accuracy beyond the training length" + ("" if include_unfitted else
                                                            " (†: unfitted runs left out)"), fontsize=10)
    fig.tight_layout()
    figures.save(fig, path)
    return path


def write_plots(rows: list[dict], directory: str, *, include_unfitted: bool = False) -> list[str]:
    """Every plot of the module docstring in ``directory``; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = _length_plots(rows, directory, include_unfitted) + _sweep_plots(rows, directory, include_unfitted)
    heat = write_heatmap(rows, os.path.join(directory, "aggregate_heatmap.png"), include_unfitted=include_unfitted)
    return paths + ([heat] if heat else [])
