"""Decoder layers: norm module, MLP, attention sublayer and the residual block.

Parameters are float32 ``nnx.Param``; matmuls run in the compute dtype
(``model.dtype``) by casting the weights at use. Norm math is
``posenc.norms``, residual placements ``posenc.placements``, QK-norm
``posenc.stability.qk_norm``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from posenc import norms, placements, stability
from posenc.model import attention as attn_lib


def lecun_normal(key, shape, fan_in):
    return jax.random.normal(key, shape, jnp.float32) / math.sqrt(fan_in)


def xavier_normal(key, shape, fan_in, fan_out, gain=1.0):
    return gain * math.sqrt(2.0 / (fan_in + fan_out)) * jax.random.normal(key, shape, jnp.float32)


@jax.custom_vjp
def linear(x, w):
    """``x @ w`` for x [..., D], w [D, N] -> [..., N]; same values and gradients as ``x @ w``.

    The weight gradient is ``x^T @ g`` over all leading axes. Autodiff leaves
    XLA:CPU to transpose ``g`` (e.g. the [tokens, 4D] MLP activation
    gradient, fused into the GELU backward with strided writes); here ``x``
    is transposed instead, behind an optimization barrier so the transpose
    is not folded back into the dot. (Transposing whichever of ``x`` and
    ``g`` is smaller measured 4-7% slower at the benchmark configs R and T.)
    """
    return x @ w


def _linear_fwd(x, w):
    return x @ w, (x, w)


def _linear_bwd(res, g):
    x, w = res
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    dw = jax.lax.optimization_barrier(x2.T) @ g2
    return g @ w.T, dw.astype(w.dtype)


linear.defvjp(_linear_fwd, _linear_bwd)


class Norm(nnx.Module):
    """Any ``posenc.norms.NORMS`` norm over the last axis, params from posenc.norms."""

    def __init__(self, kind, dim, *, eps, dyt_alpha=0.5):
        norm = norms.NORMS[kind]
        self.kind = kind
        self.eps = float(eps) if "eps" in norm.keywords else None
        init_kw = {"dyt_alpha": dyt_alpha} if "dyt_alpha" in norm.init_keywords else {}
        params = norms.init_params(kind, dim, **init_kw)
        self.params = nnx.Dict({n: nnx.Param(v) for n, v in params.items()})

    def __call__(self, x):
        return norms.normalize(self.kind, x, {n: p[...] for n, p in self.params.items()},
                               eps=self.eps)


class MLP(nnx.Module):
    """GELU MLP ``W2 gelu(W1 x)`` or SwiGLU ``W2 (silu(W1 x) * W3 x)`` (Shazeer 2020)."""

    def __init__(self, kind, d_model, hidden, *, dtype, gain, rngs):
        if kind not in ("gelu", "swiglu"):
            raise ValueError(f"unknown mlp {kind!r}; choose one of: gelu, swiglu")
        self.kind, self.dtype = kind, dtype

        def init(shape, fan_in, fan_out):
            key = rngs.params()
            if gain is None:
                return nnx.Param(lecun_normal(key, shape, fan_in))
            return nnx.Param(xavier_normal(key, shape, fan_in, fan_out, gain))

        self.w1 = init((d_model, hidden), d_model, hidden)
        self.w2 = init((hidden, d_model), hidden, d_model)
        self.w3 = init((d_model, hidden), d_model, hidden) if kind == "swiglu" else None

    def __call__(self, x):
        h = linear(x, self.w1[...].astype(self.dtype))
        if self.kind == "swiglu":
            h = jax.nn.silu(h) * linear(x, self.w3[...].astype(self.dtype))
        else:
            h = jax.nn.gelu(h)
        return linear(h, self.w2[...].astype(self.dtype))


class Attention(nnx.Module):
    """Multi-head / grouped-query attention with QK-norm and a position encoding."""

    def __init__(self, spec, encoding, *, dtype, vo_gain, rngs):
        D, H, K, head_dim = spec.d_model, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim, self.dtype = H, K, head_dim, dtype
        self.softcap = spec.norm.attn_softcap
        self.impl, self.block = spec.attention_impl, spec.attention_block
        self.causal_block = spec.attention_causal_block
        self.qk_norm_kind = spec.norm.qk_norm
        self.qk_eps = None if self.qk_norm_kind == "none" else spec.norm.eps
        self.encoding = encoding

        def proj(shape, fan_in, fan_out, gain):
            if gain is None:
                return nnx.Param(lecun_normal(rngs.params(), shape, fan_in))
            return nnx.Param(xavier_normal(rngs.params(), shape, fan_in, fan_out, gain))

        # DeepNorm: q/k xavier gain 1, v/out xavier gain beta.
        qk_gain = None if vo_gain is None else 1.0
        self.wq = proj((D, H, head_dim), D, H * head_dim, qk_gain)
        self.wk = proj((D, K, head_dim), D, K * head_dim, qk_gain)
        self.wv = proj((D, K, head_dim), D, K * head_dim, vo_gain)
        self.wo = proj((H, head_dim, D), H * head_dim, D, vo_gain)
        qk = stability.qk_norm_init(self.qk_norm_kind, H, K, head_dim)
        self.qk_params = nnx.Dict({n: nnx.Param(v) for n, v in qk.items()})

    def project(self, x):
        """x [B, L, D] -> q [B, L, H, Dh], k, v [B, L, K, Dh] (QK-normed, not yet rotated).

        One [D, (H + 2K) Dh] matmul for q, k and v: the input is read (and, for
        the weight gradient, transposed) once instead of three times.
        """
        ws = [p[...].astype(self.dtype) for p in (self.wq, self.wk, self.wv)]
        w = jnp.concatenate([w.reshape(w.shape[0], -1) for w in ws], axis=1)
        qkv = linear(x, w)
        H, K, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = jnp.split(qkv, [H * Dh, (H + K) * Dh], axis=-1)
        lead = x.shape[:-1]
        q, k, v = q.reshape(lead + (H, Dh)), k.reshape(lead + (K, Dh)), v.reshape(lead + (K, Dh))
        params = {n: p[...] for n, p in self.qk_params.items()}
        q, k = stability.qk_norm(self.qk_norm_kind, q, k, params, eps=self.qk_eps)
        return q, k, v

    def attend(self, q, k, v, q_positions, k_positions, *, seq_len, q_offset=0, kv_length=None,
               causal=True, return_stats=False):
        """Rotate with the encoding, attend, project out: -> [B, Lq, D] (, stats).

        Positions may have batch 1 (shared by every example); every encoding
        broadcasts them against the batch of q and k.
        """
        q, k = self.encoding.qk(q, k, q_positions, k_positions, seq_len=seq_len)
        res = attn_lib.attention(
            q, k, v, q_positions, k_positions, self.encoding, scale=1.0 / math.sqrt(self.head_dim),
            causal=causal, q_offset=q_offset, kv_length=kv_length, softcap=self.softcap,
            impl=self.impl, block=self.block, causal_block=self.causal_block,
            return_stats=return_stats)
        out, stats = res if return_stats else (res, None)
        wo = self.wo[...].astype(self.dtype)
        y = linear(out.astype(self.dtype).reshape(out.shape[:-2] + (-1,)),
                   wo.reshape(-1, wo.shape[-1]))
        return (y, stats) if return_stats else y


class Block(nnx.Module):
    """One decoder layer: attention then MLP, each wrapped by posenc.placements.residual."""

    def __init__(self, spec, encoding, *, layer_index, dtype, rngs):
        n = spec.norm
        mix = {"mixln_fraction": n.mixln_fraction} if n.placement == "mixln" else {}
        self.placement = placements.layer_placement(n.placement, layer_index, spec.num_layers, **mix)
        deep = self.placement == "deepnorm"
        alpha, beta = norms.deepnorm_constants(spec.num_layers) if deep else (None, None)
        self.alpha = alpha
        self.attn = Attention(spec, encoding, dtype=dtype, vo_gain=beta, rngs=rngs)
        hidden = int(spec.d_model * spec.mlp_ratio)
        self.mlp = MLP(spec.mlp, spec.d_model, hidden, dtype=dtype, gain=beta, rngs=rngs)
        rezero = self.placement == "rezero"

        def norm():
            return None if rezero else Norm(n.kind, spec.d_model, eps=n.eps, dyt_alpha=n.dyt_alpha)

        self.norm1, self.norm2 = norm(), norm()
        sandwich = self.placement == "sandwich"
        self.norm1_out = norm() if sandwich else None
        self.norm2_out = norm() if sandwich else None
        # ReZero: one gate per layer, shared by its attention and MLP (the reference's resweight).
        self.gate = nnx.Param(jnp.zeros((), jnp.float32)) if rezero else None
        self.dropout = nnx.Dropout(spec.dropout, rngs=rngs)

    def _residual(self, x, sublayer, norm, norm_out):
        kw = {}
        if self.placement == "sandwich":
            kw["norm_out"] = norm_out
        elif self.placement == "deepnorm":
            kw["alpha"] = self.alpha
        elif self.placement == "rezero":
            kw["gate"] = self.gate[...].astype(x.dtype)
        return placements.residual(self.placement, x, sublayer, norm, **kw)

    def __call__(self, x, attend, *, deterministic):
        """x [B, L, D]; ``attend(h) -> (y, stats)`` runs this layer's attention on h."""
        stats = {}

        def attn_sub(h):
            y, s = attend(self.attn, h)
            stats.update(s or {})
            return self.dropout(y, deterministic=deterministic)

        x = self._residual(x, attn_sub, self.norm1, self.norm1_out)
        mlp_sub = lambda h: self.dropout(self.mlp(h), deterministic=deterministic)  # noqa: E731
        x = self._residual(x, mlp_sub, self.norm2, self.norm2_out)
        return x, stats
