"""Multi-axis RoPE: each rotary frequency reads the position on one of A axes.

Multimodal RoPE (M-RoPE; Wang et al. 2024, "Qwen2-VL", arXiv 2409.12191):
a token has A = 3 position ids (temporal, height, width), ``positions`` int
[A, ..., L] (axis first, as Hugging Face's ``position_ids`` [3, batch, L]).
Frequency j of ``inv_freq`` [F] rotates by ``positions[axis(j)] * inv_freq[j]``
with ``axis(j)`` from ``sections`` (A counts summing to F):

- contiguous (Qwen2-VL, ``mrope_section``): frequencies 0..s0-1 read axis 0,
  the next s1 axis 1, ...; with layout "half" both halves of the head use the
  same split (Hugging Face splits ``mrope_section * 2`` over the width-Dh cos);
- interleaved (Qwen3-VL, Qwen team 2025; transformers qwen3_vl): frequency j reads
  axis a = j % A when a > 0 and j < A * s_a, else axis 0, so T, H and W each
  span low and high frequencies ([T H W T H W ... T T]).

Text tokens carry the same id on every axis, which makes this plain RoPE
(:func:`posenc.rope.apply`, bitwise). Each axis is relative on its own:
<R(p) q, R(p') k> depends only on the per-axis differences p' - p.
:func:`position_ids` builds the ids of a sequence of text runs and image /
video grids (Qwen2-VL's ``get_rope_index``).

2D RoPE for images (Heo et al. 2024, "Rotary Position Embedding for Vision
Transformer", arXiv 2403.13298; official code naver-ai/rope-vit, models/vit_rope.py),
positions [2, ..., L] = (x, y) (:func:`grid_positions`):

- axial: half the frequencies read x, half y: :func:`apply` with
  ``axial_frequencies(d)`` and ``sections=(d // 4, d // 4)``;
- RoPE-Mixed: learned per-head frequency pairs, angle = fx[h, j] x + fy[h, j] y
  (:func:`apply_mixed`, initial values from :func:`mixed_frequencies`).

The official code rotates interleaved pairs (2i, 2i + 1) (``torch.view_as_complex``),
posenc's ``layout="interleaved"``; ``"half"`` pairs (j, j + d/2) instead, the same
encoding up to a fixed permutation of the head dims. Angles, precision and the
``layout`` / ``attention_factor`` / ``angles`` keywords are those of
:mod:`posenc.rope`.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.encodings.rope import rope

__all__ = ["apply", "apply_mixed", "axial_frequencies", "frequency_axes", "grid_positions",
           "mixed_frequencies", "position_ids"]


def _check_sections(sections) -> list[int]:
    if isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence) or not sections:
        raise ValueError(f"sections must be a non-empty sequence of non-negative integers; got {sections!r}")
    return [checks.integer(f"sections[{a}]", s, minimum=0) for a, s in enumerate(sections)]


def frequency_axes(sections, *, interleaved: bool = False) -> np.ndarray:
    """The axis each frequency reads: int32 [F], F = sum(sections), sections[a] entries equal to a.

    Contiguous: ``[0] * s0 + [1] * s1 + ...`` (Qwen2-VL). Interleaved:
    frequency j reads a = j % A if a > 0 and j < A * s_a, else 0 (Qwen3-VL);
    each axis a > 0 then needs its last frequency a + A (s_a - 1) < F.
    """
    checks.boolean("interleaved", interleaved)
    sections = _check_sections(sections)
    num_axes, num_freq = len(sections), sum(sections)
    if not interleaved:
        return np.repeat(np.arange(num_axes, dtype=np.int32), sections)
    for a, s in enumerate(sections[1:], start=1):
        if s and a + num_axes * (s - 1) >= num_freq:
            raise ValueError(
                f"interleaved sections {sections}: axis {a} takes frequencies {a}, {a + num_axes}, ..., "
                f"{a + num_axes * (s - 1)}, beyond the {num_freq} frequencies: each axis a > 0 needs "
                f"a + {num_axes} (sections[a] - 1) < {num_freq}")
    j = np.arange(num_freq)
    axis = j % num_axes
    return np.where((axis > 0) & (j < num_axes * np.asarray(sections)[axis]), axis, 0).astype(np.int32)


def _axis_angles(positions, inv_freq, sections, interleaved, angles) -> jax.Array:
    """Angles float32 [..., L, F] of positions [A, ..., L], each frequency on its axis."""
    positions = jnp.asarray(positions)
    if positions.ndim < 2:
        raise ValueError(f"positions must be [A, ..., L] (one row of ids per axis); got shape {positions.shape}")
    sections = _check_sections(sections)
    num_axes = positions.shape[0]
    if len(sections) != num_axes:
        raise ValueError(f"sections {sections} must have one entry per axis: positions {positions.shape} "
                         f"are [A, ..., L] with A = {num_axes}")
    theta = rope.angles(positions, inv_freq, method=angles)  # [A, ..., L, F]: every axis at every frequency
    num_freq = theta.shape[-1]
    if sum(sections) != num_freq:
        raise ValueError(f"sections {sections} must sum to len(inv_freq) = {num_freq}; they sum to {sum(sections)}")
    axes = frequency_axes(sections, interleaved=interleaved)
    out = theta[0]
    for a in range(1, num_axes):
        out = jnp.where(jnp.asarray(axes == a), theta[a], out)
    return out


def _rotate(x, theta, *, layout, attention_factor):
    """rope.apply's rotation of x [..., L, H, Dh] by angles broadcastable to [..., L, H, d/2]."""
    checks.choice("layout", layout, rope.LAYOUTS)
    if isinstance(attention_factor, numbers.Real) and not attention_factor > 0:
        raise ValueError(f"attention_factor must be positive; got {attention_factor!r}")
    return rope.rotate(x, jnp.cos(theta) * attention_factor, jnp.sin(theta) * attention_factor, layout=layout)


