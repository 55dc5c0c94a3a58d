"""Causal multi-head attention, dense and blocked (online softmax).

Logits are ``s_ij = softcap(scale * q_i . k_j + E_ij)`` where ``E`` is what
the position encoding adds (``encoding.bias`` from positions,
``encoding.feature_bias`` from per-token features such as FoX's forget gates,
and ``encoding.content_logits`` from q, k and positions). The whole pre-mask
logit is soft-capped (Gemma 2 caps before the mask; we add the position
terms before the cap too, so that no term can escape it), then the mask is
applied and ``softmax`` taken. The output is ``w @ v`` plus
``encoding.values(w, ...)`` (Shaw's relative values). With ``call.sinks`` (gpt-oss's
learned sinks, ``posenc.learned_sinks``) each head's sink logit joins every
row's denominator: the dense path's softmax, the blocked path's running sum
after the last key block (``learned_sinks.output_scale``) and the fused kernel.

Masking is by index, not position: key ``j`` is visible to query ``i`` when
``j < kv_length`` and (if causal) ``j <= p`` with ``p = q_offset + i`` the
query's key index. ``q_offset`` is the index of the first query among the
keys (the cache length in decoding) and may be traced. A layer's span
narrows that further: ``window=W`` keeps ``p - W < j`` (a sliding window,
Gemma / Mistral), ``chunk=C`` keeps ``j // C == p // C`` (Llama 4's chunked
attention); without the causal mask a window is symmetric (``|p - j| < W``).

The blocked path (``impl="blocked"``) processes ``block`` queries (or all
of them, when fewer: a decoding step's one query is not padded to a block)
against ``block`` keys at a time with the online softmax of Rabe & Staats 2021 /
FlashAttention, computing the encoding terms per (query block, key block), so
memory is ``O(B H block^2)`` instead of ``O(B H L^2)``. Key blocks that lie
entirely above the causal diagonal are skipped with ``lax.cond``. The key-block
step is rematerialised (``jax.checkpoint``) so the gradient stores only the
running ``(o, m, l)`` per step, not the attention weights. Encodings with
``full_rows`` (CoPE: cumulative gates over the whole key row) use one key block
spanning every key; only their queries are blocked. With a window or chunk
span, each query block visits only the fixed number of key blocks that can
hold its span (``lax.dynamic_index_in_dim``), so a windowed layer costs
``O(L (W + block))`` and not ``O(L^2)``; the dense path's causal query blocks
slice their keys to the span likewise.

Everything about a call except its arrays travels in one frozen
:class:`AttentionCall` (scale, mask, offsets, span, soft-cap, path, block
sizes, per-token features, statistics), handed unchanged from the layer to
the dense and blocked paths, the fused kernel's plan and a unit's own
``attention`` hook: a new term changes that one type.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from posenc.attention import learned_sinks
from posenc.model import fused
from posenc.model.attention_call import IMPLS, AttentionCall, check_impl
from posenc.model.attention_call import is_static_int as _static_int
from posenc.norms import norms

__all__ = ["IMPLS", "AttentionCall", "attention", "blocked_attention", "check_impl",
           "dense_attention", "span_start", "visible_keys", "weight_stats"]

_NEG = -1e30  # finite mask value: exp(_NEG - m) underflows to 0 without inf - inf = nan


def _repeat_kv(x, num_heads):
    """[B, L, K, Dh] -> [B, L, H, Dh] for grouped-query attention."""
    groups = num_heads // x.shape[2]
    return x if groups == 1 else jnp.repeat(x, groups, axis=2)


def _mask(q_index, k_index, *, causal, q_offset, kv_length, window=0, chunk=0):
    """Boolean [Lq, Lk]: key j visible to query i (index based; see the module doc)."""
    j, p = k_index[None, :], q_offset + q_index[:, None]
    m = j < kv_length
    if causal:
        m = m & (j <= p)
    if window:
        m = m & (j > p - window)
        if not causal:
            m = m & (j < p + window)
    if chunk:
        m = m & (j // chunk == p // chunk)
    return m


def span_start(p, *, window=0, chunk=0):
    """The smallest key index query index ``p`` may see under its span (0 for a full span).

    A Python int for a Python int ``p`` (static slicing), an array otherwise.
    """
    if window:
        return max(p - window + 1, 0) if _static_int(p) else jnp.maximum(p - window + 1, 0)
    if chunk:
        return (p // chunk) * chunk
    return 0 if _static_int(p) else jnp.zeros_like(p)


def visible_keys(num_queries, *, q_offset, kv_length, causal=True, window=0, chunk=0):
    """int32 [Lq]: how many keys each query sees under the mask of :func:`attention`.

    With the causal mask, ``posenc.logit_scale.num_keys``; without it, every
    key of the span below ``kv_length``.
    """
    from posenc.attention import logit_scale

    if causal:
        return logit_scale.num_keys(jnp.arange(num_queries), kv_length=kv_length, offset=q_offset,
                                    window=window or None, chunk=chunk or None)
    p = jnp.arange(num_queries, dtype=jnp.int32) + jnp.asarray(q_offset, jnp.int32)
    lo = span_start(p, window=window, chunk=chunk)
    hi = jnp.full_like(p, kv_length - 1) if not (window or chunk) else (
        p + window - 1 if window else lo + chunk - 1)
    hi = jnp.minimum(hi, jnp.asarray(kv_length, jnp.int32) - 1)
    return jnp.maximum(hi - lo + 1, 0).astype(jnp.int32)


def _logits(encoding, q, k, qp, kp, call):
    """Pre-mask float32 logits [B, H, Lq, Lk] (k already has H heads) and the unit's own
    visibility (bool [B | 1, 1, Lq, Lk], or None: every pair); ``call.q_offset`` is the key
    index of the first of these queries relative to the first of these keys."""
    visible = None
    if encoding.has_pair_logits:  # q.k from per-region rotations (a remapped RoPE)
        s, visible = encoding.pair_logits(q, k, qp, kp, scale=call.scale)
        visible = None if visible is None else visible[..., None, :, :]
    else:
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * call.scale
    bias = encoding.bias(qp, kp)
    if bias is not None:
        s = s + bias
    if encoding.has_feature_bias:
        fb = encoding.feature_bias(call.q_features, call.k_features, causal=call.causal)
        if fb is not None:
            s = s + fb
    extra = encoding.content_logits(q, k, qp, kp, scale=call.scale, q_offset=call.q_offset)
    if extra is not None:
        s = s + extra
    if call.softcap:
        s = norms.softcap(s, call.softcap)
    return s, visible


def _narrow(mask, visible):
    return mask if visible is None else mask & visible


def _call_mask(q_index, k_index, call):
    return _mask(q_index, k_index, causal=call.causal, q_offset=call.q_offset,
                 kv_length=call.kv_length, window=call.window, chunk=call.chunk)


def _dense_rows(q, k, v, q_positions, k_positions, encoding, call):
    """One dense softmax over every key; -> out (, (max logit, entropy sum, valid row count))."""
    B, Lq, H, _ = q.shape
    Lk = k.shape[1]
    mask = _call_mask(jnp.arange(Lq), jnp.arange(Lk), call)
    sinks = call.sinks
    plain = not (encoding.has_content_logits or encoding.has_values or encoding.has_feature_bias
                 or encoding.has_pair_logits or call.softcap or call.stats or sinks is not None
                 or q.shape[-1] != v.shape[-1])  # jax.nn.dot_product_attention: one head width
    if plain:
        # jax.nn.dot_product_attention picks cuDNN flash attention on GPU when it
        # can; on CPU it is the XLA reference (materialises the logits, float32
        # softmax), numerically the same as the manual path below.
        bias = encoding.bias(q_positions, k_positions)
        if bias is not None:
            bias = jnp.broadcast_to(bias, (B, H, Lq, Lk)).astype(q.dtype)
        return jax.nn.dot_product_attention(
            q, k, v, bias=bias, mask=jnp.broadcast_to(mask, (B, 1, Lq, Lk)), scale=call.scale)
    kr, vr = _repeat_kv(k, H), _repeat_kv(v, H)
    s, visible = _logits(encoding, q, kr, q_positions, k_positions, call)
    mask = _narrow(mask, visible)
    s = jnp.where(mask, s, _NEG)
    # Softmax written out so the stats reuse its row max m and sum l (one pass
    # over the [B, H, Lq, Lk] logits instead of a log per weight); the max is
    # a constant for the gradient, as in jax.nn.softmax.
    m = m_keys = jax.lax.stop_gradient(s.max(-1, keepdims=True))
    if sinks is not None:  # posenc.learned_sinks.softmax: the sink joins the denominator only
        sink = sinks.astype(jnp.float32)[:, None, None]
        m = jnp.maximum(m, jax.lax.stop_gradient(sink))
    e = jnp.where(mask, jnp.exp(s - m), 0.0)
    l = e.sum(-1, keepdims=True)
    if sinks is not None:
        l = l + jnp.exp(sink - m)
    l_safe = jnp.where(l > 0, l, 1.0)  # a row with no visible key gets zero weights
    w = e / l_safe
    out = jnp.einsum("bhqk,bkhd->bqhd", w.astype(v.dtype), vr,
                     preferred_element_type=jnp.float32)
    vals = encoding.values(w, q_positions, k_positions)
    if vals is not None:
        out = out + vals
    out = out.astype(q.dtype)
    if not call.stats:
        return out
    # Entropy of a row: -sum_j w_j log w_j = log l + sum_j w_j (m - s_j), every
    # term >= 0 (no cancellation); masked keys have w_j = 0.
    # With sinks, the sink's weight w_s = exp(s_h - m) / l is part of the distribution.
    row_valid = mask.any(-1)[..., None]  # [Lq, 1]
    ent = jnp.log(l_safe) + jnp.sum(w * (m - s), axis=-1, keepdims=True)
    if sinks is not None:
        ent = ent + jnp.exp(sink - m) / l_safe * (m - sink)
    rows = jnp.broadcast_to(row_valid, ent.shape)
    return out, (jnp.max(jnp.where(rows, m_keys, -jnp.inf), axis=(0, 2, 3)), jnp.sum(jnp.where(rows, ent, 0.0)),
                 rows.sum())


def weight_stats(logits, weights, visible, *, rest=None):
    """Diagnostics of explicit attention weights (units with their own attention).

    ``max_attention_logit``: the largest visible logit; ``attention_entropy``:
    the mean over rows with a visible key of ``-sum_j w_j log w_j`` (plus
    ``-r log r`` for a ``rest`` mass [B, H, Lq] given to the query's own
    value, stick-breaking). logits, weights [B, H, Lq, Lk]; visible bool,
    broadcastable to them.
    """
    visible = jnp.broadcast_to(visible, logits.shape)
    safe = jnp.where(weights > 0, weights, 1.0)
    ent = -jnp.sum(jnp.where(weights > 0, weights * jnp.log(safe), 0.0), axis=-1)
    if rest is not None:
        ent = ent - jnp.where(rest > 0, rest * jnp.log(jnp.where(rest > 0, rest, 1.0)), 0.0)
    rows = visible.any(-1)
    per_head = jnp.max(jnp.where(visible, logits, _NEG), axis=(0, 2, 3))
    return {"max_attention_logit": jnp.max(per_head), "max_logit_per_head": per_head,
            "attention_entropy": jnp.sum(jnp.where(rows, ent, 0.0)) / jnp.maximum(rows.sum(), 1)}


def _token_slice(features, start, end):
    return {n: f[:, start:end] for n, f in (features or {}).items()}


def dense_attention(q, k, v, q_positions, k_positions, encoding, call: AttentionCall):
    """Attention materialising [B, H, Lq, Lk] logits; q [B,Lq,H,Dh], k/v [B,Lk,K,Dh].

    With ``call.causal`` and a ``call.causal_block`` smaller than Lq (and static
    ``q_offset`` / ``kv_length``), the queries are split into blocks of that
    size and block ``[s, e)`` attends only to its visible keys
    ``[0, q_offset + e)``: an exact softmax over every key it can see, with
    the logits above the diagonal never computed (about half the work of
    one [Lq, Lk] softmax for many blocks). With a window or chunk span the
    block's keys start at the first one its span reaches.
    """
    Lq, Lk = q.shape[1], k.shape[1]
    call = call.replace(kv_length=call.num_keys(Lk))
    q_offset, kv_length, causal_block = call.q_offset, call.kv_length, call.causal_block
    return_stats, window, chunk = call.stats, call.window, call.chunk
    split = (call.causal and causal_block and Lq > causal_block and _static_int(q_offset)
             and _static_int(kv_length))
    if not split:
        res = _dense_rows(q, k, v, q_positions, k_positions, encoding, call)
        return _finish_stats(res, return_stats)
    outs, parts = [], []
    for s in range(0, Lq, causal_block):
        e = min(s + causal_block, Lq)
        # keys past q_offset + e - 1 are above the diagonal of every query of the block
        kend = max(min(q_offset + e, kv_length, Lk), 1)
        # keys before the span of the block's first query are hidden from all of its queries
        # (a chunk start is a multiple of C: chunk membership survives the shift)
        lo = 0 if encoding.full_rows else span_start(q_offset + s, window=window, chunk=chunk)
        kstart = min(lo, kend - 1)
        kv = min(kv_length, kend) - kstart if lo < kend else 0  # lo >= kend: no visible key
        part_call = call.replace(causal=True, q_offset=q_offset + s - kstart, kv_length=kv,
                                 q_features=_token_slice(call.q_features, s, e),
                                 k_features=_token_slice(call.k_features, kstart, kend))
        res = _dense_rows(q[:, s:e], k[:, kstart:kend], v[:, kstart:kend], q_positions[:, s:e],
                          k_positions[:, kstart:kend], encoding, part_call)
        out, part = res if return_stats else (res, None)
        outs.append(out)
        parts.append(part)
    out = jnp.concatenate(outs, axis=1)
    if not return_stats:
        return out
    return _finish_stats((out, (jnp.max(jnp.stack([p[0] for p in parts]), axis=0),
                                sum(p[1] for p in parts), sum(p[2] for p in parts))), True)


def _finish_stats(res, return_stats):
    if not return_stats:
        return res
    out, (per_head, ent_sum, rows) = res
    return out, {"max_attention_logit": jnp.max(per_head), "max_logit_per_head": per_head,
                 "attention_entropy": ent_sum / jnp.maximum(rows, 1)}


def _pad(x, axis, size):
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def blocked_attention(q, k, v, q_positions, k_positions, encoding, call: AttentionCall):
    """Same result as :func:`dense_attention` in O(B H block^2) memory (see module doc);
    blocks of ``call.block`` queries and keys."""
    B, Lq, H = q.shape[:3]
    Lk, Dh = k.shape[1], v.shape[-1]  # q and k may be wider than v (Encoding.qk_head_dim)
    block, causal, q_offset = call.block, call.causal, call.q_offset
    window, chunk, return_stats = call.window, call.chunk, call.stats
    kv_length = call.num_keys(Lk)
    call = call.replace(kv_length=kv_length)
    bq = min(block, Lq)  # fewer queries than a block (decoding): one block of just those, not padded
    nq = -(-Lq // bq)
    bk = -(-Lk // block) * block if encoding.full_rows else block
    nk = -(-Lk // bk)
    kr, vr = _repeat_kv(k, H), _repeat_kv(v, H)
    span = window or chunk
    # Key blocks that can hold a query block's span: its keys lie in [lo, lo + span + bq - 2].
    steps = min(nk, (span + bq - 2) // bk + 2) if (span and causal and not encoding.full_rows) else nk

    def split(x, n, b):  # [B, n*b, ...] -> [n, B, b, ...] (positions may have batch 1)
        x = _pad(x, 1, n * b)
        return jnp.moveaxis(x.reshape((x.shape[0], n, b) + x.shape[2:]), 1, 0)

    qs, qps = split(q, nq, bq), split(q_positions, nq, bq)
    qfs = {n: split(f, nq, bq) for n, f in call.q_features.items()}
    ks, vs, kps = split(kr, nk, bk), split(vr, nk, bk), split(k_positions, nk, bk)
    kfs = {n: split(f, nk, bk) for n, f in call.k_features.items()}

    def key_step(carry, xs, q_blk, qp_blk, qf_blk, qi):
        o, m, l, a = carry
        k_blk, v_blk, kp_blk, kf_blk, kj = xs
        q_index = qi * bq + jnp.arange(bq)
        k_index = kj * bk + jnp.arange(bk)
        mask = _call_mask(q_index, k_index, call)
        s, visible = _logits(encoding, q_blk, k_blk, qp_blk, kp_blk,
                             call.replace(q_offset=q_offset + qi * bq - kj * bk, q_features=qf_blk,
                                          k_features=kf_blk))
        mask = _narrow(mask, visible)
        s = jnp.where(mask, s, _NEG)
        m_new = jnp.maximum(m, s.max(-1))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        pv = jnp.einsum("bhqk,bkhd->bqhd", p.astype(v_blk.dtype), v_blk,
                        preferred_element_type=jnp.float32)
        vals = encoding.values(p, qp_blk, kp_blk)  # linear in the weights: rescales like pv
        if vals is not None:
            pv = pv + vals
        o = o * jnp.moveaxis(alpha, 1, 2)[..., None] + pv
        l = l * alpha + p.sum(-1)
        a = a * alpha + (p * s).sum(-1)  # for the entropy: sum_j p_j s_j
        return (o, m_new, l, a)

    def query_step(_, xs):
        q_blk, qp_blk, qf_blk, qi = xs
        init = (jnp.zeros((B, bq, H, Dh), jnp.float32), jnp.full((B, H, bq), _NEG, jnp.float32),
                jnp.zeros((B, H, bq), jnp.float32), jnp.zeros((B, H, bq), jnp.float32))
        step = jax.checkpoint(functools.partial(key_step, q_blk=q_blk, qp_blk=qp_blk,
                                                qf_blk=qf_blk, qi=qi))
        first_query = q_offset + qi * bq
        last_query = first_query + bq - 1
        lo = span_start(first_query, window=window, chunk=chunk) if causal else 0

        def needed(kj):
            n = kj * bk < kv_length
            if causal:
                n = n & (kj * bk <= last_query)
                if span:
                    n = n & ((kj + 1) * bk > lo)
            return n

        def run(carry, xs):
            return jax.lax.cond(needed(xs[4]), step, lambda c, _: c, carry, xs), None

        if steps == nk:
            (o, m, l, a), _ = jax.lax.scan(run, init, (ks, vs, kps, kfs, jnp.arange(nk)))
        else:
            # Only the `steps` key blocks from the one holding the span's start.
            first = jnp.clip(lo // bk, 0, nk - steps)

            def body(carry, t):
                kj = first + t
                blk = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, kj, 0, keepdims=False),
                                   (ks, vs, kps, kfs))
                return run(carry, blk + (kj,))

            (o, m, l, a), _ = jax.lax.scan(body, init, jnp.arange(steps))
        if call.sinks is None:
            l_safe = jnp.where(l > 0, l, 1.0)
            out = o / jnp.moveaxis(l_safe, 1, 2)[..., None]
            # entropy of softmax row: log l + m - (sum_j p_j s_j) / l
            ent = jnp.log(l_safe) + m - a / l_safe
            return None, (out.astype(q.dtype), m, ent)
        # the sink joins the denominator after the last key block (posenc.learned_sinks)
        out = o * jnp.moveaxis(learned_sinks.output_scale(m, l, call.sinks), 1, 2)[..., None]
        m_s, l_s = learned_sinks.normalizer(m, l, call.sinks)
        sink = call.sinks.astype(jnp.float32)[:, None]
        # entropy with the sink's weight: log Z - sum_j w_j s_j - w_s s_h, log Z = m' + log l'
        ent = m_s + jnp.log(l_s) - (a * jnp.exp(m - m_s) + sink * jnp.exp(sink - m_s)) / l_s
        return None, (out.astype(q.dtype), m, ent)

    _, (out, m, ent) = jax.lax.scan(query_step, None, (qs, qps, qfs, jnp.arange(nq)))
    out = jnp.moveaxis(out, 0, 1).reshape(B, nq * bq, H, Dh)[:, :Lq]
    if not return_stats:
        return out
    valid = (jnp.arange(nq * bq) < Lq).reshape(nq, 1, 1, bq)
    count = valid.sum() * B * H
    per_head = jnp.max(jnp.where(valid, m, _NEG), axis=(0, 1, 3))
    stats = {
        "max_attention_logit": jnp.max(per_head),
        "max_logit_per_head": per_head,
        "attention_entropy": jnp.sum(jnp.where(valid, ent, 0.0)) / count,
    }
    return out, stats


def attention(q, k, v, q_positions, k_positions, encoding, call: AttentionCall):
    """Multi-head attention with a position encoding; dense, blocked or fused (see module doc).

    Args:
      q: [B, Lq, H, Dq]; k: [B, Lk, K, Dq]; v: [B, Lk, K, Dh] with H % K == 0 (GQA); the
        queries and keys may be wider than the values (``Encoding.qk_head_dim``: PoPE).
      q_positions, k_positions: int [B | 1, Lq], [B | 1, Lk] (used by the encoding only).
      encoding: a ``posenc.model.encoding.Encoding`` (bias, content_logits, values, ...).
      call: the :class:`AttentionCall` (scale, mask, offsets, span, soft-cap, path,
        features, statistics). Units with their own attention weights (``attention``
        hook: stick-breaking, PaTH) get it unchanged; their span support is
        ``Encoding.check_span``, the rule config validation applies too.
    Returns:
      [B, Lq, H, Dh] in q.dtype (and a stats dict when ``call.stats``).
    """
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"num_heads {q.shape[2]} is not a multiple of num_kv_heads {k.shape[2]}")
    cls = type(encoding)
    cls.check_span(call.span, where=f"attention with span {call.span!r} (window={call.window}, "
                                    f"chunk={call.chunk})")
    if cls.own_attention():  # stick-breaking, PaTH: the unit's own weights
        if call.sinks is not None:
            raise ValueError(f"attention sinks join a softmax, but position kind {cls.name!r} computes "
                             "its own attention weights")
        return encoding.attention(q, k, v, q_positions, k_positions, call)
    impl = call.impl
    if impl == "pallas" or (impl == "auto" and fused.on_accelerator()):
        terms, why = fused.plan(q, k, v, q_positions, k_positions, encoding, call)
        if terms is not None:
            return fused.attention(q, k, v, q_positions, k_positions, terms, call)
        if impl == "pallas" and not call.stats:
            raise ValueError(f"attention_impl 'pallas' cannot run this call: {why}")
    if call.runs_blocked(q.shape[1], k.shape[1]):
        return blocked_attention(q, k, v, q_positions, k_positions, encoding, call)
    return dense_attention(q, k, v, q_positions, k_positions, encoding, call)
