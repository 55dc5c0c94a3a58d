"""LFM2: gated short convolutions (``conv`` layers) and attention with per-head QK RMSNorm.

The ``conv`` layers are ``model.layer_types`` entry ``short_conv``
(transformers' ``Lfm2ShortConv``: ``out_proj(C * conv(B * x))``); the
attention layers have RoPE and per-head QK RMSNorms (``q_layernorm``,
``k_layernorm``); every layer has a SwiGLU ``feed_forward`` (w1 gate, w3 up,
w2 down) whose width is HF's adjusted one (``block_auto_adjust_ff_dim``). The
final norm is ``embedding_norm``.
"""

from __future__ import annotations

from posenc.hf import fields, hf_params, mixer_fields, mixer_params, rope_fields
from posenc.hf.registry import Family, register

MIXER_OF = {"conv": "short_conv", "full_attention": "attention"}


def mlp_width(hf):
    """LFM2's feed-forward width: 2/3 of intermediate_size, times the multiplier, rounded up to
    block_multiple_of (block_auto_adjust_ff_dim)."""
    width = int(hf["intermediate_size"])
    if hf.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier, multiple = hf.get("block_ffn_dim_multiplier", 1.0), int(hf.get("block_multiple_of", 256))
        if multiplier is not None:
            width = int(multiplier * width)
            width = multiple * ((width + multiple - 1) // multiple)
    return width


def lfm2_fields(hf):
    """LFM2: short-convolution layers, RoPE attention with per-head QK RMSNorm, SwiGLU MLPs, tied head."""
    n = int(hf["num_hidden_layers"])
    idxs = hf.get("full_attn_idxs")
    default = ["full_attention" if idxs is None or i in idxs else "conv" for i in range(n)]
    mixers = mixer_fields.mixers(hf, n, hf.get("layer_types") or default, MIXER_OF)
    out = fields.base(hf, "lfm2", eps_key="norm_eps", tie_default=True)
    out["model.mlp"] = "swiglu"
    out["model.mlp_hidden"] = mlp_width(hf)
    out["model.norm.qk_norm"] = "rms"
    rope_fields.set_rope(out, rope_fields.rope_options(hf, rope_fields.rope_params(hf)))
    fields.set_spans(out, hf, ["full"] * n)
    out["model.layer_types"] = mixers
    if "short_conv" in mixers:
        out.update({"model.recurrent.short_conv.conv_width": int(hf.get("conv_L_cache", 3)),
                    "model.recurrent.short_conv.bias": bool(hf.get("conv_bias", False))})
    return out


def lfm2_params(hf, tensors, spec):
    """LFM2's layers: the short convolution under conv, attention under self_attn, feed_forward."""
    t, out = hf_params.Tensors(tensors), {}
    hf_params.head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    hf_params.norm(out, ("final_norm",), t, "model.embedding_norm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        if spec.layer_type(i) == "attention":
            mixer_params.attention(out, b + ("attn",), t, p + "self_attn.", spec, q_norm="q_layernorm",
                                   k_norm="k_layernorm", o="out_proj")
        else:
            mixer_params.short_conv(out, b, t, p + "conv.", spec.recurrent.options["short_conv"])
        mixer_params.mlp(out, b, t, p + "feed_forward.", gate="w1", up="w3", down="w2")
        hf_params.norm(out, b + ("norm1",), t, p + "operator_norm", "rms")
        hf_params.norm(out, b + ("norm2",), t, p + "ffn_norm", "rms")
    t.done()
    return out


register("lfm2", Family("lfm2", lfm2_fields, lfm2_params))
