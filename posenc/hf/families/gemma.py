"""Gemma 2 and Gemma 3 (text): sandwich norms, GeGLU, windowed and global layers, logit soft-capping.

Gemma 2 alternates window and global layers and rotates them alike; Gemma 3
has 5 window layers to 1 global (``sliding_window_pattern``) and a RoPE per
layer type (:func:`posenc.hf.fields.rope_by_type`).
"""

from __future__ import annotations

from posenc.hf import fields, hf_params, rope_fields
from posenc.hf.registry import Family, register


def gemma(preset: str):
    """``fields(hf)`` of Gemma 2 (``preset`` "gemma2") or Gemma 3 ("gemma3")."""
    def read(hf):
        fields.refuse(hf, {"attention_bias": ((False,), "posenc's Gemma layers have no biases"),
                           "use_bidirectional_attention": ((None, False), "posenc decodes causally")})
        out = fields.base(hf, preset, tie_default=True)
        out["model.mlp"] = fields.act(hf, "hidden_activation",
                                      {"gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"})
        n = out["model.num_layers"]
        every = 2 if preset == "gemma2" else hf.get("sliding_window_pattern", 6)
        spans = fields.layer_spans(hf, n, ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                                           for i in range(n)])
        out.update(fields.spans(spans))
        out["model.attention_window"] = int(hf["sliding_window"]) if "window" in spans else 0
        out["model.attention_scale"] = float(hf.get("query_pre_attn_scalar", 256)) ** -0.5
        out["model.norm.attn_softcap"] = float(hf.get("attn_logit_softcapping") or 0.0)
        out["model.norm.final_softcap"] = float(hf.get("final_logit_softcapping") or 0.0)
        if preset == "gemma2":
            rope_fields.set_rope(out, rope_fields.rope_options(hf, rope_fields.rope_params(hf)))
        else:
            fields.rope_by_type(hf, out, spans)
        return out
    return read


register("gemma2", Family("gemma2", gemma("gemma2"), hf_params.llama_params))
register("gemma3_text", Family("gemma3", gemma("gemma3"), hf_params.llama_params))
