"""KERPLE: kernelized relative positional bias (logarithmic and power kernels).

Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for
Length Extrapolation".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from posenc.absolute import relative_distances

KINDS = ("log", "power")
MIN_PARAM = 0.01  # the reference code's eps: a, p are clamped to >= 1e-2
MAX_POWER = 2.0  # power kernel: p in (0, 2] keeps -a |i-j|^p conditionally positive definite


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _clamp(x, lo, hi=None):
    """Clamp the value but pass the gradient straight through.

    The reference code clamps the parameter tensors in place before each
    forward pass and differentiates through the clamped value as if it were
    the parameter. A plain ``clip`` would zero the gradient below the bound
    and freeze a parameter there forever; the identity gradient keeps the
    reference behaviour. (A custom JVP rather than
    ``x + stop_gradient(clip(x) - x)``, which loses float32 precision.)
    """
    return jnp.clip(x, lo, hi)


@_clamp.defjvp
def _clamp_jvp(lo, hi, primals, tangents):
    return _clamp(primals[0], lo, hi), tangents[0]


def bias(q_positions, k_positions, a, p, *, kind: str = "log") -> jax.Array:
    """KERPLE bias from per-head kernel parameters.

    - ``kind="log"``:   ``bias[h, i, j] = -p_h * log(1 + a_h |i - j|)``
    - ``kind="power"``: ``bias[h, i, j] = -a_h * |i - j|^p_h``

    ``a`` and ``p`` are clamped to >= 0.01 (and ``p <= 2`` for power) with a
    straight-through gradient, as in the reference implementation. At
    ``|i - j| = 0`` the power kernel is 0 with finite gradients (0^p is
    guarded, so no NaN from ``0^p log 0``).

    Shapes: q_positions int [..., Lq], k_positions int [..., Lk], a [H], p [H]
    -> float32 [..., H, Lq, Lk].
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose one of: {', '.join(KINDS)}")
    a = jnp.asarray(a, jnp.float32)
    p = jnp.asarray(p, jnp.float32)
    if a.ndim != 1 or p.shape != a.shape:
        raise ValueError(f"a and p must both have shape [H], got {a.shape} and {p.shape}")
    d = jnp.abs(relative_distances(q_positions, k_positions)).astype(jnp.float32)[..., None, :, :]
    a = _clamp(a, MIN_PARAM)[:, None, None]
    if kind == "log":
        p = _clamp(p, MIN_PARAM)[:, None, None]
        return -p * jnp.log1p(a * d)
    p = _clamp(p, MIN_PARAM, MAX_POWER)[:, None, None]
    positive = d > 0
    # d^p = exp(p log d) has gradient d^p log d in p: NaN at d = 0 unless guarded.
    dp = jnp.where(positive, jnp.where(positive, d, 1.0) ** p, 0.0)
    return -a * dp
