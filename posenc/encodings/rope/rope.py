"""Rotary position embedding (RoPE; Su et al. 2021, RoFormer).

Each pair of head dims (x_a, x_b) at position p is rotated by the angle
p * inv_freq[i]:

    x_a' = x_a cos(p inv_i) - x_b sin(p inv_i)
    x_b' = x_b cos(p inv_i) + x_a sin(p inv_i)

so that <R_m q, R_n k> = <q, R_{n-m} k> depends only on n - m. Two pairings
of the head dims are in use and both are supported through `layout`:

- "half" (rotate_half; GPT-NeoX, HF Llama): pairs (j, j + d/2);
- "interleaved" (RoFormer, GPT-J, Meta Llama): pairs (2i, 2i + 1).

They are equal up to a fixed permutation of the head dims. Only the first
d = 2 * len(inv_freq) dims are rotated; the rest pass through (partial
rotary, e.g. GPT-NeoX rotary_pct).

Frequencies, with every context-extension scaling (PI, NTK, dynamic NTK,
YaRN, LongRoPE, Llama 3.1), come from :func:`frequencies` (implemented in
``posenc.rope_scaling`` and re-exported here).

Angles (keyword ``angles`` of :func:`apply` and :func:`cos_sin`):

- "exact" (default): p * inv_freq reduced modulo 2 pi exactly from the
  integer position (``posenc.phase``), within 3e-7 rad for every int32
  position, so logits <R_m q, R_n k> at positions shifted by 10^6 (or 2^30)
  equal those at offset 0 to float32 rounding. It costs ~25 float32 ops per
  angle on top of the product, paid once per (position, frequency) and
  shared by the heads: median CPU time on 2 cores, +50% for the cos / sin
  of a [1, 4096] x 32 call and +15-20% for ``apply`` on x [8, 256, 4, 64]
  (f32 or bf16). The default because a long-context library should not
  drift with the absolute position.
- "canonical": the float32 product p * inv_freq, as Hugging Face, GPT-NeoX
  and Meta Llama compute it: bit-level parity with their outputs (checkpoint
  import, parity tests). Its error grows as |p inv_freq| 2^-24 rad: logits
  of unit q, k (Dh 32) at offset 10^6 differ from offset 0 by up to ~4e-4.

Precision otherwise: products are elementwise (a matmul/einsum would run at
reduced precision on TPU/GPU by default), positions are cast from int
straight to float32 / int32 (bf16 cannot hold consecutive integers above
256), and the rotation runs in float32; only the result is cast back to
x.dtype. bf16 inputs: the output is the float32 rotation rounded to bf16
once, so each element is within 2^-8 of the exact rotation relatively (plus
1e-6 |pair|), at any position (tested at 100K), and a logit of two bf16
rotations is within 2^-7 |q| |k| of the exact one at any offset (tested to
10^6); with "canonical" angles the angle error alone reaches 2^-8 rad near
p inv = 65K.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.encodings import phase
from posenc.encodings.rope.rope_scaling import KINDS, frequencies

__all__ = ["ANGLES", "KINDS", "LAYOUTS", "angles", "apply", "cos_sin", "frequencies", "rotary_dim",
           "rotate"]

LAYOUTS = ("half", "interleaved")
ANGLES = ("exact", "canonical")


def rotary_dim(head_dim: int, fraction: float = 1.0) -> int:
    """Number of rotated head dims: int(head_dim * fraction) (HF partial_rotary_factor).

    Raises ValueError unless 0 < fraction <= 1 and the result is even and positive.
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or head_dim <= 0:
        raise ValueError(f"head_dim must be a positive integer; got {head_dim!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1]; got {fraction!r}")
    d = int(head_dim * fraction)
    if d <= 0 or d % 2:
        raise ValueError(
            f"rotary dim int({head_dim} * {fraction}) = {d} must be even and positive; "
            "choose a fraction that gives an even number of dims"
        )
    return d


def _check_positions(positions) -> jax.Array:
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(
            f"positions must be an integer array (never float or bf16); got dtype {positions.dtype}"
        )
    return positions


def _check_inv_freq(inv_freq) -> jax.Array:
    inv_freq = jnp.asarray(inv_freq)
    if inv_freq.ndim != 1 or inv_freq.shape[0] == 0:
        raise ValueError(
            f"inv_freq must be a non-empty 1-D array [rotary_dim // 2]; got shape {inv_freq.shape}"
        )
    return inv_freq.astype(jnp.float32)


