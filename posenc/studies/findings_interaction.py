"""Findings ``interaction``: position encoding x norm placement, and whether the best placement depends on it.

Per task, encoding variant (e.g. ``rope``, ``rope_qknorm``) x placement, the
OOD score and the score at the training length; per variant the best
placement, marked clear when the per-seed differences from the runner-up
exclude zero; whether the best placement depends on the encoding.
``findings.md`` gets :func:`interaction_markdown`,
``plots/findings_interaction_<task>.png`` :func:`plot_interaction`.
"""

from __future__ import annotations

import os

from posenc.studies import compare_report, figures, stats, tables
from posenc.studies.findings_scores import fmt, notes, run_scores, score_cells, task_metric


def best_placements(rows, include_unfitted: bool = False) -> dict:
    """``{task: {variant: {"best", "clear", "cells": {placement: cell}}}}`` (OOD score)."""
    cells = score_cells(run_scores(rows), ("task", "variant", "placement"), include_unfitted)
    out = {}
    for (task, variant, placement), cell in cells.items():
        out.setdefault(task, {}).setdefault(variant, {"cells": {}})["cells"][placement] = cell
    for task, variants in out.items():
        _, higher = task_metric(task, rows)
        for v in variants.values():
            ranked = sorted(((c["ood"], p) for p, c in v["cells"].items() if c["ood"] is not None),
                            key=lambda sp: sp[0][0], reverse=higher)
            v["best"] = ranked[0][1] if ranked else None
            v["runner_up"] = ranked[1][1] if len(ranked) >= 2 else None
            # clear: the per-seed differences best - runner-up (seed by seed) exclude zero
            v["paired"] = None if v["runner_up"] is None else stats.paired(
                v["cells"][v["best"]]["by_seed"], v["cells"][v["runner_up"]]["by_seed"])
            v["clear"] = stats.excludes_zero(v["paired"])
    return out


def interaction_markdown(rows, include_unfitted: bool = False) -> str:
    res = best_placements(rows, include_unfitted)
    lines = ["## Position encoding x norm placement", ""]
    for task in sorted(res):
        metric, higher = task_metric(task, rows)
        what = ("log-perplexity (nats per token, lower is better)" if metric == "loss"
                else compare_report.DESCRIBE.get(metric, metric))
        variants = res[task]
        placements = sorted({p for v in variants.values() for p in v["cells"]})
        lines += [f"### {task}", "",
                  f"OOD {what}, averaged over the lengths beyond training: {tables.INTERVAL_NOTE}; in "
                  "brackets the mean at the training length. Best placement per row in bold; *clear*: the "
                  "per-seed differences from the runner-up (paired by seed) have a 95% t-interval that "
                  "excludes zero.", "",
                  "| encoding | " + " | ".join(placements) + " | best |", "|" + "---|" * (len(placements) + 2)]
        for name in sorted(variants):
            v = variants[name]
            cells = []
            for p in placements:
                c = v["cells"].get(p)
                if c is None:
                    cells.append("")
                    continue
                text = f"{fmt(c['ood'])} ({tables.number(c['ind'], 2, spread=False)}){notes(c)}"
                cells.append(f"**{text}**" if p == v["best"] else text)
            d = v["paired"]
            vs = "" if d is None or d.half is None else (
                f" vs {v['runner_up']}: {d.mean:+.3f} [{d.mean - d.half:+.3f}, {d.mean + d.half:+.3f}]")
            best = "n/a" if v["best"] is None else v["best"] + (" (clear" if v["clear"] else " (unresolved") + vs + ")"
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {best} |")
        bests = {v["best"] for v in variants.values() if v["best"]}
        clear = {n: v["best"] for n, v in variants.items() if v["clear"]}
        if len(bests) <= 1:
            verdict = f"the same best placement ({', '.join(bests) or 'none'}) for every encoding"
        elif len(set(clear.values())) > 1:
            verdict = ("the best placement depends on the encoding, each clear of its runner-up by a paired "
                       "seed interval: "
                       + ", ".join(f"{n}: {p}" for n, p in sorted(clear.items())))
        else:
            verdict = ("the best placement differs between encodings ("
                       + ", ".join(f"{n}: {v['best']}" for n, v in sorted(variants.items()) if v["best"])
                       + "), but not every best is clear of its runner-up by a paired seed interval: not "
                       "resolved at this number of seeds")
        lines += ["", f"On {task}: {verdict}.", ""]
    return "\n".join(lines)


def plot_interaction(rows, directory: str, include_unfitted: bool = False) -> list[str]:
    import numpy as np

    res, paths = best_placements(rows, include_unfitted), []
    plt = figures.pyplot()
    for task, variants in sorted(res.items()):
        metric, higher = task_metric(task, rows)
        names = sorted(variants)
        placements = sorted({p for v in variants.values() for p in v["cells"]})
        values = np.full((len(names), len(placements)), np.nan)
        texts = np.full(values.shape, "", dtype=object)
        for i, n in enumerate(names):
            for j, p in enumerate(placements):
                c = variants[n]["cells"].get(p)
                if c is not None and c["ood"] is not None:
                    values[i, j] = c["ood"][0]
                    texts[i, j] = (tables.number(c["ood"], 2, spread=False).replace(" [", "\n[")
                                   + ("*" if p == variants[n]["best"] else ""))
                elif c is not None:
                    texts[i, j] = "diverged" if c["diverged"] else "not fitted" if c["unfitted"] else "n/a"
        fig, ax = plt.subplots(figsize=(2.5 + 1.25 * len(placements), 1.4 + 0.62 * len(names)))
        image = ax.imshow(np.ma.masked_invalid(values), aspect="auto",
                          cmap="viridis" if higher else "viridis_r")
        for (i, j), t in np.ndenumerate(texts):
            ax.text(j, i, t, ha="center", va="center", fontsize=7, color="white")
        ax.set_xticks(range(len(placements)), placements, fontsize=8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        label = "OOD accuracy" if higher else "OOD log-perplexity"
        fig.colorbar(image, ax=ax, label=label)
        ax.set_title(f"{task}: {label} per encoding x placement\n(* best per row; mean, 95% t-interval)",
                     fontsize=9)
        fig.tight_layout()
        paths.append(figures.save(fig, os.path.join(directory, f"findings_interaction_{task}.png")))
    return paths
