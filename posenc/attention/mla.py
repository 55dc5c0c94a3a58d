"""Multi-head latent attention (MLA): DeepSeek-V2 / V3's low-rank key-value compression.

DeepSeek-AI 2024, "DeepSeek-V2" (arXiv 2405.04434) section 2.1; official code
``deepseek-ai/DeepSeek-V3`` ``inference/model.py`` (class ``MLA``). With x
[..., L, D], per head h (N = qk_nope_head_dim, R = qk_rope_head_dim, V =
v_head_dim, C = kv_lora_rank, Cq = q_lora_rank)::

    [q_nope_h | q_pe_h] = x W_q              (Cq = 0)  or  RMSNorm(x W_qa) W_qb
    [c | k_pe]          = x W_kva            c [C]: the latent, k_pe [R]: one rotary key for all heads
    c                   = RMSNorm(c)
    [k_nope_h | v_h]    = c W_kvb,h          W_kvb [C, H, N + V]
    s_hij = scale (q_nope_hi . k_nope_hj + rot(q_pe_hi) . rot(k_pe_j))

The rotation ``rot`` (the RoPE family) acts on the R-wide parts only; the
"nope" parts carry no position. A cache holds ``c`` and the rotated ``k_pe``
(C + R numbers per token for every head). Decoding may use the absorbed form
(the official ``attn_impl="absorb"``): ``W_kvb``'s key part moves into the
query and its value part after the weights::

    q_abs_hi = q_nope_hi W_kvb,h[:, :N]^T         [C]
    s_hij    = scale (q_abs_hi . c_j + rot(q_pe_hi) . rot(k_pe_j))
    out_hi   = (sum_j w_hij c_j) W_kvb,h[:, N:]     [V]

which is multi-query attention over keys ``[c | rot(k_pe)]`` and values ``c``
(one key head) followed by a per-head projection: :func:`absorb_query`,
:func:`absorbed_keys`, :func:`absorbed_output`. The explicit and absorbed
forms give the same logits and outputs up to rounding.

The softmax scale is ``(N + R)^-1/2`` times ``m^2`` with YaRN's magnitude
``m = 0.1 mscale ln(factor) + 1`` when the context is extended
(:func:`softmax_scale`; the official ``softmax_scale``, Hugging Face's
``mscale_all_dim``).

Weights: ``wq`` [D, H, N + R] or ``wq_a`` [D, Cq], ``q_norm`` [Cq], ``wq_b``
[Cq, H, N + R]; ``wkv_a`` [D, C + R]; ``kv_norm`` [C]; ``wkv_b`` [C, H, N + V].
Float32 statistics in the norms; outputs in the input dtype.
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc.encodings.rope import rope_scaling_math
from posenc.norms import norms

__all__ = ["LATENT_EPS", "absorb_query", "absorbed_keys", "absorbed_output", "absorbed_scores", "expand",
           "explicit_scores", "latent", "queries", "softmax_scale", "yarn_mscale"]

LATENT_EPS = 1e-6  # eps of the q and kv latents' RMSNorms: the RMSNorm default of the official and HF code


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude ``0.1 mscale ln(factor) + 1`` (1 when factor <= 1)."""
    return rope_scaling_math.mscale(float(factor), float(mscale))


def softmax_scale(qk_head_dim: int, *, factor: float = 1.0, mscale: float = 0.0) -> float:
    """``qk_head_dim^-1/2``, times ``yarn_mscale(factor, mscale)^2`` when ``mscale`` > 0.

    The official code multiplies by ``m^2`` when ``max_seq_len > original_seq_len``
    (its ``mscale`` argument); Hugging Face's DeepSeek-V3 when ``rope_scaling`` has
    ``mscale_all_dim`` (passed here as ``mscale``).
    """
    if int(qk_head_dim) < 1:
        raise ValueError(f"qk_head_dim must be a positive int; got {qk_head_dim!r}")
    scale = float(qk_head_dim) ** -0.5
    if mscale:
        scale *= yarn_mscale(factor, mscale) ** 2
    return scale


def _dot(x, w):
    """x [..., D] times w [D, ...] -> [..., ...] (float32 accumulation, x's dtype out)."""
    out = jnp.tensordot(x, w.astype(x.dtype), axes=1, preferred_element_type=jnp.float32)
    return out.astype(x.dtype)


