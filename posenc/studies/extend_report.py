"""Tables and plots of the extend study (rows of :func:`posenc.studies.extend.study_row`).

Cells are means over seeds with their 95% t-interval (``tables.number``); a
budget whose fine-tune diverged prints ``diverged``. Text: loss (nats per byte);
passkey and the RULER tasks: retrieval accuracy (exact match: the whole answer right).
"""

from __future__ import annotations

import collections
import os

import numpy as np

from posenc.studies import figures, stats, tables


def _metric(task: str) -> tuple[str, str]:
    """(metric, label): text's loss, every retrieval task's exact match (teacher-forced: the
    answer's every token the argmax with the earlier answer tokens given)."""
    return ("loss", "loss (nats / byte)") if task == "text" else (
        "exact_match", f"{task} exact match (teacher-forced)")


def _cells(rows):
    """``{(task, method, factor, steps, eval_length): [values over seeds]}`` (None = diverged)."""
    out = collections.defaultdict(list)
    for r in rows:
        if r.get("sweep"):  # a task's sweep rows (passkey depth) stay in the rows, not in the cells
            continue
        metric = _metric(r["task"])[0]
        out[(r["task"], r["method"], r["factor"], r["finetune_steps"], r["eval_length"])].append(
            None if r.get("diverged_at_step") is not None else r[metric])
    return out


def _fmt(values, metric: str | None = None) -> str:
    if not values:
        return ""
    good = [v for v in values if v is not None]
    if not good:
        return "diverged"
    text = tables.number(stats.interval(good), metric=metric, spread=False)
    return text + (f" [{len(values) - len(good)} diverged]" if len(good) < len(values) else "")


