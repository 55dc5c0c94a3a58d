"""Pallas kernels of the fused attention: forward, dq (+ term arrays), dk/dv (+ key vectors).

Structure of jax.experimental.pallas.ops.gpu.attention (FlashAttention-2):
one program per (batch, head, query block) loops over the key blocks it can
see (forward and dq); one program per (batch, kv head, key block) loops over
the query heads of its group and the query blocks that can see it (dk, dv).
Blocks nobody sees are skipped by the loop bounds. Layouts inside (the
wrapper in ``posenc.kernels.flash`` prepares them; ``[n, b]`` and
``[n * b, 1]`` are the same memory, a reshape):

    q, do, o      [B, H, Lq, Dh]      k, v, dk, dv   [B, K, Lk, Dh]
    scalars       [2] int32 (q_offset, kv_length)
    forward, dq:  per-query values columns [.., Lq, 1] (blocks [bq, 1]),
                  per-key values rows [.., nk, bk] (row j of the whole array)
    dk/dv:        per-query values rows [.., nq, bq], per-key columns [.., Lk, 1]
    term head arrays [H, 1, n]; shared [m, n]

So a tile (``[bq, bk]`` forward and dq, ``[bk, bq]`` in dk/dv) is formed by
broadcasting a column against a row: no transposes, lane-dense vectors.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from posenc.kernels import score_term

NEG = -1e30  # finite mask value: exp(NEG - m) underflows to 0 and NEG - NEG = 0, no nan
_NT = (((1,), (1,)), ((), ()))  # contract the last dims: a @ b.T


@dataclasses.dataclass(frozen=True)
class Config:
    """Static description of one kernel instance (hashable: part of the jit key)."""

    scale: float
    causal: bool
    window: int | None
    chunk: int | None
    softcap: float
    block_q: int
    block_k: int
    groups: int          # query heads per kv head
    batch_pos: bool      # positions have a batch axis (else shared by the batch)
    terms: tuple         # ((fn-bearing Term skeleton, n_head, n_shared, has_q, has_k), ...)
    interpret: Any
    backend: str | None  # "gpu" | "tpu" | None (interpret / default specs)
    sinks: bool = False  # a learned sink logit per head [H, 1, 1] joins the softmax denominator


# ---------------------------------------------------------------- the tile

def _mask(cfg, q_idx, k_idx, kv_len):
    """Key j visible to query i (indices), broadcast column x row (either orientation)."""
    m = k_idx < kv_len
    if cfg.causal:
        m = m & (k_idx <= q_idx)
    if cfg.window is not None:
        m = m & (k_idx > q_idx - cfg.window)
    if cfg.chunk is not None:
        m = m & (lax.div(q_idx, cfg.chunk) == lax.div(k_idx, cfg.chunk))
    return m


def _cap(cfg, raw):
    return cfg.softcap * jnp.tanh(raw / cfg.softcap) if cfg.softcap else raw


def _logits(cfg, q, k, e):
    """Pre-mask logit ``softcap(scale q.k + E)``, float32 [len(q), len(k)]."""
    s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * cfg.scale
    if e is not None:
        s = s + e
    return _cap(cfg, s)


def _d_cap(cfg, s):
    """d softcap / d raw from the capped value: 1 - tanh^2."""
    if not cfg.softcap:
        return None
    t = s / cfg.softcap
    return 1.0 - t * t


def _terms(cfg):
    return tuple(t[0] for t in cfg.terms)


# ---------------------------------------------------------------- loop bounds

def _cdiv(a, b: int):
    return lax.div(a + (b - 1), b)  # a >= 0


def kv_block_range(cfg, first, kv_len, num_k_blocks):
    """Key blocks [lo, hi) that queries ``first .. first + bq - 1`` (indices) can see."""
    last = first + (cfg.block_q - 1)
    hi_key = kv_len
    lo_key = jnp.int32(0)
    if cfg.causal:
        hi_key = jnp.minimum(hi_key, last + 1)
    if cfg.window is not None:
        lo_key = jnp.maximum(lo_key, first - (cfg.window - 1))
    if cfg.chunk is not None:
        c = cfg.chunk
        lo_key = jnp.maximum(lo_key, lax.div(first, c) * c)
        hi_key = jnp.minimum(hi_key, (lax.div(last, c) + 1) * c)
    hi = jnp.minimum(_cdiv(jnp.maximum(hi_key, 0), cfg.block_k), num_k_blocks)
    lo = lax.div(lo_key, cfg.block_k)
    return lo, jnp.maximum(hi, lo)


def q_block_range(cfg, key_first, q_offset, kv_len, num_q_blocks):
    """Query blocks [lo, hi) that can see keys ``key_first .. key_first + bk - 1``."""
    key_last = jnp.minimum(key_first + (cfg.block_k - 1), kv_len - 1)  # last key anyone sees
    lo_q = jnp.int32(0)
    hi_q = jnp.int32(num_q_blocks * cfg.block_q)
    if cfg.causal:
        lo_q = jnp.maximum(lo_q, key_first - q_offset)
    if cfg.window is not None:
        hi_q = jnp.minimum(hi_q, key_last + cfg.window - q_offset)
    if cfg.chunk is not None:
        c = cfg.chunk
        lo_q = jnp.maximum(lo_q, lax.div(key_first, c) * c - q_offset)
        hi_q = jnp.minimum(hi_q, (lax.div(key_last, c) + 1) * c - q_offset)
    hi_q = jnp.where(key_first < kv_len, hi_q, 0)  # a block past kv_length is seen by nobody
    lo = lax.div(lo_q, cfg.block_q)
    hi = _cdiv(jnp.maximum(hi_q, 0), cfg.block_q)
    return lo, jnp.maximum(hi, lo)


# ---------------------------------------------------------------- ref unpacking

def _split_terms(cfg, refs):
    """Flat term refs -> per-term (head refs, shared refs, q_vec ref | None, k_vec ref | None)."""
    out, it = [], iter(refs)
    for _, nh, ns, hq, hk in cfg.terms:
        head = tuple(next(it) for _ in range(nh))
        shared = tuple(next(it) for _ in range(ns))
        qv = next(it) if hq else None
        kv = next(it) if hk else None
        out.append((head, shared, qv, kv))
    return out, list(it)


def _iota(n, axis):
    shape = (n, 1) if axis == 0 else (1, n)
    return lax.broadcasted_iota(jnp.int32, shape, axis)


# ---------------------------------------------------------------- forward

def _fwd_kernel(scal_ref, q_ref, k_ref, v_ref, qpos_ref, kpos_ref, *refs, cfg):
    terms, rest = _split_terms(cfg, refs)
    sink_ref, (o_ref, lse_ref) = (rest[0], rest[1:]) if cfg.sinks else (None, rest)
    bq, bk = cfg.block_q, cfg.block_k
    qi = pl.program_id(2)
    q_offset, kv_len = scal_ref[0], scal_ref[1]
    first = q_offset + qi * bq
    q_idx = first + _iota(bq, 0)
    q = q_ref[...]
    q_pos = qpos_ref[...]
    head = tuple(tuple(r[...] for r in t[0]) for t in terms)
    shared = tuple(tuple(r[...] for r in t[1]) for t in terms)
    q_vec = tuple(None if t[2] is None else t[2][...] for t in terms)
    nk = kpos_ref.shape[0]

    def body(j, carry):
        o, m, l = carry
        start = pl.multiple_of(j * bk, bk)
        k = k_ref[pl.ds(start, bk), :]
        v = v_ref[pl.ds(start, bk), :]
        k_pos = kpos_ref[pl.ds(j, 1), :]
        k_vec = tuple(None if t[3] is None else t[3][pl.ds(j, 1), :] for t in terms)
        e = score_term.total(_terms(cfg), head, shared, q_pos, k_pos, q_vec, k_vec)
        s = _logits(cfg, q, k, e)
        mask = _mask(cfg, q_idx, start + _iota(bk, 1), kv_len)
        s = jnp.where(mask, s, NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
        l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
        o = alpha * o + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return o, m_new, l

    lo, hi = kv_block_range(cfg, first, kv_len, nk)
    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((bq, 1), NEG, jnp.float32),
            jnp.zeros((bq, 1), jnp.float32))
    o, m, l = lax.fori_loop(lo, hi, body, init)
    if sink_ref is not None:
        # posenc.learned_sinks.normalizer: the sink joins the denominator only, exp(s - m') with
        # m' = max(m, s); o follows the shift of m. The lse includes the sink, so the backward
        # kernels' p = exp(s - lse) are the sink softmax's weights as they are.
        sink = sink_ref[...].reshape(1, 1)
        m_new = jnp.maximum(m, sink)
        alpha = jnp.exp(m - m_new)
        l = l * alpha + jnp.exp(sink - m_new)
        o, m = o * alpha, m_new
    # A query with no visible key gets output 0; its lse is never used (all p = 0).
    l_safe = jnp.where(l > 0, l, 1.0)
    o_ref[...] = (o / l_safe).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l_safe)


# ---------------------------------------------------------------- dq and term arrays

def _dq_kernel(scal_ref, q_ref, k_ref, v_ref, qpos_ref, kpos_ref, *refs, cfg):
    terms, rest = _split_terms(cfg, refs)
    do_ref, lse_ref, delta_ref, dq_ref = rest[:4]
    grad_refs = rest[4:]
    bq, bk = cfg.block_q, cfg.block_k
    qi = pl.program_id(2)
    q_offset, kv_len = scal_ref[0], scal_ref[1]
    first = q_offset + qi * bq
    q_idx = first + _iota(bq, 0)
    q = q_ref[...]
    do = do_ref[...]
    lse = lse_ref[...]
    delta = delta_ref[...]
    q_pos = qpos_ref[...]
    head = tuple(tuple(r[...] for r in t[0]) for t in terms)
    shared = tuple(tuple(r[...] for r in t[1]) for t in terms)
    q_vec = tuple(None if t[2] is None else t[2][...] for t in terms)
    nk = kpos_ref.shape[0]
    fns = _terms(cfg)

    def body(j, carry):
        dq, g = carry
        start = pl.multiple_of(j * bk, bk)
        k = k_ref[pl.ds(start, bk), :]
        v = v_ref[pl.ds(start, bk), :]
        k_pos = kpos_ref[pl.ds(j, 1), :]
        k_vec = tuple(None if t[3] is None else t[3][pl.ds(j, 1), :] for t in terms)
        if fns:
            e, vjp = jax.vjp(lambda h, s, qv: score_term.total(fns, h, s, q_pos, k_pos, qv, k_vec),
                             head, shared, q_vec)
        else:
            e, vjp = None, None
        s = _logits(cfg, q, k, e)
        mask = _mask(cfg, q_idx, start + _iota(bk, 1), kv_len)
        p = jnp.where(mask, jnp.exp(jnp.where(mask, s, NEG) - lse), 0.0)
        dp = lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
        ds = p * (dp - delta)
        dcap = _d_cap(cfg, s)
        if dcap is not None:
            ds = ds * dcap
        dq = dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)
        if vjp is not None:
            g = jax.tree.map(jnp.add, g, vjp(ds))
        return dq, g

    zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)
    init = (jnp.zeros(q.shape, jnp.float32), zeros((head, shared, q_vec)))
    lo, hi = kv_block_range(cfg, first, kv_len, nk)
    dq, (dh, dsh, dqv) = lax.fori_loop(lo, hi, body, init)
    dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)
    it = iter(grad_refs)
    for t, gh, gs, gq in zip(terms, dh, dsh, dqv):
        for x in gh:
            next(it)[...] = x
        for x in gs:
            next(it)[...] = x
        if t[2] is not None:
            next(it)[...] = gq


# ---------------------------------------------------------------- dk, dv and key vectors

def _dkv_kernel(scal_ref, q_ref, k_ref, v_ref, qpos_ref, kpos_ref, *refs, cfg):
    """Transposed tiles [bk, bq] (as the Triton tutorial's dk/dv kernel): per-query values are
    rows and per-key values columns, so dv = p^T do and dk = ds^T q need no transposes."""
    terms, rest = _split_terms(cfg, refs)
    do_ref, lse_ref, delta_ref, dk_ref, dv_ref = rest[:5]
    dkvec_refs = rest[5:]
    bq, bk = cfg.block_q, cfg.block_k
    kj = pl.program_id(2)
    q_offset, kv_len = scal_ref[0], scal_ref[1]
    key_first = kj * bk
    k_idx = key_first + _iota(bk, 0)  # [bk, 1]
    k = k_ref[...]
    v = v_ref[...]
    k_pos = kpos_ref[...]  # [bk, 1]
    shared = tuple(tuple(r[...] for r in t[1]) for t in terms)
    nq = qpos_ref.shape[0]
    fns = _terms(cfg)
    has_kvec = any(t[3] is not None for t in terms)
    lo, hi = q_block_range(cfg, key_first, q_offset, kv_len, nq)

    def head_body(i, carry):
        dk, dv = carry
        head = tuple(tuple(r[i] for r in t[0]) for t in terms)
        k_vec = tuple(None if t[3] is None else t[3][i] for t in terms)  # [bk, 1]

        def q_body(qb, carry):
            dk, dv, gk = carry
            start = pl.multiple_of(qb * bq, bq)
            rows = pl.ds(start, bq)
            q = q_ref[i, rows, :]
            do = do_ref[i, rows, :]
            lse = lse_ref[i, pl.ds(qb, 1), :]  # [1, bq]
            delta = delta_ref[i, pl.ds(qb, 1), :]
            q_pos = qpos_ref[pl.ds(qb, 1), :]
            q_vec = tuple(None if t[2] is None else t[2][i, pl.ds(qb, 1), :] for t in terms)
            if not fns:
                e, vjp = None, None
            elif has_kvec:
                e, vjp = jax.vjp(
                    lambda kv: score_term.total(fns, head, shared, q_pos, k_pos, q_vec, kv), k_vec)
            else:
                e, vjp = score_term.total(fns, head, shared, q_pos, k_pos, q_vec, k_vec), None
            s = _logits(cfg, k, q, e)  # [bk, bq]: terms are elementwise, so E arrives transposed
            mask = _mask(cfg, q_offset + start + _iota(bq, 1), k_idx, kv_len)
            p = jnp.where(mask, jnp.exp(jnp.where(mask, s, NEG) - lse), 0.0)
            dv = dv + jnp.dot(p.astype(do.dtype), do, preferred_element_type=jnp.float32)
            dp = lax.dot_general(v, do, _NT, preferred_element_type=jnp.float32)
            ds = p * (dp - delta)
            dcap = _d_cap(cfg, s)
            if dcap is not None:
                ds = ds * dcap
            dk = dk + jnp.dot(ds.astype(q.dtype), q, preferred_element_type=jnp.float32)
            if vjp is not None:
                (g,) = vjp(ds)
                gk = jax.tree.map(jnp.add, gk, g)
            return dk, dv, gk

        gk0 = jax.tree.map(jnp.zeros_like, k_vec)
        dk, dv, gk = lax.fori_loop(lo, hi, q_body, (dk, dv, gk0))
        it = iter(dkvec_refs)
        for t, g in zip(terms, gk):
            if t[3] is not None:
                next(it)[i] = g
        return dk, dv

    init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    dk, dv = lax.fori_loop(0, cfg.groups, head_body, init)
    dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
