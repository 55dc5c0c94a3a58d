"""Normalising the values, and HybridNorm: QKV-norm in attention, post-norm around the FFN.

**Value norm** (:func:`value_norm`; Gemma 4, transformers ``models/gemma4``
``Gemma4TextAttention``): ``v <- v * (mean(v^2) + eps)^(-1/2)`` per head over
``Dh``, RMSNorm without a gain (``Gemma4RMSNorm(head_dim, eps=rms_norm_eps,
with_scale=False)``, ``rms_norm_eps = 1e-6``), on the values after the
projection (values take no RoPE). Gemma 4 normalises q and k the same way with
a gain (``q_norm``, ``k_norm``, gain initialised to ones, no ``1 + w``).

**HybridNorm** (Zhuo et al. 2025, arXiv 2503.04598; ``BryceZhuo/HybridNorm``,
OLMo's ``olmo/model.py`` with ``attn_norm: false``, ``use_query_norm``,
``use_key_norm``, ``use_value_norm: true``, ``ffn_norm: true``,
``ffn_residual_after_norm: true``):

    Y = X + Attention_QKVnorm(X)          q, k, v each RMS-normalised per head (:func:`qkv_norm`)
    X_next = N(Y) + FFN(N(Y))             the FFN's residual starts from the normalised stream

No norm before the QKV projection; the decoder keeps its final norm.
HybridNorm* (the README's ``norm_pos_special_config
"{0: {'attn_norm': True, 'ffn_residual': False}}"``) makes the first layer
pre-norm in both sublayers (``X + Attention_QKVnorm(N_a(X))``, then ``Y +
FFN(N(Y))``): :func:`block` with ``attention_norm``.

A model placement therefore (1) normalises q, k (before RoPE) and v per head
inside attention, (2) feeds attention the un-normalised stream, (3) replaces
the FFN's pre-norm residual ``Y + FFN(N(Y))`` by ``N(Y) + FFN(N(Y))``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks

_F32 = jnp.float32

GEMMA4_EPS = 1e-6  # Gemma4TextConfig.rms_norm_eps
OLMO_EPS = 1e-5  # OLMo's layer_norm_eps, HybridNorm's QKV-norm eps


def _rms(x32, eps):
    return x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)


def value_norm(v, *, eps=GEMMA4_EPS):
    """Gemma 4's value norm: ``v / sqrt(mean(v^2) + eps)`` over the last axis, no gain.

    Args:
      v: ``[..., L, Hkv, Dh]`` (any shape: normalised over the last axis).
      eps: > 0.
    Returns:
      like ``v`` (float32 inside).
    """
    eps = checks.number("eps", eps, positive=True)
    v = jnp.asarray(v)
    return _rms(v.astype(_F32), eps).astype(v.dtype)


def qkv_norm(q, k, v, q_scale, k_scale, v_scale, *, eps=OLMO_EPS):
    """HybridNorm's QKV-norm: RMSNorm with a gain ``[Dh]`` on each head of q, k and v.

    OLMo's ``RMSLayerNorm``: statistics in float32, the normalised value cast
    to the input dtype, then multiplied by the gain (initialised to ones).

    Args:
      q: ``[..., L, H, Dh]``; k, v: ``[..., L, Hkv, Dh]``.
      q_scale, k_scale, v_scale: ``[Dh]``.
      eps: > 0 (OLMo's 1e-5).
    Returns:
      ``(q, k, v)`` with their shapes and dtypes.
    """
    eps = checks.number("eps", eps, positive=True)
    out = []
    for name, x, g in (("q", q, q_scale), ("k", k, k_scale), ("v", v, v_scale)):
        x = jnp.asarray(x)
        if jnp.shape(g) != (x.shape[-1],):
            raise ValueError(f"{name}_scale shape {jnp.shape(g)} does not match the head_dim of {name} with "
                             f"shape {tuple(x.shape)}; expected ({x.shape[-1]},)")
        out.append(_rms(x.astype(_F32), eps).astype(x.dtype) * jnp.asarray(g).astype(x.dtype))
    return tuple(out)


def block(x, attention, mlp, norm, *, attention_norm=None):
    """One HybridNorm decoder layer (``attention`` applies the QKV-norm inside).

    Args:
      x: ``[..., D]``.
      attention: ``[..., D] -> [..., D]``, normalising q, k, v itself.
      mlp: ``[..., D] -> [..., D]``.
      norm: the FFN norm ``N``.
      attention_norm: None for HybridNorm (``X + Attention(X)``, then ``N(Y) +
        FFN(N(Y))``); a norm for HybridNorm*'s first layer (``X +
        Attention(N_a(X))``, then ``Y + FFN(N(Y))``).
    Returns:
      ``[..., D]`` in ``x.dtype``.
    """
    if attention_norm is None:
        y = (x + attention(x)).astype(x.dtype)
        n = norm(y)
        return (n + mlp(n)).astype(x.dtype)
    y = (x + attention(attention_norm(x))).astype(x.dtype)
    return (y + mlp(norm(y))).astype(x.dtype)
