"""Qwen3-Next's full-attention layers and dense MLPs.

Gated attention (each head's gate after its query in q_proj), (1 + w)
RMSNorms, per-head qk-norm and partial RoPE. Its Gated DeltaNet
(linear-attention) layers and mixture-of-experts MLPs are refused in one
line: a checkpoint whose layer_types are all full_attention and whose MLPs
are dense (``num_experts`` 0 or every layer in ``mlp_only_layers``) loads.
"""

from __future__ import annotations

from posenc.hf import fields, hf_params, rope_fields
from posenc.hf.registry import Family, register


def qwen3_next_fields(hf):
    """Qwen3-Next's full-attention layers: gated attention (each head's gate after its query in
    q_proj), (1 + w) RMSNorms, per-head qk-norm, partial RoPE and dense MLPs."""
    n = int(hf["num_hidden_layers"])
    every = hf.get("full_attention_interval", 4)  # HF's layer_types when the config has none
    types = hf.get("layer_types") or fields.every(n, every, "linear_attention", "full_attention")
    linear = [i for i, t in enumerate(types) if t == "linear_attention"]
    if linear:
        raise ValueError(f"unsupported linear-attention layers {linear} in config.json (model_type "
                         "'qwen3_next'): Gated DeltaNet is not in posenc (a checkpoint whose "
                         "layer_types are all full_attention loads)")
    experts, step = hf.get("num_experts", 512), hf.get("decoder_sparse_step", 1)
    dense = set(hf.get("mlp_only_layers") or ())
    moe = [i for i in range(n) if i not in dense and experts and step and (i + 1) % step == 0]
    if moe:
        raise ValueError(f"unsupported mixture-of-experts layers {moe} in config.json (model_type "
                         f"'qwen3_next', num_experts={experts}): posenc's MLPs are dense (a "
                         "checkpoint with num_experts=0 or every layer in mlp_only_layers loads)")
    out = fields.llama_core(hf, "qwen3")
    p = rope_fields.rope_params(hf)
    p.setdefault("partial_rotary_factor", 0.25)  # HF's default for Qwen3-Next
    rope_fields.set_rope(out, rope_fields.rope_options(hf, p))
    fields.set_spans(out, hf, fields.layer_spans(hf, n, types))
    out["model.norm.kind"] = "rms_offset"  # (1 + w) gains, also on q_norm / k_norm
    out["model.attention_gate"] = "elementwise"
    return out


register("qwen3_next", Family("qwen3", qwen3_next_fields, hf_params.llama_params))
