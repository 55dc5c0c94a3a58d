"""Normalization functions: LayerNorm, RMSNorm, ScaleNorm, DyT, Derf, L2, soft-capping.

All functions normalise over the last axis of ``x`` (any leading shape),
compute statistics in float32 and return an array of ``x.dtype``.

Where the gain is applied: in float32, *before* the cast back to ``x.dtype``
(Gemma style: ``(normed * (1 + w)).astype(x.dtype)``). Llama casts the
normalised activations to the input dtype first and multiplies by the gain
afterwards; in bf16 the two orders are not bit-identical. Parameters (gain,
bias) are read in float32 whatever their storage dtype.

``normalize(kind, x, params)`` and ``init_params(kind, dim)`` dispatch on the
names of :data:`NORMS` (each entry: description, parameters, the keywords it
takes) so that a model can build any norm from a config string; a keyword
the kind does not use is a ValueError.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from posenc import checks

_F32 = jnp.float32


def _check_eps(eps, name: str = "eps") -> None:
    # Only concrete values are checked; a traced eps is the caller's business.
    if not isinstance(eps, jax.core.Tracer):
        _positive(name, eps)


def _positive(name: str, value) -> float:
    return checks.number(name, value, positive=True)


def _check_vector(name: str, p, x) -> None:
    """``p`` must be a vector of length ``x.shape[-1]`` (shapes are static)."""
    shape = tuple(jnp.shape(p))
    if shape != (x.shape[-1],):
        raise ValueError(
            f"{name} shape {shape} does not match the last axis of x with shape "
            f"{tuple(x.shape)}; expected {(x.shape[-1],)}"
        )


def _check_scalar(name: str, p) -> None:
    shape = tuple(jnp.shape(p))
    if shape != ():
        raise ValueError(f"{name} must be a scalar (shape ()); got shape {shape}")


def layer_norm(x, scale, bias=None, *, eps=1e-6):
    """Layer normalisation over the last axis (Ba et al. 2016).

    ``y = (x - mean) * rsqrt(var + eps) * scale [+ bias]`` with the biased
    (1/D) variance, computed two-pass in float32 so that a large mean does
    not cancel the variance.

    Args:
      x: ``[..., D]``, any float dtype.
      scale: ``[D]`` gain.
      bias: ``[D]`` or None (no bias).
      eps: > 0, added to the variance.
    Returns:
      ``[..., D]`` in ``x.dtype``.
    """
    _check_eps(eps)
    _check_vector("scale", scale, x)
    if bias is not None:
        _check_vector("bias", bias, x)
    x32 = x.astype(_F32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    centered = x32 - mean
    var = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
    y = centered * jax.lax.rsqrt(var + eps) * jnp.asarray(scale, _F32)
    if bias is not None:
        y = y + jnp.asarray(bias, _F32)
    return y.astype(x.dtype)


def rms_norm(x, scale, *, eps=1e-6, unit_offset=False):
    """Root-mean-square normalisation over the last axis (Zhang & Sennrich 2019).

    ``y = x * rsqrt(mean(x^2) + eps) * g`` with ``g = scale``, or
    ``g = 1 + scale`` when ``unit_offset`` (Gemma parameterisation, ``scale``
    initialised to 0). The gain is applied in float32 before the cast back.

    Args:
      x: ``[..., D]``.
      scale: ``[D]``.
      eps: > 0, added to the mean square.
      unit_offset: use the gain ``1 + scale``.
    Returns:
      ``[..., D]`` in ``x.dtype``.
    """
    _check_eps(eps)
    _check_vector("scale", scale, x)
    x32 = x.astype(_F32)
    ms = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    gain = jnp.asarray(scale, _F32)
    if unit_offset:
        gain = 1.0 + gain
    return (x32 * jax.lax.rsqrt(ms + eps) * gain).astype(x.dtype)


def _safe_inv_norm(x32, eps):
    # 1 / max(||x||, eps) written as rsqrt(max(sum x^2, eps^2)): the gradient
    # of sqrt at 0 is infinite, while max() routes it to the eps^2 constant,
    # so gradients stay finite at x = 0.
    sq = jnp.sum(jnp.square(x32), axis=-1, keepdims=True)
    return jax.lax.rsqrt(jnp.maximum(sq, eps * eps))


def scale_norm(x, gain, *, eps=1e-5):
    """ScaleNorm (Nguyen & Salazar 2019): ``g * x / max(||x||_2, eps)``.

    One learned scalar ``g`` (initialised to ``sqrt(D)``) replaces the
    per-feature gain.

    Args:
      x: ``[..., D]``.
      gain: scalar.
      eps: > 0, lower bound on the norm.
    Returns:
      ``[..., D]`` in ``x.dtype``.
    """
    _check_eps(eps)
    _check_scalar("gain", gain)
    x32 = x.astype(_F32)
    return (jnp.asarray(gain, _F32) * x32 * _safe_inv_norm(x32, eps)).astype(x.dtype)


def l2_normalize(x, *, eps=1e-6):
    """Unit-norm rows: ``x / max(||x||_2, eps)`` over the last axis.

    Used by cosine attention / L2 QK-norm. ``x = 0`` maps to 0 with finite
    gradients.

    Args:
      x: ``[..., D]``.
      eps: > 0, lower bound on the norm.
    Returns:
      ``[..., D]`` in ``x.dtype``.
    """
    _check_eps(eps)
    x32 = x.astype(_F32)
    return (x32 * _safe_inv_norm(x32, eps)).astype(x.dtype)


def dyt(x, alpha, gamma, beta=None):
    """Dynamic Tanh (Zhu et al. 2025): ``gamma * tanh(alpha * x) + beta``.

    A normalisation-free replacement for LayerNorm; ``alpha`` is a learned
    scalar (init 0.5), ``gamma`` ones, ``beta`` zeros.

    Args:
      x: ``[..., D]``.
      alpha: scalar.
      gamma: ``[D]``.
      beta: ``[D]`` or None.
    Returns:
      ``[..., D]`` in ``x.dtype``.
    """
    _check_scalar("alpha", alpha)
    _check_vector("gamma", gamma, x)
    if beta is not None:
        _check_vector("beta", beta, x)
    y = jnp.asarray(gamma, _F32) * jnp.tanh(jnp.asarray(alpha, _F32) * x.astype(_F32))
    if beta is not None:
        y = y + jnp.asarray(beta, _F32)
    return y.astype(x.dtype)


def derf(x, alpha, shift, gamma, beta=None):
    """Dynamic erf (Chen et al. 2025, arXiv 2512.10938): ``gamma * erf(alpha * x + shift) + beta``.

    A normalisation-free replacement for LayerNorm / RMSNorm like DyT, with
    the error function and a learned scalar shift. Initial values of the
    official code (``zlab-princeton/Derf``, ``Dynamic_erf``): ``alpha`` 0.5
    (their GPT-2 and DiT-XL runs set 1.0), ``shift`` 0, ``gamma`` ones,
    ``beta`` zeros.

    Args:
      x: ``[..., D]``.
      alpha: scalar.
      shift: scalar.
      gamma: ``[D]``.
      beta: ``[D]`` or None.
    Returns:
      ``[..., D]`` in ``x.dtype``.
    """
    _check_scalar("alpha", alpha)
    _check_scalar("shift", shift)
    _check_vector("gamma", gamma, x)
    if beta is not None:
        _check_vector("beta", beta, x)
    z = jnp.asarray(alpha, _F32) * x.astype(_F32) + jnp.asarray(shift, _F32)
    y = jnp.asarray(gamma, _F32) * jax.lax.erf(z)
    if beta is not None:
        y = y + jnp.asarray(beta, _F32)
    return y.astype(x.dtype)


def softcap(x, cap):
    """Logit soft-capping (Gemma 2): ``cap * tanh(x / cap)``.

    Smoothly bounds ``x`` to ``(-cap, cap)``; Gemma 2 uses 50 on attention
    logits (before the mask) and 30 on the final logits. Computed in float32.

    Args:
      x: any shape.
      cap: concrete number > 0.
    Returns:
      like ``x`` (same shape and dtype).
    """
    if isinstance(cap, jax.core.Tracer):
        raise ValueError("cap must be a concrete number > 0, not a traced value")
    c = _positive("cap", cap)
    x = jnp.asarray(x)
    return (c * jnp.tanh(x.astype(_F32) / c)).astype(x.dtype)


def deepnorm_constants(num_layers):
    """DeepNorm residual and init constants (Wang et al. 2022), decoder-only.

    ``x = LN(alpha * x + F(x))`` with ``alpha = (2N)^(1/4)``; the value,
    output and MLP matrices are initialised xavier-normal with gain
    ``beta = (8N)^(-1/4)`` (q/k projections gain 1). ``N`` is the number of
    decoder layers. N = 12: (2.2134, 0.3195); N = 6: (1.8612, 0.3799).

    Returns:
      ``(alpha, beta)`` as Python floats.
    """
    num_layers = checks.integer("num_layers", num_layers, minimum=1)
    return (2.0 * num_layers) ** 0.25, (8.0 * num_layers) ** -0.25


# ---------------------------------------------------------------------------
# Dispatch by name: one entry per norm kind says everything about it.


@dataclasses.dataclass(frozen=True)
class NormKind:
    """A norm selectable by name: description, parameters, and the keywords it takes."""

    description: str
    apply: Callable  # (x, params, **keywords) -> y
    init: Callable  # (dim, **init_keywords) -> params dict
    params: tuple[str, ...]  # the keys of that dict, sorted
    keywords: tuple[str, ...] = ()  # keywords of `normalize` this kind uses
    init_keywords: tuple[str, ...] = ()  # keywords of `init_params` this kind uses


def _ones(dim):
    return jnp.ones((dim,), _F32)


def _zeros(dim):
    return jnp.zeros((dim,), _F32)


def _dyt_init(dim, dyt_alpha=0.5):
    return {"alpha": jnp.asarray(_positive("dyt_alpha", dyt_alpha), _F32), "gamma": _ones(dim),
            "beta": _zeros(dim)}


def _derf_init(dim, derf_alpha=0.5):
    # Dynamic_erf (zlab-princeton/Derf): alpha = ones(1) * alpha_init_value, shift = zeros(1),
    # weight ones(D), bias zeros(D); alpha and shift are scalars here.
    return {"alpha": jnp.asarray(_positive("derf_alpha", derf_alpha), _F32),
            "shift": jnp.zeros((), _F32), "gamma": _ones(dim), "beta": _zeros(dim)}


NORMS: dict[str, NormKind] = {
    "layer": NormKind("LayerNorm with bias",
                      lambda x, p, **kw: layer_norm(x, p["scale"], p["bias"], **kw),
                      lambda d: {"scale": _ones(d), "bias": _zeros(d)}, ("bias", "scale"), ("eps",)),
    "layer_nobias": NormKind("LayerNorm without bias",
                             lambda x, p, **kw: layer_norm(x, p["scale"], **kw),
                             lambda d: {"scale": _ones(d)}, ("scale",), ("eps",)),
    "rms": NormKind("RMSNorm with gain g", lambda x, p, **kw: rms_norm(x, p["scale"], **kw),
                    lambda d: {"scale": _ones(d)}, ("scale",), ("eps",)),
    "rms_offset": NormKind("RMSNorm with gain (1 + w), w init 0 (Gemma)",
                           lambda x, p, **kw: rms_norm(x, p["scale"], unit_offset=True, **kw),
                           lambda d: {"scale": _zeros(d)}, ("scale",), ("eps",)),
    "scale": NormKind("ScaleNorm, one scalar gain init sqrt(D) (Nguyen & Salazar 2019)",
                      lambda x, p, **kw: scale_norm(x, p["gain"], **kw),
                      lambda d: {"gain": jnp.asarray(math.sqrt(d), _F32)}, ("gain",), ("eps",)),
    "dyt": NormKind("Dynamic Tanh (Zhu et al. 2025)",
                    lambda x, p: dyt(x, p["alpha"], p["gamma"], p["beta"]), _dyt_init,
                    ("alpha", "beta", "gamma"), init_keywords=("dyt_alpha",)),
    "derf": NormKind("Dynamic erf, gamma erf(alpha x + shift) + beta (Chen et al. 2025)",
                     lambda x, p: derf(x, p["alpha"], p["shift"], p["gamma"], p["beta"]), _derf_init,
                     ("alpha", "beta", "gamma", "shift"), init_keywords=("derf_alpha",)),
    "none": NormKind("identity", lambda x, p: x, lambda d: {}, ()),
}
KINDS = tuple(NORMS)


def _kind(kind) -> NormKind:
    return NORMS[checks.choice("norm kind", kind, NORMS)]


def _given(**kw) -> dict:
    return {k: v for k, v in kw.items() if v is not None}


def normalize(kind, x, params, *, eps=None):
    """Apply the norm named ``kind`` (one of :data:`NORMS`).

    Args:
      kind: one of layer, layer_nobias, rms, rms_offset, scale, dyt, derf, none.
      x: ``[..., D]``.
      params: dict as returned by :func:`init_params` (same keys).
      eps: > 0, or None for each function's default (1e-6; ScaleNorm 1e-5).
        DyT, Derf and none take no eps: passing one is a ValueError.
    Returns:
      ``[..., D]`` in ``x.dtype``.
    """
    norm = _kind(kind)
    kw = _given(eps=eps)
    checks.no_extra(f"norm kind {kind!r}", kw, allowed=norm.keywords)
    names = norm.params
    got = tuple(sorted(params))
    if got != names:
        raise ValueError(
            f"norm kind {kind!r} expects params with keys ({', '.join(names)}); "
            f"got ({', '.join(got)})"
        )
    if eps is not None:
        _check_eps(eps)
    return norm.apply(x, params, **kw)


def init_params(kind, dim, *, dyt_alpha=None, derf_alpha=None):
    """Standard initial parameters (float32) of the norm named ``kind``.

    layer: scale ones [D], bias zeros [D]; layer_nobias, rms: scale ones;
    rms_offset: scale zeros (gain 1 + 0); scale: gain sqrt(D) scalar;
    dyt: alpha ``dyt_alpha`` (default 0.5) scalar, gamma ones, beta zeros;
    derf: alpha ``derf_alpha`` (default 0.5) scalar, shift 0 scalar, gamma ones,
    beta zeros (the official ``Dynamic_erf``); none: {}. ``dyt_alpha`` or
    ``derf_alpha`` with another kind is a ValueError.
    """
    norm = _kind(kind)
    kw = _given(dyt_alpha=dyt_alpha, derf_alpha=derf_alpha)
    checks.no_extra(f"init_params of norm kind {kind!r}", kw, allowed=norm.init_keywords)
    dim = checks.integer("dim", dim, minimum=1)
    return norm.init(dim, **kw)


def embed_scale(dim, dtype):
    """Token-embedding multiplier ``sqrt(dim)`` cast to ``dtype`` (Vaswani et al. 2017; Gemma).

    Gemma casts the normaliser to the activation dtype, so in bf16
    ``sqrt(3072) = 55.43`` becomes 55.5.
    """
    checks.integer("dim", dim, minimum=1)
    return jnp.asarray(math.sqrt(dim), dtype)
