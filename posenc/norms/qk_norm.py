"""QK-norm: normalise queries and keys before their dot product (ViT-22B, OLMo 2, Gemma 3, Llama 4).

Shapes: ``q`` ``[..., L, H, Dh]``, ``k`` ``[..., L, Hkv, Dh]`` (``H`` a
multiple of ``Hkv``: grouped-query attention). ``QK_NORMS`` names every kind
with its parameters; :func:`qk_norm_init` makes them, :func:`qk_norm` applies
them (statistics in float32, output in the input dtype).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.norms import norms

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
