"""Names of every norm, residual placement and QK-norm, read from the modules that implement them.

Each name is declared once, beside its implementation: ``posenc.norms.NORMS``,
``posenc.placements.PLACEMENTS``, ``posenc.qk_norm.QK_NORMS``. This module
is a read-only view for configs and error messages. Position encodings are
model units: their registry is ``posenc.model.ENCODINGS``.
"""

from __future__ import annotations

from posenc import checks
from posenc.norms import norms, placements, qk_norm

NORM_KINDS: dict[str, str] = {name: k.description for name, k in norms.NORMS.items()}
PLACEMENTS: dict[str, str] = {name: p.description for name, p in placements.PLACEMENTS.items()}
QK_NORMS: dict[str, str] = {name: entry[0] for name, entry in qk_norm.QK_NORMS.items()}


def check_norm_kind(name: str) -> str:
    """Return ``name`` if it is a norm kind, else raise ValueError listing them."""
    return checks.choice("norm kind", name, NORM_KINDS)


def check_placement(name: str) -> str:
    """Return ``name`` if it is a residual placement, else raise ValueError listing them."""
    return checks.choice("norm placement", name, PLACEMENTS)


def check_qk_norm(name: str) -> str:
    """Return ``name`` if it is a QK-norm, else raise ValueError listing them."""
    return checks.choice("qk_norm", name, QK_NORMS)
