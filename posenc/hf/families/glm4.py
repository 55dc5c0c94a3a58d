"""GLM-4: sandwich norms under GLM's names, q / k / v biases, half the head rotated in interleaved pairs."""

from __future__ import annotations

import functools

from posenc.hf import fields, hf_params, rope_fields
from posenc.hf.registry import Family, register

# posenc's block norms -> GLM-4's names
GLM4_NORMS = {"norm1": "input_layernorm", "norm1_out": "post_self_attn_layernorm",
              "norm2": "post_attention_layernorm", "norm2_out": "post_mlp_layernorm"}


def glm4_fields(hf):
    """GLM-4's fields: partial RoPE (``partial_rotary_factor``, default 0.5) on pairs (2i, 2i + 1)."""
    out = fields.llama_core(hf, "glm4", o_bias=False)  # GLM-4: q / k / v biases, none on o_proj
    p = rope_fields.rope_params(hf)
    p.setdefault("partial_rotary_factor", 0.5)
    rope_fields.set_rope(out, rope_fields.rope_options(hf, p))
    out["model.position.rope.layout"] = "interleaved"  # GLM rotates pairs (2i, 2i + 1)
    fields.set_spans(out, hf, ["full"] * out["model.num_layers"])
    return out


register("glm4", Family("glm4", glm4_fields, functools.partial(hf_params.llama_params, norms=GLM4_NORMS)))
