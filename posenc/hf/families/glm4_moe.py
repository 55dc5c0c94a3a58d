"""GLM-4.5 (``glm4_moe``): pre-norm layers with q / k / v biases, per-head QK-norm and partial RoPE,
and DeepSeek-V3's mixture of experts from ``first_k_dense_replace`` on.

RoPE rotates the first ``partial_rotary_factor`` of each head in halves
(pairs (j, j + d/4)), unlike GLM-4's interleaved pairs. The router scores with
a sigmoid of float32 logits, adds ``e_score_correction_bias`` for the
(group-limited) choice only, and scales the renormalised weights by
``routed_scaling_factor``; ``n_shared_experts`` shared experts see every
token. Multi-token-prediction layers' weights (``num_nextn_predict_layers``)
are refused in one line.
"""

from __future__ import annotations

from posenc.hf import fields, hf_params, moe_fields, moe_params, rope_fields
from posenc.hf.registry import Family, register


def glm4_moe_fields(hf):
    """GLM-4.5: q / k / v biases (none on o_proj), QK-norm with use_qk_norm, RoPE on part of each head."""
    out = fields.llama_core(hf, "glm4_moe", o_bias=False)
    p = rope_fields.rope_params(hf)
    p.setdefault("partial_rotary_factor", hf.get("partial_rotary_factor", 0.5))
    rope_fields.set_rope(out, rope_fields.rope_options(hf, p))
    if not hf.get("use_qk_norm", False):
        out["model.norm.qk_norm"] = "none"
    fields.set_spans(out, hf, ["full"] * out["model.num_layers"])
    moe_fields.moe({**hf, "first_k_dense_replace": hf.get("first_k_dense_replace") or 0}, out, options=(
        "norm_topk_prob", "n_group", "topk_group", "routed_scaling_factor", "n_shared_experts"))
    return out


def glm4_moe_params(hf, tensors, spec):
    """The Llama-like layers with DeepSeek-V3's router, experts and shared experts (posenc.hf.moe_params)."""
    moe_params.refuse_extra_layers(hf, tensors, spec.num_layers)
    return hf_params.llama_params(hf, tensors, spec, moe=moe_params.sigmoid_moe)


register("glm4_moe", Family("glm4_moe", glm4_moe_fields, glm4_moe_params))