def apply(x, positions, inv_freq, *, sections, interleaved=False, layout="half", attention_factor=1.0,
          angles="exact"):
    """Multi-axis RoPE (M-RoPE) of queries or keys.

    Args:
      x: [..., L, H, Dh], any float dtype.
      positions: integer [A, ..., L], one row of ids per axis (Qwen2-VL: t, h, w),
        the dims after A broadcastable to x's leading dims (e.g. [3, B, L]).
      inv_freq: [F], F <= Dh / 2; the first 2F dims of x rotate, the rest pass through.
      sections: A non-negative ints summing to F (Qwen2-VL ``mrope_section``,
        e.g. (16, 24, 24) with head_dim 128).
      interleaved: False: contiguous blocks per axis (Qwen2-VL); True: Qwen3-VL's
        interleaving (:func:`frequency_axes`).
      layout, attention_factor, angles: as :func:`posenc.rope.apply`.

    Returns:
      Array like x. Equal ids on every axis give ``posenc.rope.apply`` exactly.
    """
    theta = _axis_angles(positions, inv_freq, sections, interleaved, angles)
    return _rotate(x, theta[..., None, :], layout=layout, attention_factor=attention_factor)


def position_ids(segments, *, start: int = 0) -> np.ndarray:
    """Qwen2-VL's 3-axis position ids (``get_rope_index``) of text runs and vision grids: int32 [3, L].

    segments: in sequence order, each an int n (n text tokens: the next n ids on
    all three axes) or a grid (t, h, w) of t * h * w tokens in (t, h, w) order,
    the LLM grid after the spatial merge (``grid_thw // [1, m, m]``): ids
    s + (i_t, i_h, i_w) with s the next id. A grid (t, h, w, step) puts frame i_t
    at floor(i_t * step) (Qwen2.5-VL: step = second_per_grid_t * tokens_per_second).
    The next id is always the largest id so far + 1; the first is ``start``
    (continue a sequence from ``ids.max() + 1``). Host-side (NumPy): the
    layout decides the length L.
    """
    nxt = checks.integer("start", start, minimum=0)
    parts = []
    if isinstance(segments, (str, bytes)) or not isinstance(segments, Sequence):
        raise ValueError(f"segments must be a sequence of ints and (t, h, w[, step]) tuples; got {segments!r}")
    for i, seg in enumerate(segments):
        if checks.is_int(seg):
            n = checks.integer(f"segments[{i}]", seg, minimum=0)
            ids = np.broadcast_to(np.arange(nxt, nxt + n), (3, n))
        elif isinstance(seg, (tuple, list)) and len(seg) in (3, 4):
            t, h, w = (checks.integer(f"segments[{i}][{k}]", v, minimum=1) for k, v in enumerate(seg[:3]))
            step = checks.number(f"segments[{i}][3]", seg[3], minimum=0) if len(seg) == 4 else 1
            ti, hi, wi = np.meshgrid(np.floor(np.arange(t) * step).astype(np.int64), np.arange(h), np.arange(w),
                                     indexing="ij")
            ids = np.stack([ti.ravel(), hi.ravel(), wi.ravel()]) + nxt
        else:
            raise ValueError(f"segments[{i}] must be an int (a text run) or a grid (t, h, w) or (t, h, w, step); "
                             f"got {seg!r}")
        if ids.size:
            nxt = int(ids.max()) + 1
        parts.append(ids)
    return np.concatenate([np.zeros((3, 0), np.int64), *parts], axis=1).astype(np.int32)


