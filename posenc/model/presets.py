"""Model-family presets: the architecture of a family as dotted ``model.*`` config fields.

``PRESETS[name]`` is a plain dict ``{"model.field": value}``, applied to a
config with ``posenc.config.overrides.apply(config, PRESETS[name])``
(the default config's ``:gemma3`` etc.: configs/default.py) and the starting point of
``posenc.hf`` for a checkpoint of the family, which then sets the
checkpoint's own sizes, RoPE scaling, window and the exact layer pattern.
Each preset holds what makes the family's layers what they are (norms and
their placement, MLP, biases, RoPE base and layout, spans, soft-caps, QK-norm,
logit scale, the per-layer options of ``model.position.layers``); sizes stay
the config's, except ``model.num_layers`` where a layer pattern needs a whole
period (Gemma 3: 6, Llama 4 and SWAN-GPT: 4). Values are the published
models' (the HF configs of the named checkpoint); a preset used at a small
scale (configs/default.py) changes the window / chunk after applying it. The
hybrid families (recurrent mixers beside attention: Qwen3-Next, Falcon-H1,
Granite 4.0-H, Kimi Linear, ...) are ``posenc.model.hybrid_presets``'.
"""

from __future__ import annotations

import math

from posenc.model import hybrid_presets

_LLAMA_LIKE = {
    "model.position.kind": "rope",
    "model.norm.kind": "rms",
    "model.norm.placement": "pre",
    "model.mlp": "swiglu",
    "model.tie_embeddings": False,
}

_GEMMA = {
    "model.position.kind": "rope",
    "model.position.rope.base": 10000.0,
    "model.norm.kind": "rms_offset",  # (1 + w) gains
    "model.norm.placement": "sandwich",  # input / post-attention, pre- / post-feedforward norms
    "model.norm.eps": 1e-6,
    "model.norm.embed_scale": True,  # embeddings times sqrt(d_model)
    "model.mlp": "geglu",  # gelu_pytorch_tanh gate
    "model.tie_embeddings": True,
}

