"""Normalization as pure functions (jax only): the norms, their placement around a
residual sublayer, QK-norm, z-loss, training diagnostics and the names of them all.

Each module is public as ``posenc.<name>`` (see ``posenc/__init__.py``), except
``norms.py`` itself: ``posenc.norms`` is this package, so it re-exports the
public names of ``posenc.norms.norms`` (``posenc.norms.rms_norm``).
"""

from posenc.norms.norms import (
    KINDS,
    NORMS,
    NormKind,
    deepnorm_constants,
    derf,
    dyt,
    embed_scale,
    init_params,
    l2_normalize,
    layer_norm,
    normalize,
    rms_norm,
    scale_norm,
    softcap,
)

__all__ = [
    "KINDS",
    "NORMS",
    "NormKind",
    "deepnorm_constants",
    "derf",
    "dyt",
    "embed_scale",
    "init_params",
    "l2_normalize",
    "layer_norm",
    "normalize",
    "rms_norm",
    "scale_norm",
    "softcap",
]
