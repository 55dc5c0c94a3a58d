"""The gated delta rule (Gated DeltaNet; Qwen3-Next, Qwen3.5): chunked and recurrent.

Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2
with Delta Rule" (ICLR 2025, arXiv 2412.06464). The reference for exactness
is transformers 5.x's pure-torch path, ``models/qwen3_next/modeling_qwen3_next.py``:
``torch_chunk_gated_delta_rule``, ``torch_recurrent_gated_delta_rule``,
``l2norm``, ``Qwen3NextRMSNormGated`` and the gates of
``Qwen3NextGatedDeltaNet.forward``; fla-org/flash-linear-attention
``fla/ops/gated_delta_rule/naive.py`` has the same recurrence.

Per value head, with state ``S`` [Dk, Dv], log decay ``g_t <= 0`` and
writing strength ``beta_t`` in (0, 1) (:func:`gates`)::

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T
    o_t = S_t^T (scale q_t)                              scale = Dk^-1/2

(``S_{t-1}^T k_t`` is what the state already recalls for ``k_t``: the delta
rule writes only the error). ``qk_l2norm`` L2-normalises ``q`` and ``k``
first (``use_qk_l2norm_in_kernel=True``, as every Qwen3-Next layer calls it).

The chunked form (chunks of ``chunk_size`` tokens, the WY / UT form of
DeltaNet): inside a chunk, with ``G_i`` the cumulative log decay,
``T = (I + strict_lower(beta_i k_i . k_j exp(G_i - G_j)))^{-1}`` turns the
chunk's writes into ``u = T (beta v)`` and ``w = T (beta k exp(G))``; a scan
over chunks then reads ``v_new = u - w S``, ``o = (q exp(G)) S +
(q k^T o decay) v_new`` and carries ``S <- exp(G_C) S + (k exp(G_C - G))^T
v_new``. Lengths not a multiple of the chunk are padded with ``k = v = 0``,
``g = 0``, ``beta = 0`` (no decay, no write), so the final state is exact.

Grouped value heads (fla's GVA; the Qwen3-Next layer's ``repeat_interleave``
of q and k when ``num_v_heads > num_k_heads``): key head h serves value heads
``h G .. h G + G - 1``. State layout ``[..., Hv, Dk, Dv]`` (transformers'
``recurrent_states``), float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.recurrent._common import F32, check_heads, einsum, from_chunks, mm, solve_unit_lower, to_chunks
from posenc.recurrent._common import gated_rms_norm as _gated_rms_norm
from posenc.recurrent._common import l2norm as _l2norm


def gates(a, b, A_log, dt_bias) -> tuple[jax.Array, jax.Array]:
    """Qwen3-Next's gates ``(g, beta)``: ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``.

    ``a``, ``b`` are the layer's ``in_proj_ba`` outputs per value head;
    ``g`` is the log decay of each step (<= 0). float32.

    Shapes: a, b [..., L, Hv], A_log, dt_bias [Hv] -> (float32 [..., L, Hv], float32 [..., L, Hv]).
    """
    a32 = jnp.asarray(a).astype(F32)
    g = -jnp.exp(jnp.asarray(A_log).astype(F32)) * jax.nn.softplus(a32 + jnp.asarray(dt_bias).astype(F32))
    return g, jax.nn.sigmoid(jnp.asarray(b).astype(F32))


def l2norm(x, *, eps=1e-6) -> jax.Array:
    """``x * rsqrt(sum(x^2) + eps)`` over the last axis (transformers' / fla's ``l2norm``). float32."""
    checks.number("eps", eps, positive=True)
    return _l2norm(x, eps=eps)


def gated_rms_norm(x, gate, weight, *, eps=1e-6) -> jax.Array:
    """Qwen3-Next's output norm: ``weight * rms_norm(x) * silu(gate)`` (norm before the gate).

    transformers' ``Qwen3NextRMSNormGated`` (fla ``FusedRMSNormGated``), over
    the last axis (``head_v_dim``). float32 math, output in ``x.dtype``.

    Shapes: x [..., Dv], gate [..., Dv], weight [Dv] -> like x.
    """
    return _gated_rms_norm(x, gate, weight, eps=eps, activation="silu", norm_before_gate=True)


def check_inputs(q, k, v, g, beta, *, scale, qk_l2norm, initial_state, per_channel: bool) -> tuple[float, int]:
    """Shape and argument checks shared with ``posenc.kda`` -> (scale, value heads per key head)."""
    q, k, v, g, beta = (jnp.shape(t) for t in (q, k, v, g, beta))
    if len(q) < 3 or k != q or len(v) < 3:
        raise ValueError(f"q and k must have the same shape [..., L, Hk, Dk] and v [..., L, Hv, Dv]; "
                         f"got {q}, {k}, {v}")
    length, hk, dk = q[-3:]
    hv, dv = v[-2:]
    if v[-3] != length:
        raise ValueError(f"v must have the length L = {length} of q; got {v}")
    rep = check_heads("value heads per key head", hv, hk)
    g_tail = (length, hv, dk) if per_channel else (length, hv)
    if g[-len(g_tail):] != g_tail:
        raise ValueError(f"g must have shape [..., {'L, Hv, Dk' if per_channel else 'L, Hv'}] = {g_tail}; got {g}")
    if beta[-2:] != (length, hv):
        raise ValueError(f"beta must have shape [..., L, Hv] = {(length, hv)}; got {beta}")
    if initial_state is not None and jnp.shape(initial_state)[-3:] != (hv, dk, dv):
        raise ValueError(f"initial_state must have shape [..., Hv, Dk, Dv] = [..., {hv}, {dk}, {dv}]; "
                         f"got {jnp.shape(initial_state)}")
    checks.boolean("qk_l2norm", qk_l2norm)
    return (dk ** -0.5 if scale is None else checks.number("scale", scale, positive=True)), rep


def prepare(q, k, v, g, beta, initial_state, *, scale, qk_l2norm, rep, per_channel):
    """float32 inputs broadcast to one batch shape (traced): q, k normalised, scaled and repeated to
    the value heads; the initial state (zeros by default)."""
    hv, dk, dv = v.shape[-2], q.shape[-1], v.shape[-1]
    q32, k32 = q.astype(F32), k.astype(F32)
    if qk_l2norm:
        q32, k32 = _l2norm(q32), _l2norm(k32)
    q32 = jnp.repeat(q32 * scale, rep, axis=-2)
    k32 = jnp.repeat(k32, rep, axis=-2)
    g_tail = g.shape[-3:] if per_channel else g.shape[-2:]
    batch = jnp.broadcast_shapes(q.shape[:-3], v.shape[:-3], g.shape[:-len(g_tail)], beta.shape[:-2])
    q32, k32 = (jnp.broadcast_to(t, batch + t.shape[-3:]) for t in (q32, k32))
    v32 = jnp.broadcast_to(v.astype(F32), batch + v.shape[-3:])
    g32 = jnp.broadcast_to(g.astype(F32), batch + g_tail)
    b32 = jnp.broadcast_to(beta.astype(F32), batch + beta.shape[-2:])
    s0 = (jnp.zeros(batch + (hv, dk, dv), F32) if initial_state is None
          else jnp.broadcast_to(initial_state.astype(F32), batch + (hv, dk, dv)))
    return q32, k32, v32, g32, b32, s0


def _step(s, q, k, v, g, b):
    """One delta-rule step on float32 head-major tensors; ``g`` [..., H] or [..., H, Dk]."""
    decay = jnp.exp(g)[..., None, None] if g.ndim == s.ndim - 2 else jnp.exp(g)[..., None]
    s = s * decay
    recalled = einsum("...kv,...k->...v", s, k)
    s = s + k[..., :, None] * ((v - recalled) * b[..., None])[..., None, :]
    return s, einsum("...kv,...k->...v", s, q)


@functools.partial(jax.jit, static_argnames=("scale", "qk_l2norm", "rep", "per_channel"))
def recurrent_core(q, k, v, g, beta, initial_state, *, scale, qk_l2norm, rep, per_channel):
    """The recurrence token by token (also ``posenc.kda``'s: ``g`` [..., L, H] or, per_channel, [..., L, H, Dk])."""
    q, k, v, g, b, s0 = prepare(q, k, v, g, beta, initial_state, scale=scale, qk_l2norm=qk_l2norm, rep=rep,
                                per_channel=per_channel)
    t = q.ndim - 3

    def one(s, inputs):
        s, o = _step(s, *inputs)
        return s, o

    final, o = jax.lax.scan(one, s0, tuple(jnp.moveaxis(x, t, 0) for x in (q, k, v, g, b)))
    return jnp.moveaxis(o, 0, t), final


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule token by token: ``(o, final_state)``.

    transformers' ``torch_recurrent_gated_delta_rule`` (with
    ``use_qk_l2norm_in_kernel = qk_l2norm`` and the final state always
    returned), plus fla's ``scale`` (default ``Dk^-1/2``) and grouped value
    heads. One token with a state is the decoding step. float32 math; ``o``
    in ``v.dtype``, the state float32.

    Shapes: q, k [..., L, Hk, Dk], v [..., L, Hv, Dv], g, beta [..., L, Hv],
    initial_state [..., Hv, Dk, Dv] -> (o [..., L, Hv, Dv], float32 [..., Hv, Dk, Dv]).
    """
    scale, rep = check_inputs(q, k, v, g, beta, scale=scale, qk_l2norm=qk_l2norm, initial_state=initial_state,
                              per_channel=False)
    o, final = recurrent_core(*(jnp.asarray(t) for t in (q, k, v, g, beta)), initial_state, scale=scale,
                              qk_l2norm=qk_l2norm, rep=rep, per_channel=False)
    return o.astype(jnp.asarray(v).dtype), final


def chunked(q, k, v, g, beta, *, chunk_size=64, scale=None, initial_state=None,
            qk_l2norm=False) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule by chunks: ``(o, final_state)``, equal to :func:`recurrent`.

    transformers' ``torch_chunk_gated_delta_rule`` (see the module
    docstring for the algebra; the UT transform is a triangular solve, as
    its ``torch.linalg.solve_triangular`` path). Arguments as
    :func:`recurrent`, plus ``chunk_size`` (64 in transformers and fla).
    Memory O(L chunk Hv) for the intra-chunk terms.
    """
    chunk = checks.integer("chunk_size", chunk_size, minimum=1)
    chunk = min(chunk, max(1, jnp.shape(q)[-3]))  # a sequence shorter than a chunk: one chunk of it, not padded
    scale, rep = check_inputs(q, k, v, g, beta, scale=scale, qk_l2norm=qk_l2norm, initial_state=initial_state,
                              per_channel=False)
    o, final = _chunked(*(jnp.asarray(t) for t in (q, k, v, g, beta)), initial_state, chunk=chunk, scale=scale,
                        qk_l2norm=qk_l2norm, rep=rep)
    return o.astype(jnp.asarray(v).dtype), final


