"""CoPE: contextual position encoding.

Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count
What's Important". Positions count gated keys instead of tokens::

    g_ij = sigmoid(q_i . k_j / sqrt(dh))
    p_ij = min(sum_{t=j..i} g_it, npos - 1)
    logit_ij += q_i . e[p_ij]    (interpolated between e[floor p] and e[ceil p])

Queries are aligned to the end of the keys: query i (of Lq) sits at key
index i + Lk - Lq, so Lq = Lk is self-attention and Lq < Lk is decoding with
a cache of earlier keys; both give the same values for the same token.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def _causal_mask(lq: int, lk: int) -> jax.Array:
    """[Lq, Lk] bool: key t is visible to query i iff t <= i + (Lk - Lq)."""
    return jnp.arange(lk)[None, :] <= jnp.arange(lq)[:, None] + (lk - lq)


def positions(gate_logits, *, npos: int, causal: bool = True) -> jax.Array:
    """Contextual positions ``p_ij = sum_{t=j..i} sigmoid(g_it)``, clamped to ``npos - 1``.

    A reverse cumulative sum of the gates along the key axis. With
    ``causal=True`` gates of keys after the query are zeroed first (so they
    do not count, and p_ij = 0 for j > i); with ``causal=False`` the sum runs
    to the last key.

    Shapes: gate_logits [..., H, Lq, Lk] -> float32 [..., H, Lq, Lk].
    """
    if isinstance(npos, bool) or not isinstance(npos, (int, np.integer)) or npos < 1:
        raise ValueError(f"npos must be a positive integer, got {npos!r}")
    g = jnp.asarray(gate_logits)
    if g.ndim < 2:
        raise ValueError(f"gate_logits must have shape [..., Lq, Lk], got {g.shape}")
    gates = jax.nn.sigmoid(g.astype(jnp.float32))
    if causal:
        gates = jnp.where(_causal_mask(*g.shape[-2:]), gates, 0.0)
    pos = jax.lax.cumsum(gates, axis=gates.ndim - 1, reverse=True)
    return jnp.minimum(pos, float(npos - 1))


def logits(q, k, embeddings, *, causal: bool = True) -> jax.Array:
    """CoPE term ``q_i . e[p_ij]`` to add to the content logits.

    Gates use ``q . k / sqrt(dh)``; ``npos`` is ``len(embeddings)``.
    ``q @ E^T`` [..., npos] is computed once per query, then the values at
    floor(p) and ceil(p) are gathered and mixed with weight ``p - floor(p)``
    (the gradient reaches the gates through that weight), as in the paper's
    code. That code adds this term to ``q . k`` and then divides the sum by
    sqrt(dh); divide this term the same way to reproduce it.

    Shapes: q [..., Lq, H, Dh], k [..., Lk, H, Dh], embeddings [npos, Dh]
    -> float32 [..., H, Lq, Lk].
    """
    q, k, e = jnp.asarray(q), jnp.asarray(k), jnp.asarray(embeddings)
    if q.ndim < 3 or k.ndim < 3 or q.shape[-2:] != k.shape[-2:]:
        raise ValueError(f"q and k must have shape [..., L, H, Dh] with equal H, Dh; got {q.shape}, {k.shape}")
    if e.ndim != 2 or e.shape[-1] != q.shape[-1]:
        raise ValueError(f"embeddings must have shape [npos, Dh] with Dh = {q.shape[-1]}, got {e.shape}")
    q, k, e = q.astype(jnp.float32), k.astype(jnp.float32), e.astype(jnp.float32)
    gate_logits = jnp.einsum("...qhd,...khd->...hqk", q, k) / math.sqrt(q.shape[-1])
    pos = positions(gate_logits, npos=e.shape[0], causal=causal)  # [..., H, Lq, Lk]
    per_pos = jnp.einsum("...qhd,nd->...hqn", q, e)  # [..., H, Lq, npos]
    lo = jnp.floor(pos)
    w = pos - lo
    lo = lo.astype(jnp.int32)
    hi = jnp.ceil(pos).astype(jnp.int32)
    at_lo = jnp.take_along_axis(per_pos, lo, axis=-1)
    at_hi = jnp.take_along_axis(per_pos, hi, axis=-1)
    return at_hi * w + at_lo * (1.0 - w)
