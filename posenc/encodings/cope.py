"""CoPE: contextual position encoding.

Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count
What's Important". Positions count gated keys instead of tokens::

    g_ij = sigmoid(q_i . k_j / sqrt(dh))
    p_ij = min(sum_{t=j..i} g_it, npos - 1)
    logit_ij += q_i . e[p_ij]    (interpolated between e[floor p] and e[ceil p])

Queries are aligned to the end of the keys: query i (of Lq) sits at key
index i + Lk - Lq, so Lq = Lk is self-attention and Lq < Lk is decoding with
a cache of earlier keys; both give the same values for the same token.

Speed (CPU training is the common case here): the reverse cumulative sum is
blocked (a small triangular matmul inside blocks of keys, a short cumsum
across blocks), the interpolation reads ``q @ E^T`` through flat gathers,
and ``logits`` has a hand-written derivative (``jax.custom_jvp``, so forward
and reverse mode both work) that reuses the forward's gates, slopes and
indices instead of differentiating through floor/ceil and index tuples.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from posenc import checks

_BLOCK = 16  # keys per block of the cumulative sum; 8-32 all beat lax.cumsum on CPU
_MAX_FLAT = 2**31  # tables this large take the take_along_axis path (int32 flat indices)


def _causal_mask(lq: int, lk: int) -> jax.Array:
    """[Lq, Lk] bool: key t is visible to query i iff t <= i + (Lk - Lq)."""
    return jnp.arange(lk)[None, :] <= jnp.arange(lq)[:, None] + (lk - lq)


def _reverse_cumsum(x: jax.Array) -> jax.Array:
    """``sum_{t >= j} x_t`` along the last axis.

    On CPU ``lax.cumsum`` lowers to a log-depth reduce-window scan that
    makes several passes over [.., Lk]; here one pass sums inside blocks of
    ``_BLOCK`` keys with a triangular matmul (full float32 precision, also
    on TPU/GPU) and a cumsum over the Lk / _BLOCK block totals adds the
    blocks to the right.
    """
    n = x.shape[-1]
    if n % _BLOCK or n < 2 * _BLOCK:
        return jax.lax.cumsum(x, axis=x.ndim - 1, reverse=True)
    blocks = x.reshape(x.shape[:-1] + (n // _BLOCK, _BLOCK))
    upper = jnp.tril(jnp.ones((_BLOCK, _BLOCK), x.dtype))  # [t, j] = 1 iff t >= j
    within = jnp.matmul(blocks, upper, precision=jax.lax.Precision.HIGHEST)
    totals = within[..., 0]
    after = jax.lax.cumsum(totals, axis=totals.ndim - 1, reverse=True) - totals
    return (within + after[..., None]).reshape(x.shape)


def _gates(gate_logits: jax.Array, causal: bool) -> jax.Array:
    gates = jax.nn.sigmoid(gate_logits.astype(jnp.float32))
    if causal:
        gates = jnp.where(_causal_mask(*gate_logits.shape[-2:]), gates, 0.0)
    return gates


def positions(gate_logits, *, npos: int, causal: bool = True) -> jax.Array:
    """Contextual positions ``p_ij = sum_{t=j..i} sigmoid(g_it)``, clamped to ``npos - 1``.

    A reverse cumulative sum of the gates along the key axis. With
    ``causal=True`` gates of keys after the query are zeroed first (so they
    do not count, and p_ij = 0 for j > i); with ``causal=False`` the sum runs
    to the last key.

    Shapes: gate_logits [..., H, Lq, Lk] -> float32 [..., H, Lq, Lk].
    """
    checks.integer("npos", npos, minimum=1)
    g = jnp.asarray(gate_logits)
    if g.ndim < 2:
        raise ValueError(f"gate_logits must have shape [..., Lq, Lk], got {g.shape}")
    return jnp.minimum(_reverse_cumsum(_gates(g, causal)), float(npos - 1))


def _take(table: jax.Array, idx: jax.Array) -> jax.Array:
    """``table[..., r, idx[..., r, j]]`` for table [..., R, n], idx int [..., R, m].

    A gather with one flat index per element: ``take_along_axis`` builds a
    full index tuple per element, several times slower to gather and, above
    all, to scatter-add in the backward pass on CPU. Indices are clipped, so
    NaN positions (a diverged run) never read out of bounds.
    """
    n = table.shape[-1]
    if table.size >= _MAX_FLAT:
        return jnp.take_along_axis(table, jnp.clip(idx, 0, n - 1), axis=-1)
    rows = math.prod(idx.shape[:-1])
    flat = jnp.clip(idx, 0, n - 1) + (jnp.arange(rows, dtype=jnp.int32) * n).reshape(idx.shape[:-1] + (1,))
    return table.reshape(-1).at[flat].get(mode="promise_in_bounds")


def _forward(q, k, e, causal):
    """CoPE term for q [B, Lq, H, Dh], k [B, Lk, H, Dh] and what its derivative reuses."""
    npos = e.shape[0]
    gates = _gates(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1]), causal)
    pos = jnp.minimum(_reverse_cumsum(gates), float(npos - 1))
    per_pos = jnp.einsum("bqhd,nd->bhqn", q, e)  # [B, H, Lq, npos]
    lo = jnp.floor(pos)
    w = pos - lo
    i_lo, i_hi = lo.astype(jnp.int32), jnp.ceil(pos).astype(jnp.int32)
    at_lo, at_hi = _take(per_pos, i_lo), _take(per_pos, i_hi)
    out = at_hi * w + at_lo * (1.0 - w)
    # d out / d pos = at_hi - at_lo: zero where pos is an integer (floor = ceil)
    # and where it is clamped to npos - 1, as for the formula differentiated by JAX.
    return out, (gates, w, at_hi - at_lo, i_lo, i_hi)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _cope(q, k, e, causal):
    return _forward(q, k, e, causal)[0]


@_cope.defjvp
def _cope_jvp(causal, primals, tangents):
    # The derivative of the formula with the floor/ceil indices held fixed.
    # Linear in the tangents, so JAX transposes it for reverse mode: the
    # cumsum becomes a forward cumsum, the gathers scatter-adds into [.., npos].
    q, k, e = primals
    dq, dk, de = tangents
    out, (gates, w, slope, i_lo, i_hi) = _forward(q, k, e, causal)
    d_logits = jnp.einsum("bqhd,bkhd->bhqk", dq, k) + jnp.einsum("bqhd,bkhd->bhqk", q, dk)
    d_logits = d_logits / math.sqrt(q.shape[-1])
    d_pos = _reverse_cumsum(gates * (1.0 - gates) * d_logits)  # masked gates are 0: no term
    d_per_pos = jnp.einsum("bqhd,nd->bhqn", dq, e) + jnp.einsum("bqhd,nd->bhqn", q, de)
    d_out = _take(d_per_pos, i_hi) * w + _take(d_per_pos, i_lo) * (1.0 - w) + slope * d_pos
    return out, d_out


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
    batch = jnp.broadcast_shapes(q.shape[:-3], k.shape[:-3])
    (lq, h, dh), lk = q.shape[-3:], k.shape[-3]
    q = jnp.broadcast_to(q.astype(jnp.float32), batch + q.shape[-3:]).reshape((-1, lq, h, dh))
    k = jnp.broadcast_to(k.astype(jnp.float32), batch + k.shape[-3:]).reshape((-1, lk, h, dh))
    out = _cope(q, k, e.astype(jnp.float32), bool(causal))
    return out.reshape(batch + (h, lq, lk))
