"""Llama 4 (text, dense layers): chunked-attention RoPE layers and global NoPE layers (iRoPE).

Every ``no_rope_layer_interval``-th layer is NoPE and global, the others
rotate (complex pairs (2i, 2i + 1)) within chunks of
``attention_chunk_size``; the NoPE layers scale their queries with
length (``attn_temperature_tuning``). Mixture-of-experts layers are refused
in one line (a text model with ``moe_layers=[]`` loads).
"""

from __future__ import annotations

import functools

from posenc.hf import fields, hf_params, rope_fields
from posenc.hf.registry import Family, register, unsupported


def llama4_fields(hf):
    """Llama 4's fields: spans, NoPE layers, qk-norm and the temperature of the NoPE layers."""
    moe = hf.get("moe_layers")
    if moe is None:
        step = hf.get("interleave_moe_layer_step", 1)
        moe = list(range(step - 1, hf["num_hidden_layers"], step)) if step else []
    if moe:
        raise unsupported(hf, "moe_layers", f"layers {moe} are mixture-of-experts, which posenc does "
                          "not have (a text model with moe_layers=[] loads)")
    fields.refuse(hf, {"attention_bias": ((False,), "posenc's Llama 4 layers have no biases")})
    hf = {**hf, "intermediate_size": hf.get("intermediate_size_mlp", hf.get("intermediate_size"))}
    out = fields.base(hf, "llama4")
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


register("llama4_text", Family("llama4", llama4_fields, functools.partial(hf_params.llama_params, mlp="feed_forward")))
