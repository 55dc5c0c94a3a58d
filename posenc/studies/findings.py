"""Findings of a comparison grid beyond table.md: the randomized-positions gain and PE x norm placement.

    python -m posenc findings --workdir WORKDIR --kind randomized   # from WORKDIR/results.jsonl
    python -m posenc findings --workdir WORKDIR --figures docs/figures --name quick

``python -m posenc compare`` calls :func:`write` after its report, so a grid
whose config sets ``findings`` writes these too; the command above redoes
it from a finished grid's rows, and with ``--figures`` copies the grid's
figures into DIR as ``findings_<name>_<file>.png``.

Every score is per run: the mean over the evaluation lengths beyond the
training length of the token accuracy (``text``: of the log-perplexity over
all tokens, lower is better), and the same at the training length. Runs
that did not fit (``fitted`` False) are left out and counted, as in
table.md; runs that diverged count as diverged. Cells are the mean and the
95% t-interval over seeds (:func:`posenc.studies.stats.interval`); a claim that one
variant beats another is made only when the interval of their per-seed
differences (:func:`posenc.studies.stats.paired`) excludes zero.
With ``--include_unfitted`` (``include_unfitted=True``; ``python -m posenc
compare --include_unfitted`` passes it on) the unfitted runs are scored too and the
cells say ``[k unfitted, included]``.

* ``randomized`` (Ruoss et al. 2023): per task and encoding ``k``, the gain
  = OOD accuracy of ``k_randomized`` minus that of ``k``, paired by seed (its
  interval over seeds and a verdict: helps / hurts / unresolved); per
  encoding the mean gain over tasks (the spread over tasks beside it), and
  the mean over every (task, encoding) pair: the paper's +12.0% figure.
  Writes ``findings.md`` and ``plots/findings_randomized.png``.
* ``interaction``: per task, encoding variant (e.g. ``rope``,
  ``rope_qknorm``) x placement, the OOD score and the score at the training
  length; per variant the best placement, marked clear when the per-seed
  differences from the runner-up exclude zero; whether the best placement depends on
  the encoding. Writes ``findings.md`` and
  ``plots/findings_interaction_<task>.png``.
* ``sizes`` (length generalization in problem sizes, e.g. the arithmetic
  grids): per table (task or task variant) and label, the exact match of
  the main metric (decoded where the rows have it) at every problem size;
  at each size beyond training, each label against the best one, paired by
  seed; with the config's ``targets`` (``{"size": n, "at_least": {label:
  v}, "below": {label: v}}``) a target check at size n: each label's mean
  and interval against its bound, and every at-least label minus every
  below label, paired by seed. Writes ``findings.md`` and
  ``plots/findings_sizes_<table>.png``.
"""

from __future__ import annotations

import collections
import os
import shutil

from posenc.studies import compare_report, figures, stats, tables

KINDS = ("", "randomized", "interaction", "sizes")


# ------------------------------------------------------------------ scores
def _metric(task: str, rows=()) -> tuple[str, bool]:
    """(row field, higher is better) of a task's score: the compare report's main metric."""
    metric = compare_report.main_metric(task, rows)
    return metric, metric != "loss"


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
        metric, _ = _metric(first["task"], group)
        ood = [r[metric] for r in group if r["eval_length"] > r["train_length"] and r.get(metric) is not None]
        ind = [r[metric] for r in group if r["eval_length"] == r["train_length"] and r.get(metric) is not None]
        out.append(dict(task=first["task"], variant=first.get("variant") or first["position"],
                        placement=first.get("placement"), seed=first["seed"],
                        fitted=first.get("fitted"), diverged=first.get("diverged_at_step") is not None,
                        ood=sum(ood) / len(ood) if ood else None, ind=ind[0] if ind else None))
    return out


def _cells(scores, keys, include_unfitted: bool = False) -> dict:
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


def _fmt(stat, digits: int = 3) -> str:
    return tables.number(stat, digits)


def _notes(cell) -> str:
    return "".join(f" [{cell[k]} {k}{', included' if k == 'unfitted' and cell['included'] else ''}]"
                   for k in ("unfitted", "diverged") if cell[k])


