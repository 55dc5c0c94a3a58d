"""ReRoPE and Leaky ReRoPE: relative distances clipped at a window (Su 2023).

Training-free context extension of a RoPE model (blog "Rectified Rotary
Position Embeddings", kexue.fm/archives/9708; official code bojone/rerope,
``rerope_patch.py`` and ``leaky_rerope_patch.py``). With window w and
d = i - j >= 0:

    ReRoPE:        d' = min(d, w)
    Leaky ReRoPE:  d' = d for d < w,  w + (d - w) / k beyond   (leaky=k > 1)

The official code computes two logit sets and merges them by the mask
|d| < w: the plain RoPE logits, and a second set where ReRoPE rotates the
query at position w and leaves the key unrotated, and Leaky ReRoPE rotates
both with linearly scaled RoPE (positions / k), the query at i + w (k - 1)
and the key at j. :func:`regions` gives exactly those two sets.

Differences from the official code, and why:

- The official patches also multiply the queries by max(1, log(i + 1) /
  log(training_length)); that is a logit scale, not a position
  (``posenc.logit_scale.logn``).
- The official Leaky ReRoPE slices its RoPE table at w (k - 1), so it needs
  an integer k; posenc takes any k > 1 with w (k - 1) an integer (the query
  positions stay integers) and raises ValueError otherwise.

Shapes: q_positions int [..., Lq], k_positions int [..., Lk] -> float32
[..., Lq, Lk]; NaN where j > i (see ``posenc.remap``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.encodings.rope import remap

__all__ = ["regions", "relative_positions"]


def _check(window, leaky):
    window = checks.integer("window", window, minimum=1)
    if leaky is None:
        return window, None
    if not checks.is_real(leaky) or not math.isfinite(float(leaky)) or not float(leaky) > 1:
        raise ValueError(f"leaky must be a finite number > 1 (None: ReRoPE); got {leaky!r}")
    leaky = float(leaky)
    offset = window * (leaky - 1)
    if abs(offset - round(offset)) > 1e-9 * max(1.0, abs(offset)):
        raise ValueError(
            f"window * (leaky - 1) must be an integer (the query offset of Leaky ReRoPE); "
            f"got window={window}, leaky={leaky!r}: {offset!r}")
    return window, leaky


def relative_positions(q_positions, k_positions, *, window: int, leaky=None) -> jax.Array:
    """ReRoPE relative positions: min(d, window); Leaky ReRoPE: window + (d - window) / leaky beyond it.

    window >= 1; leaky: None (ReRoPE) or a number k > 1 with window (k - 1)
    an integer. NaN above the diagonal (d < 0).
    """
    window, leaky = _check(window, leaky)
    _, _, d = remap.positions(q_positions, k_positions)
    df = d.astype(jnp.float32)
    if leaky is None:
        rel = jnp.minimum(df, jnp.float32(window))
    else:
        rel = jnp.where(d < window, df, jnp.float32(window) + (df - window) / jnp.float32(leaky))
    return jnp.where(d >= 0, rel, jnp.nan)


def regions(q_positions, k_positions, *, window: int, leaky=None) -> list[remap.Region]:
    """[near, far] regions (``posenc.remap.Region``) of ReRoPE / Leaky ReRoPE.

    near: positions (i, j), mask 0 <= d < window. far (mask d >= window):
    ReRoPE (window, 0); Leaky ReRoPE (i + window (k - 1), j) with scale 1 / k.
    """
    window, leaky = _check(window, leaky)
    q, k, d = remap.positions(q_positions, k_positions)
    near = remap.Region(q, k, (d >= 0) & (d < window))
    if leaky is None:
        far = remap.Region(jnp.full_like(q, window), jnp.zeros_like(k), d >= window)
    else:
        far = remap.Region(q + round(window * (leaky - 1)), k, d >= window, 1.0 / leaky)
    return [near, far]
