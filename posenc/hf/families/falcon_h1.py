"""Falcon-H1: attention and Mamba-2 side by side in every layer, with its muP multipliers.

Every layer is ``model.layer_types`` entry ``parallel_mamba2``: attention
(RoPE) reading the normed input times ``attention_in_multiplier``, its output
times ``attention_out_multiplier``, plus Mamba-2 reading it times
``ssm_in_multiplier``, in_proj's [z | x | B | C | dt] times ``ssm_multipliers``,
its output times ``ssm_out_multiplier`` (``model.recurrent.parallel_mamba2``);
the Mamba-2 norm is none (``mamba_rms_norm`` false: y * silu(z)) or the
group-wise gated one, before or after the gate (``mamba_norm_before_gate``).
The rest are folded into the weights or set as posenc's multipliers:
``key_multiplier`` into k_proj, ``mlp_multipliers`` (gate, down) into the
SwiGLU's gate and down projections, ``embedding_multiplier`` and
``lm_head_multiplier`` as ``model.embedding_multiplier`` and
``model.logits_multiplier``.
"""

from __future__ import annotations

from posenc.hf import fields, hf_params, mixer_fields, mixer_params, rope_fields
from posenc.hf.registry import Family, register, unsupported


def falcon_h1_fields(hf):
    """Falcon-H1: parallel attention and Mamba-2 layers with their multipliers, SwiGLU MLPs."""
    n = int(hf["num_hidden_layers"])
    if bool(hf.get("mamba_proj_bias", False)) != bool(hf.get("projectors_bias", False)):
        raise unsupported(hf, "projectors_bias", "posenc's Mamba-2 has biases on in_proj and out_proj together "
                          "(mamba_proj_bias)")
    heads, head_dim = int(hf["mamba_n_heads"]), int(hf["mamba_d_head"])
    inner = hf.get("mamba_d_ssm") or int(hf.get("mamba_expand", 2) * int(hf["hidden_size"]))
    if int(inner) != heads * head_dim:
        raise unsupported(hf, "mamba_d_ssm", f"the inner width must be mamba_n_heads * mamba_d_head = "
                          f"{heads * head_dim}")
    out = fields.llama_core(hf, "falcon_h1")
    rope_fields.set_rope(out, rope_fields.rope_options(hf, rope_fields.rope_params(hf)))
    fields.set_spans(out, hf, ["full"] * n)
    out["model.layer_types"] = ("parallel_mamba2",) * n
    out["model.embedding_multiplier"] = float(hf.get("embedding_multiplier", 1.0))
    out["model.logits_multiplier"] = float(hf.get("lm_head_multiplier", 1.0))
    norm = ("grouped" if int(hf.get("mamba_n_groups", 1)) > 1 else "full") if hf.get("mamba_rms_norm") else "none"
    out.update(mixer_fields.mamba2({k: v for k, v in hf.items() if k != "mamba_expand"}, norm=norm))
    if norm != "none":
        out["model.recurrent.mamba2.norm_before_gate"] = bool(hf.get("mamba_norm_before_gate", True))
    p = "model.recurrent.parallel_mamba2."
    for name in ("attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier"):
        out[p + name] = float(hf.get(name, 1.0))
    out[p + "ssm_multipliers"] = tuple(float(m) for m in hf.get("ssm_multipliers") or (1.0,) * 5)
    return out


def falcon_h1_params(hf, tensors, spec):
    """Falcon-H1's layers: self_attn and mamba as the parallel mixer's attention and mamba, feed_forward
    with its multipliers folded in."""
    t, out = hf_params.Tensors(tensors), {}
    gate_m, down_m = hf.get("mlp_multipliers") or (1.0, 1.0)
    hf_params.head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    hf_params.norm(out, ("final_norm",), t, "model.final_layernorm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        mixer_params.attention(out, b + ("attn", "attention"), t, p + "self_attn.", spec,
                               key_multiplier=float(hf.get("key_multiplier", 1.0)))
        mixer_params.mamba2(out, b + ("attn", "mamba"), t, p + "mamba.", spec.recurrent.options["mamba2"])
        mixer_params.mlp(out, b, t, p + "feed_forward.", gate_scale=float(gate_m), down_scale=float(down_m))
        hf_params.norm(out, b + ("norm1",), t, p + "input_layernorm", "rms")
        hf_params.norm(out, b + ("norm2",), t, p + "pre_ff_layernorm", "rms")
    t.done()
    return out


register("falcon_h1", Family("falcon_h1", falcon_h1_fields, falcon_h1_params))
