"""STRING: shifted rotary position embeddings (An et al. 2025,
"Why Does the Effective Context Length of LLMs Fall Short?").

Training-free (ICLR 2025; official code HKUNLP/STRING,
``string_for_llama.py``). Large relative distances are rarely trained, so
STRING drops them: with shift S and local window W, for d = i - j >= 0

    d < S :  d                  (sliding-window attention on the diagonal)
    d >= S:  d - S + W          (shifted: the well-trained distances from W on)

so the largest distances, L - S .. L - 1, are never used, and a key just
beyond the diagonal band sees the distance W again. The official code
rotates the queries twice (at i, and at i - S + W; keys at j), attends with
a sliding window and a shifted triangle and merges the two by their softmax
normalizers; :func:`regions` gives the two.

Differences from the official code, and why:

- In its prefill (``string_flash_forward``) the sliding window is flash
  attention's ``window_size=[S, 0]``, which holds d <= S, and the triangle
  holds d >= S, so the key at exactly d = S is attended twice (at S and at
  W). Its decoding path attends to the last S keys (d < S) on the diagonal
  and the rest (d >= S) shifted: a partition. posenc follows the decoding
  path (a partition, so cached decoding equals the full forward pass); the
  two agree on every other pair.
- The official RoPE tables carry the magnitude 0.1 ln 2 + 1 on both q and k
  (a logit scale, as YaRN's), which is not part of this module.

Shapes: q_positions int [..., Lq], k_positions int [..., Lk] -> float32
[..., Lq, Lk]; NaN where j > i (see ``posenc.remap``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.encodings.rope import remap

__all__ = ["regions", "relative_positions"]


def _check(shift, local_window):
    shift = checks.integer("shift", shift, minimum=1)
    local_window = checks.integer("local_window", local_window, minimum=0, maximum=shift)
    return shift, local_window


def relative_positions(q_positions, k_positions, *, shift: int, local_window: int) -> jax.Array:
    """STRING relative positions: d below ``shift``, d - shift + local_window from it on; NaN above the diagonal.

    shift S >= 1 (official ``shifted_offset``, suggested 0.25-0.4 of the
    training length); local_window W in [0, S] (official ``local_value``,
    suggested 128-512; W = S is plain RoPE).
    """
    shift, local_window = _check(shift, local_window)
    _, _, d = remap.positions(q_positions, k_positions)
    rel = jnp.where(d < shift, d, d - shift + local_window).astype(jnp.float32)
    return jnp.where(d >= 0, rel, jnp.nan)


def regions(q_positions, k_positions, *, shift: int, local_window: int) -> list[remap.Region]:
    """[diagonal, shifted] regions (``posenc.remap.Region``) of STRING.

    diagonal: positions (i, j), mask 0 <= d < S; shifted: positions
    (i - S + W, j), mask d >= S.
    """
    shift, local_window = _check(shift, local_window)
    q, k, d = remap.positions(q_positions, k_positions)
    return [remap.Region(q, k, (d >= 0) & (d < shift)),
            remap.Region(q - (shift - local_window), k, d >= shift)]
