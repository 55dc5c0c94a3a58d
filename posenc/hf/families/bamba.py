"""Bamba: Mamba-2 layers with attention at ``attn_layer_indices``.

The Mamba-2 layers (``model.layer_types`` entry ``mamba2``) have the gated
norm over the whole inner width; the attention layers are Llama's with RoPE
on part of each head (``partial_rotary_factor``); every layer has a SwiGLU
``feed_forward`` after ``pre_ff_layernorm``.
"""

from __future__ import annotations

from posenc.hf import fields, hf_params, mixer_fields, mixer_params, rope_fields
from posenc.hf.registry import Family, register, unsupported


def bamba_fields(hf):
    """Bamba: Mamba-2 layers, attention at attn_layer_indices with partial RoPE, SwiGLU MLPs."""
    n = int(hf["num_hidden_layers"])
    attn = set(hf.get("attn_layer_indices") or ())
    if any(not 0 <= i < n for i in attn):
        raise unsupported(hf, "attn_layer_indices", f"indices must lie in 0..{n - 1}")
    if hf.get("mamba_d_head") == "auto":
        hf = {**hf, "mamba_d_head": int(hf["mamba_expand"] * hf["hidden_size"]) // int(hf["mamba_n_heads"])}
    out = fields.llama_core(hf, "bamba")
    p = rope_fields.rope_params(hf)
    rope_fields.set_rope(out, rope_fields.rope_options(hf, p))
    fields.set_spans(out, hf, ["full"] * n)
    out["model.layer_types"] = tuple("attention" if i in attn else "mamba2" for i in range(n))
    if len(attn) < n:
        out.update(mixer_fields.mamba2(hf, norm="full"))
    return out


def bamba_params(hf, tensors, spec):
    """Bamba's layers: Mamba-2 under mamba, Llama's attention under self_attn, feed_forward."""
    t, out = hf_params.Tensors(tensors), {}
    hf_params.head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    hf_params.norm(out, ("final_norm",), t, "model.final_layernorm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        mixer_params.attention_or_mamba2(out, b, t, spec, i, attention_prefix=p + "self_attn.",
                                         mamba_prefix=p + "mamba.")
        mixer_params.mlp(out, b, t, p + "feed_forward.")
        hf_params.norm(out, b + ("norm1",), t, p + "input_layernorm", "rms")
        hf_params.norm(out, b + ("norm2",), t, p + "pre_ff_layernorm", "rms")
    t.done()
    return out


register("bamba", Family("bamba", bamba_fields, bamba_params))
