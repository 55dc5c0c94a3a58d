"""Comparison report: ``table.md`` and PNG plots of metric vs eval length.

Rows are grouped per task by label (the run's ``variant`` if it has one,
else the position kind, marked ``+randomized``; ``@<eval variant>`` for
the rows of an evaluation variant; plus the norm placement / kind when they
vary in the task), and per eval length aggregated over seeds as mean ± std (population
std, 0 for one seed). Cells that are not applicable (e.g. a learned table
past its rows) print ``n/a``, runs that diverged ``diverged`` (or ``[k
diverged]`` after the mean of the other seeds); both are left out of the
plots.
Main metric: accuracy (exact match alongside), and loss for ``text``.
"""

from __future__ import annotations

import collections
import os

import numpy as np

from posenc.training.results import atomic_write_text


def main_metric(task: str) -> str:
    return "loss" if task == "text" else "accuracy"


def _label(row: dict, vary: set[str]) -> str:
    if row.get("variant"):
        parts = [row["variant"]]
    else:
        parts = [row["position"] + ("+randomized" if row.get("randomized") else "")]
    if row.get("eval_variant"):
        parts[0] += f"@{row['eval_variant']}"
    if "placement" in vary:
        parts.append(row["placement"])
    if "norm" in vary:
        parts.append(row["norm"])
    return "/".join(parts)


def summarize(rows: list[dict]) -> dict:
    """``{task: {label: {eval_length: {metric: (mean, std, n) or None}}}}`` over seeds."""
    by_task = collections.defaultdict(list)
    for r in rows:
        by_task[r["task"]].append(r)
    out = {}
    for task, rs in by_task.items():
        vary = {f for f in ("placement", "norm") if len({r[f] for r in rs}) > 1}
        cells = collections.defaultdict(lambda: collections.defaultdict(list))
        for r in rs:
            cells[_label(r, vary)][r["eval_length"]].append(r)
        table = {}
        for label, by_len in cells.items():
            table[label] = {}
            for length, group in sorted(by_len.items()):
                stats = {}
                for m in ("loss", "accuracy", "exact_match"):
                    vals = [g[m] for g in group if g[m] is not None]
                    stats[m] = (float(np.mean(vals)), float(np.std(vals)), len(vals)) if vals else None
                stats["diverged"] = sum(g.get("diverged_at_step") is not None for g in group)
                table[label][length] = stats
        out[task] = table
    return out


def _cell(stats: dict, task: str) -> str:
    main, diverged = stats[main_metric(task)], stats.get("diverged", 0)
    if main is None:
        return "diverged" if diverged else "n/a"
    text = f"{main[0]:.3f} ± {main[1]:.3f}"
    em = stats["exact_match"]
    if task != "text" and em is not None:
        text += f" (EM {em[0]:.2f})"
    if diverged:
        text += f" [{diverged} diverged]"
    return text


def table_markdown(rows: list[dict]) -> str:
    """Markdown: per task, rows = label, columns = eval lengths (train length marked *)."""
    summary = summarize(rows)
    lines = []
    for task in sorted(summary):
        table = summary[task]
        lengths = sorted({n for t in table.values() for n in t})
        train_lengths = {r["train_length"] for r in rows if r["task"] == task}
        seeds = {r["seed"] for r in rows if r["task"] == task}
        metric = main_metric(task)
        lines += [f"## {task}", "",
                  f"{metric} (mean ± std over {len(seeds)} seed(s))"
                  + ("" if task == "text" else ", exact match (EM) in brackets")
                  + f"; * = training length {', '.join(map(str, sorted(train_lengths)))}", ""]
        header = ["encoding"] + [f"{n}{'*' if n in train_lengths else ''}" for n in lengths]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for label in sorted(table):
            cells = [_cell(table[label][n], task) if n in table[label] else "" for n in lengths]
            lines.append("| " + " | ".join([label] + cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_table(rows: list[dict], path: str) -> None:
    atomic_write_text(path, table_markdown(rows))


def write_plots(rows: list[dict], directory: str) -> list[str]:
    """One PNG per (task, metric): metric vs eval length (log2 x), a line per label, seed error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    paths = []
    for task, table in sorted(summarize(rows).items()):
        metrics = ["loss"] if task == "text" else ["accuracy", "exact_match", "loss"]
        train_lengths = sorted({r["train_length"] for r in rows if r["task"] == task})
        for metric in metrics:
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            for label in sorted(table):
                pts = [(n, s[metric]) for n, s in sorted(table[label].items()) if s[metric] is not None]
                if not pts:
                    continue
                xs = [n for n, _ in pts]
                ax.errorbar(xs, [v[0] for _, v in pts], yerr=[v[1] for _, v in pts],
                            marker="o", capsize=3, label=label)
            for n in train_lengths:
                ax.axvline(n, color="gray", linestyle=":", linewidth=1)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("evaluation length (tokens)")
            ax.set_ylabel(metric)
            ax.set_title(f"{task}: {metric} vs length (dotted: training length)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = os.path.join(directory, f"{task}_{metric}.png")
            tmp = path + ".tmp.png"
            fig.savefig(tmp, dpi=100)
            os.replace(tmp, path)
            plt.close(fig)
            paths.append(path)
    return paths
