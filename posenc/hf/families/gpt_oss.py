"""gpt-oss: sliding-window and full layers with learned sinks, and experts with the clamped SwiGLU.

The router (``router.weight``, ``router.bias``) takes a softmax over the top-k
logits (``model.moe.router`` "top_k_softmax"); the experts are stored
stacked in posenc's layout already (``gate_up_proj [E, H, 2I]`` with gate and
up interleaved, ``down_proj [E, I, H]``, and their biases). A checkpoint with
``quantization_config`` ``{"quant_method": "mxfp4"}`` (as gpt-oss is
published) stores the expert matrices as MXFP4 ``*_blocks`` / ``*_scales``:
each is dequantized on load (``posenc.mxfp4.dequantize_experts``, bit for bit
transformers' ``convert_moe_packed_tensors``), tensor by tensor, to float32.
The attention is Llama-like with biases on q, k, v and o, one sink logit per
head (``self_attn.sinks``), the config's ``layer_types`` and its YaRN RoPE.
"""

from __future__ import annotations

import numpy as np

from posenc.hf import fields, hf_params, moe_fields
from posenc.hf.checkpoint import View
from posenc.hf.registry import Family, register, unsupported
from posenc.moe import mxfp4


def gpt_oss_fields(hf):
    """gpt-oss: spans of layer_types, learned sinks, YaRN; E experts of width intermediate_size, top-k."""
    q = hf.get("quantization_config")
    if q is not None and q.get("quant_method") != "mxfp4":
        raise unsupported(hf, "quantization_config", "posenc dequantizes MXFP4 experts (quant_method "
                          "'mxfp4') and reads float tensors otherwise")
    out = fields.llama_core(hf, "gpt_oss")
    n = out["model.num_layers"]
    fields.set_spans(out, hf, fields.layer_spans(hf, n, fields.every(n, 2, "sliding_attention",
                                                                       "full_attention")))
    moe_fields.moe(hf, out, width_key="intermediate_size")
    return out


def _expert_matrix(t, name):
    """``name`` ([E, H, 2I] / [E, I, H]), or its MXFP4 ``name_blocks`` / ``name_scales`` dequantized."""
    if t.has(name + "_blocks"):
        blocks = np.asarray(t(name + "_blocks")).astype(np.uint8, copy=False)  # given as float32: exact
        scales = np.asarray(t(name + "_scales")).astype(np.uint8, copy=False)
        return mxfp4.dequantize_experts(blocks, scales, dtype=np.float32)
    return t(name)


def _experts(out, path, t, layer_prefix, spec):
    m = layer_prefix + "mlp."
    out[path + ("router",)] = t(m + "router.weight").T
    out[path + ("router_bias",)] = t(m + "router.bias")
    for name in ("gate_up", "down"):
        out[path + (name,)] = _expert_matrix(t, m + f"experts.{name}_proj")
        out[path + (name + "_bias",)] = t(m + f"experts.{name}_proj_bias")


def gpt_oss_params(hf, tensors, spec):
    """Llama-like layers with each layer's sinks [H] and the experts (MXFP4 ones dequantized)."""
    names = [f"model.layers.{i}.self_attn.sinks" for i in range(spec.num_layers)]
    sinks = [tensors[n] for n in names]
    out = hf_params.llama_params(hf, View(tensors, {k: k for k in tensors if k not in names}), spec,
                                 moe=_experts)
    for i, s in enumerate(sinks):
        out[("blocks", i, "attn", "sinks")] = s
    return out


register("gpt_oss", Family("gpt_oss", gpt_oss_fields, gpt_oss_params))
