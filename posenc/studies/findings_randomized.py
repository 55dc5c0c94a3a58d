"""Findings ``randomized``: the gain of randomized positions (Ruoss et al. 2023) over each encoding.

Per task and encoding ``k``, the gain = OOD accuracy of ``k_randomized``
minus that of ``k``, paired by seed (its interval over seeds and a verdict:
helps / hurts / unresolved); per encoding the mean gain over tasks (the
spread over tasks beside it), and the mean over every (task, encoding) pair:
the paper's +12.0% figure. ``findings.md`` gets :func:`randomized_markdown`,
``plots/findings_randomized.png`` :func:`plot_randomized`.
"""

from __future__ import annotations

from posenc.studies import figures, stats
from posenc.studies.findings_scores import fmt, notes, run_scores, score_cells


def randomized_gain(rows, include_unfitted: bool = False) -> dict:
    """Per task and encoding ``k``: the gain of ``k_randomized`` over ``k``, paired by seed.

    ``{"tasks": {task: {kind: mean gain}}, "paired": {task: {kind: interval of the per-seed
    gains}}, "verdicts": {task: {kind: "helps" | "hurts" | "unresolved"}}, "per_encoding":
    {kind: interval over tasks of the mean gains}, "overall": ..., "missing": [...]}``. A
    verdict needs the paired interval over seeds (seed s of ``k_randomized`` minus seed s of
    ``k``) to exclude zero; the spread over tasks is not a seed interval. A pair without a
    score on both sides (nothing fitted) is listed in ``missing``.
    """
    cells = score_cells(run_scores(rows), ("task", "variant"), include_unfitted)
    tasks = sorted({t for t, _ in cells})
    kinds = sorted({v[: -len("_randomized")] for _, v in cells if v.endswith("_randomized")})
    gains, paired, verdicts, missing = {}, {}, {}, []
    for task in tasks:
        for k in kinds:
            plain, rand = cells.get((task, k)), cells.get((task, f"{k}_randomized"))
            if plain is None or rand is None:
                continue
            if plain["ood"] is None or rand["ood"] is None:
                missing.append((task, k))
                continue
            gains.setdefault(task, {})[k] = rand["ood"][0] - plain["ood"][0]
            diff = stats.paired(rand["by_seed"], plain["by_seed"])
            paired.setdefault(task, {})[k] = diff
            verdicts.setdefault(task, {})[k] = gain_verdict(diff)
    per = {k: stats.interval([g[k] for g in gains.values() if k in g]) for k in kinds}
    overall = stats.interval([v for g in gains.values() for v in g.values()])
    return {"tasks": gains, "paired": paired, "verdicts": verdicts, "per_encoding": per, "overall": overall,
            "missing": missing, "cells": cells}


def gain_verdict(diff) -> str:
    """"helps" / "hurts" when a paired interval excludes zero above / below it, else "unresolved"."""
    if not stats.excludes_zero(diff):
        return "unresolved"
    return "helps" if diff.mean > 0 else "hurts"


def randomized_markdown(rows, include_unfitted: bool = False) -> str:
    res = randomized_gain(rows, include_unfitted)
    kinds = sorted(res["per_encoding"])
    lines = ["## Randomized positions: gain in accuracy beyond the training length", "",
             "Gain = OOD accuracy (each run's accuracy averaged over the lengths beyond training) with "
             "`model.position.randomized` minus without, paired by seed: in brackets the 95% t-interval of "
             "the per-seed gains and the verdict (helps / hurts only when that interval excludes zero). "
             "Per encoding: the mean of the tasks' mean gains, with the spread over tasks (a t-interval "
             "over tasks, not over seeds). Ruoss et al. 2023 report +12.0% on average. "
             + ("Every run is scored, fitted or not (--include_unfitted)." if include_unfitted
                else "Only runs that fitted the training length are scored."), "",
             "| task | " + " | ".join(f"{k}: plain → randomized (gain)" for k in kinds) + " |",
             "|" + "---|" * (len(kinds) + 1)]
    for task in sorted({t for t, _ in res["cells"]}):
        cells = []
        for k in kinds:
            plain, rand = res["cells"].get((task, k)), res["cells"].get((task, f"{k}_randomized"))
            if plain is None or rand is None:
                cells.append("")
                continue
            gain = res["tasks"].get(task, {}).get(k)
            diff = res["paired"].get(task, {}).get(k)
            pair = "" if diff is None or diff.half is None else (
                f" [{diff.mean - diff.half:+.3f}, {diff.mean + diff.half:+.3f}] {res['verdicts'][task][k]}")
            cells.append(f"{fmt(plain['ood'], 2)}{notes(plain)} → {fmt(rand['ood'], 2)}{notes(rand)}"
                         + ("" if gain is None else f" (**{gain:+.3f}**{pair})"))
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines.append("| **mean gain over tasks** | " + " | ".join(
        f"{fmt(res['per_encoding'][k])} ({res['per_encoding'][k][2] if res['per_encoding'][k] else 0} tasks)"
        for k in kinds) + " |")
    lines += ["", f"Mean gain over every (task, encoding) pair: {fmt(res['overall'])}"
              + (f" ({res['overall'][2]} pairs)" if res["overall"] else "") + "."]
    if res["missing"]:
        lines.append("Pairs without a fitted run on one side (left out): "
                     + ", ".join(f"{t}/{k}" for t, k in res["missing"]) + ".")
    return "\n".join(lines) + "\n"


def plot_randomized(rows, path: str, include_unfitted: bool = False) -> str | None:
    res = randomized_gain(rows, include_unfitted)
    kinds = [k for k in sorted(res["per_encoding"]) if res["per_encoding"][k]]
    if not kinds:
        return None
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(kinds), 4.0))
    for i, k in enumerate(kinds):
        mean, half = res["per_encoding"][k][:2]
        ax.bar(i, mean, yerr=0 if half is None else half, capsize=4, color=f"C{i}", alpha=0.7)
        per_task = [g[k] for g in res["tasks"].values() if k in g]
        ax.scatter([i] * len(per_task), per_task, color="black", s=10, zorder=3)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.axhline(0.12, color="gray", linestyle="--", linewidth=1, label="Ruoss et al. 2023: +0.120 mean")
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel("OOD accuracy gain (randomized - plain)")
    ax.set_title("randomized positions: mean gain over tasks (95% t-interval; dots: tasks)\n"
                 + ("every run, fitted or not" if include_unfitted else "runs that fitted the training length"),
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    figures.save(fig, path)
    return path
