"""Stick-breaking attention: each key takes a sigmoid share of what the closer keys left.

Tan et al. 2025, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-depth Study" (ICLR 2025). Official code:
shawntan/stickbreaking-attention (commit 3147a38), reference
``stickbreaking_attention/sb_ref.py`` (``stickbreaking``) and
``tests/test_attn.py`` (``ref_fwd``)::

    beta_ij = sigmoid(z_ij),   z_ij = scale * q_i . k_j
    A_ij    = beta_ij * prod_{j<k<i'} (1 - beta_ik)
    log A_ij = logsigmoid(z_ij) + sum_{j<k<i'} logsigmoid(-z_ik)
    o_i     = sum_j A_ij v_j + (1 - sum_j A_ij) v_i

``attend_current=False`` (the official default) masks the diagonal: keys
``j < i`` and ``i' = i``; ``attend_current=True`` includes it: ``j <= i``
and ``i' = i + 1``. Weights are computed in log space, with no
renormalisation (they sum to at most 1) and no positional encoding: the
remaining mass goes to the query's own value, as in ``ref_fwd``.

Queries sit at key indices ``q_offset + i`` (default ``Lk - Lq``: the last
``Lq`` keys, as in decoding with a cache; ``q_offset`` may be traced, with a
fixed-size cache whose keys past the queries are masked). :func:`blocked_attention`
walks key blocks from the diagonal backwards and carries the running
``sum log(1 - beta)``, so memory is O(block^2) per query block.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks

_F32 = jnp.float32


def _visible(q_index, k_index, attend_current):
    """[Lq, Lk] bool: key j is weighted by query i (j < i, or j <= i)."""
    if attend_current:
        return k_index[None, :] <= q_index[:, None]
    return k_index[None, :] < q_index[:, None]


def _shifted_reverse_cumsum(x):
    """``sum_{m > j} x_m`` along the last axis (the inclusive reverse sum shifted by one: no cancellation)."""
    s = jax.lax.cumsum(x, axis=x.ndim - 1, reverse=True)
    return jnp.concatenate([s[..., 1:], jnp.zeros_like(s[..., :1])], axis=-1)


def _log_weights(z, visible):
    """float32 ``log A`` for logits z [..., Lq, Lk]; -inf where not visible."""
    log_rest = jnp.where(visible, jax.nn.log_sigmoid(-z), 0.0)
    log_a = jax.nn.log_sigmoid(z) + _shifted_reverse_cumsum(log_rest)
    return jnp.where(visible, log_a, -jnp.inf), log_rest


def _concrete_scalar(x):
    """A Python number for a concrete scalar (NumPy / JAX arrays included); None when traced."""
    if isinstance(x, jax.core.Tracer):
        return None
    if isinstance(x, (np.ndarray, np.generic, jax.Array)) and np.ndim(x) == 0:
        x = np.asarray(x)
        return x.item() if x.dtype != bool else x
    return x


def _offset(q_offset, lq, lk):
    """Index of the first query among the keys: checked when concrete, passed through when traced."""
    if q_offset is None:
        if lq > lk:
            raise ValueError(f"more queries than keys ({lq} > {lk}) needs an explicit q_offset")
        return lk - lq
    value = _concrete_scalar(q_offset)
    if value is None:
        return q_offset
    return checks.integer("q_offset", value, minimum=0, maximum=lk - lq)


def _scale(scale):
    value = _concrete_scalar(scale)
    if value is None:
        return scale
    return checks.number("scale", value, positive=True)


def log_weights(logits, *, attend_current: bool = False, q_offset=None) -> jax.Array:
    """``log A_ij`` (float32), -inf wherever a key is masked.

    Shapes: logits [..., Lq, Lk] (pre-activation z) -> float32 [..., Lq, Lk].
    """
    checks.boolean("attend_current", attend_current)
    z = jnp.asarray(logits)
    if z.ndim < 2:
        raise ValueError(f"logits must have shape [..., Lq, Lk]; got {z.shape}")
    lq, lk = z.shape[-2:]
    q_index = _offset(q_offset, lq, lk) + jnp.arange(lq)
    visible = _visible(q_index, jnp.arange(lk), attend_current)
    return _log_weights(z.astype(_F32), visible)[0]


def weights(logits, *, attend_current: bool = False, q_offset=None) -> jax.Array:
    """Stick-breaking weights ``A_ij = sigmoid(z_ij) prod_{j<k<i'} (1 - sigmoid(z_ik))``.

    ``logits`` is the pre-activation ``z`` (scale included) of causal
    attention: query i is key ``q_offset + i`` (default ``Lk - Lq``; square
    logits: query i is key i). Zeros wherever a key is masked (after the
    query, and the diagonal unless ``attend_current``). Rows sum to at most
    1; the rest, ``1 - sum_j A_ij``, belongs to the query's own value.

    Shapes: logits [..., Lq, Lk] -> [..., Lq, Lk] in logits.dtype.
    """
    z = jnp.asarray(logits)
    return jnp.exp(log_weights(z, attend_current=attend_current, q_offset=q_offset)).astype(z.dtype)


def _check_qkv(q, k, v):
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if q.ndim < 3 or k.shape != v.shape or k.ndim != q.ndim or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q, k, v must have shapes [..., Lq, H, Dh], [..., Lk, Hkv, Dh], "
                         f"[..., Lk, Hkv, Dh]; got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-2] % k.shape[-2]:
        raise ValueError(f"query heads ({q.shape[-2]}) must be a multiple of key heads ({k.shape[-2]})")
    groups = q.shape[-2] // k.shape[-2]
    if groups > 1:  # grouped-query attention: kv head h serves query heads h*G .. h*G+G-1
        k, v = jnp.repeat(k, groups, axis=-2), jnp.repeat(v, groups, axis=-2)
    return q, k, v


def _own_values(v, q_offset, lq):
    """v at the queries' own key indices: [..., Lq, H, Dh] float32."""
    return jax.lax.dynamic_slice_in_dim(v, q_offset, lq, axis=v.ndim - 3).astype(_F32)


def attention(q, k, v, *, scale, attend_current: bool = False, q_offset=None) -> jax.Array:
    """Dense stick-breaking attention ``o_i = sum_j A_ij v_j + (1 - sum_j A_ij) v_i``.

    ``z = scale * q . k`` in float32; ``A`` from :func:`weights`; the
    remaining mass goes to the value at the query's own key index (as
    ``ref_fwd``'s ``o + rem[..., None] * v``). Grouped-query keys / values
    (fewer heads) are repeated.

    Shapes: q [..., Lq, H, Dh], k, v [..., Lk, Hkv, Dh] -> like q.
    """
    checks.boolean("attend_current", attend_current)
    scale = _scale(scale)
    q, k, v = _check_qkv(q, k, v)
    lq, lk = q.shape[-3], k.shape[-3]
    off = _offset(q_offset, lq, lk)
    z = jnp.einsum("...qhd,...khd->...hqk", q, k, preferred_element_type=_F32) * scale
    visible = _visible(off + jnp.arange(lq), jnp.arange(lk), attend_current)
    a = jnp.exp(_log_weights(z, visible)[0])
    out = jnp.einsum("...hqk,...khd->...qhd", a, v.astype(_F32))
    rest = 1.0 - jnp.swapaxes(jnp.sum(a, axis=-1), -1, -2)  # [..., Lq, H]
    return (out + rest[..., None] * _own_values(v, off, lq)).astype(q.dtype)


def _pad(x, axis, multiple):
    n = x.shape[axis]
    extra = -n % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def blocked_attention(q, k, v, *, scale, attend_current: bool = False, q_offset=None,
                      block: int = 64) -> jax.Array:
    """:func:`attention` in (query block, key block) tiles, key blocks from the diagonal backwards.

    Per query block the key blocks are visited from the one holding the
    diagonal towards key 0 (a reverse ``lax.scan``; blocks entirely after
    the queries are skipped with ``lax.cond``), carrying the output
    accumulator, the weight mass and ``sum_{k > block} log(1 - beta_ik)``,
    the log of the stick the closer keys left. A tile's weights are
    ``exp(logsigmoid(z) + in-tile suffix sum + carried sum)``. Memory is
    O(B H block^2) per query block; the tile step is rematerialised
    (``jax.checkpoint``) so the gradient keeps only the carries. Query blocks
    run one after another (``lax.map``).

    Shapes: q [..., Lq, H, Dh], k, v [..., Lk, Hkv, Dh] -> like q.
    """
    checks.boolean("attend_current", attend_current)
    block = checks.integer("block", block, minimum=1)
    scale = _scale(scale)
    q, k, v = _check_qkv(q, k, v)
    lead, (lq, h, dh), lk = q.shape[:-3], q.shape[-3:], k.shape[-3]
    off = _offset(q_offset, lq, lk)
    own = _own_values(v, off, lq)
    b = math.prod(lead)
    bq, bk = min(block, lq), min(block, lk)
    qf = _pad(q.reshape((b, lq, h, dh)), 1, bq)
    kf = _pad(k.reshape((b, lk, h, dh)), 1, bk)
    vf = _pad(v.reshape((b, lk, h, dh)), 1, bk)
    nq, nk = qf.shape[1] // bq, kf.shape[1] // bk
    q_blocks = jnp.moveaxis(qf.reshape((b, nq, bq, h, dh)), 1, 0)
    k_blocks = jnp.moveaxis(kf.reshape((b, nk, bk, h, dh)), 1, 0)
    v_blocks = jnp.moveaxis(vf.reshape((b, nk, bk, h, dh)), 1, 0)
    last_seen = 0 if attend_current else 1  # the last key index a query weights is i - last_seen

    def query_block(args):
        qi, qb = args
        q_index = off + qi * bq + jnp.arange(bq)

        @jax.checkpoint
        def tile(carry, kj, kb, vb):
            acc, mass, log_rest_sum = carry
            k_index = kj * bk + jnp.arange(bk)
            visible = _visible(q_index, k_index, attend_current) & (k_index < lk)[None, :]
            z = jnp.einsum("bqhd,bkhd->bhqk", qb, kb, preferred_element_type=_F32) * scale
            log_a, log_rest = _log_weights(z, visible)
            a = jnp.exp(log_a + log_rest_sum[..., None])
            acc = acc + jnp.einsum("bhqk,bkhd->bqhd", a, vb.astype(_F32))
            return acc, mass + jnp.sum(a, axis=-1), log_rest_sum + jnp.sum(log_rest, axis=-1)

        def step(carry, xs):
            kj, kb, vb = xs
            after = kj * bk > q_index[-1] - last_seen  # every key of the tile is after every query
            carry = jax.lax.cond(after, lambda c: c, lambda c: tile(c, kj, kb, vb), carry)
            return carry, None

        init = (jnp.zeros((b, bq, h, dh), _F32), jnp.zeros((b, h, bq), _F32),
                jnp.zeros((b, h, bq), _F32))
        (acc, mass, _), _ = jax.lax.scan(step, init, (jnp.arange(nk), k_blocks, v_blocks),
                                         reverse=True)
        return acc, mass

    acc, mass = jax.lax.map(query_block, (jnp.arange(nq), q_blocks))
    acc = jnp.moveaxis(acc, 0, 1).reshape((b, nq * bq, h, dh))[:, :lq]
    mass = jnp.moveaxis(mass, 0, 2).reshape((b, h, nq * bq))[..., :lq]
    rest = 1.0 - jnp.swapaxes(mass, -1, -2)  # [b, Lq, H]
    out = acc.reshape(lead + (lq, h, dh)) + rest.reshape(lead + (lq, h))[..., None] * own
    return out.astype(q.dtype)

