"""The scores findings are made of: one per run, and cells of runs over seeds.

Every score is per run: the mean over the evaluation lengths beyond the
training length of the compare report's main metric (token accuracy;
``text``: the log-perplexity over all tokens, lower is better), and the same
at the training length. A cell groups runs by some of their keys: the 95%
t-interval over seeds (:func:`posenc.studies.stats.interval`) of the fitted
runs that did not diverge (``include_unfitted``: the unfitted too), the
per-seed values for paired differences, and the counts of the runs left out.
"""

from __future__ import annotations

import collections

from posenc.studies import compare_report, stats, tables


def task_metric(task: str, rows=()) -> tuple[str, bool]:
    """(row field, higher is better) of a task's score: the compare report's main metric."""
    field = compare_report.main_metric(task, rows)
    return field, field != "loss"


def run_scores(rows) -> list[dict]:
    """One dict per run: task, variant, placement, seed, fitted, diverged, ood and in-distribution score."""
    runs = collections.defaultdict(list)
    for r in rows:
        if r.get("sweep") or r.get("eval_variant"):
            continue
        runs[(r.get("run"), r.get("config_hash"), r["seed"])].append(r)
    out = []
    for group in runs.values():
        first = group[0]
        metric, _ = task_metric(first["task"], group)
        ood = [r[metric] for r in group if r["eval_length"] > r["train_length"] and r.get(metric) is not None]
        ind = [r[metric] for r in group if r["eval_length"] == r["train_length"] and r.get(metric) is not None]
        out.append(dict(task=first["task"], variant=first.get("variant") or first["position"],
                        placement=first.get("placement"), seed=first["seed"],
                        fitted=first.get("fitted"), diverged=first.get("diverged_at_step") is not None,
                        ood=sum(ood) / len(ood) if ood else None, ind=ind[0] if ind else None))
    return out


def score_cells(scores, keys, include_unfitted: bool = False) -> dict:
    """``{key tuple: {"ood", "ind": interval or None, "runs", "unfitted", "diverged", "included"}}`` over seeds."""
    groups = collections.defaultdict(list)
    for s in scores:
        groups[tuple(s[k] for k in keys)].append(s)
    out = {}
    for key, g in groups.items():
        use = [s for s in g if (include_unfitted or s["fitted"] is not False) and not s["diverged"]]
        out[key] = dict(ood=stats.interval([s["ood"] for s in use if s["ood"] is not None]),
                        by_seed={s["seed"]: s["ood"] for s in use if s["ood"] is not None},
                        ind=stats.interval([s["ind"] for s in use if s["ind"] is not None]),
                        runs=len(g), unfitted=sum(s["fitted"] is False for s in g),
                        diverged=sum(s["diverged"] for s in g), included=include_unfitted)
    return out


def fmt(stat, digits: int = 3) -> str:
    """An interval as a table cell (:func:`posenc.studies.tables.number`)."""
    return tables.number(stat, digits)


def notes(cell) -> str:
    """The cell's runs left out (or included), e.g. `` [1 unfitted] [2 diverged]``."""
    return "".join(f" [{cell[k]} {k}{', included' if k == 'unfitted' and cell['included'] else ''}]"
                   for k in ("unfitted", "diverged") if cell[k])
