"""Training-stability tools: QK-norm, z-loss, embedding scale and diagnostics.

Shapes: ``q`` ``[..., L, H, Dh]``, ``k`` ``[..., L, Hkv, Dh]`` (``H`` a
multiple of ``Hkv``: grouped-query attention); attention logits and weights
``[..., H, Lq, Lk]``; output logits ``[..., V]``. Losses and diagnostics are
float32 scalars computed in float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks, norms

_F32 = jnp.float32


def _check_qk(q, k) -> None:
    if q.ndim < 3 or k.ndim < 3:
        raise ValueError(
            f"q and k must be [..., L, H, Dh]; got shapes {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k head_dim differ: q shape {tuple(q.shape)}, k shape {tuple(k.shape)}"
        )
    if q.shape[-2] % k.shape[-2]:
        raise ValueError(
            f"q heads ({q.shape[-2]}) must be a multiple of k heads ({k.shape[-2]}); "
            f"got q shape {tuple(q.shape)}, k shape {tuple(k.shape)}"
        )


def _rms_full(x, scale, eps):
    # OLMo 2 normalises the whole projection (H * Dh) before splitting heads.
    flat = x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])
    return norms.rms_norm(flat, scale, eps=eps).reshape(x.shape)


def _rms_plain(x, eps):
    x32 = x.astype(_F32)
    return (x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)).astype(x.dtype)


# name -> (description, param names, keywords of qk_norm_init it uses)
QK_NORMS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "none": ("no QK normalisation", (), ()),
    "layer": ("LayerNorm without bias over head_dim (ViT-22B)", ("q_scale", "k_scale"), ()),
    "rms": ("RMSNorm per head over head_dim (Gemma 3, Qwen 3)", ("q_scale", "k_scale"), ()),
    "rms_full": ("RMSNorm over the full q / k projection (OLMo 2)", ("q_scale", "k_scale"), ()),
    "l2": ("L2 normalisation with a learned temperature (cosine attention)", ("temperature",),
           ("l2_temperature",)),
    "rms_plain": ("RMSNorm per head over head_dim without a gain (Llama 4's Llama4TextL2Norm)",
                  (), ()),
}


def qk_norm(kind, q, k, params, *, eps=None):
    """Normalise queries and keys before the dot product (and before RoPE).

    Dehghani et al. 2023 (ViT-22B) stabilise attention-logit growth this way
    (also Wortsman et al. 2023). Kinds (:data:`QK_NORMS`):

    - ``none``: unchanged.
    - ``layer``: LayerNorm without bias over ``Dh``; ``q_scale``, ``k_scale``
      ``[Dh]`` shared by heads (ViT-22B).
    - ``rms``: RMSNorm per head over ``Dh``; scales ``[Dh]`` (Gemma 3, Qwen 3).
    - ``rms_full``: RMSNorm over the whole projection ``H * Dh`` (OLMo 2);
      ``q_scale`` ``[H * Dh]``, ``k_scale`` ``[Hkv * Dh]``.
    - ``l2``: ``q <- t * q / ||q||``, ``k <- k / ||k||`` with a learned scalar
      temperature ``t`` (cosine attention).
    - ``rms_plain``: ``x * rsqrt(mean(x^2) + eps)`` per head, no parameters
      (HF ``Llama4TextL2Norm``: ``sqrt(Dh) x / ||x||`` up to eps; Llama 4
      applies it after RoPE: ``model.norm.qk_norm_after_rope``).

    Args:
      kind: a QK_NORMS name.
      q: ``[..., L, H, Dh]``.
      k: ``[..., L, Hkv, Dh]``.
      params: dict from :func:`qk_norm_init`.
      eps: > 0, default 1e-6; ``none`` takes no eps (passing one is a ValueError).
    Returns:
      ``(q, k)`` with their shapes and dtypes.
    """
    checks.choice("qk_norm", kind, QK_NORMS)
    if kind == "none" and eps is not None:
        raise ValueError(f"qk_norm 'none' does not use eps; got eps={eps!r}")
    eps = 1e-6 if eps is None else eps
    _check_qk(q, k)
    expected = tuple(sorted(QK_NORMS[kind][1]))
    got = tuple(sorted(params))
    if got != expected:
        raise ValueError(
            f"qk_norm {kind!r} expects params with keys ({', '.join(expected)}); "
            f"got ({', '.join(got)})"
        )
    if kind == "none":
        return q, k
    if kind == "layer":
        return (
            norms.layer_norm(q, params["q_scale"], eps=eps),
            norms.layer_norm(k, params["k_scale"], eps=eps),
        )
    if kind == "rms":
        return (
            norms.rms_norm(q, params["q_scale"], eps=eps),
            norms.rms_norm(k, params["k_scale"], eps=eps),
        )
    if kind == "rms_full":
        return _rms_full(q, params["q_scale"], eps), _rms_full(k, params["k_scale"], eps)
    if kind == "rms_plain":
        return _rms_plain(q, eps), _rms_plain(k, eps)
    # l2: the temperature restores a usable logit range after normalising.
    t = jnp.asarray(params["temperature"], _F32)
    if t.shape != ():
        raise ValueError(f"temperature must be a scalar (shape ()); got shape {t.shape}")
    q_hat = norms.l2_normalize(q.astype(_F32), eps=eps)
    return (t * q_hat).astype(q.dtype), norms.l2_normalize(k, eps=eps)


def qk_norm_init(kind, num_heads, num_kv_heads, head_dim, *, l2_temperature=None):
    """Initial float32 parameters of :func:`qk_norm`.

    layer / rms: ``q_scale``, ``k_scale`` ones ``[Dh]``; rms_full: ones
    ``[H * Dh]`` and ``[Hkv * Dh]``; l2: ``temperature`` scalar, default
    ``head_dim``: with the usual ``1 / sqrt(Dh)`` attention scale the logits
    start at ``sqrt(Dh) * cos(q, k)``, the softmax scale of nGPT (Loshchilov
    et al. 2024); none: {}. ``l2_temperature`` with another kind is a ValueError.
    """
    checks.choice("qk_norm", kind, QK_NORMS)
    given = {} if l2_temperature is None else {"l2_temperature": l2_temperature}
    checks.no_extra(f"qk_norm_init of qk_norm {kind!r}", given, allowed=QK_NORMS[kind][2])
    for name, v in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        checks.integer(name, v, minimum=1)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    if kind in ("none", "rms_plain"):
        return {}
    if kind in ("layer", "rms"):
        return {"q_scale": jnp.ones((head_dim,), _F32), "k_scale": jnp.ones((head_dim,), _F32)}
    if kind == "rms_full":
        return {
            "q_scale": jnp.ones((num_heads * head_dim,), _F32),
            "k_scale": jnp.ones((num_kv_heads * head_dim,), _F32),
        }
    t = float(head_dim) if l2_temperature is None else float(l2_temperature)
    return {"temperature": jnp.asarray(t, _F32)}


def z_loss(logits, *, weight=1e-4, mask=None):
    """Auxiliary z-loss ``weight * mean(logsumexp(logits)^2)`` (Chowdhery et al. 2022).

    Pushes the softmax normaliser log Z towards 0 so output logits cannot
    drift (PaLM: weight 1e-4; OLMo 2: 1e-5).

    Args:
      logits: ``[..., V]``.
      weight: the coefficient lambda.
      mask: ``[...]`` (bool or 0/1), True where the position counts; None = all.
    Returns:
      float32 scalar, the mean over unmasked positions (0 if none).
    """
    log_z = _logsumexp(logits)
    sq = jnp.square(log_z)
    if mask is None:
        return weight * jnp.mean(sq)
    m = jnp.broadcast_to(jnp.asarray(mask, _F32), sq.shape)
    return weight * jnp.sum(sq * m) / jnp.maximum(jnp.sum(m), 1.0)


def _logsumexp(logits):
    return jax.nn.logsumexp(jnp.asarray(logits).astype(_F32), axis=-1)


def embed_scale(dim, dtype):
    """Token-embedding multiplier ``sqrt(dim)`` cast to ``dtype`` (Vaswani et al. 2017; Gemma).

    Gemma casts the normaliser to the activation dtype, so in bf16
    ``sqrt(3072) = 55.43`` becomes 55.5.
    """
    checks.integer("dim", dim, minimum=1)
    return jnp.asarray(math.sqrt(dim), dtype)


def max_attention_logit(logits, mask=None):
    """Largest attention logit over valid entries (Wortsman et al. 2023 track its growth).

    Args:
      logits: ``[..., H, Lq, Lk]`` pre-softmax.
      mask: broadcastable to ``logits`` (True = attended), or None.
    Returns:
      float32 scalar (-inf if every entry is masked).
    """
    x = jnp.asarray(logits).astype(_F32)
    if mask is not None:
        x = jnp.where(mask, x, -jnp.inf)
    return jnp.max(x)


def attention_entropy(weights, mask=None):
    """Mean attention entropy ``-sum_j p_ij log p_ij`` over heads and valid queries.

    Collapse of this entropy signals attention-logit growth (Zhai et al.
    2023; Wortsman et al. 2023). Terms with ``p = 0`` count as 0, with
    finite gradients.

    Args:
      weights: ``[..., H, Lq, Lk]`` softmax output.
      mask: broadcastable to ``weights`` (True = attended), or None. Masked
        entries are left out; a query with no attended key is left out of
        the mean.
    Returns:
      float32 scalar in nats (uniform over ``Lk`` keys: ``log Lk``).
    """
    p = jnp.asarray(weights).astype(_F32)
    valid = p > 0
    if mask is not None:
        valid = valid & jnp.asarray(mask, bool)
    # log of a safe value so the unused branch of where() has no NaN gradient.
    plogp = jnp.where(valid, p * jnp.log(jnp.where(valid, p, 1.0)), 0.0)
    ent = -jnp.sum(plogp, axis=-1)
    if mask is None:
        return jnp.mean(ent)
    q_valid = jnp.any(jnp.broadcast_to(jnp.asarray(mask, bool), p.shape), axis=-1).astype(_F32)
    return jnp.sum(ent * q_valid) / jnp.maximum(jnp.sum(q_valid), 1.0)


def logit_stats(logits):
    """Output-logit diagnostics: ``mean`` of the logits and mean ``log_z`` (logsumexp).

    ``log_z`` drifting away from 0 precedes output-logit divergence
    (Wortsman et al. 2023); z-loss counteracts it.

    Args:
      logits: ``[..., V]``.
    Returns:
      dict(mean=float32 scalar, log_z=float32 scalar).
    """
    x = jnp.asarray(logits).astype(_F32)
    return {"mean": jnp.mean(x), "log_z": jnp.mean(_logsumexp(x))}


def lr_sensitivity(final_losses, initial_loss):
    """Learning-rate sensitivity (Wortsman et al. 2023).

    ``mean over eta of (min(L(eta), L0) - L*)`` with ``L0`` the loss at
    initialisation and ``L* = min over eta of min(L(eta), L0)``. A run that
    diverged (NaN or inf final loss) counts as ``L0``. Lower is more robust.

    Args:
      final_losses: final losses over the LR grid (sequence, array, or dict
        lr -> loss); concrete values.
      initial_loss: ``L0``, finite.
    Returns:
      Python float.
    """
    if isinstance(final_losses, dict):
        final_losses = list(final_losses.values())
    losses = np.asarray(final_losses, np.float64).reshape(-1)
    if losses.size == 0:
        raise ValueError("final_losses is empty; give one final loss per learning rate")
    l0 = float(initial_loss)
    if not math.isfinite(l0):
        raise ValueError(f"initial_loss must be finite; got {initial_loss!r}")
    clipped = np.where(np.isfinite(losses), np.minimum(losses, l0), l0)
    return float(np.mean(clipped - clipped.min()))