@functools.partial(jax.jit, static_argnames=("chunk", "scale", "qk_l2norm", "rep"))
def _chunked(q, k, v, g, beta, initial_state, *, chunk, scale, qk_l2norm, rep):
    q, k, v, g, b, s0 = prepare(q, k, v, g, beta, initial_state, scale=scale, qk_l2norm=qk_l2norm, rep=rep,
                                per_channel=False)
    length = q.shape[-3]
    # head-major chunks: [..., H, Nc, C, D]
    qc, kc, vc = (jnp.moveaxis(to_chunks(t, chunk, -3), -2, -4) for t in (q, k, v))
    gc, bc = (jnp.moveaxis(to_chunks(t, chunk, -2), -1, -3) for t in (g, b))    # [..., H, Nc, C]
    gcum = jnp.cumsum(gc, axis=-1)
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    # exp(G_i - G_j) for j <= i; masked before the exp, which would overflow above the diagonal
    decay = jnp.exp(jnp.where(lower, gcum[..., :, None] - gcum[..., None, :], -jnp.inf))
    kb = kc * bc[..., None]
    a_strict = jnp.where(jnp.tril(lower, -1), mm(kb, jnp.swapaxes(kc, -1, -2)) * decay, 0.0)
    u = solve_unit_lower(a_strict, vc * bc[..., None])
    w = solve_unit_lower(a_strict, kb * jnp.exp(gcum)[..., None])
    intra = jnp.where(lower, mm(qc, jnp.swapaxes(kc, -1, -2)) * decay, 0.0)
    q_in = qc * jnp.exp(gcum)[..., None]
    k_out = kc * jnp.exp(gcum[..., -1:] - gcum)[..., None]
    whole = jnp.exp(gcum[..., -1])                                             # [..., H, Nc]

    def one(s, inputs):
        u_i, w_i, q_i, k_i, a_i, d_i = inputs
        v_new = u_i - mm(w_i, s)
        o_i = mm(q_i, s) + mm(a_i, v_new)
        return s * d_i[..., None, None] + mm(jnp.swapaxes(k_i, -1, -2), v_new), o_i

    final, o = jax.lax.scan(one, s0, tuple(jnp.moveaxis(t, -3, 0) for t in (u, w, q_in, k_out, intra))
                            + (jnp.moveaxis(whole, -1, 0),))
    o = jnp.moveaxis(o, 0, -3)                                                 # [..., H, Nc, C, Dv]
    o = from_chunks(jnp.moveaxis(o, -4, -2), length, -4)                       # [..., L, H, Dv]
    return o, final