PRESETS: dict[str, dict] = {
    # Llama 3.1 / 3.2: RoPE 500k with the llama3 frequency scaling (factor 8 from 8192 tokens)
    "llama3": {**_LLAMA_LIKE, "model.norm.eps": 1e-5,
               "model.position.rope.base": 500000.0,
               "model.position.rope.scaling": "llama3", "model.position.rope.factor": 8.0,
               "model.position.rope.original_length": 8192,
               "model.position.rope.low_freq_factor": 1.0,
               "model.position.rope.high_freq_factor": 4.0},
    # Mistral 7B v0.1: every layer a sliding window of 4096
    "mistral": {**_LLAMA_LIKE, "model.norm.eps": 1e-5, "model.position.rope.base": 10000.0,
                "model.attention_span": "window", "model.attention_window": 4096},
    # Qwen2 / 2.5: RoPE 1e6, q / k / v biases. Its HF code has no log-n scaling (Qwen-1's
    # use_logn_attn: the "qwen" preset); sliding windows are off in the released configs.
    "qwen2": {**_LLAMA_LIKE, "model.norm.eps": 1e-6, "model.position.rope.base": 1e6,
              "model.bias": "qkv"},
    # Qwen-1 (trust_remote_code, not in transformers): log-n attention past the 2048 training tokens
    "qwen": {**_LLAMA_LIKE, "model.norm.eps": 1e-6, "model.position.rope.base": 10000.0,
             "model.bias": "qkv", "model.logit_scale.kind": "logn",
             "model.logit_scale.train_length": 2048},
    # Gemma 2: soft-capped attention (50) and output (30) logits, window and global layers alternate
    "gemma2": {**_GEMMA, "model.num_layers": 2, "model.attention_span": "window",
               "model.attention_window": 4096, "model.global_every": 2,
               "model.norm.attn_softcap": 50.0, "model.norm.final_softcap": 30.0},
    # Gemma 3 (4B and up): 5 window layers (1024) : 1 global, RoPE 10k on the window layers and
    # 1M on the global ones, QK-norm. (Gemma 3 4B+ also scale the global RoPE linearly by 8 and
    # Gemma 3 1B uses a window of 512: posenc.hf reads both from the checkpoint.)
    "gemma3": {**_GEMMA, "model.num_layers": 6, "model.attention_span": "window",
               "model.attention_window": 1024, "model.global_every": 6,
               "model.norm.qk_norm": "rms",
               "model.position.layers": ({"every": 6, "offset": 5, "rope.base": 1e6},)},
    # Llama 4 (Scout / Maverick text layers): chunked attention (8192) on the RoPE layers, a global
    # NoPE layer every 4th with the attention temperature, weight-free QK-norm after RoPE on the
    # RoPE layers only, RoPE 500k with interleaved pairs (its complex rotation)
    "llama4": {**_LLAMA_LIKE, "model.norm.eps": 1e-5, "model.num_layers": 4,
               "model.position.rope.base": 500000.0, "model.position.rope.layout": "interleaved",
               "model.position.layers": ({"every": 4, "offset": 3, "kind": "nope"},),
               "model.attention_span": "chunk", "model.attention_chunk": 8192,
               "model.global_every": 4,
               "model.norm.qk_norm": "rms_plain", "model.norm.qk_norm_layers": "positional",
               "model.norm.qk_norm_after_rope": True,
               "model.logit_scale.kind": "temperature", "model.logit_scale.layers": "nope",
               "model.logit_scale.floor_scale": 8192.0, "model.logit_scale.attn_scale": 0.1},
    # SWAN-GPT: sliding-window RoPE layers, a global NoPE layer every 4th with log-n scaling
    "swan": {"model.position.kind": "rope", "model.num_layers": 4,
             "model.position.layers": ({"every": 4, "offset": 3, "kind": "nope"},),
             "model.attention_span": "window", "model.attention_window": 512,
             "model.global_every": 4,
             "model.logit_scale.kind": "logn", "model.logit_scale.layers": "nope"},
    # GPT-NeoX / Pythia: rotary on the first 25% of each head, parallel attention and MLP,
    # LayerNorm with bias, biases everywhere, exact GELU
    "gpt_neox": {"model.position.kind": "rope", "model.position.rope.base": 10000.0,
                 "model.position.rope.rotary_fraction": 0.25, "model.norm.kind": "layer",
                 "model.norm.eps": 1e-5, "model.parallel_residual": True, "model.bias": "all",
                 "model.mlp": "gelu_erf", "model.tie_embeddings": False},
    # Phi-3: Llama-like; the 128k models scale RoPE with LongRoPE (per-checkpoint short / long
    # factors, original length 4096: posenc.hf reads them)
    "phi3": {**_LLAMA_LIKE, "model.norm.eps": 1e-5, "model.position.rope.base": 10000.0},
    # BLOOM: ALiBi, LayerNorm after the embedding, biases everywhere, tanh GELU, tied head
    "bloom": {"model.position.kind": "alibi", "model.norm.kind": "layer", "model.norm.eps": 1e-5,
              "model.norm.embed_norm": True, "model.bias": "all", "model.mlp": "gelu",
              "model.tie_embeddings": True},
    # Qwen3 (dense): Qwen2's layers without biases, with a per-head RMSNorm of q and k before RoPE
    "qwen3": {**_LLAMA_LIKE, "model.norm.eps": 1e-6, "model.position.rope.base": 1e6,
              "model.norm.qk_norm": "rms"},
    # OLMo 2: the norms on the sublayer outputs (x + N(F(x)), "reordered"), RMSNorm of the whole
    # q / k projection, RoPE 500k
    "olmo2": {**_LLAMA_LIKE, "model.norm.eps": 1e-6, "model.norm.placement": "reordered",
              "model.norm.qk_norm": "rms_full", "model.position.rope.base": 500000.0},
    # OLMo 3: OLMo 2's layers, 3 sliding-window (4096) : 1 global (posenc.hf reads each layer
    # type's RoPE, e.g. YaRN on the global layers of the long-context checkpoints)
    "olmo3": {**_LLAMA_LIKE, "model.norm.eps": 1e-6, "model.norm.placement": "reordered",
              "model.norm.qk_norm": "rms_full", "model.position.rope.base": 500000.0,
              "model.num_layers": 4, "model.attention_span": "window",
              "model.attention_window": 4096, "model.global_every": 4},
    # SmolLM3: Llama-like, every 4th layer NoPE, tied head, RoPE 5M
    "smollm3": {**_LLAMA_LIKE, "model.norm.eps": 1e-6, "model.position.rope.base": 5e6,
                "model.tie_embeddings": True, "model.num_layers": 4,
                "model.position.layers": ({"every": 4, "offset": 3, "kind": "nope"},)},
    # GLM-4 (0414): sandwich RMSNorms, q / k / v biases, RoPE on half of each head in pairs (2i, 2i + 1)
    "glm4": {**_LLAMA_LIKE, "model.norm.eps": 1e-5, "model.norm.placement": "sandwich",
             "model.bias": "qkv", "model.position.rope.base": 10000.0,
             "model.position.rope.layout": "interleaved", "model.position.rope.rotary_fraction": 0.5},
    # Cohere 2 (Command R7B / A): one LayerNorm without bias feeding parallel attention and MLP,
    # 3 sliding-window (4096) RoPE layers : 1 global NoPE layer, interleaved RoPE pairs, tied head,
    # output logits times logit_scale (transformers' default 0.0625; posenc.hf reads the checkpoint's)
    "cohere2": {"model.position.kind": "rope", "model.position.rope.base": 50000.0,
                "model.position.rope.layout": "interleaved", "model.norm.kind": "layer_nobias",
                "model.norm.eps": 1e-5, "model.norm.placement": "pre", "model.parallel_residual": True,
                "model.mlp": "swiglu", "model.tie_embeddings": True, "model.num_layers": 4,
                "model.attention_span": "window", "model.attention_window": 4096,
                "model.global_every": 4,
                "model.position.layers": ({"every": 4, "offset": 3, "kind": "nope"},),
                "model.logits_multiplier": 0.0625},
    # EXAONE 4.0: OLMo 2's reordered norms with a per-head QK RMSNorm, 3 sliding-window (4096)
    # RoPE layers : 1 global NoPE layer
    "exaone4": {**_LLAMA_LIKE, "model.norm.eps": 1e-5, "model.norm.placement": "reordered",
                "model.norm.qk_norm": "rms", "model.position.rope.base": 1e6,
                "model.num_layers": 4, "model.attention_span": "window",
                "model.attention_window": 4096, "model.global_every": 4,
                "model.position.layers": ({"every": 4, "offset": 3, "kind": "nope"},)},
    # DeepSeek-V3 (its dense layers; posenc has no mixture of experts): multi-head latent attention
    # (q_lora_rank 1536, kv_lora_rank 512, 128 + 64 query / key widths, 128 values), YaRN x40 from 4096
    # on the rotary parts in pairs (2i, 2i + 1), the softmax scale 192^-1/2 times mscale(40, 1)^2
    "deepseek_v3": {**_LLAMA_LIKE, "model.norm.eps": 1e-6, "model.num_kv_heads": 0,
                    "model.mla.kv_lora_rank": 512, "model.mla.q_lora_rank": 1536,
                    "model.mla.qk_nope_head_dim": 128, "model.mla.qk_rope_head_dim": 64,
                    "model.mla.v_head_dim": 128,
                    "model.attention_scale": 192 ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2,
                    "model.position.rope.base": 10000.0, "model.position.rope.layout": "interleaved",
                    "model.position.rope.scaling": "yarn", "model.position.rope.factor": 40.0,
                    "model.position.rope.original_length": 4096, "model.position.rope.beta_fast": 32.0,
                    "model.position.rope.beta_slow": 1.0, "model.position.rope.mscale": 1.0,
                    "model.position.rope.mscale_all_dim": 1.0},
    # T5-style relative bias with unscaled logits (T5 folds 1 / sqrt(d) into its init), RMSNorm,
    # gated GELU (T5 v1.1), one bias table shared by every layer
    "t5": {"model.position.kind": "t5", "model.attention_scale": 1.0, "model.norm.kind": "rms",
           "model.norm.placement": "pre", "model.mlp": "geglu", "model.tie_embeddings": False},
}