def angles(positions, inv_freq, *, method="canonical") -> jax.Array:
    """Rotation angles of positions * inv_freq, float32 [..., L, d/2].

    positions: integer [..., L]; inv_freq: [d/2]. ``method="canonical"``:
    the elementwise float32 product (never a matmul), positions cast int ->
    float32 directly. ``method="exact"``: the product reduced modulo 2 pi
    into [-pi, pi] from the integer position, within 3e-7 rad
    (``posenc.phase.reduced_angles``).
    """
    checks.choice("angles", method, ANGLES)
    positions = _check_positions(positions)
    inv_freq = _check_inv_freq(inv_freq)
    if method == "exact":
        return phase.reduced_angles(positions, inv_freq)
    return positions.astype(jnp.float32)[..., None] * inv_freq


_angles = angles  # the keyword ``angles`` of the functions below shadows this name


def cos_sin(positions, inv_freq, *, angles="exact"):
    """(cos, sin) of the rotation angles, float32 [..., L, d/2] each; ``angles``: "exact" | "canonical"."""
    theta = _angles(positions, inv_freq, method=angles)
    return jnp.cos(theta), jnp.sin(theta)


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")


def rotate(x, cos, sin, *, layout="half"):
    """Rotate the first 2 * cos.shape[-1] dims of x by the given cos / sin.

    x: [..., L, H, Dh]; cos, sin: float32 broadcastable to [..., L, H, d/2]
    (typically [..., L, 1, d/2]); they may carry a per-pair magnitude (xPos)
    or the attention factor. Math in float32, result in x.dtype; dims from d
    on pass through unchanged.
    """
    _check_layout(layout)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"x must be a floating-point array; got dtype {x.dtype}")
    if x.ndim < 3:
        raise ValueError(f"x must have shape [..., L, H, Dh]; got shape {x.shape}")
    half = cos.shape[-1]
    d = 2 * half
    if half == 0 or d > x.shape[-1]:
        raise ValueError(
            f"rotary dim 2 * {half} = {d} must be in [2, head dim {x.shape[-1]}] "
            f"(inv_freq may have at most head_dim // 2 = {x.shape[-1] // 2} entries)"
        )
    target = x.shape[:-1] + (half,)
    for name, t in (("cos", cos), ("sin", sin)):
        try:
            shape = jnp.broadcast_shapes(target, t.shape)
        except ValueError:
            shape = None
        if shape != target:
            raise ValueError(
                f"{name} of shape {t.shape} (from positions [..., L]) does not broadcast to the "
                f"leading dims of x {x.shape[:-1]}; positions must be [..., L] with leading dims "
                "broadcastable to those of x"
            )
    # cos / sin are shared by every (batch, head) element: without the barrier XLA fuses their
    # computation into the elementwise rotation and repeats it per element (4-10x slower on CPU).
    cos, sin = jax.lax.optimization_barrier((jnp.asarray(cos), jnp.asarray(sin)))
    xr = x[..., :d].astype(jnp.float32)
    if layout == "half":
        a, b = xr[..., :half], xr[..., half:]
        out = jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    else:
        a, b = xr[..., 0::2], xr[..., 1::2]
        out = jnp.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(xr.shape)
    out = out.astype(x.dtype)
    if d == x.shape[-1]:
        return out
    return jnp.concatenate([out, x[..., d:]], axis=-1)


def apply(x, positions, inv_freq, *, layout="half", attention_factor=1.0, angles="exact"):
    """Apply RoPE (Su et al. 2021) to queries or keys.

    x' = x cos(p inv) + rotate(x) sin(p inv), both scaled by attention_factor
    (HF convention: logits then scale by attention_factor ** 2).

    Args:
      x: [..., L, H, Dh], any float dtype.
      positions: integer [..., L], leading dims broadcastable to those of x
        (e.g. [L] or [B, L] for x [B, L, H, Dh]).
      inv_freq: [d/2] with d = 2 * len(inv_freq) <= Dh, e.g. from
        :func:`frequencies`; the first d dims are rotated, the rest pass through.
      layout: "half" (pairs (j, j + d/2), GPT-NeoX / HF) or "interleaved"
        (pairs (2i, 2i + 1), RoFormer / GPT-J / Meta Llama).
      attention_factor: multiplies cos and sin (float or jnp scalar).
      angles: "exact" (default; range-reduced from the integer positions,
        shift invariant at any offset) or "canonical" (float32 p * inv_freq,
        bitwise as Hugging Face). See the module docstring.

    Returns:
      Array like x (same shape and dtype).
    """
    _check_layout(layout)
    if isinstance(attention_factor, numbers.Real) and not attention_factor > 0:
        raise ValueError(f"attention_factor must be positive; got {attention_factor!r}")
    cos, sin = cos_sin(positions, inv_freq, angles=angles)
    cos = cos[..., None, :] * attention_factor  # [..., L, 1, d/2]: shared by heads
    sin = sin[..., None, :] * attention_factor
    return rotate(x, cos, sin, layout=layout)