def grid_positions(height: int, width: int) -> np.ndarray:
    """(x, y) ids of a height x width grid of patches, row by row: int32 [2, height * width].

    Token n = y * width + x (rope-vit ``init_t_xy(end_x=width, end_y=height)``).
    """
    height = checks.integer("height", height, minimum=1)
    width = checks.integer("width", width, minimum=1)
    n = np.arange(height * width)
    return np.stack([n % width, n // width]).astype(np.int32)


def _magnitudes(rotary_dim, base) -> np.ndarray:
    """rope-vit's d/4 frequencies 1 / base^(4i / d), float32 (computed in float64)."""
    d = checks.integer("rotary_dim", rotary_dim, minimum=4)
    if d % 4:
        raise ValueError(f"rotary_dim must be a multiple of 4 (a pair of dims per axis and frequency); got {d}")
    base = checks.number("base", base, positive=True)
    return (1.0 / base ** (np.arange(0, d, 4) / d)).astype(np.float32)


def axial_frequencies(rotary_dim: int, *, base: float = 100.0) -> jax.Array:
    """Axial 2D RoPE frequencies (rope-vit ``compute_axial_cis``): float32 [rotary_dim // 2].

    The d/4 frequencies 1 / base^(4i / d) for x, then the same for y: use with
    :func:`apply`, positions [2, ..., L] (x, y) and ``sections=(d // 4, d // 4)``.
    rope-vit's axial models use base 100.
    """
    mag = _magnitudes(rotary_dim, base)
    return jnp.asarray(np.concatenate([mag, mag]))


def mixed_frequencies(key, rotary_dim: int, num_heads: int, *, base: float = 10.0, rotate: bool = True) -> jax.Array:
    """Initial RoPE-Mixed frequencies (rope-vit ``init_random_2d_freqs``): float32 [2, H, rotary_dim // 2].

    Per head h an angle a_h ~ U[0, 2 pi) (0 if not ``rotate``) and the d/4
    magnitudes m_i = 1 / base^(4i / d): fx[h] = [m cos a_h, -m sin a_h],
    fy[h] = [m sin a_h, m cos a_h] (the official cos / sin of pi/2 + a_h), so
    frequency i turns along direction a_h and frequency d/4 + i along a_h + pi/2.
    rope-vit's mixed models use base 10 and learn the result (a parameter per layer).
    """
    num_heads = checks.integer("num_heads", num_heads, minimum=1)
    checks.boolean("rotate", rotate)
    mag = jnp.asarray(_magnitudes(rotary_dim, base))
    if rotate:
        a = jax.random.uniform(key, (num_heads, 1), jnp.float32, 0.0, 2 * np.pi)
    else:
        a = jnp.zeros((num_heads, 1), jnp.float32)
    cos, sin = jnp.cos(a), jnp.sin(a)
    fx = jnp.concatenate([mag * cos, -mag * sin], axis=-1)
    fy = jnp.concatenate([mag * sin, mag * cos], axis=-1)
    return jnp.stack([fx, fy])


def apply_mixed(x, positions, freqs, *, layout="half", attention_factor=1.0, angles="exact"):
    """RoPE-Mixed (Heo et al. 2024): rotate pair j of head h by fx[h, j] x + fy[h, j] y.

    Args:
      x: [..., L, H, Dh], any float dtype.
      positions: integer [2, ..., L] (x, y), e.g. :func:`grid_positions`.
      freqs: float [2, H, F] (fx, fy), F <= Dh / 2: learned, initially
        :func:`mixed_frequencies`; gradients flow to them.
      layout, attention_factor: as :func:`posenc.rope.apply` (rope-vit: "interleaved").
      angles: "exact" (each of fx x and fy y reduced mod 2 pi from the integer
        position) or "canonical" (float32 fx x + fy y, as rope-vit).

    Returns:
      Array like x.
    """
    positions = jnp.asarray(positions)
    freqs = jnp.asarray(freqs)
    heads = jnp.shape(x)[-2] if jnp.ndim(x) >= 3 else None
    if positions.ndim < 2 or positions.shape[0] != 2:
        raise ValueError(f"positions must be [2, ..., L] (x, y); got shape {positions.shape}")
    if freqs.ndim != 3 or freqs.shape[0] != 2 or freqs.shape[1] != heads:
        raise ValueError(f"freqs must be [2, H, F] with H the heads of x [..., L, H, Dh] {jnp.shape(x)}; "
                         f"got shape {freqs.shape}")
    num_heads, num_freq = freqs.shape[1:]
    theta = (rope.angles(positions[0], freqs[0].reshape(-1), method=angles)
             + rope.angles(positions[1], freqs[1].reshape(-1), method=angles))
    theta = theta.reshape(*theta.shape[:-1], num_heads, num_freq)  # [..., L, H, F]
    return _rotate(x, theta, layout=layout, attention_factor=attention_factor)
