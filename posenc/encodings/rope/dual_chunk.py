"""Dual Chunk Attention (DCA; An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models").

Training-free context extension of a RoPE model (ICML 2024; official code
HKUNLP/ChunkLlama, ``chunkllama_attn_replace.py``). With chunk size s and
local window w, the sequence is cut into chunks of c = s - w positions.
Keys are rotated at j mod c. A query at i and a key at j <= i, chunk
indices ci = i // c and cj = j // c:

    intra-chunk       (cj == ci):     (i mod c) - (j mod c)          = i - j
    successive-chunk  (cj == ci - 1): min(i mod c + c, s) - (j mod c)
    inter-chunk       (cj <= ci - 2): min(2c - 1, s) - (j mod c)

The query is rotated at i mod c (intra), at min(i mod c + c, s) (the
official ``qc_t`` table; successive: the true distance for the first w
queries of a chunk) and at the constant min(2c - 1, s) (inter: ``qc_t`` at
c - 1). The official code attends to the three key sets separately and
merges them by their softmax normalizers; :func:`regions` gives the three.
Every distance is at most s: the model sees only distances it was trained
on when s is within its training length (the official default: s = 3/4 of it,
w = 1/8 of it).

Differences from the official code, and why:

- Chunks are read off the positions (i // c), not off the row / cache-slot
  index, and the inter-chunk query position is the constant c - 1 (the
  official code takes the position of row c - 1 mod c); both agree for
  positions 0, 1, 2, ..., which the official code assumes.
- Beyond its pre-training length the official RoPE tables carry the YaRN-like
  magnitude 0.05 ln(L / L_train) + 1 on both q and k; that is a logit scale,
  not a position, and is not part of this module.

Shapes: q_positions int [..., Lq], k_positions int [..., Lk] -> float32
[..., Lq, Lk]; NaN where j > i (see ``posenc.remap``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.encodings.rope import remap

__all__ = ["chunk_length", "regions", "relative_positions"]


def chunk_length(*, chunk: int, local_window: int) -> int:
    """c = chunk - local_window (the official ``chunk_len``); ValueError unless chunk > local_window >= 0."""
    chunk = checks.integer("chunk", chunk, minimum=1)
    local_window = checks.integer("local_window", local_window, minimum=0)
    if local_window >= chunk:
        raise ValueError(f"local_window must be < chunk; got local_window={local_window}, chunk={chunk}")
    return chunk - local_window


def _parts(q_positions, k_positions, chunk, local_window):
    c = chunk_length(chunk=chunk, local_window=local_window)
    q, k, d = remap.positions(q_positions, k_positions)
    qi, kj = q % c, k % c
    step = (q // c)[..., :, None] - (k // c)[..., None, :]  # chunks between query and key
    q_succ = jnp.minimum(qi + c, chunk)
    q_inter = min(2 * c - 1, chunk)
    return d, step, qi, kj, q_succ, q_inter


def relative_positions(q_positions, k_positions, *, chunk: int, local_window: int) -> jax.Array:
    """DCA relative positions (intra-, successive- and inter-chunk); NaN above the diagonal.

    chunk: the chunk size s (official ``chunk_size``); local_window: w < s
    (chunks hold c = s - w positions). All distances are <= s.
    """
    d, step, qi, kj, q_succ, q_inter = _parts(q_positions, k_positions, chunk, local_window)
    intra = qi[..., :, None] - kj[..., None, :]
    succ = q_succ[..., :, None] - kj[..., None, :]
    inter = q_inter - kj[..., None, :]
    rel = jnp.where(step == 0, intra, jnp.where(step == 1, succ, inter)).astype(jnp.float32)
    return jnp.where(d >= 0, rel, jnp.nan)


def regions(q_positions, k_positions, *, chunk: int, local_window: int) -> list[remap.Region]:
    """[intra, successive, inter] regions (``posenc.remap.Region``) of DCA.

    Keys at j mod c in all three; queries at i mod c (same chunk, j <= i),
    min(i mod c + c, s) (previous chunk) and min(2c - 1, s) (older chunks).
    """
    d, step, qi, kj, q_succ, q_inter = _parts(q_positions, k_positions, chunk, local_window)
    return [
        remap.Region(qi, kj, (step == 0) & (d >= 0)),
        remap.Region(q_succ, kj, step == 1),
        remap.Region(jnp.full_like(qi, q_inter), kj, step >= 2),
    ]