PRESETS.update(hybrid_presets.PRESETS)

# Mixture-of-experts families (model.moe; posenc.model.moe): each family's attention and norms, its router,
# experts and shared experts, which layers are MoE, and its training losses (router_aux_loss_coef and
# router_z_loss_coef as its config or paper sets them). The expert counts are small (8, top-2; the
# checkpoint's own in the comment): like the widths they are sizes, which posenc.hf sets per checkpoint.
_MOE = {"model.moe.num_experts": 8, "model.moe.num_experts_per_tok": 2}
_SIGMOID_ROUTER = {"model.moe.router": "sigmoid_top_k", "model.moe.norm_topk_prob": True,
                   "model.moe.routed_scaling_factor": 2.5, "model.moe.score_correction_bias": True,
                   "model.moe.router_dtype": "float32", "model.moe.n_shared_experts": 1,
                   "model.moe.router_aux_loss_coef": 0.0}  # balanced by the bias update, not a loss
PRESETS.update({
    # Mixtral 8x7B: Llama-like layers, RoPE 1e6, 8 experts top-2 renormalised (the real counts)
    "mixtral": {**_LLAMA_LIKE, "model.norm.eps": 1e-5, "model.position.rope.base": 1e6, **_MOE,
                "model.moe.norm_topk_prob": True, "model.moe.router_aux_loss_coef": 0.02},
    # Qwen3-MoE (30B-A3B: 128 experts, top-8): Qwen3's layers, top-k renormalised, weights rounded to
    # the logits' dtype
    "qwen3_moe": {**PRESETS["qwen3"], **_MOE, "model.moe.norm_topk_prob": True, "model.moe.round_weights": True,
                  "model.moe.router_aux_loss_coef": 0.001},
    # OLMoE-1B-7B (64 experts, top-8): RMSNorm of the whole q / k projections, top-k not renormalised,
    # weights rounded; the load-balancing (0.01) and router z-loss (0.001) weights of the OLMoE paper
    "olmoe": {**_LLAMA_LIKE, "model.norm.eps": 1e-5, "model.position.rope.base": 10000.0,
              "model.norm.qk_norm": "rms_full", **_MOE, "model.moe.round_weights": True,
              "model.moe.router_aux_loss_coef": 0.01, "model.moe.router_z_loss_coef": 0.001},
    # DeepSeek-V3 with its experts (256 in 8 groups, top-8 within the best 4 groups; layers from
    # first_k_dense_replace = 3 on): sigmoid scores plus the correction bias for the choice, scaled by
    # 2.5, one shared expert, the loss-free bias update (1e-3); here 8 experts in 4 groups, the best 2,
    # MoE from layer 1. The "deepseek_v3" preset is its attention and dense layers alone.
    "deepseek_v3_moe": {**PRESETS["deepseek_v3"], **_MOE, **_SIGMOID_ROUTER, "model.moe.n_group": 4,
                        "model.moe.topk_group": 2, "model.moe.first_k_dense_replace": 1},
    # GLM-4.5 (160 experts, top-8, one group; MoE from layer 3): DeepSeek-V3's router and shared expert,
    # pre-norm, q / k / v biases, per-head QK-norm, RoPE 1e6 on half of each head (pairs (j, j + d/4))
    "glm4_moe": {**_LLAMA_LIKE, "model.norm.eps": 1e-5, "model.bias": "qkv", "model.norm.qk_norm": "rms",
                 "model.position.rope.base": 1e6, "model.position.rope.rotary_fraction": 0.5, **_MOE,
                 **_SIGMOID_ROUTER, "model.moe.first_k_dense_replace": 1},
    # gpt-oss-20b (32 experts, top-4): sliding-window (128) and full layers alternating, learned sinks,
    # biases on q, k, v, o, YaRN x32 from 4096 (no truncation); softmax over the top-k logits of a router
    # with a bias, experts with biases and the clamped SwiGLU; router_aux_loss_coef 0.9 (its config)
    "gpt_oss": {**_LLAMA_LIKE, "model.norm.eps": 1e-5, "model.bias": "attention", "model.num_layers": 2,
                "model.attention_sinks": "learned", "model.attention_span": "window",
                "model.attention_window": 128, "model.global_every": 2,
                "model.position.rope.base": 150000.0, "model.position.rope.scaling": "yarn",
                "model.position.rope.factor": 32.0, "model.position.rope.original_length": 4096,
                "model.position.rope.beta_fast": 32.0, "model.position.rope.beta_slow": 1.0,
                "model.position.rope.truncate": False, **_MOE, "model.moe.router": "top_k_softmax",
                "model.moe.router_bias": True, "model.moe.expert_bias": True, "model.moe.glu": "clamped_swiglu",
                "model.moe.router_aux_loss_coef": 0.9},
    # Llama 4 text (Scout: 16 experts, Maverick: 128 on every 2nd layer): Llama 4's attention layers,
    # top-1 sigmoid router whose score scales the expert's input, one shared expert
    "llama4_moe": {**PRESETS["llama4"], **_MOE, "model.moe.num_experts_per_tok": 1,
                   "model.moe.router": "top_k_sigmoid", "model.moe.scale": "input",
                   "model.moe.n_shared_experts": 1, "model.moe.router_aux_loss_coef": 0.001},
})


def get(name: str) -> dict:
    """A copy of preset ``name``; ValueError listing the presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of: {', '.join(sorted(PRESETS))}")
    return dict(PRESETS[name])
