"""Tables and plots of the stability study (rows of :class:`posenc.studies.stability.Stability`).

LR sensitivity (Wortsman et al. 2023, posenc.diagnostics.lr_sensitivity): over
the learning-rate grid of one (size, variant, seed), the mean of
min(final loss, initial loss) minus the best final loss, a diverged run
counting as the initial loss; then the mean over seeds with its 95% t-interval
and min-max (``tables.number``), and each variant's paired difference from the
baseline over the seeds both have (``stats.paired``): "X is less sensitive than
the baseline" needs that interval below zero. Per size, the final loss and the
largest attention logit of each variant minus the baseline's at every
learning rate, paired by seed the same way, the logit as its log10 (QK-Clip's
claim: a bounded logit at no worse loss).
"""

from __future__ import annotations

import collections
import os

import numpy as np

from posenc.norms import diagnostics
from posenc.studies import figures, stats, tables
from posenc.workdir import files


def _loss(r) -> float:
    return float("nan") if r["loss"] is None else float(r["loss"])


def sensitivities_by_seed(rows) -> dict:
    """``{(size, variant): {seed: LR sensitivity}}``."""
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["size"], r["variant"], r["seed"])].append(r)
    out = collections.defaultdict(dict)
    for (size, variant, seed), rs in groups.items():
        out[(size, variant)][seed] = diagnostics.lr_sensitivity([_loss(r) for r in rs], rs[0]["initial_loss"])
    return out


def sensitivities(rows) -> dict:
    """``{(size, variant): [LR sensitivity of each seed]}``."""
    return {k: list(v.values()) for k, v in sensitivities_by_seed(rows).items()}


def _pm(values, *, spread: bool = True) -> str:
    return tables.number(stats.interval(values), metric="loss", spread=spread)


def _final(rs) -> str:
    good = [r["loss"] for r in rs if r["loss"] is not None]
    if not good:
        return "diverged"
    text = _pm(good, spread=False)
    return text + (f" [{len(rs) - len(good)} diverged]" if len(good) < len(rs) else "")