def table_markdown(rows: list[dict]) -> str:
    """Per task and factor: a row per method, columns zero-shot at L and s L, then each budget at s L."""
    cells, lines = _cells(rows), []
    seeds = sorted({r["seed"] for r in rows})
    for task in tables.order(rows, "task"):
        mine = [r for r in rows if r["task"] == task]
        metric, label = _metric(task)
        length = mine[0]["train_length"]
        lines += [f"## {task}: {label}", "", f"Mean [95% t-interval] over {len(seeds)} seed(s); base trained at L = "
                  f"{length}; fine-tuning tokens in brackets.", ""]
        for factor in sorted({r["factor"] for r in mine}):
            rs = [r for r in mine if r["factor"] == factor]
            target = rs[0]["target_length"]
            budgets = sorted({r["finetune_steps"] for r in rs})
            tokens = {r["finetune_steps"]: r["finetune_tokens"] for r in rs}
            cols = ([(0, length, f"zero-shot @{length}")] if any(r["eval_length"] == length for r in rs)
                    else [])
            cols += [(b, target, f"{'zero-shot' if not b else f'{b} steps [{tokens[b]}]'} @{target}")
                     for b in budgets]
            lines += [f"### factor {factor:g} (target {target})", "",
                      "| method | " + " | ".join(c[2] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
            for method in tables.order(rs, "method"):
                vals = [_fmt(cells.get((task, method, factor, b, n), []), metric) for b, n, _ in cols]
                lines.append(f"| {method} | " + " | ".join(vals) + " |")
            lines.append("")
    return "\n".join(lines)


def _mean(values):
    good = [v for v in values if v is not None]
    return float(np.mean(good)) if good else None


def write_plots(rows: list[dict], directory: str) -> list[str]:
    """extend_loss_vs_length.png, extend_loss_vs_tokens.png and per retrieval task extend_<task>.png
    (passkey: extend_passkey.png)."""
    plt = figures.pyplot()
    os.makedirs(directory, exist_ok=True)
    cells, paths = _cells(rows), []
    text = [r for r in rows if r["task"] == "text"]
    methods = tables.order(rows, "method")
    colors = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    factors = sorted({r["factor"] for r in rows})
    length = rows[0]["train_length"] if rows else 0

    if text:
        budgets = sorted({r["finetune_steps"] for r in text})
        fig, axes = plt.subplots(1, len(budgets), figsize=(4.2 * len(budgets), 3.8), sharey=True,
                                 squeeze=False)
        base = _mean(cells.get(("text", "default", factors[0], 0, length), []))
        for ax, b in zip(axes[0], budgets):
            for m in methods:
                pts = [(f * length, _mean(cells.get(("text", m, f, b, int(round(f * length))), [])))
                       for f in factors]
                pts = [(x, y) for x, y in pts if y is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=colors[m], label=m)
            if base is not None:
                ax.plot([length], [base], marker="*", color="black", markersize=12, linestyle="",
                        label=f"base @ L={length}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("evaluation length = target length s L")
            ax.set_title("zero-shot" if not b else f"after {b} fine-tuning steps")
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("loss at the target length")
        axes[0][-1].legend(fontsize=7)
        fig.tight_layout()
        paths.append(os.path.join(directory, "extend_loss_vs_length.png"))
        figures.save(fig, paths[-1])

    for task, name in [("text", "extend_loss_vs_tokens.png")] + [
            (t, f"extend_{t}.png") for t in tables.order(rows, "task") if t != "text"]:
        mine = [r for r in rows if r["task"] == task]
        if not mine:
            continue
        metric, label = _metric(task)
        fs = sorted({r["factor"] for r in mine})
        fig, axes = plt.subplots(1, len(fs), figsize=(4.2 * len(fs), 3.8), squeeze=False)
        for ax, f in zip(axes[0], fs):
            target = int(round(f * length))
            for m in methods:
                tokens = sorted({r["finetune_tokens"] for r in mine
                                 if r["method"] == m and r["factor"] == f})
                by_tokens = {r["finetune_tokens"]: r["finetune_steps"] for r in mine
                             if r["method"] == m and r["factor"] == f}
                pts = [(t, _mean(cells.get((task, m, f, by_tokens[t], target), []))) for t in tokens]
                pts = [(x, y) for x, y in pts if y is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=colors[m], label=m)
            nonzero = sorted({r["finetune_tokens"] for r in mine if r["finetune_tokens"]})
            if nonzero:
                ax.set_xscale("symlog", linthresh=nonzero[0])
            ax.set_xlabel("fine-tuning tokens (0 = zero-shot)")
            ax.set_title(f"factor {f:g}: {label} at {target}")
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel(label)
        axes[0][-1].legend(fontsize=7)
        fig.tight_layout()
        paths.append(os.path.join(directory, name))
        figures.save(fig, paths[-1])
    return paths


def paired_markdown(rows: list[dict], *, baseline: str = "default") -> str:
    """Zero-shot at each target: every method against ``baseline`` seed by seed.

    Per task and factor, a row per method: its metric at s L (mean [95% t-interval] {min-max} over
    seeds) and the paired difference method - baseline over the seeds both have; "X beats Y" needs
    that interval to exclude zero (:func:`posenc.studies.stats.paired`). With a task's depth
    sweep (passkey), the mean over seeds at each depth follows.
    """
    zero = [r for r in rows if not r["finetune_steps"] and r["eval_length"] == r["target_length"]]
    lines = []
    for task in tables.order(zero, "task"):
        metric, label = _metric(task)
        for factor in sorted({r["factor"] for r in zero if r["task"] == task}):
            rs = [r for r in zero if r["task"] == task and r["factor"] == factor]
            plain = [r for r in rs if not r.get("sweep")]
            by = {m: {r["seed"]: r[metric] for r in plain if r["method"] == m} for m in tables.order(plain, "method")}
            depths = sorted({r["sweep"]["depth"] for r in rs if r.get("sweep") and "depth" in r["sweep"]})
            lines += [f"### {task}, factor {factor:g}: zero-shot {label} at {rs[0]['target_length']} against "
                      f"{baseline}", ""]
            header = ["method", label, f"- {baseline} (paired)", "excludes 0"] + [f"depth {d:g}" for d in depths]
            body = []
            for m, values in by.items():
                diff = stats.paired(values, by.get(baseline, {}))
                at = [stats.interval([r[metric] for r in rs if r["method"] == m and r.get("sweep")
                                      and r["sweep"].get("depth") == d]) for d in depths]
                body.append([m, tables.number(stats.interval(list(values.values())), metric=metric),
                             "" if m == baseline else tables.number(diff, spread=False),
                             "" if m == baseline else ("yes" if stats.excludes_zero(diff) else "no")]
                            + [f"{a.mean:.3f}" if a else "" for a in at])
            lines += tables.table(header, body) + [""]
    return "\n".join(lines)
