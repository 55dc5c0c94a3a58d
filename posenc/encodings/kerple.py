"""KERPLE: kernelized relative positional bias (logarithmic and power kernels).

Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for
Length Extrapolation". Reference: chijames/KERPLE (GPT-NeoX fork),
``megatron/mpu/layers.py``, ``ParallelKerpleLog`` / ``ParallelKerplePower``.

Constraint. The reference clamps the stored parameter tensors in place
(``bias_p.data = bias_p.data.clamp(min=eps)``, power: ``max=2``) at every
forward pass, i.e. after every optimizer update: projected gradient descent.
The pure equivalent is :func:`constrain`, which the training step applies
to the stored a, p after each update. :func:`bias` also clamps, with a
straight-through gradient: on constrained parameters that is the identity
(the same forward value and gradient as the reference), and on parameters
nobody constrained it keeps the kernel valid (a, p >= 0.01, p <= 2) and the
gradient alive. It cannot keep the stored value from drifting below the
bound, where the bias stops changing until the drift is undone; only
:func:`constrain` does that.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from posenc.encodings.absolute import relative_distances

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


def _check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose one of: {', '.join(KINDS)}")


def constrain(a, p, *, kind: str = "log"):
    """Project stored parameters onto the kernel's domain: (max(a, 0.01), clip(p, 0.01, p_max)).

    p_max is 2 for the power kernel (-a |i-j|^p is conditionally positive
    definite for p in (0, 2]) and none for the log kernel, as in the
    reference's in-place clamps. Apply it after each optimizer update (the
    reference clamps before each forward pass, i.e. after each update).
    Works on traced values; dtypes and shapes are kept.
    """
    _check_kind(kind)
    a, p = jnp.asarray(a), jnp.asarray(p)
    a = jnp.maximum(a, jnp.asarray(MIN_PARAM, a.dtype))
    p = jnp.clip(p, jnp.asarray(MIN_PARAM, p.dtype), None if kind == "log" else jnp.asarray(MAX_POWER, p.dtype))
    return a, p


def bias(q_positions, k_positions, a, p, *, kind: str = "log") -> jax.Array:
    """KERPLE bias from per-head kernel parameters.

    - ``kind="log"``:   ``bias[h, i, j] = -p_h * log(1 + a_h |i - j|)``
    - ``kind="power"``: ``bias[h, i, j] = -a_h * |i - j|^p_h``

    ``a`` and ``p`` are clamped to >= 0.01 (and ``p <= 2`` for power) with a
    straight-through gradient (a no-op on parameters kept in range by
    :func:`constrain`, see the module docstring). At
    ``|i - j| = 0`` the power kernel is 0 with finite gradients (0^p is
    guarded, so no NaN from ``0^p log 0``).

    Shapes: q_positions int [..., Lq], k_positions int [..., Lk], a [H], p [H]
    -> float32 [..., H, Lq, Lk].
    """
    _check_kind(kind)
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
