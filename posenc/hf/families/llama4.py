"""Llama 4 (text): chunked-attention RoPE layers, global NoPE layers (iRoPE) and mixture-of-experts MLPs.

Every ``no_rope_layer_interval``-th layer is NoPE and global, the others
rotate (complex pairs (2i, 2i + 1)) within chunks of
``attention_chunk_size``; the NoPE layers scale their queries with
length (``attn_temperature_tuning``). The layers of ``moe_layers`` (or every
``interleave_moe_layer_step``-th) are mixture-of-experts (preset
``llama4_moe``): a top-1 sigmoid router whose weight scales the expert's
input, experts of width ``intermediate_size`` and a shared expert; the dense
layers' width is ``intermediate_size_mlp``.
"""

from __future__ import annotations

import functools

from posenc.hf import fields, hf_params, moe_fields, moe_params, rope_fields
from posenc.hf.registry import Family, refuse, register


def llama4_fields(hf):
    """Llama 4's fields: spans, NoPE layers, qk-norm and the temperature of the NoPE layers."""
    moe = hf.get("moe_layers")
    if moe is None:
        step = hf.get("interleave_moe_layer_step", 1)
        moe = list(range(step - 1, hf["num_hidden_layers"], step)) if step else []
    fields.refuse(hf, {"attention_bias": ((False,), "posenc's Llama 4 layers have no biases")})
    experts = hf  # the experts' width is intermediate_size, the dense MLPs' intermediate_size_mlp
    hf = {**hf, "intermediate_size": hf.get("intermediate_size_mlp", hf.get("intermediate_size"))}
    out = fields.base(hf, "llama4_moe" if moe else "llama4")
    if moe:  # the MoE layers as the complement of mlp_only_layers
        only = [i for i in range(hf["num_hidden_layers"]) if i not in moe]
        moe_fields.moe({**experts, "decoder_sparse_step": 1, "mlp_only_layers": only}, out,
                       width_key="intermediate_size")
    out["model.mlp"] = fields.act(hf, "hidden_act", {"silu": "swiglu"})
    n = out["model.num_layers"]
    interval = hf.get("no_rope_layer_interval", 4)
    rope_layers = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    chunk = hf.get("attention_chunk_size")
    spans = fields.layer_spans(hf, n, ["chunked_attention" if r and chunk else "full_attention"
                                       for r in rope_layers])
    out.update(fields.spans(spans))
    out["model.attention_chunk"] = int(chunk) if "chunk" in spans else 0
    rope_fields.set_rope(out, rope_fields.rope_options(hf, rope_fields.rope_params(hf)))
    out["model.position.rope.layout"] = "interleaved"  # Llama 4 rotates complex pairs (2i, 2i + 1)
    nope = tuple(i for i, r in enumerate(rope_layers) if not r)
    fields.nope(out, nope)
    if not hf.get("use_qk_norm", True):
        out.update({"model.norm.qk_norm": "none", "model.norm.qk_norm_layers": "all",
                    "model.norm.qk_norm_after_rope": False})
    if hf.get("attn_temperature_tuning", True) and nope:
        out["model.logit_scale.floor_scale"] = float(hf.get("floor_scale", 8192))
        out["model.logit_scale.attn_scale"] = float(hf.get("attn_scale", 0.1))
    else:
        out.update({"model.logit_scale.kind": "none", "model.logit_scale.layers": "all",
                    "model.logit_scale.floor_scale": 8192.0, "model.logit_scale.attn_scale": 0.1})
    if not nope and out["model.norm.qk_norm"] != "none":
        out["model.norm.qk_norm_layers"] = "all"
    return out


def _experts(out, path, t, layer_prefix, spec):
    """Llama 4's router (top-1 sigmoid), experts stored as posenc's [E, H, 2I] / [E, I, H] (gate and up
    as halves) and the shared expert."""
    m = layer_prefix + "feed_forward."
    out[path + ("router",)] = t(m + "router.weight").T
    out[path + ("gate_up",)] = t(m + "experts.gate_up_proj")
    out[path + ("down",)] = t(m + "experts.down_proj")
    moe_params.shared(out, path, t, m + "shared_expert.")


register("llama4_text", Family("llama4", llama4_fields, functools.partial(
    hf_params.llama_params, mlp="feed_forward", moe=_experts)))
refuse("llama4", "the multimodal Llama 4 checkpoint holds a vision tower (vision_config), which posenc's "
       "decoder does not have; its text model (model_type llama4_text) loads")
