"""Constant multipliers on the embeddings, residual branches, attention logits and output logits (muP-style).

Two model families fix these at construction (all default 1, i.e. Llama):

**MiniCPM** (Hu et al. 2024, arXiv 2404.06395; ``modeling_minicpm.py`` of the
MiniCPM checkpoints, transformers ``models/minicpm3``):

    embeddings  embed(tokens) * scale_emb
    residual    x + F(N(x)) * scale_depth / sqrt(num_layers)     both sublayers of every layer
    attention   the usual 1 / sqrt(Dh)
    logits      lm_head(h / (hidden_size / dim_model_base))       h after the final norm

**Granite** (IBM Granite 3, transformers ``models/granite`` ``GraniteModel``,
``GraniteDecoderLayer``, ``GraniteAttention``, ``GraniteForCausalLM``):

    embeddings  embed(tokens) * embedding_multiplier
    residual    x + F(N(x)) * residual_multiplier
    attention   logits = q.k * attention_multiplier               (replaces 1 / sqrt(Dh))
    logits      lm_head(h) / logits_scaling

:func:`minicpm` and :func:`granite` return the four factors as
:class:`Multipliers` (``logits`` as a multiplier: MiniCPM's ``dim_model_base /
hidden_size``, Granite's ``1 / logits_scaling``; dividing the final hidden
state or the logits is the same since the head is linear). :func:`residual`
applies the residual one (float32 product, the stream's dtype out).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from posenc import checks

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Multipliers:
    """The four constants: ``embedding``, ``residual`` and ``logits`` multiply; ``attention`` is the
    logit scale of attention, None for the usual ``1 / sqrt(Dh)``."""

    embedding: float = 1.0
    residual: float = 1.0
    logits: float = 1.0
    attention: float | None = None


def _positive(name, value) -> float:
    return checks.number(name, value, positive=True)


def minicpm(*, hidden_size, num_layers, scale_emb=1.0, scale_depth=1.0, dim_model_base=None):
    """MiniCPM's multipliers: ``scale_emb``, ``scale_depth / sqrt(num_layers)``, ``dim_model_base /
    hidden_size`` (``dim_model_base`` default ``hidden_size``: no logit scaling)."""
    hidden_size = checks.integer("hidden_size", hidden_size, minimum=1)
    num_layers = checks.integer("num_layers", num_layers, minimum=1)
    base = hidden_size if dim_model_base is None else _positive("dim_model_base", dim_model_base)
    return Multipliers(embedding=_positive("scale_emb", scale_emb),
                       residual=_positive("scale_depth", scale_depth) / math.sqrt(num_layers),
                       logits=base / hidden_size)


def granite(*, embedding_multiplier=1.0, residual_multiplier=1.0, attention_multiplier=None, logits_scaling=1.0):
    """Granite's multipliers; ``attention_multiplier`` None keeps ``1 / sqrt(Dh)`` (the config always sets one)."""
    attention = None if attention_multiplier is None else _positive("attention_multiplier", attention_multiplier)
    return Multipliers(embedding=_positive("embedding_multiplier", embedding_multiplier),
                       residual=_positive("residual_multiplier", residual_multiplier),
                       logits=1.0 / _positive("logits_scaling", logits_scaling), attention=attention)


def scale(x, multiplier):
    """``x * multiplier`` in float32, ``x.dtype`` out (embeddings, final hidden state or logits)."""
    x = jnp.asarray(x)
    return (x.astype(_F32) * multiplier).astype(x.dtype)


def residual(x, branch_out, multiplier):
    """``x + branch_out * multiplier``: a scaled residual branch, ``[..., D]`` in ``x.dtype``."""
    x = jnp.asarray(x)
    return (x.astype(_F32) + jnp.asarray(branch_out, _F32) * multiplier).astype(x.dtype)


def attention_scale(multipliers, head_dim):
    """The attention logit scale: ``multipliers.attention``, or ``1 / sqrt(head_dim)`` when None."""
    if multipliers.attention is not None:
        return multipliers.attention
    return 1.0 / math.sqrt(checks.integer("head_dim", head_dim, minimum=1))
