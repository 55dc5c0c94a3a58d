"""Qwen3-Next: gated full-attention layers and Gated DeltaNet layers, with mixture-of-experts MLPs.

Gated attention (each head's gate after its query in q_proj), (1 + w)
RMSNorms, per-head qk-norm and partial RoPE; the ``linear_attention`` layers
are Gated DeltaNet (``model.layer_types`` entry ``gated_deltanet``, its
projections grouped by key head: in_proj_qkvz, in_proj_ba). The MLPs are
mixture-of-experts (``model.moe``: softmax top-k with the weights rounded, a
shared expert of width ``shared_expert_intermediate_size`` scaled by
``sigmoid(x . shared_expert_gate)``) except on ``mlp_only_layers`` and off
``decoder_sparse_step``, which keep a dense MLP of ``intermediate_size``.
"""

from __future__ import annotations

from posenc.hf import fields, hf_params, mixer_params, moe_fields, moe_params, rope_fields
from posenc.hf.registry import Family, register, unsupported

# HF layer_types -> posenc's model.layer_types
MIXER_OF = {"full_attention": "attention", "linear_attention": "gated_deltanet"}


def layer_types(hf, n, default):
    """posenc's mixer per layer of the config's ``layer_types`` (``default``: HF's when it has none)."""
    types = hf.get("layer_types") or default
    if len(types) != n:
        raise unsupported(hf, "layer_types", f"{len(types)} entries for {n} layers")
    for t in types:
        if t not in MIXER_OF:
            raise unsupported(hf, "layer_types", f"layer type {t!r}; posenc's are {', '.join(MIXER_OF)}")
    return tuple(MIXER_OF[t] for t in types)


def gated_deltanet_fields(hf, projections):
    """model.recurrent.gated_deltanet of the config's linear_* sizes."""
    return {"model.recurrent.gated_deltanet.num_key_heads": int(hf["linear_num_key_heads"]),
            "model.recurrent.gated_deltanet.num_value_heads": int(hf["linear_num_value_heads"]),
            "model.recurrent.gated_deltanet.key_head_dim": int(hf["linear_key_head_dim"]),
            "model.recurrent.gated_deltanet.value_head_dim": int(hf["linear_value_head_dim"]),
            "model.recurrent.gated_deltanet.conv_width": int(hf.get("linear_conv_kernel_dim", 4)),
            "model.recurrent.gated_deltanet.projections": projections}


def qwen3_next_fields(hf):
    """Qwen3-Next: gated attention (each head's gate after its query in q_proj), (1 + w) RMSNorms,
    per-head qk-norm, partial RoPE, Gated DeltaNet layers, dense and mixture-of-experts MLPs."""
    n = int(hf["num_hidden_layers"])
    every = hf.get("full_attention_interval", 4)  # HF's layer_types when the config has none
    mixers = layer_types(hf, n, fields.every(n, every, "linear_attention", "full_attention"))
    experts, step = hf.get("num_experts", 512), hf.get("decoder_sparse_step", 1)
    dense = set(hf.get("mlp_only_layers") or ())
    moe = [i for i in range(n) if i not in dense and experts and step and (i + 1) % step == 0]
    out = fields.llama_core(hf, "qwen3_next")
    if moe:  # softmax top-k (weights rounded), a shared expert scaled by sigmoid(x . g)
        moe_fields.moe({"norm_topk_prob": True, **hf, "num_experts": experts}, out,  # HF's default
                       options=("norm_topk_prob",))
        out.update({"model.moe.round_weights": True, "model.moe.n_shared_experts": 1,
                    "model.moe.shared_expert_gate": True, "model.moe.shared_expert_intermediate_size":
                    int(hf.get("shared_expert_intermediate_size") or hf["moe_intermediate_size"])})
    p = rope_fields.rope_params(hf)
    p.setdefault("partial_rotary_factor", 0.25)  # HF's default for Qwen3-Next
    rope_fields.set_rope(out, rope_fields.rope_options(hf, p))
    fields.set_spans(out, hf, ["full"] * n)
    out["model.norm.kind"] = "rms_offset"  # (1 + w) gains, also on q_norm / k_norm
    out["model.norm.qk_norm"] = "rms"
    out["model.attention_gate"] = "elementwise"
    out["model.layer_types"] = mixers
    if "gated_deltanet" in mixers:
        out.update(gated_deltanet_fields(hf, "qkvz"))
    return out


def qwen3_next_params(hf, tensors, spec):
    """Qwen3-Next's layers: attention as Llama's (q_proj with the gates), Gated DeltaNet's tensors under
    linear_attn, (1 + w) norms (the gated norm of the delta rule's output has plain w)."""
    t, out = hf_params.Tensors(tensors), {}
    hf_params.head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    hf_params.norm(out, ("final_norm",), t, "model.norm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        if spec.layer_type(i) == "attention":
            mixer_params.attention(out, b + ("attn",), t, p + "self_attn.", spec, offset=1.0)
        else:
            mixer_params.gated_deltanet(out, b, t, p + "linear_attn.", spec.recurrent.options["gated_deltanet"])
        if spec.moe is not None and spec.moe.layers[i]:
            moe_params.softmax_moe()(out, b + ("mlp",), t, p, spec)
            moe_params.shared(out, b + ("mlp",), t, p + "mlp.shared_expert.")
            out[b + ("mlp", "shared_expert_gate")] = t(p + "mlp.shared_expert_gate.weight")[0]
        else:
            mixer_params.mlp(out, b, t, p + "mlp.")
        for ours, theirs in hf_params.PRE_NORMS.items():
            hf_params.norm(out, b + (ours,), t, p + theirs, "rms")
    t.done()
    return out


register("qwen3_next", Family("qwen3_next", qwen3_next_fields, qwen3_next_params))
