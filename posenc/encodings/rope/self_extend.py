"""Self-Extend: grouped attention beyond a neighbor window (Jin et al. 2024, "LLM Maybe LongLM").

Training-free context extension of a RoPE model (ICML 2024; official code
datamllab/LongLM, ``self_extend_patch/Llama.py``). With group size G and
neighbor window W, a query at position i and a key at j <= i, d = i - j:

    d < W :  d                                         (neighbor attention)
    d >= W:  floor(i / G) - floor(j / G) + W - W / G    (grouped attention)

The grouped positions are floor(p / G), the query's shifted by W - W / G so
that the two pieces meet at W (exactly at d = W when G divides W). The
official code rotates queries and keys twice (neighbor: i and j; grouped:
i // G + W - W / G and j // G), computes both logit sets and merges them by
the neighbor mask 0 <= d < W; :func:`regions` gives those two sets.

Differences from the official code, and why:

- W / G is true division, as in the official eager path (prefill and
  decoding) and the flash prefill; the official flash *decoding* path adds
  W - W // G instead, which differs by frac(W / G) < 1 when G does not divide
  W. When it does not, the grouped distances are fractional and the grouped
  region carries positions G * floor(p / G) (+ (G - 1) W for queries) with
  scale 1 / G, which rotate by the same angles with integer positions.
- Masks are read off the positions (d < W), not off the row / cache-slot
  index; the two agree for contiguous positions, which the official code
  assumes (its decoding path re-creates key positions as arange).
- The official code sets the shift to 0 when every query position is below
  W; no visible pair is grouped then (d <= i < W for keys at j >= 0), so
  posenc always shifts.
- The optional log-scaled queries (``scale_base``) are a logit scale, not a
  position: ``posenc.logit_scale.logn``.

Shapes: q_positions int [..., Lq], k_positions int [..., Lk] -> float32
[..., Lq, Lk]; NaN where j > i (see ``posenc.remap``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.encodings.rope import remap

__all__ = ["regions", "relative_positions"]


def _check(group, window):
    return checks.integer("group", group, minimum=1), checks.integer("window", window, minimum=1)


def relative_positions(q_positions, k_positions, *, group: int, window: int) -> jax.Array:
    """Self-Extend relative positions: d below the window, grouped distances beyond it.

    ``d < window``: d = i - j; ``d >= window``: i // group - j // group +
    window - window / group (float). NaN above the diagonal (d < 0).
    group >= 1 (1: plain RoPE); window >= 1 (the neighbor window).
    """
    group, window = _check(group, window)
    q, k, d = remap.positions(q_positions, k_positions)
    grouped = ((q // group)[..., :, None] - (k // group)[..., None, :]).astype(jnp.float32)
    grouped = grouped + jnp.float32(window - window / group)
    rel = jnp.where(d < window, d.astype(jnp.float32), grouped)
    return jnp.where(d >= 0, rel, jnp.nan)


def regions(q_positions, k_positions, *, group: int, window: int) -> list[remap.Region]:
    """[neighbor, grouped] regions (``posenc.remap.Region``) of Self-Extend.

    neighbor: positions (i, j), mask 0 <= d < window. grouped: mask d >=
    window; positions (i // G + W - W // G, j // G) with scale 1 when G
    divides W, else (G (i // G) + (G - 1) W, G (j // G)) with scale 1 / G.
    """
    group, window = _check(group, window)
    q, k, d = remap.positions(q_positions, k_positions)
    neighbor = remap.Region(q, k, (d >= 0) & (d < window))
    if window % group == 0:
        grouped = remap.Region(q // group + (window - window // group), k // group, d >= window)
    else:
        grouped = remap.Region(group * (q // group) + (group - 1) * window, group * (k // group),
                               d >= window, 1.0 / group)
    return [neighbor, grouped]
