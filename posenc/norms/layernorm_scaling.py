"""LayerNorm Scaling: shrink each pre-norm output by the square root of its layer's depth.

Sun et al. 2025, "The Curse of Depth in Large Language Models" (arXiv
2502.05795), official code ``lmsdss/LayerNorm-Scaling``
(``peft_pretraining/modeling_llama.py``, ``LlamaDecoderLayer.forward``, norm
type ``LNS``). In a pre-norm decoder the variance of the residual stream grows
with depth, so deep layers approach the identity; scaling the output of both
pre-norms of layer ``l`` (1-based) by ``1 / sqrt(l)`` keeps it in check:

    h = x + Attention(N_attn(x) / sqrt(l))
    y = h + MLP(N_mlp(h) / sqrt(l))

The code counts layers from 0 (``layer_index``) and uses ``1 / sqrt(layer_index
+ 1)``: the first layer is unscaled. The final norm before the output head is
not scaled. The authors recommend plain (not depth-scaled) initialisation with
it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from posenc import checks

_F32 = jnp.float32


def factor(layer_index):
    """``1 / sqrt(layer_index + 1)`` of the 0-based ``layer_index``.

    A Python integer (>= 0) gives a Python float; an integer array (e.g. the
    index of a ``jax.lax.scan`` over layers) gives float32 of its shape.
    """
    if checks.is_int(layer_index):
        return 1.0 / math.sqrt(checks.integer("layer_index", layer_index, minimum=0) + 1)
    dtype = getattr(layer_index, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"layer_index must be an integer >= 0 or an integer array; got {layer_index!r}")
    return jax.lax.rsqrt(jnp.asarray(layer_index).astype(_F32) + 1.0)


def scale(normed, layer_index):
    """A pre-norm output ``[..., D]`` times :func:`factor` (float32 product, ``normed.dtype`` out)."""
    normed = jnp.asarray(normed)
    return (normed.astype(_F32) * factor(layer_index)).astype(normed.dtype)


def block(x, attention, mlp, attention_norm, mlp_norm, *, layer_index):
    """One pre-norm decoder layer with LayerNorm Scaling.

    Args:
      x: ``[..., D]`` residual stream.
      attention, mlp: the sublayers, ``[..., D] -> [..., D]``.
      attention_norm, mlp_norm: the layer's two norms, ``[..., D] -> [..., D]``.
      layer_index: 0-based index of the layer (Python int or integer array).
    Returns:
      ``[..., D]`` in ``x.dtype``.
    """
    h = (x + attention(scale(attention_norm(x), layer_index))).astype(x.dtype)
    return (h + mlp(scale(mlp_norm(h), layer_index))).astype(x.dtype)
