"""Kimi Linear with dense MLPs: Kimi Delta Attention layers and NoPE multi-head latent attention.

The ``linear_attention`` layers are KDA (``model.layer_types`` entry ``kda``:
per-channel decay ``-exp(A_log) softplus(f_b(f_a x) + dt_bias)``, the output
gated by ``sigmoid(g_b(g_a x))`` after a per-head RMSNorm); the
``full_attention`` layers are DeepSeek's MLA without RoPE (``model.mla``, the
key's rotary part shared by the heads and left unrotated; softmax scale
``qk_head_dim ** -0.5``). Mixture-of-experts MLPs (``mlp_layer_types``
"sparse") are refused in one line.
"""

from __future__ import annotations

import numpy as np

from posenc.hf import fields, hf_params, mixer_fields, mixer_params
from posenc.hf.hf_params import heads_in, heads_out, norm
from posenc.hf.registry import Family, register, unsupported

MIXER_OF = {"linear_attention": "kda", "full_attention": "attention"}


def kimi_linear_fields(hf):
    """Kimi Linear (dense): KDA and NoPE MLA layers, SwiGLU MLPs."""
    n = int(hf["num_hidden_layers"])
    sparse = [i for i, t in enumerate(hf.get("mlp_layer_types") or ["dense"] * n) if t != "dense"]
    if sparse:
        raise unsupported(hf, "mlp_layer_types", f"layers {sparse} are mixture-of-experts, which this loader "
                          "does not place (a checkpoint whose mlp_layer_types are all dense loads)")
    heads = int(hf["num_attention_heads"])
    fields.refuse(hf, {"attention_bias": ((False,), "posenc's MLA has no biases"),
                       "num_key_value_heads": ((None, heads), "MLA's keys have every head"),
                       "pretraining_tp": ((None, 1), "tensor-parallel slicing changes the sums")})
    mixers = mixer_fields.mixers(hf, n, hf.get("layer_types") or ["full_attention"] * n, MIXER_OF)
    out = fields.base(hf, "kimi_linear")
    out["model.mlp"] = fields.act(hf, "hidden_act", {"silu": "swiglu"})
    nope, rope_dim = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"])
    out.update({"model.num_kv_heads": 0, "model.head_dim": nope + rope_dim,
                "model.mla.kv_lora_rank": int(hf["kv_lora_rank"]),
                "model.mla.q_lora_rank": int(hf.get("q_lora_rank") or 0),
                "model.mla.qk_nope_head_dim": nope, "model.mla.qk_rope_head_dim": rope_dim,
                "model.mla.v_head_dim": int(hf["v_head_dim"]), "model.position.kind": "nope"})
    fields.set_spans(out, hf, ["full"] * n)
    out["model.layer_types"] = mixers
    if "kda" in mixers:
        out.update({"model.recurrent.kda.num_heads": int(hf["linear_num_heads"]),
                    "model.recurrent.kda.head_dim": int(hf["linear_head_dim"]),
                    "model.recurrent.kda.conv_width": int(hf.get("linear_conv_kernel_dim", 4))})
    return out


def kda(out, b, t, prefix, options):
    """Kimi Delta Attention's tensors (``posenc.model.mixers.kda``): q / k / v convs stacked."""
    a = b + ("attn",)
    for ours, theirs in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"),
                         ("forget_gate_down", "f_a_proj"), ("forget_gate_up", "f_b_proj"),
                         ("beta_proj", "b_proj"), ("output_gate_down", "g_a_proj"),
                         ("output_gate_up", "g_b_proj"), ("o_proj", "o_proj")):
        out[a + (ours,)] = t(prefix + theirs + ".weight").T
    if t.has(prefix + "conv1d.weight"):
        out[a + ("conv",)] = t(prefix + "conv1d.weight")[:, 0, :]
    else:
        out[a + ("conv",)] = np.concatenate([t(prefix + f"{n}_conv1d.weight")[:, 0, :] for n in "qkv"])
    out[a + ("A_log",)] = t(prefix + "A_log").reshape(-1)
    out[a + ("dt_bias",)] = t(prefix + "dt_bias").reshape(options["num_heads"], options["head_dim"])
    out[a + ("o_norm",)] = t(prefix + "o_norm.weight")


def mla(out, b, t, a, spec):
    """MLA's projections (posenc.model.latent_attention), as DeepSeek-V3's."""
    m, H = spec.mla, spec.num_heads
    qk, nv = m.qk_head_dim, m.qk_nope_head_dim + m.v_head_dim
    if m.q_lora_rank:
        out[b + ("attn", "wq_a")] = t(a + "q_a_proj.weight").T
        out[b + ("attn", "q_norm")] = t(a + "q_a_layernorm.weight")
        out[b + ("attn", "wq_b")] = heads_in(t(a + "q_b_proj.weight"), H, qk)
    else:
        out[b + ("attn", "wq")] = heads_in(t(a + "q_proj.weight"), H, qk)
    out[b + ("attn", "wkv_a")] = t(a + "kv_a_proj_with_mqa.weight").T
    out[b + ("attn", "kv_norm")] = t(a + "kv_a_layernorm.weight")
    out[b + ("attn", "wkv_b")] = heads_in(t(a + "kv_b_proj.weight"), H, nv)
    out[b + ("attn", "wo")] = heads_out(t(a + "o_proj.weight"), H, m.v_head_dim)


def kimi_linear_params(hf, tensors, spec):
    """Kimi Linear's layers: KDA or MLA under self_attn, the dense MLP under block_sparse_moe (or mlp)."""
    t, out = hf_params.Tensors(tensors), {}
    hf_params.head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    norm(out, ("final_norm",), t, "model.norm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        if spec.layer_type(i) == "attention":
            mla(out, b, t, p + "self_attn.", spec)
        else:
            kda(out, b, t, p + "self_attn.", spec.recurrent.options["kda"])
        mlp = "mlp." if t.has(p + "mlp.gate_proj.weight") else "block_sparse_moe."
        mixer_params.mlp(out, b, t, p + mlp)
        for ours, theirs in hf_params.PRE_NORMS.items():
            norm(out, b + (ours,), t, p + theirs, "rms")
    t.done()
    return out


register("kimi_linear", Family("kimi_linear", kimi_linear_fields, kimi_linear_params))
