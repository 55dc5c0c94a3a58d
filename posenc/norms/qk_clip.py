"""QK-Clip (MuonClip): cap each head's attention logits by shrinking its query and key weights.

Kimi Team 2025, "Kimi K2: Open Agentic Intelligence" (arXiv 2507.20534), section
2.1 and Algorithm 1. After an optimizer step, each head ``h`` whose largest
pre-softmax logit ``S_h`` seen in the step's forward passes (over the batch,
queries and keys, after the ``1/sqrt(Dh)`` scale) exceeds ``tau`` gets

    gamma_h = min(1, tau / S_h)
    W_q^h <- gamma_h^alpha W_q^h,   W_k^h <- gamma_h^(1 - alpha) W_k^h

so that its logits (bilinear in the two weights) shrink by ``gamma_h``: the
largest becomes ``tau``. Kimi K2 uses ``tau = 100`` and ``alpha = 1/2`` (each
side ``sqrt(gamma)``), as do Megatron-LM's defaults (``qk_clip_threshold =
100``, ``qk_clip_alpha = 0.5``, ``megatron/core/transformer/attention.py``
``SelfAttention.clip_qk``). With grouped-query attention a key serves several
query heads: Megatron takes ``S`` as the maximum over the heads of each KV
group and scales the group's query heads by ``gamma^alpha`` and its key head
by ``gamma^(1 - alpha)`` (:func:`clip`; per head when ``Hkv == H``).

MLA (:func:`clip_mla`; ``multi_latent_attention.py`` ``MLASelfAttention.
clip_qk``): the per-head non-rotary parts ``q_nope``, ``k_nope`` take
``gamma^alpha`` and ``gamma^(1 - alpha)``, the per-head rotary query ``q_rope``
takes ``gamma``, and the rotary key shared by all heads is left untouched (it
cannot be scaled per head); every logit ``q_nope.k_nope + q_rope.k_rope``
again shrinks by ``gamma``.

The functions act on weight arrays: ``head_axis`` names the axis that indexes
heads (posenc's ``wq [D, H, Dh]``: ``head_axis=1``; a PyTorch ``[H * Dh, D]``
weight reshaped to ``[H, Dh, D]``: ``head_axis=0``). A bias of q or k (``[H,
Dh]``) scales like its weight: apply :func:`scale_heads` with the factors of
:func:`clip_scales`. Factors are computed in float32; arrays keep their dtype.
A head with ``S <= tau`` (also ``S = -inf``: nothing attended) keeps factor 1.
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc import checks

_F32 = jnp.float32

THRESHOLD = 100.0  # tau of Kimi K2 and Megatron's qk_clip_threshold default
ALPHA = 0.5  # Megatron's qk_clip_alpha: the query's share of the factor


def max_logit_per_head(logits, mask=None):
    """Largest attention logit of each head over every other axis (batch, queries, keys).

    Args:
      logits: ``[..., H, Lq, Lk]`` pre-softmax logits (after the attention scale).
      mask: broadcastable to ``logits`` (True = attended), or None.
    Returns:
      float32 ``[H]`` (``-inf`` for a head with no attended entry).
    """
    x = jnp.asarray(logits)
    if x.ndim < 3:
        raise ValueError(f"logits must be [..., H, Lq, Lk]; got shape {tuple(x.shape)}")
    x = x.astype(_F32)
    if mask is not None:
        x = jnp.where(mask, x, -jnp.inf)
    axes = tuple(i for i in range(x.ndim) if i != x.ndim - 3)
    return jnp.max(x, axis=axes)


def _threshold(threshold) -> float:
    return checks.number("threshold", threshold, positive=True)


def _alpha(alpha) -> float:
    return checks.number("alpha", alpha, minimum=0.0, maximum=1.0)


def clip_factors(max_logits, *, threshold=THRESHOLD):
    """Per-head factor ``gamma = min(1, tau / S)`` (1 where ``S <= tau``), float32, shape of ``max_logits``."""
    tau = _threshold(threshold)
    s = jnp.asarray(max_logits).astype(_F32)
    return jnp.where(s > tau, tau / jnp.where(s > tau, s, 1.0), 1.0)


def _group_max(max_logits, num_kv_heads: int):
    s = jnp.asarray(max_logits).astype(_F32)
    if s.ndim != 1:
        raise ValueError(f"max_logits must be [H]; got shape {tuple(s.shape)}")
    num_heads = s.shape[0]
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"the number of query heads ({num_heads}) must be a multiple of the number of "
                         f"key heads ({num_kv_heads})")
    # query head h reads key head h // (H / Hkv), as posenc's attention and Megatron's fused QKV
    return jnp.max(s.reshape(num_kv_heads, num_heads // num_kv_heads), axis=1)


def clip_scales(max_logits, *, num_kv_heads, threshold=THRESHOLD, alpha=ALPHA):
    """The multipliers of :func:`clip`: ``(q_scale [H], k_scale [Hkv])``, float32.

    ``gamma`` per KV group from the group's largest logit; ``q_scale`` repeats
    ``gamma^alpha`` over the group's query heads, ``k_scale = gamma^(1 - alpha)``.
    """
    num_kv_heads = checks.integer("num_kv_heads", num_kv_heads, minimum=1)
    a = _alpha(alpha)
    gamma = clip_factors(_group_max(max_logits, num_kv_heads), threshold=threshold)
    num_heads = jnp.shape(max_logits)[0]
    q_scale = jnp.repeat(gamma ** a, num_heads // num_kv_heads)
    return q_scale, gamma ** (1.0 - a)


def scale_heads(w, scale, *, head_axis):
    """``w`` with its slices along ``head_axis`` multiplied by ``scale [H]`` (in float32, cast back)."""
    w = jnp.asarray(w)
    axis = checks.integer("head_axis", head_axis, minimum=-w.ndim, maximum=w.ndim - 1) % w.ndim
    scale = jnp.asarray(scale, _F32)
    if scale.shape != (w.shape[axis],):
        raise ValueError(f"scale shape {tuple(scale.shape)} does not match axis {head_axis} of w with shape "
                         f"{tuple(w.shape)}; expected ({w.shape[axis]},)")
    shape = [1] * w.ndim
    shape[axis] = w.shape[axis]
    return (w.astype(_F32) * scale.reshape(shape)).astype(w.dtype)


def clip(w_q, w_k, max_logits, *, head_axis, threshold=THRESHOLD, alpha=ALPHA):
    """QK-Clip of a (grouped-query) attention layer's query and key weights.

    Args:
      w_q: query weights with ``H`` heads along ``head_axis`` (e.g. ``[D, H, Dh]``).
      w_k: key weights with ``Hkv`` heads along ``head_axis`` (``H`` a multiple of ``Hkv``).
      max_logits: ``[H]`` largest logit per query head (:func:`max_logit_per_head`,
        maximised over the step's micro-batches and data-parallel replicas).
      head_axis: the head axis of both weights.
      threshold: ``tau`` > 0 (100).
      alpha: the query's share in [0, 1] (0.5: ``sqrt(gamma)`` on each side).
    Returns:
      ``(w_q, w_k)`` rescaled, shapes and dtypes kept.
    """
    w_q, w_k = jnp.asarray(w_q), jnp.asarray(w_k)
    if w_q.ndim != w_k.ndim:
        raise ValueError(f"w_q and w_k must have the same rank; got shapes {tuple(w_q.shape)} and "
                         f"{tuple(w_k.shape)}")
    axis = checks.integer("head_axis", head_axis, minimum=-w_q.ndim, maximum=w_q.ndim - 1)
    if jnp.shape(max_logits) != (w_q.shape[axis],):
        raise ValueError(f"max_logits must be [H] = ({w_q.shape[axis]},) for w_q with shape "
                         f"{tuple(w_q.shape)} and head_axis={head_axis}; got shape {jnp.shape(max_logits)}")
    q_scale, k_scale = clip_scales(max_logits, num_kv_heads=w_k.shape[axis], threshold=threshold,
                                   alpha=alpha)
    return scale_heads(w_q, q_scale, head_axis=axis), scale_heads(w_k, k_scale, head_axis=axis)


def clip_mla(w_q_nope, w_q_rope, w_k_nope, max_logits, *, head_axis, threshold=THRESHOLD, alpha=ALPHA):
    """QK-Clip of multi-head latent attention (Kimi K2, DeepSeek-V3 MLA).

    ``q_nope <- gamma^alpha q_nope``, ``q_rope <- gamma q_rope``, ``k_nope <-
    gamma^(1 - alpha) k_nope`` per head; the shared rotary key is not touched
    (it is not an argument). ``w_k_nope`` is the key part of the per-head
    up-projection (Megatron's ``linear_kv_up_proj`` rows ``[:qk_head_dim]`` of
    each head; the value rows stay as they are).

    Args:
      w_q_nope, w_q_rope, w_k_nope: weights with ``H`` heads along ``head_axis``.
      max_logits: ``[H]``.
    Returns:
      ``(w_q_nope, w_q_rope, w_k_nope)`` rescaled, shapes and dtypes kept.
    """
    arrays = [jnp.asarray(w) for w in (w_q_nope, w_q_rope, w_k_nope)]
    axis = checks.integer("head_axis", head_axis, minimum=-arrays[0].ndim, maximum=arrays[0].ndim - 1)
    heads = {w.shape[axis] if -w.ndim <= axis < w.ndim else None for w in arrays}
    if len(heads) != 1 or jnp.shape(max_logits) != (arrays[0].shape[axis],):
        raise ValueError(f"w_q_nope, w_q_rope, w_k_nope and max_logits must share H heads along head_axis="
                         f"{head_axis}; got shapes {[tuple(w.shape) for w in arrays]} and max_logits shape "
                         f"{jnp.shape(max_logits)}")
    a = _alpha(alpha)
    gamma = clip_factors(max_logits, threshold=threshold)
    return (scale_heads(arrays[0], gamma ** a, head_axis=axis), scale_heads(arrays[1], gamma, head_axis=axis),
            scale_heads(arrays[2], gamma ** (1.0 - a), head_axis=axis))
