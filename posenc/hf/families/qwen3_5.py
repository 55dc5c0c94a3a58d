"""Qwen3.5's text model (``qwen3_5_text``): Qwen3-Next's layers with dense MLPs and split projections.

Gated attention (each head's gate after its query in q_proj), (1 + w)
RMSNorms, per-head qk-norm, partial RoPE and Gated DeltaNet layers whose
projections are split (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
``in_proj_a``). Its interleaved M-RoPE (``mrope_section``) gives text tokens,
whose three position ids are equal, plain RoPE: that is what posenc applies.
"""

from __future__ import annotations

from posenc.hf import fields, rope_fields
from posenc.hf.families import qwen3_next
from posenc.hf.registry import Family, register


def qwen3_5_fields(hf):
    """Qwen3.5 (text): Qwen3-Next's attention and norms, Gated DeltaNet with split projections."""
    n = int(hf["num_hidden_layers"])
    every = hf.get("full_attention_interval", 4)
    mixers = qwen3_next.layer_types(hf, n, fields.every(n, every, "linear_attention", "full_attention"))
    out = fields.llama_core(hf, "qwen3_5")
    p = {k: v for k, v in rope_fields.rope_params(hf).items() if k not in ("mrope_section", "mrope_interleaved")}
    p.setdefault("partial_rotary_factor", 0.25)
    rope_fields.set_rope(out, rope_fields.rope_options(hf, p))
    fields.set_spans(out, hf, ["full"] * n)
    out["model.norm.kind"] = "rms_offset"
    out["model.norm.qk_norm"] = "rms"
    out["model.attention_gate"] = "elementwise"
    out["model.layer_types"] = mixers
    if "gated_deltanet" in mixers:
        out.update(qwen3_next.gated_deltanet_fields(hf, "split"))
    return out


register("qwen3_5_text", Family("qwen3_5", qwen3_5_fields, qwen3_next.qwen3_next_params))
