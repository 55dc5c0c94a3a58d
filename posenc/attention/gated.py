"""Gated attention: a sigmoid gate from the query projection on the attention output of every head.

Qiu et al. 2025, "Gated Attention for Large Language Models: Non-linearity,
Sparsity, and Attention-Sink-Free" (NeurIPS 2025, arXiv 2505.06708;
official code qiuzh20/gated_attention, ``modeling_qwen3.py``
``Qwen3Attention.forward``), as used by Qwen3-Next (transformers
``models/qwen3_next/modeling_qwen3_next.py`` ``Qwen3NextAttention.forward``).
The query projection is widened to give, besides the queries, gate logits
``g``; after attention (before the output projection)::

    out[..., l, h, :] = attention_output[..., l, h, :] * sigmoid(g[..., l, h, :])

elementwise (``g`` [..., L, H, Dh], the paper's best variant and Qwen3-Next's)
or headwise (``g`` [..., L, H, 1], one scalar per head and token).

Where the gate sits in the projection's output (:func:`split_query_gate`):
the last axis is cut into ``num_heads / group_size`` blocks, each holding the
queries of ``group_size`` consecutive heads, then their gates:
``[q_h0 .. q_h(G-1), g_h0 .. g_h(G-1)]``.

- Qwen3-Next: ``group_size=1``. It views the output as ``[..., H, 2 Dh]``
  and chunks the last axis in two: head h's query, then head h's gate.
- the paper's code: ``group_size = num_heads // num_key_value_heads``. It views
  the output as ``[..., H_kv, -1]`` and splits each KV group into its G
  queries and G gates (``[G Dh, G Dh]`` elementwise, ``[G Dh, G]`` headwise).

The two agree when ``num_key_value_heads == num_heads``; a checkpoint of one
read with the other's layout mixes queries and gates.

Shapes: q_proj_out [..., L, H (Dh + gate_dim)] -> query [..., L, H, Dh],
gate logits [..., L, H, gate_dim] (gate_dim = Dh or 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks

MODES = ("elementwise", "headwise")


def gate_dim(mode: str, head_dim: int) -> int:
    """Width of one head's gate: ``head_dim`` (elementwise) or 1 (headwise)."""
    mode = checks.choice("gate mode", mode, MODES)
    return checks.integer("head_dim", head_dim, minimum=1) if mode == "elementwise" else 1


def split_query_gate(q_proj_out, *, num_heads: int, head_dim: int, mode: str = "elementwise",
                     group_size: int = 1) -> tuple[jax.Array, jax.Array]:
    """Queries and gate logits from the widened query projection's output.

    ``group_size=1`` is Qwen3-Next's layout (per head: query, then gate);
    ``group_size = num_heads // num_key_value_heads`` is the paper code's
    (per KV group: its queries, then their gates). No arithmetic: a reshape
    and a split, values and dtype unchanged.

    Shapes: q_proj_out [..., L, H (Dh + gate_dim)] -> (query [..., L, H, Dh],
    gate_logits [..., L, H, gate_dim]), gate_dim = Dh (elementwise) or 1 (headwise).
    """
    num_heads = checks.integer("num_heads", num_heads, minimum=1)
    head_dim = checks.integer("head_dim", head_dim, minimum=1)
    group_size = checks.integer("group_size", group_size, minimum=1)
    if num_heads % group_size:
        raise ValueError(f"group_size must divide num_heads = {num_heads}; got {group_size}")
    width = gate_dim(mode, head_dim)
    x = jnp.asarray(q_proj_out)
    want = num_heads * (head_dim + width)
    if x.ndim < 1 or x.shape[-1] != want:
        raise ValueError(f"q_proj_out must have last axis num_heads * (head_dim + gate_dim) = {num_heads} * "
                         f"({head_dim} + {width}) = {want} for mode {mode!r}; got shape {x.shape}")
    lead, groups = x.shape[:-1], num_heads // group_size
    x = x.reshape(*lead, groups, group_size * (head_dim + width))
    query = x[..., : group_size * head_dim].reshape(*lead, num_heads, head_dim)
    gate_logits = x[..., group_size * head_dim:].reshape(*lead, num_heads, width)
    return query, gate_logits


def gate(output, gate_logits) -> jax.Array:
    """``output * sigmoid(gate_logits)``: float32 math, in the dtype of ``output``.

    Shapes: output [..., L, H, Dh], gate_logits [..., L, H, Dh] (elementwise)
    or [..., L, H, 1] (headwise) -> like output.
    """
    output, gate_logits = jnp.asarray(output), jnp.asarray(gate_logits)
    if output.ndim < 2 or gate_logits.shape[:-1] != output.shape[:-1] or gate_logits.shape[-1] not in (
            1, output.shape[-1]):
        raise ValueError(f"gate_logits must have shape [..., L, H, Dh] or [..., L, H, 1] for output "
                         f"{output.shape}; got {gate_logits.shape}")
    g = jax.nn.sigmoid(gate_logits.astype(jnp.float32))
    return (output.astype(jnp.float32) * g).astype(output.dtype)
