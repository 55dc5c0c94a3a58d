"""Kimi Delta Attention (KDA): the gated delta rule with a decay per key channel.

Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention
Architecture" (arXiv 2510.26692). The reference for exactness is
transformers 5.x's pure-torch path, ``models/kimi_linear/modeling_kimi_linear.py``:
``chunk_kimi_delta_attention`` and ``recurrent_kimi_delta_attention`` (the
fallbacks of fla's ``chunk_kda`` / ``fused_recurrent_kda``),
``KimiLinearForgetGate`` and ``KimiLinearRMSNormGated``; fla-org/flash-linear-attention
keeps the same recurrence in ``fla/ops/kda/naive.py`` (``naive_recurrent_kda``,
``naive_chunk_kda``) and the gates in ``fla/ops/kda/gate.py``.

As ``posenc.gated_delta`` but the log decay ``g_t`` is a vector over the key
channels ``[Dk]`` (one forget rate per channel, not per head)::

    S_t = diag(exp(g_t)) S_{t-1}
    S_t = S_t + beta_t k_t (v_t - S_t^T k_t)^T          S [Dk, Dv]
    o_t = S_t^T (scale q_t)                              scale = Dk^-1/2

The chunked form is the same WY / UT algebra with the pairwise decays
``exp(G_i - G_j)`` taken per channel inside the dot products, a
``[chunk, chunk, Dk]`` tensor; to bound memory it is built chunk by chunk
inside the scan over chunks (transformers builds it for all chunks at once,
which needs O(L chunk Dk) memory per head). Kimi Linear's delta layers take
no position encoding (nor do its MLA layers): order comes from the decay
and the short convolution (``posenc.short_conv``, SiLU) before q, k, v.

Grouped value heads as ``posenc.gated_delta`` (fla's GVA). State layout
``[..., Hv, Dk, Dv]``, float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.recurrent._common import F32, einsum, from_chunks, mm, solve_unit_lower, to_chunks
from posenc.recurrent._common import gated_rms_norm as _gated_rms_norm
from posenc.recurrent.gated_delta import check_inputs, prepare, recurrent_core


def gate(f, A_log, dt_bias=None, *, lower_bound=None) -> jax.Array:
    """KDA's log decay per key channel (<= 0), float32.

    Default (Kimi Linear, ``KimiLinearForgetGate``; fla ``naive_kda_gate``):
    ``g = -exp(A_log[h]) softplus(f + dt_bias)``. With ``lower_bound`` (< 0;
    fla ``naive_kda_lowerbound_gate``): ``g = lower_bound sigmoid(exp(A_log[h])
    (f + dt_bias))``, bounded below. ``f`` is the forget projection
    (``f_b_proj(f_a_proj(h))``) by heads.

    Shapes: f [..., L, H, Dk], A_log (H values: [H] or transformers' [1, 1, H, 1]),
    dt_bias (H Dk values: [H Dk] or [H, Dk]) -> float32 [..., L, H, Dk].
    """
    f = jnp.asarray(f)
    if f.ndim < 2:
        raise ValueError(f"f must have shape [..., L, H, Dk]; got {f.shape}")
    h, dk = f.shape[-2:]
    a_log = jnp.asarray(A_log).astype(F32)
    if a_log.size != h:
        raise ValueError(f"A_log must hold H = {h} values; got shape {a_log.shape}")
    x = f.astype(F32)
    if dt_bias is not None:
        dt_bias = jnp.asarray(dt_bias)
        if dt_bias.size != h * dk:
            raise ValueError(f"dt_bias must hold H Dk = {h * dk} values; got shape {dt_bias.shape}")
        x = x + dt_bias.astype(F32).reshape(h, dk)
    rate = jnp.exp(a_log.reshape(h, 1))
    if lower_bound is None:
        return -rate * jax.nn.softplus(x)
    bound = checks.number("lower_bound", lower_bound, below=0.0)
    return bound * jax.nn.sigmoid(rate * x)


def gated_rms_norm(x, gate, weight, *, eps=1e-6) -> jax.Array:
    """Kimi Linear's output norm: ``weight * rms_norm(x) * sigmoid(gate)`` (norm before the gate).

    transformers' ``KimiLinearRMSNormGated`` (fla ``FusedRMSNormGated`` with
    ``activation="sigmoid"``), over the last axis (``head_dim``); ``gate`` is
    ``g_b_proj(g_a_proj(h))`` by heads. float32 math, output in ``x.dtype``.

    Shapes: x [..., Dv], gate [..., Dv], weight [Dv] -> like x.
    """
    return _gated_rms_norm(x, gate, weight, eps=eps, activation="sigmoid", norm_before_gate=True)


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False) -> tuple[jax.Array, jax.Array]:
    """KDA token by token: ``(o, final_state)``.

    transformers' ``recurrent_kimi_delta_attention`` (fla ``naive_recurrent_kda``,
    ``fused_recurrent_kda``) with ``use_qk_l2norm_in_kernel = qk_l2norm``,
    fla's ``scale`` (default ``Dk^-1/2``) and the final state always
    returned. One token with a state is the decoding step. float32 math; ``o``
    in ``v.dtype``, the state float32.

    Shapes: q, k [..., L, Hk, Dk], v [..., L, Hv, Dv], g [..., L, Hv, Dk],
    beta [..., L, Hv], initial_state [..., Hv, Dk, Dv]
    -> (o [..., L, Hv, Dv], float32 [..., Hv, Dk, Dv]).
    """
    scale, rep = check_inputs(q, k, v, g, beta, scale=scale, qk_l2norm=qk_l2norm, initial_state=initial_state,
                              per_channel=True)
    o, final = recurrent_core(*(jnp.asarray(t) for t in (q, k, v, g, beta)), initial_state, scale=scale,
                              qk_l2norm=qk_l2norm, rep=rep, per_channel=True)
    return o.astype(jnp.asarray(v).dtype), final


def chunked(q, k, v, g, beta, *, chunk_size=64, scale=None, initial_state=None,
            qk_l2norm=False) -> tuple[jax.Array, jax.Array]:
    """KDA by chunks: ``(o, final_state)``, equal to :func:`recurrent`.

    transformers' ``chunk_kimi_delta_attention`` (fla ``naive_chunk_kda``,
    ``chunk_kda``), the UT transform as a triangular solve. Arguments as
    :func:`recurrent`, plus ``chunk_size`` (64 in transformers and fla).
    Lengths not a multiple of the chunk are padded with ``g = 0``,
    ``beta = 0``, so the final state is exact. Memory O(B Hv chunk^2 Dk) for
    the chunk in flight.
    """
    chunk = checks.integer("chunk_size", chunk_size, minimum=1)
    chunk = min(chunk, max(1, jnp.shape(q)[-3]))  # a sequence shorter than a chunk: one chunk of it, not padded
    scale, rep = check_inputs(q, k, v, g, beta, scale=scale, qk_l2norm=qk_l2norm, initial_state=initial_state,
                              per_channel=True)
    o, final = _chunked(*(jnp.asarray(t) for t in (q, k, v, g, beta)), initial_state, chunk=chunk, scale=scale,
                        qk_l2norm=qk_l2norm, rep=rep)
    return o.astype(jnp.asarray(v).dtype), final


@functools.partial(jax.jit, static_argnames=("chunk", "scale", "qk_l2norm", "rep"))
def _chunked(q, k, v, g, beta, initial_state, *, chunk, scale, qk_l2norm, rep):
    q, k, v, g, b, s0 = prepare(q, k, v, g, beta, initial_state, scale=scale, qk_l2norm=qk_l2norm, rep=rep,
                                per_channel=True)
    length = q.shape[-3]
    # chunks first, then head-major: [Nc, ..., H, C, D]
    qc, kc, vc, gc = (jnp.moveaxis(jnp.moveaxis(to_chunks(t, chunk, -3), -2, -4), -3, 0) for t in (q, k, v, g))
    bc = jnp.moveaxis(jnp.moveaxis(to_chunks(b, chunk, -2), -1, -3), -2, 0)    # [Nc, ..., H, C]
    gcum = jnp.cumsum(gc, axis=-2)
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    strict = jnp.tril(lower, -1)

    def one(s, inputs):
        q_i, k_i, v_i, g_i, b_i = inputs
        # exp(G_i - G_j) per channel for j <= i; masked before the exp, which would overflow above
        pair = jnp.exp(jnp.where(lower[:, :, None], g_i[..., :, None, :] - g_i[..., None, :, :], -jnp.inf))
        kb = k_i * b_i[..., None]
        a_strict = jnp.where(strict, einsum("...id,...jd,...ijd->...ij", kb, k_i, pair), 0.0)
        u = solve_unit_lower(a_strict, v_i * b_i[..., None])
        w = solve_unit_lower(a_strict, kb * jnp.exp(g_i))
        a_qk = einsum("...id,...jd,...ijd->...ij", q_i, k_i, pair)            # zero above the diagonal
        v_new = u - mm(w, s)
        o_i = mm(q_i * jnp.exp(g_i), s) + mm(a_qk, v_new)
        last = g_i[..., -1:, :]
        s = s * jnp.swapaxes(jnp.exp(last), -1, -2) + mm(jnp.swapaxes(k_i * jnp.exp(last - g_i), -1, -2), v_new)
        return s, o_i

    final, o = jax.lax.scan(one, s0, (qc, kc, vc, gcum, bc))                  # o [Nc, ..., H, C, Dv]
    o = jnp.moveaxis(jnp.moveaxis(o, 0, -3), -4, -2)                           # [..., Nc, C, H, Dv]
    return from_chunks(o, length, -4), final
