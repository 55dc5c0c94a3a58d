"""Helpers shared by the recurrent mixers: float32 matmuls, chunking, the
unit lower-triangular solve of the delta rules, L2 and gated RMS norms."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from posenc import checks

F32 = jnp.float32
# the chunked and the step forms must agree to float32 rounding: full-precision matmuls on every backend
HI = jax.lax.Precision.HIGHEST
mm = functools.partial(jnp.matmul, precision=HI)
einsum = functools.partial(jnp.einsum, precision=HI)

GATE_ACTIVATIONS = ("silu", "sigmoid")


def to_chunks(x, chunk: int, axis: int):
    """Zero-pad the token axis to a multiple of ``chunk`` and split it into [N, chunk]."""
    axis = axis % x.ndim
    pad = -x.shape[axis] % chunk
    if pad:
        x = jnp.pad(x, [(0, 0)] * axis + [(0, pad)] + [(0, 0)] * (x.ndim - axis - 1))
    return x.reshape(x.shape[:axis] + (x.shape[axis] // chunk, chunk) + x.shape[axis + 1:])


def from_chunks(x, length: int, axis: int):
    """Inverse of :func:`to_chunks`: merge [N, chunk] at ``axis`` and drop the padding."""
    axis = axis % x.ndim
    x = x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2:])
    return jax.lax.slice_in_dim(x, 0, length, axis=axis)


def solve_unit_lower(a_strict, rhs):
    """``(I + A)^{-1} rhs`` for a strictly lower-triangular ``A`` [..., C, C].

    The UT transform of the delta rules: the official code builds the inverse
    row by row (forward substitution); a triangular solve gives the same.
    """
    c = a_strict.shape[-1]
    eye = jnp.eye(c, dtype=a_strict.dtype)
    return jax.lax.linalg.triangular_solve(a_strict + eye, rhs, left_side=True, lower=True,
                                           unit_diagonal=True)


def l2norm(x, *, eps=1e-6):
    """``x * rsqrt(sum(x^2) + eps)`` over the last axis in float32 (fla's ``l2norm``)."""
    x = jnp.asarray(x).astype(F32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def gated_rms_norm(x, gate, weight, *, eps, activation, norm_before_gate, group_size=None):
    """RMS norm of ``x`` (per group of ``group_size`` channels) times ``weight``, gated by ``act(gate)``.

    ``norm_before_gate``: ``weight * norm(x) * act(gate)`` (Qwen3-Next, Kimi);
    otherwise ``weight * norm(x * act(gate))`` (Mamba-2). float32 math, output
    in ``x.dtype``.
    """
    checks.number("eps", eps, positive=True)
    checks.choice("activation", activation, GATE_ACTIVATIONS)
    x = jnp.asarray(x)
    weight = jnp.asarray(weight)
    d = x.shape[-1]
    if weight.shape != (d,):
        raise ValueError(f"weight must have shape [D] = [{d}]; got {weight.shape}")
    g32 = None
    if gate is not None:
        gate = jnp.asarray(gate)
        if gate.shape[-1] != d:
            raise ValueError(f"gate must end in D = {d} like x; got {gate.shape}")
        g32 = gate.astype(F32)
        g32 = jax.nn.silu(g32) if activation == "silu" else jax.nn.sigmoid(g32)
    group = d if group_size is None else checks.integer("group_size", group_size, minimum=1)
    if d % group:
        raise ValueError(f"group_size must divide D = {d}; got {group}")
    h = x.astype(F32)
    if g32 is not None and not norm_before_gate:
        h = h * g32
    hg = h.reshape(h.shape[:-1] + (d // group, group))
    hg = hg * jax.lax.rsqrt(jnp.mean(hg * hg, axis=-1, keepdims=True) + eps)
    h = hg.reshape(h.shape) * weight.astype(F32)
    if g32 is not None and norm_before_gate:
        h = h * g32
    return h.astype(x.dtype)


def check_heads(name: str, heads: int, groups: int) -> int:
    """Heads per group (key heads or B/C groups), naming the bad value."""
    if groups < 1 or heads % groups:
        raise ValueError(f"{name}: the {heads} heads must be a multiple of the {groups} groups")
    return heads // groups
