"""The formatting every report shares: numbers with intervals, markdown tables, row grouping, files.

One format for every study: a cell is ``mean ± half-width`` of the 95%
t-interval over seeds (:mod:`posenc.studies.stats`), a table is a
markdown grid, and every file is written atomically (:mod:`posenc.workdir.files`).
"""

from __future__ import annotations

import collections
import math

from posenc.workdir import files

# The range of each metric: intervals are clipped to it when printed.
BOUNDS = {"accuracy": (0.0, 1.0), "exact_match": (0.0, 1.0), "decoded_accuracy": (0.0, 1.0),
          "decoded_exact_match": (0.0, 1.0), "loss": (0.0, None), "loss_last_L": (0.0, None),
          "perplexity": (1.0, None), "perplexity_last_L": (1.0, None)}
INTERVAL_NOTE = ("mean [95% t-interval over seeds, clipped to the metric's range] {min-max over seeds}; "
                 "one seed: the value alone")
SAMPLED_NOTE = ("[sampled k/F rows +-h]: decoded accuracy estimated from k of the F examples with an error "
                "(eval.decode_rows; summed over the cell's seeds), without bias; h: the 95% half-width of that "
                "sampling error alone, 1.96 sqrt(sum of the seeds' decoded_accuracy_se^2) / seeds (already inside "
                "the seeds' spread and t-interval); the exact match is never sampled")


def number(stat, digits: int = 3, *, metric: str | None = None, spread: bool = True) -> str:
    """A cell: the mean, its 95% t-interval clipped to ``metric``'s range, the seeds' min-max.

    ``0.569 [0.467, 0.671] {0.50-0.64}``; one seed: ``0.569``; None: "n/a".
    ``spread=False`` leaves the min-max out.
    """
    if stat is None:
        return "n/a"
    text = f"{stat.mean:.{digits}f}"
    if stat.half is None:
        return text
    lo, hi = stat.bounds(*BOUNDS.get(metric, (None, None)))
    text += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    if spread:
        d = max(digits - 1, 2)
        text += f" {{{stat.low:.{d}f}-{stat.high:.{d}f}}}"
    return text


def sampled(rows) -> tuple[int, int, float] | None:
    """``(decoded rows, failing rows, h)`` of the rows of a cell whose decoded accuracy was estimated from a
    sample of their failing rows (eval.decode_rows; :data:`SAMPLED_NOTE`), None where every row was decoded.

    ``h``: the 95% half-width of the sampling error of the cell's mean, ``1.96 sqrt(sum se_s^2) / n``
    over its ``n`` rows with a decoded accuracy (``se_s``: each row's ``decoded_accuracy_se``).
    """
    use = [r for r in rows if r.get("decoded_accuracy") is not None and r.get("failing_rows") is not None]
    if not any(r["decoded_rows"] < r["failing_rows"] for r in use):
        return None
    half = 1.96 * math.sqrt(sum((r.get("decoded_accuracy_se") or 0.0) ** 2 for r in use)) / len(use)
    return sum(r["decoded_rows"] for r in use), sum(r["failing_rows"] for r in use), half


def order(rows, key) -> list:
    """The distinct values of ``key`` in ``rows``, in order of first appearance."""
    return list(dict.fromkeys(r[key] for r in rows))


def groupby(rows, keys) -> dict:
    """``{tuple of the keys' values: [rows]}``, groups in order of first appearance."""
    out = collections.defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def table(header, body) -> list[str]:
    """Markdown lines of a table: ``header`` the column names, ``body`` rows of cell strings."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in body]
    return lines + [""]


def write(path: str, text: str) -> str:
    """Write a report file atomically; returns its path."""
    return files.atomic_write(path, text)


def missing_note(ctx) -> list[str]:
    """Lines saying which points of a partial study have no rows yet (none when it is complete)."""
    if not getattr(ctx, "missing", None):
        return []
    names = [p.name for p in ctx.missing]
    shown = ", ".join(names[:12]) + (f", ... ({len(names) - 12} more)" if len(names) > 12 else "")
    return [f"**Partial: {len(names)} of {len(ctx.points)} points have no rows yet** ({shown}); "
            "their cells are missing or have fewer seeds.", ""]
