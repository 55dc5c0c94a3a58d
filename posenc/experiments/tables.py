"""The formatting every report shares: numbers with intervals, markdown tables, row grouping, files.

One format for every study: a cell is ``mean ± half-width`` of the 95%
t-interval over seeds (:mod:`posenc.experiments.stats`), a table is a
markdown grid, and every file is written atomically (:mod:`posenc.files`).
"""

from __future__ import annotations

import collections

from posenc import files


def number(stat, digits: int = 3) -> str:
    """``mean ± half`` of an interval ``(mean, half_width, n)``; "n/a" for None."""
    if stat is None:
        return "n/a"
    mean, half, _ = stat
    return f"{mean:.{digits}f}" + ("" if half is None else f" ± {half:.{digits}f}")


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
