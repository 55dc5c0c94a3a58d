"""The grids of the compare config (``--config compare:ARG``), one module per family of grids.

Each module's ``GRIDS`` maps the ``ARG`` names it defines to a function ``fill(c, arg)`` that
sets the grid, the base config's fields and the variants of ``c`` (the compare config with
the default base). A new grid is an entry there, or a new module here: nothing else lists them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable


def grids() -> dict[str, Callable]:
    """Every grid's ``ARG`` -> its ``fill(c, arg)``, from the ``GRIDS`` of each module of this package."""
    out: dict[str, Callable] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for arg, fill in getattr(module, "GRIDS", {}).items():
            if arg in out:
                raise ValueError(f"compare grid {arg!r} is defined twice (compare_grids.{info.name})")
            out[arg] = fill
    return out
