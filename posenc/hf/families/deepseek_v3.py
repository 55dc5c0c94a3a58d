"""DeepSeek-V3: multi-head latent attention (``model.mla``), SwiGLU MLPs and mixture-of-experts layers.

RoPE acts on the rotary parts of queries and keys (interleaved pairs with
``rope_interleave``), and the softmax scale is multiplied by YaRN's
``mscale_all_dim`` factor squared (transformers' ``yarn_apply_mscale``).
The layers from ``first_k_dense_replace`` on are mixture-of-experts
(``model.moe``, preset ``deepseek_v3_moe``): sigmoid scores, the
``e_score_correction_bias`` added for the group-limited choice only (a
non-trained variable), ``routed_scaling_factor`` and ``n_shared_experts``;
multi-token-prediction layers' weights (``num_nextn_predict_layers``) are
refused in one line.
"""

from __future__ import annotations

from posenc.attention import mla
from posenc.hf import fields, hf_params, moe_fields, moe_params, rope_fields
from posenc.hf.hf_params import heads_in, heads_out, norm
from posenc.hf.registry import Family, register


def deepseek_v3_fields(hf):
    """DeepSeek-V3's dense layers: multi-head latent attention (model.mla), RoPE on the rotary parts
    (interleaved pairs with rope_interleave), the softmax scale times YaRN's mscale_all_dim squared."""
    n = int(hf["num_hidden_layers"])
    dense = hf.get("first_k_dense_replace", 3)  # HF's default
    moe = dense is None or int(dense) < n  # layers from first_k_dense_replace on: experts (model.moe)
    heads = int(hf["num_attention_heads"])
    fields.refuse(hf, {"attention_bias": ((False,), "posenc's MLA has no biases"),
                       "num_key_value_heads": ((None, heads), "MLA's keys have every head (HF repeats them)"),
                       "pretraining_tp": ((None, 1), "tensor-parallel slicing changes the sums"),
                       "moe_layer_freq": ((None, 1), "every layer from first_k_dense_replace on is MoE"),
                       "topk_method": ((None, "noaux_tc"), "posenc's router is noaux_tc (sigmoid_top_k)"),
                       "scoring_func": ((None, "sigmoid"), "posenc's router scores with a sigmoid")})
    out = fields.base(hf, "deepseek_v3_moe" if moe else "deepseek_v3")
    if moe:
        moe_fields.moe({**hf, "first_k_dense_replace": dense or 0}, out, options=(
            "norm_topk_prob", "n_group", "topk_group", "routed_scaling_factor", "n_shared_experts"))
    out["model.mlp"] = fields.act(hf, "hidden_act", {"silu": "swiglu"})
    nope, rope_dim = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"])
    out.update({"model.num_kv_heads": 0, "model.head_dim": nope + rope_dim,
                "model.mla.kv_lora_rank": int(hf["kv_lora_rank"]),
                "model.mla.q_lora_rank": int(hf.get("q_lora_rank") or 0),
                "model.mla.qk_nope_head_dim": nope, "model.mla.qk_rope_head_dim": rope_dim,
                "model.mla.v_head_dim": int(hf["v_head_dim"])})
    p = rope_fields.rope_params(hf)
    rope_fields.set_rope(out, rope_fields.rope_options(hf, p))
    out["model.position.rope.layout"] = "interleaved" if hf.get("rope_interleave", True) else "half"
    # transformers' yarn_apply_mscale: any scaled RoPE with mscale_all_dim multiplies the softmax scale
    all_dim = p.get("mscale_all_dim") if p["rope_type"] != "default" else None
    out["model.attention_scale"] = mla.softmax_scale(nope + rope_dim, factor=float(p.get("factor") or 1.0),
                                                     mscale=float(all_dim or 0.0))
    fields.set_spans(out, hf, ["full"] * n)
    return out


def deepseek_v3_params(hf, tensors, spec):
    """DeepSeek-V3's dense layers: MLA's projections (posenc.model.latent_attention), SwiGLU MLPs."""
    moe_params.refuse_extra_layers(hf, tensors, spec.num_layers)
    t, out = hf_params.Tensors(tensors), {}
    m, H = spec.mla, spec.num_heads
    qk, nv = m.qk_head_dim, m.qk_nope_head_dim + m.v_head_dim
    hf_params.head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    norm(out, ("final_norm",), t, "model.norm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        a = p + "self_attn."
        if m.q_lora_rank:
            out[b + ("attn", "wq_a")] = t(a + "q_a_proj.weight").T
            out[b + ("attn", "q_norm")] = t(a + "q_a_layernorm.weight")
            out[b + ("attn", "wq_b")] = heads_in(t(a + "q_b_proj.weight"), H, qk)
        else:
            out[b + ("attn", "wq")] = heads_in(t(a + "q_proj.weight"), H, qk)
        out[b + ("attn", "wkv_a")] = t(a + "kv_a_proj_with_mqa.weight").T  # [D, C + R]: latent, rotary key
        out[b + ("attn", "kv_norm")] = t(a + "kv_a_layernorm.weight")
        out[b + ("attn", "wkv_b")] = heads_in(t(a + "kv_b_proj.weight"), H, nv)  # [C, H, N + V]
        out[b + ("attn", "wo")] = heads_out(t(a + "o_proj.weight"), H, m.v_head_dim)
        if spec.moe is not None and spec.moe.layers[i]:  # router, experts and shared experts
            moe_params.sigmoid_moe(out, b + ("mlp",), t, p, spec)
        else:
            hf_params.dense_mlp(out, b + ("mlp",), t, p + "mlp.", spec)
        for ours, theirs in hf_params.PRE_NORMS.items():
            norm(out, b + (ours,), t, p + theirs, "rms")
    t.done()
    return out


register("deepseek_v3", Family("deepseek_v3", deepseek_v3_fields, deepseek_v3_params))
