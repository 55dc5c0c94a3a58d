"""PoPE: polar coordinate position embeddings (content in the magnitude, position in the phase).

Gopalakrishnan, Csordás, Schmidhuber and Mozer 2025, "Decoupling the 'What'
and 'Where' With Polar Coordinate Positional Embeddings" (arXiv 2509.10534).
Each of the d components of a query / key becomes a complex number whose
magnitude is the content and whose phase is the position alone::

    mu_c = softplus(x_c)                                  (magnitude, >= 0)
    q~_tc = mu^q_tc e^{i t theta_c}                       (query at position t)
    k~_sc = mu^k_sc e^{i (s theta_c + delta_c)}           (key at position s)
    a_ts  = Re[q~_t^H k~_s] = sum_c mu^q_tc mu^k_sc cos((s - t) theta_c + delta_c)

with d frequencies ``theta_c = base^(-c / d)``, c = 0 .. d-1 (twice RoPE's
d / 2: every component has its own), and a learned phase bias ``delta`` per
key head and frequency, clamped to ``[-2 pi, 0]`` (initialised at 0; the
paper's alternative init is uniform in that range). Unlike RoPE, the
content of a component cannot shift its phase: the score of a pair depends
on the positions only through ``s - t``, and on the content only through
the magnitudes.

The real part of the Hermitian product is a plain dot product of real
vectors of twice the width: :func:`query` and :func:`key` return
``[mu cos(phi), mu sin(phi)]`` per component (interleaved, as lucidrains'
``rearrange(..., 'two ... d -> ... (d two)')``), so any attention kernel
computes ``a_ts``; :func:`logits` computes it directly in complex form.

Where lucidrains/PoPE-pytorch (``PoPE_pytorch/pope.py``, ``apply_pope_to_qk``
and ``PoPE.forward``) differs from the paper, and what posenc does:

- the frequencies, magnitudes, phases, key bias, clamp and zero init are the
  paper's in both;
- partial PoPE (``len(inv_freq) < Dh``) is the code's alone: the first
  ``len(inv_freq)`` components are encoded and the rest are passed through
  unchanged (no softplus) and appended; posenc does the same; the paper
  encodes every component;
- the code takes the query positions as the last ``Lq`` of the key positions
  (``slice_right_at_dim``); posenc takes explicit positions for both;
- the code's bias has one row per head of the module (``heads``) and is added
  to the keys before grouped-query heads are repeated; posenc's has one row
  per head of ``x`` in :func:`key` (the key heads).

Phases (keyword ``angles``, as ``posenc.rope.apply``): "exact" (default)
reduces ``t theta_c`` modulo 2 pi from the integer position
(``posenc.phase``), so scores at positions shifted by 10^6 equal those at 0
to float32 rounding; "canonical" is the float32 product ``t * theta_c`` of
lucidrains' code, whose error grows as ``|t theta_c| 2^-24`` rad.

The attention scale is a matter of the caller: lucidrains' attention uses
``1 / sqrt(Dh)`` of the original head dimension, not of the doubled one.

Shapes: x [..., L, H, Dh], positions int [..., L], inv_freq [r] (r <= Dh),
bias [H, r] -> [..., L, H, Dh + r] (2 r encoded, Dh - r passed through).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.encodings.absolute import check_positions
from posenc.encodings.rope import rope

_F32 = jnp.float32


def frequencies(dim: int, *, base: float = 10000.0) -> jax.Array:
    """PoPE's frequencies ``theta_c = base^(-c / dim)``, c = 0 .. dim-1 (one per component).

    Shapes: -> float32 [dim].
    """
    dim = checks.integer("dim", dim, minimum=1)
    base = checks.number("base", base, positive=True)
    return jnp.asarray(base, _F32) ** (-jnp.arange(dim, dtype=_F32) / dim)


def clamp_bias(bias) -> jax.Array:
    """The key phase bias as used: ``clip(bias, -2 pi, 0)`` in float32 (zero gradient outside)."""
    return jnp.clip(jnp.asarray(bias, _F32), -2.0 * math.pi, 0.0)


def _phases(positions, inv_freq, angles: str) -> jax.Array:
    """``positions * inv_freq`` (reduced modulo 2 pi for "exact"), float32 [..., L, 1, r]."""
    return rope.angles(positions, inv_freq, method=angles)[..., :, None, :]


def _encode(x, positions, inv_freq, bias, name: str, angles: str) -> jax.Array:
    x = jnp.asarray(x)
    inv_freq = jnp.asarray(inv_freq, _F32)
    if inv_freq.ndim != 1:
        raise ValueError(f"inv_freq must have shape [r]; got {inv_freq.shape}")
    if x.ndim < 3 or inv_freq.shape[0] > x.shape[-1]:
        raise ValueError(f"{name} must have shape [..., L, H, Dh] with Dh >= len(inv_freq) = {inv_freq.shape[0]}; "
                         f"got {x.shape}")
    positions = check_positions(positions)
    if positions.shape[-1] != x.shape[-3]:
        raise ValueError(f"positions must have shape [..., L] with L = {x.shape[-3]}; got {positions.shape}")
    r = inv_freq.shape[0]
    phase = _phases(positions, inv_freq, angles)  # [..., L, 1, r]
    if bias is not None:
        bias = jnp.asarray(bias)
        if bias.shape != (x.shape[-2], r):
            raise ValueError(f"bias must have shape [H, r] = ({x.shape[-2]}, {r}); got {bias.shape}")
        phase = phase + clamp_bias(bias)
    mu = jax.nn.softplus(x[..., :r].astype(_F32))
    polar = jnp.stack([mu * jnp.cos(phase), mu * jnp.sin(phase)], axis=-1)  # [..., r, 2]
    polar = polar.reshape(*polar.shape[:-2], 2 * r)
    return jnp.concatenate([polar, x[..., r:].astype(_F32)], axis=-1).astype(x.dtype)


def query(x, positions, inv_freq, *, angles: str = "exact") -> jax.Array:
    """Queries as the real vectors ``[mu cos(t theta), mu sin(t theta)]`` (interleaved per component).

    ``mu = softplus(x[..., :r])``; components r .. Dh-1 are passed through.

    Shapes: x [..., L, H, Dh], positions int [..., L], inv_freq [r] -> [..., L, H, Dh + r].
    """
    return _encode(x, positions, inv_freq, None, "x", angles)


def key(x, positions, inv_freq, *, bias=None, angles: str = "exact") -> jax.Array:
    """Keys as ``[mu cos(s theta + delta), mu sin(s theta + delta)]``, delta = clip(bias, -2 pi, 0).

    ``bias=None`` is delta = 0. ``query(q) . key(k)`` summed over the last
    axis is the PoPE score :func:`logits` (plus the passed-through part).

    Shapes: x [..., L, H, Dh], positions int [..., L], inv_freq [r], bias [H, r]
    -> [..., L, H, Dh + r].
    """
    return _encode(x, positions, inv_freq, bias, "x", angles)


def logits(q, k, q_positions, k_positions, inv_freq, *, bias=None, angles: str = "exact") -> jax.Array:
    """Unscaled PoPE scores in complex form, ``Re[q~_t^H k~_s]`` (+ the passed-through dot product).

    ``sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_c)``,
    computed as the real part of a complex product (the paper's definition;
    :func:`query` / :func:`key` are its real-vector form). Queries and keys
    have the same number of heads.

    Shapes: q [..., Lq, H, Dh], k [..., Lk, H, Dh], positions int [..., Lq] /
    [..., Lk], inv_freq [r], bias [H, r] -> float32 [..., H, Lq, Lk].
    """
    q, k = jnp.asarray(q), jnp.asarray(k)
    inv_freq = jnp.asarray(inv_freq, _F32)
    if q.ndim < 3 or k.ndim < 3 or q.shape[-2:] != k.shape[-2:] or inv_freq.ndim != 1 or (
            inv_freq.shape[0] > q.shape[-1]):
        raise ValueError(f"q and k must have shape [..., L, H, Dh] with the same H, Dh >= len(inv_freq); got "
                         f"{q.shape}, {k.shape} and inv_freq {inv_freq.shape}")
    r = inv_freq.shape[0]
    tq = _phases(check_positions(q_positions, "q_positions"), inv_freq, angles)
    tk = _phases(check_positions(k_positions, "k_positions"), inv_freq, angles)
    if bias is not None:
        bias = jnp.asarray(bias)
        if bias.shape != (k.shape[-2], r):
            raise ValueError(f"bias must have shape [H, r] = ({k.shape[-2]}, {r}); got {bias.shape}")
        tk = tk + clamp_bias(bias)
    qc = jax.nn.softplus(q[..., :r].astype(_F32)) * jnp.exp(1j * tq)
    kc = jax.nn.softplus(k[..., :r].astype(_F32)) * jnp.exp(1j * tk)
    out = jnp.real(jnp.einsum("...qhc,...khc->...hqk", jnp.conj(qc), kc))
    rest = jnp.einsum("...qhc,...khc->...hqk", q[..., r:].astype(_F32), k[..., r:].astype(_F32))
    return (out + rest).astype(_F32)