def table_markdown(rows: list[dict]) -> str:
    """LR sensitivity per variant and size, then the final loss per learning rate for each size."""
    sizes, variants = tables.order(rows, "size"), tables.order(rows, "variant")
    lrs = sorted({r["learning_rate"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    sens = sensitivities(rows)
    shape = {s: next(f"d_model {r['d_model']}, {r['num_layers']} layers" for r in rows if r["size"] == s)
             for s in sizes}
    lines = ["## LR sensitivity", "",
             "Mean over the learning-rate grid (" + ", ".join(f"{lr:g}" for lr in lrs) + ") of "
             "min(final loss, initial loss) - the best final loss over the grid (Wortsman et al. "
             f"2023; a diverged run counts as the initial loss); mean over {len(seeds)} seed(s). "
             "Lower is more robust. Loss: nats per byte at the training length.", "",
             "| variant | " + " | ".join(f"{s} ({shape[s]})" for s in sizes) + " |",
             "|---" * (len(sizes) + 1) + "|"]
    for v in variants:
        lines.append(f"| {v} | " + " | ".join(_pm(sens[(s, v)]) if sens.get((s, v)) else ""
                                              for s in sizes) + " |")
    lines.append("")
    by_seed = sensitivities_by_seed(rows)
    if any(v != "baseline" for v in variants) and "baseline" in variants and len(seeds) > 1:
        lines += ["Each variant's sensitivity minus the baseline's, paired by seed: mean [95% "
                  "t-interval]; * = the interval excludes zero.", "",
                  "| variant | " + " | ".join(sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
        for v in variants:
            if v == "baseline":
                continue
            cells = []
            for s in sizes:
                d = stats.paired(by_seed.get((s, v), {}), by_seed.get((s, "baseline"), {}))
                cells.append("" if d is None else tables.number(d, spread=False)
                             + (" *" if stats.excludes_zero(d) else ""))
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
        lines.append("")
    for s in sizes:
        mine = [r for r in rows if r["size"] == s]
        init = sorted({round(r["initial_loss"], 3) for r in mine})
        lines += [f"## Final loss per learning rate: {s} ({shape[s]})", "",
                  f"Initial loss {', '.join(map(str, init))}; mean [95% t-interval] final loss over "
                  "seeds, the largest attention logit of training in parentheses.", "",
                  "| variant | " + " | ".join(f"{lr:g}" for lr in lrs) + " |", "|---" * (len(lrs) + 1) + "|"]
        for v in variants:
            cells = []
            for lr in lrs:
                rs = [r for r in mine if r["variant"] == v and r["learning_rate"] == lr]
                logit = [r["max_attention_logit_max"] for r in rs if r["max_attention_logit_max"] is not None]
                cells.append(_final(rs) + (f" (logit {max(logit):.0f})" if logit else "") if rs else "")
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
        lines.append("")
        if "baseline" in variants and len(variants) > 1 and len(seeds) > 1:
            lines += _paired_per_rate(mine, variants, lrs, s)
    return "\n".join(lines)


def _paired_per_rate(rows, variants, lrs, size) -> list[str]:
    """Per variant and learning rate, its final loss and the log10 of its largest attention logit minus
    the baseline's, paired by seed (a diverged run leaves its seed out of the loss)."""
    def by_seed(v, lr, key):
        value = (lambda x: float(np.log10(x))) if key == "max_attention_logit_max" else float
        return {r["seed"]: value(r[key]) for r in rows
                if r["variant"] == v and r["learning_rate"] == lr and r[key] is not None and r[key] > 0}

    def cell(v, lr, key, digits):
        d = stats.paired(by_seed(v, lr, key), by_seed("baseline", lr, key))
        if d is None:
            return ""
        text = f"{d.mean:+.{digits}f}" if d.half is None else (
            f"{d.mean:+.{digits}f} [{d.mean - d.half:+.{digits}f}, {d.mean + d.half:+.{digits}f}]")
        return text + (" *" if stats.excludes_zero(d) else "")

    head = ["| variant | " + " | ".join(f"{lr:g}" for lr in lrs) + " |", "|---" * (len(lrs) + 1) + "|"]
    lines = [f"Final loss minus the baseline's ({size}), paired by seed: mean [95% t-interval]; * = the "
             "interval excludes zero (negative: lower loss than the baseline).", "", *head]
    lines += [f"| {v} | " + " | ".join(cell(v, lr, "loss", 3) for lr in lrs) + " |"
              for v in variants if v != "baseline"]
    lines += ["", f"log10 of the largest attention logit of training minus the baseline's ({size}), paired "
              "by seed (-1: ten times smaller).", "", *head]
    lines += [f"| {v} | " + " | ".join(cell(v, lr, "max_attention_logit_max", 2) for lr in lrs) + " |"
              for v in variants if v != "baseline"]
    return lines + [""]


def _outcome(r) -> float:
    return r["initial_loss"] if r["diverged"] else min(r["loss"], r["initial_loss"])


def pick_pair(rows, unstable="baseline", stable="qk_norm"):
    """(unstable, stable) rows of one size, learning rate and seed: ``unstable`` and ``stable``
    where the first does worst against the second (the paper's figure), else, without those
    variants, the worst and the best run of the group whose outcomes differ most."""
    best = None
    for rs in tables.groupby(rows, ("size", "learning_rate", "seed")).values():
        named = {r["variant"]: r for r in rs}
        if unstable in named and stable in named:
            hi, lo = named[unstable], named[stable]
        else:
            hi = max(rs, key=lambda r: (r["diverged"], _outcome(r)))
            lo = min(rs, key=_outcome)
        key = (hi["diverged"] and not lo["diverged"], _outcome(hi) - _outcome(lo), rs[0]["learning_rate"])
        if best is None or key > best[0]:
            best = (key, hi, lo)
    return (best[1], best[2]) if best else (None, None)


def write_plots(rows: list[dict], directory: str, *, run_dir: str) -> list[str]:
    """stability_loss_vs_lr.png and stability_attention_logit.png (train logs from ``run_dir``)."""
    plt = figures.pyplot()
    os.makedirs(directory, exist_ok=True)
    sizes, variants = tables.order(rows, "size"), tables.order(rows, "variant")
    colors = {v: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(variants)}
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.6 * len(sizes), 4.0), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], sizes):
        mine = [r for r in rows if r["size"] == s]
        for v in variants:
            by_lr = tables.groupby([r for r in mine if r["variant"] == v], ("learning_rate",))
            lrs = sorted(k[0] for k in by_lr)
            ys = [np.mean([min(_loss(r), r["initial_loss"]) if r["loss"] is not None else r["initial_loss"]
                           for r in by_lr[(lr,)]]) for lr in lrs]
            ax.plot(lrs, ys, marker="o", color=colors[v], label=v)
            bad = [lr for lr in lrs if all(r["diverged"] for r in by_lr[(lr,)])]
            ax.plot(bad, [by_lr[(lr,)][0]["initial_loss"] for lr in bad], marker="x", color=colors[v],
                    linestyle="", markersize=10)
        ax.axhline(np.mean([r["initial_loss"] for r in mine]), color="gray", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_title(f"{s}: final loss (x: diverged, at the initial loss)", fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("final eval loss, min(loss, initial)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    paths = [os.path.join(directory, "stability_loss_vs_lr.png")]
    figures.save(fig, paths[0])

    bad, good = pick_pair(rows)
    if bad is not None and bad is not good:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for r, style in ((bad, "-"), (good, "--")):
            log = files.read_jsonl(os.path.join(run_dir, r["run"], "train_log.jsonl"))
            pts = [(x["step"], x["max_attention_logit"]) for x in log if "max_attention_logit" in x]
            state = (f"diverged at step {r['diverged_at_step']}" if r["diverged"]
                     else f"final loss {r['loss']:.3f}")
            if pts:
                ax.plot(*zip(*pts), style, color=colors[r["variant"]], label=f"{r['variant']} ({state})")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("max attention logit")
        ax.set_title(f"{bad['size']}, learning rate {bad['learning_rate']:g}, seed {bad['seed']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(os.path.join(directory, "stability_attention_logit.png"))
        figures.save(fig, paths[-1])
    return paths
