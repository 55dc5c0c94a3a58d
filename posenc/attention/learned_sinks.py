"""Learned attention sinks: one learned logit per head joins every query's softmax and is dropped after it.

gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", arXiv 2508.10925;
official code openai/gpt-oss, ``gpt_oss/torch/model.py``, function ``sdpa``).
Each attention head h has a learned scalar ``s_h``. The logits of a query
(row i) get one extra column holding ``s_h``; the softmax runs over the
keys and that column, and the column is then dropped, so the weights of a
row sum to less than one and the sink's share goes to no value::

    w_ij = exp(l_ij) / (exp(s_h) + sum_k exp(l_ik))            out_i = sum_j w_ij v_j

The sink is not scaled: gpt-oss computes ``l = sm_scale * q.k + mask`` with
``sm_scale = 1 / sqrt(head_dim)`` and appends ``s_h`` after the scaling and
the mask. Its mask is causal plus, on every other layer (``layer_idx % 2 ==
0``), a sliding window of ``sliding_window = 128`` keys counting the query's
own (key j of query i is kept iff ``i - 128 < j <= i``; the triton kernel's
``BANDWIDTH`` is the same). The sink column is never masked. The head index
of ``sinks`` is the query head (``n_heads`` KV heads times ``q_mult``, KV-major,
as the queries are laid out). With ``s_h = 0`` this is the "softmax + 1"
(off-by-one softmax) ``exp(l_ij) / (1 + sum_k exp(l_ik))``.

A row whose keys are all masked (-inf, or a large finite negative) gets
zero weights: the finite sink keeps the denominator positive.

Blocked / flash attention keeps a running max ``m`` and sum ``l = sum_k
exp(l_ik - m)`` per row and an unnormalised accumulator ``acc = sum_k
exp(l_ik - m) v_k``. The sink enters the denominator only: :func:`normalizer`
turns ``(m, l)`` into the sink-including pair and :func:`output_scale` gives the
factor that maps ``acc`` to the output (the official triton kernel starts its
running max at the sink and adds ``exp(sink - m)`` to ``l`` at the end; the
result is the same).

Shapes: logits [..., H, Lq, Lk], sinks [H]; running max / sum [..., H, Lq].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def _sinks(sinks, num_heads: int) -> jax.Array:
    sinks = jnp.asarray(sinks)
    if sinks.shape != (num_heads,):
        raise ValueError(f"sinks must have shape [H] = ({num_heads},) to match the heads axis; got {sinks.shape}")
    return sinks.astype(_F32)


def softmax(logits, sinks) -> jax.Array:
    """Softmax over the keys with one learned sink logit per head in the denominator.

    ``w_ij = exp(l_ij - m_i) / (exp(s_h - m_i) + sum_k exp(l_ik - m_i))``,
    ``m_i = max(s_h, max_k l_ik)``. Masked logits may be -inf (or any large
    finite negative); a fully masked row gives zeros, no NaN. float32 math,
    output in the dtype of ``logits``.

    Shapes: logits [..., H, Lq, Lk], sinks [H] -> like logits.
    """
    logits = jnp.asarray(logits)
    if logits.ndim < 3:
        raise ValueError(f"logits must have shape [..., H, Lq, Lk]; got {logits.shape}")
    s = _sinks(sinks, logits.shape[-3])[:, None, None]
    x = logits.astype(_F32)
    m = jax.lax.stop_gradient(jnp.maximum(jnp.max(x, axis=-1, keepdims=True), s))
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # a sink of -inf on a fully masked row
    e = jnp.exp(x - m)
    denom = jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(s - m)
    return (e / jnp.where(denom > 0, denom, 1.0)).astype(logits.dtype)


def normalizer(m, l, sinks) -> tuple[jax.Array, jax.Array]:
    """A running softmax normaliser ``(m, l)`` with the sink added: ``(m', l')``.

    ``m' = max(m, s_h)`` and ``l' = l exp(m - m') + exp(s_h - m')``, so that
    ``m' + log l' = log(exp(s_h) + sum_k exp(l_ik))`` (the sink-including
    log-sum-exp). ``m`` may be -inf or a large finite negative (a row with
    no key seen). The accumulator must follow the same shift: see
    :func:`output_scale`.

    Shapes: m, l [..., H, Lq] (float32), sinks [H] -> float32 [..., H, Lq] each.
    """
    m, l = jnp.asarray(m, _F32), jnp.asarray(l, _F32)
    if m.ndim < 2 or m.shape != l.shape:
        raise ValueError(f"m and l must have the same shape [..., H, Lq]; got {m.shape} and {l.shape}")
    s = _sinks(sinks, m.shape[-2])[:, None]
    m_new = jnp.maximum(m, s)
    m_new = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    return m_new, l * jnp.exp(m - m_new) + jnp.exp(s - m_new)


def output_scale(m, l, sinks) -> jax.Array:
    """Factor that turns a blocked accumulator into the sink softmax's output.

    With ``acc_i = sum_k exp(l_ik - m_i) v_k`` and ``l_i = sum_k exp(l_ik -
    m_i)`` (running over key blocks), ``out_i = acc_i * output_scale_i``
    where ``output_scale = exp(m - m') / l'`` (:func:`normalizer`); it equals
    ``1 / (l + exp(s_h - m))`` without the overflow that form has when the
    sink is far above every logit. A row with no key seen gets 0.

    Shapes: m, l [..., H, Lq], sinks [H] -> float32 [..., H, Lq].
    """
    m_new, l_new = normalizer(m, l, sinks)
    return jnp.exp(jnp.asarray(m, _F32) - m_new) / l_new
