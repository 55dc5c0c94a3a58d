"""Figures of every report: matplotlib without a display, saved atomically as PNG."""

from __future__ import annotations

from posenc.workdir import files


def pyplot():
    """``matplotlib.pyplot`` with the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: str, *, dpi: int = 100) -> str:
    """Write ``fig`` to ``path`` as PNG atomically (:func:`posenc.workdir.files.atomic_write`), close it; the path."""
    files.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
    pyplot().close(fig)
    return path


def errorbar(ax, xs, stats, **kw):
    """Means with 95% t-interval bars of ``stats`` (``(mean, half_width, n)`` each) at ``xs``."""
    ys = [s[0] for s in stats]
    err = [0.0 if s[1] is None else s[1] for s in stats]
    return ax.errorbar(xs, ys, yerr=err, capsize=3, **kw)
