"""Granite 4.0-H (``granitemoehybrid``): Mamba-2 layers among attention layers, dense or MoE MLPs.

The ``mamba`` layers are Mamba-2 (``model.layer_types`` entry ``mamba2``, the
gated norm over the whole inner width), the ``attention`` layers Llama's with
RoPE or none (``position_embedding_type``); every layer's MLP is the
``shared_mlp`` (SwiGLU, [gate; up] in ``input_linear``). Granite's
multipliers: the embeddings times ``embedding_multiplier``, each residual
branch times ``residual_multiplier``, the softmax scale
``attention_multiplier``, the logits divided by ``logits_scaling``.
With ``num_local_experts`` > 0 every layer's MLP is a mixture of experts
(``model.moe``: a softmax over the top-k router logits, experts of width
``intermediate_size`` stored stacked in ``block_sparse_moe``) plus the
``shared_mlp`` as its shared expert.
"""

from __future__ import annotations

import numpy as np

from posenc.hf import fields, hf_params, mixer_fields, mixer_params, moe_fields, rope_fields
from posenc.hf.registry import Family, register, unsupported

MIXER_OF = {"mamba": "mamba2", "linear_attention": "mamba2", "attention": "attention",
            "full_attention": "attention"}


def granite_multipliers(hf, out):
    """Granite's embedding, residual, attention and logits multipliers as posenc's fields."""
    out["model.embedding_multiplier"] = float(hf.get("embedding_multiplier", 1.0))
    out["model.residual_multiplier"] = float(hf.get("residual_multiplier", 1.0))
    out["model.attention_scale"] = float(hf.get("attention_multiplier", 1.0))
    out["model.logits_multiplier"] = 1.0 / float(hf.get("logits_scaling", 1.0))


def set_position(hf, out, kind):
    """RoPE from the config, or NoPE (the preset's RoPE options dropped)."""
    if kind == "rope":
        out["model.position.kind"] = "rope"
        return
    for k in [k for k in out if k.startswith("model.position.rope.")]:
        del out[k]
    out["model.position.kind"] = "nope"


def granitemoehybrid_fields(hf):
    """Granite 4.0-H: Mamba-2 and attention layers, the shared MLP (and experts), Granite's multipliers."""
    n = int(hf["num_hidden_layers"])
    types = hf.get("layer_types") or hf.get("layers_block_type") or ["mamba"] * n
    mixers = mixer_fields.mixers(hf, n, types, MIXER_OF)
    embedding = hf.get("position_embedding_type", "nope") or "nope"
    if embedding not in ("rope", "nope"):
        raise unsupported(hf, "position_embedding_type", "posenc reads rope or nope here")
    experts = hf  # the experts' width is intermediate_size, the shared MLP's shared_intermediate_size
    hf = {**hf, "intermediate_size": hf.get("shared_intermediate_size", hf.get("intermediate_size"))}
    out = fields.llama_core(hf, "granitemoehybrid", o_bias=True)
    if hf.get("num_local_experts", 0):  # every layer: softmax over the top-k logits, plus the shared MLP
        moe_fields.moe(experts, out, width_key="intermediate_size")
        out.update({"model.moe.router": "top_k_softmax", "model.moe.n_shared_experts": 1,
                    "model.moe.shared_expert_intermediate_size": int(hf["intermediate_size"])})
    set_position(hf, out, embedding)
    if embedding == "rope":
        rope_fields.set_rope(out, rope_fields.rope_options(hf, rope_fields.rope_params(hf)))
    granite_multipliers(hf, out)
    fields.set_spans(out, hf, ["full"] * n)
    out["model.layer_types"] = mixers
    if "mamba2" in mixers:
        out.update(mixer_fields.mamba2(hf, norm="full"))
    return out


def shared_mlp(out, b, t, prefix):
    """Granite's MLP: input_linear [gate; up], output_linear."""
    gate, up = np.split(t(prefix + "input_linear.weight"), 2)
    out[b + ("mlp", "w1")], out[b + ("mlp", "w3")] = gate.T, up.T
    out[b + ("mlp", "w2")] = t(prefix + "output_linear.weight").T


def granitemoehybrid_params(hf, tensors, spec):
    """Granite 4.0-H's layers: Mamba-2 under mamba, Llama's attention under self_attn, shared_mlp."""
    t, out = hf_params.Tensors(tensors), {}
    hf_params.head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    hf_params.norm(out, ("final_norm",), t, "model.norm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        mixer_params.attention_or_mamba2(out, b, t, spec, i, attention_prefix=p + "self_attn.",
                                         mamba_prefix=p + "mamba.")
        if spec.moe is not None and spec.moe.layers[i]:  # experts [E, 2I, H] / [E, H, I], the shared MLP
            m, e = b + ("mlp",), p + "block_sparse_moe."
            out[m + ("router",)] = t(e + "router.layer.weight").T
            out[m + ("gate_up",)] = np.swapaxes(t(e + "input_linear.weight"), 1, 2)
            out[m + ("down",)] = np.swapaxes(t(e + "output_linear.weight"), 1, 2)
            out[m + ("shared_gate_up",)] = t(p + "shared_mlp.input_linear.weight").T
            out[m + ("shared_down",)] = t(p + "shared_mlp.output_linear.weight").T
        else:
            shared_mlp(out, b, t, p + "shared_mlp.")
        for ours, theirs in hf_params.PRE_NORMS.items():
            hf_params.norm(out, b + (ours,), t, p + theirs, "rms")
    t.done()
    return out


register("granitemoehybrid", Family("granitemoehybrid", granitemoehybrid_fields, granitemoehybrid_params))