# -------------------------------------------------------------- randomized
def randomized_gain(rows, include_unfitted: bool = False) -> dict:
    """Per task and encoding ``k``: the gain of ``k_randomized`` over ``k``, paired by seed.

    ``{"tasks": {task: {kind: mean gain}}, "paired": {task: {kind: interval of the per-seed
    gains}}, "verdicts": {task: {kind: "helps" | "hurts" | "unresolved"}}, "per_encoding":
    {kind: interval over tasks of the mean gains}, "overall": ..., "missing": [...]}``. A
    verdict needs the paired interval over seeds (seed s of ``k_randomized`` minus seed s of
    ``k``) to exclude zero; the spread over tasks is not a seed interval. A pair without a
    score on both sides (nothing fitted) is listed in ``missing``.
    """
    cells = _cells(run_scores(rows), ("task", "variant"), include_unfitted)
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
            cells.append(f"{_fmt(plain['ood'], 2)}{_notes(plain)} → {_fmt(rand['ood'], 2)}{_notes(rand)}"
                         + ("" if gain is None else f" (**{gain:+.3f}**{pair})"))
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines.append("| **mean gain over tasks** | " + " | ".join(
        f"{_fmt(res['per_encoding'][k])} ({res['per_encoding'][k][2] if res['per_encoding'][k] else 0} tasks)"
        for k in kinds) + " |")
    lines += ["", f"Mean gain over every (task, encoding) pair: {_fmt(res['overall'])}"
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


# ------------------------------------------------------------- interaction
def best_placements(rows, include_unfitted: bool = False) -> dict:
    """``{task: {variant: {"best", "clear", "cells": {placement: cell}}}}`` (OOD score)."""
    cells = _cells(run_scores(rows), ("task", "variant", "placement"), include_unfitted)
    out = {}
    for (task, variant, placement), cell in cells.items():
        out.setdefault(task, {}).setdefault(variant, {"cells": {}})["cells"][placement] = cell
    for task, variants in out.items():
        _, higher = _metric(task, rows)
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
        metric, higher = _metric(task, rows)
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
                text = f"{_fmt(c['ood'])} ({tables.number(c['ind'], 2, spread=False)}){_notes(c)}"
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
        metric, higher = _metric(task, rows)
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


# ------------------------------------------------------------------- sizes
def size_scores(rows, include_unfitted: bool = False) -> dict:
    """``{table: {"metric", "train": sizes, "cells": {label: {size: cell}}}}``: exact match per problem size.

    A cell is ``{"stat": interval over seeds or None, "by_seed": {seed: value}, "runs", "unfitted",
    "diverged"}``; unfitted runs are left out (``include_unfitted``: kept) and counted.
    """
    out = {}
    for table, rs in compare_report._by_task(
            r for r in rows if not r.get("sweep") and not r.get("eval_variant")).items():
        metric = compare_report.exact_of(compare_report.main_metric(table, rs))
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


def _pair(a, b) -> str:
    d = stats.paired(a["by_seed"], b["by_seed"])
    if d is None:
        return "n/a"
    if d.half is None:
        return f"{d.mean:+.3f} (1 seed)"
    verdict = "excludes 0" if stats.excludes_zero(d) else "includes 0"
    return f"{d.mean:+.3f} [{d.mean - d.half:+.3f}, {d.mean + d.half:+.3f}] ({verdict}, {d.n} seeds)"


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
                (tables.number(by[n]["stat"], metric="exact_match") + _notes(by[n]) if by[n]["stat"] else
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
                             f"{_notes(cell) if cell else ''} | {_bound_check(cell, *bound)} |")
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


# ------------------------------------------------------------------- files
def write(kind: str, rows, workdir: str, include_unfitted: bool = False, targets=None) -> list[str]:
    """Write ``findings.md`` and the figures of ``kind`` (one of KINDS; "" writes nothing)."""
    from posenc import checks

    checks.choice("findings", kind, KINDS)
    if not kind:
        return []
    plots_dir = os.path.join(workdir, "plots")
    os.makedirs(plots_dir, exist_ok=True)
    md = os.path.join(workdir, "findings.md")
    if kind == "sizes":
        tables.write(md, sizes_markdown(rows, include_unfitted, targets))
        return [md] + plot_sizes(rows, plots_dir, include_unfitted)
    if kind == "randomized":
        tables.write(md, randomized_markdown(rows, include_unfitted))
        fig = plot_randomized(rows, os.path.join(plots_dir, "findings_randomized.png"), include_unfitted)
        return [md] + ([fig] if fig else [])
    tables.write(md, interaction_markdown(rows, include_unfitted))
    return [md] + plot_interaction(rows, plots_dir, include_unfitted)


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