def queries(x, *, wq=None, wq_a=None, q_norm=None, wq_b=None, qk_nope_head_dim, eps=LATENT_EPS):
    """x [..., L, D] -> (q_nope [..., L, H, N], q_pe [..., L, H, R]), not rotated.

    ``wq`` [D, H, N + R] (q_lora_rank 0), or the low-rank ``wq_a`` [D, Cq], RMSNorm
    gain ``q_norm`` [Cq] and ``wq_b`` [Cq, H, N + R].
    """
    if (wq is None) == (wq_a is None):
        raise ValueError("give either wq (q_lora_rank 0) or wq_a, q_norm and wq_b")
    if wq is not None:
        q = _dot(x, wq)
    else:
        q = _dot(norms.rms_norm(_dot(x, wq_a), q_norm, eps=eps), wq_b)
    return q[..., :qk_nope_head_dim], q[..., qk_nope_head_dim:]


def latent(x, wkv_a, kv_norm, *, eps=LATENT_EPS):
    """x [..., L, D] -> (c [..., L, C]: the normalised latent, k_pe [..., L, R]: the shared rotary
    key, not rotated); ``wkv_a`` [D, C + R], ``kv_norm`` [C]."""
    kv = _dot(x, wkv_a)
    c, k_pe = kv[..., :kv_norm.shape[-1]], kv[..., kv_norm.shape[-1]:]
    return norms.rms_norm(c, kv_norm, eps=eps), k_pe


def expand(c, wkv_b, *, qk_nope_head_dim):
    """The latent c [..., L, C] -> (k_nope [..., L, H, N], v [..., L, H, V]); wkv_b [C, H, N + V]."""
    kv = _dot(c, wkv_b)
    return kv[..., :qk_nope_head_dim], kv[..., qk_nope_head_dim:]


def explicit_scores(q_nope, q_pe, k_nope, k_pe, *, scale):
    """float32 [..., H, Lq, Lk]: ``scale (q_nope . k_nope + q_pe . k_pe)``; q_* [..., Lq, H, .],
    k_nope [..., Lk, H, N], k_pe [..., Lk, R] (shared by the heads; rotated by the caller)."""
    s = jnp.einsum("...qhd,...khd->...hqk", q_nope, k_nope, preferred_element_type=jnp.float32)
    s = s + jnp.einsum("...qhr,...kr->...hqk", q_pe, k_pe, preferred_element_type=jnp.float32)
    return s * scale


def absorb_query(q_nope, wkv_b, *, qk_nope_head_dim):
    """q_nope [..., L, H, N] -> [..., L, H, C]: ``q_nope_h W_kvb,h[:, :N]^T`` (the key part absorbed)."""
    wk = wkv_b[..., :qk_nope_head_dim].astype(q_nope.dtype)  # [C, H, N]
    return jnp.einsum("...hn,chn->...hc", q_nope, wk, preferred_element_type=jnp.float32).astype(q_nope.dtype)


def absorbed_keys(c, k_pe):
    """The absorbed form's one key head: [c | k_pe] -> [..., L, 1, C + R] (k_pe rotated)."""
    return jnp.concatenate([c, k_pe.astype(c.dtype)], axis=-1)[..., None, :]


def absorbed_scores(q_abs, q_pe, c, k_pe, *, scale):
    """float32 [..., H, Lq, Lk]: ``scale (q_abs . c + q_pe . k_pe)``; q_abs [..., Lq, H, C],
    c [..., Lk, C], k_pe [..., Lk, R]."""
    s = jnp.einsum("...qhc,...kc->...hqk", q_abs, c, preferred_element_type=jnp.float32)
    s = s + jnp.einsum("...qhr,...kr->...hqk", q_pe, k_pe, preferred_element_type=jnp.float32)
    return s * scale


def absorbed_output(out_latent, wkv_b, *, qk_nope_head_dim):
    """Attention over the latent values [..., L, H, C] -> [..., L, H, V]: times ``W_kvb,h[:, N:]``."""
    wv = wkv_b[..., qk_nope_head_dim:].astype(out_latent.dtype)  # [C, H, V]
    out = jnp.einsum("...hc,chv->...hv", out_latent, wv, preferred_element_type=jnp.float32)
    return out.astype(out_latent.dtype)

