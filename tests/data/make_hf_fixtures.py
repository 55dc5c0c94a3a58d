"""Regenerate tests/data/hf_models/<family>/: tiny random-weight HF checkpoints and their logits.

Not run by the test suite (it needs torch and transformers). Made in a separate environment:

    python3.11 -m venv /work/hfenv
    /work/hfenv/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors==0.8.0
    /work/hfenv/bin/python tests/data/make_hf_fixtures.py [family ...]

Named families are rewritten and the other folders left as they are (no name: every family). Each
family's weights are drawn with the seed of its place in ``configs()``, so new families go last.
The committed fixtures were made with transformers 5.24.0, torch 2.13.0 (CPU), safetensors 0.8.0
and Python 3.11.7 (qwen3, olmo2, smollm3, olmo3, glm4, cohere2, exaone4, qwen3_next and deepseek_v3: Python 3.11.2 with
the same transformers, torch and safetensors). The recurrent hybrids and the mixtures of experts
(qwen3_next_linear to gpt_oss_mxfp4 in ``configs()``) were made with transformers 5.18.0, torch
2.13.0+cpu, safetensors 0.8.0 and Python 3.11.2; with those versions the script gives the earlier
folders' weights bit for bit and their logits within 1e-5. Gemma 3 text (``Gemma3TextConfig``,
``Gemma3ForCausalLM``) is in transformers since 4.50 and Llama 4 text (``Llama4TextConfig``,
``Llama4ForCausalLM``) since 4.51; this script writes the 5.x config form (``rope_parameters``, per
layer type for Gemma 3 and OLMo 3), so it needs 5.x (posenc.hf reads the 4.x form too).

Each model comes from its HF config with ``AutoModelForCausalLM.from_config`` (no download),
eager attention, float32. The weights are drawn again with larger scales than HF's init (linear
weights N(0, 1 / fan_in), embeddings N(0, 1), norm gains 1 + N(0, 0.1^2), biases N(0, 0.1^2); the
recurrent layers' decays, convolutions and stacked experts as ``redraw`` says) so that every term
moves the logits (checked for the hybrids and the mixtures of experts: zeroing any one tensor, or
setting a norm gain to its neutral value, moves the logits by more than 1e-2). Each folder holds
``config.json`` and ``model.safetensors`` (as ``save_pretrained`` writes them: transformers 5 undoes
its load-time conversions, so the layouts are the released checkpoints' own, e.g. one tensor per
expert for Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3, GLM-4.5 and Qwen3-Next, ``backbone.*`` for
Nemotron-H, separate q / k / v convolutions for Kimi Linear) and ``logits.npz``; the script loads
each folder back with ``from_pretrained`` and checks that it gives the same logits:

- ``tokens`` int32 [2, L], L = 20: past the sliding windows and chunks (8; the Mamba-2 scans'
  ``chunk_size`` too) and Phi-3's original length (16); HF's torch Gated DeltaNet and KDA use chunks
  of 64 whatever the config (chunked and recurrent forms agree), so a loader's own chunk size is its
  choice;
- ``logits`` float32 [2, L, V]: one forward pass over all L tokens;
- ``prefix_logits`` float32 [2, L, V]: row t is the last position of a forward pass over the first
  t + 1 tokens;
- ``cached_logits`` float32 [2, L, V]: HF's own cached decoding, one token per call from an empty
  cache, the position ids given (Bamba's forward in 5.18 otherwise starts them at 0 on every call).
  It equals ``prefix_logits`` (within 2e-5) except where RoPE depends on the length (Phi-3's
  LongRoPE past its original length: HF keeps the keys and hidden states computed before the
  switch); for every hybrid and mixture of experts the HF cache is exact.

``gpt_oss_mxfp4`` stores its experts as MXFP4 ``*_blocks`` / ``*_scales`` with a
``quantization_config`` {"quant_method": "mxfp4"} (see ``mxfp4_experts``); its logits come from the
dequantized weights in float32. Verified with transformers 5.18.0 on the CPU: ``from_pretrained``
with ``Mxfp4Config(dequantize=True)`` (without it, it asks for accelerate) loads the folder, its
dequantized experts equal ours bit for bit, and, cast to float32 (it keeps them in bfloat16, which
moves the logits by about 4e-2), it gives the saved logits exactly.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

V, L = 96, 20
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_models")
COMMON = dict(vocab_size=V, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def configs():
    c = transformers
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    rng = np.random.default_rng(1)
    short = [round(float(x), 4) for x in rng.uniform(1.0, 2.0, 4)]
    long = [round(float(x), 4) for x in rng.uniform(2.0, 8.0, 4)]
    yarn = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    # Gated DeltaNet sizes (Qwen3-Next, Qwen3.5) and Mamba-2 sizes (Bamba, Granite 4.0-H, Falcon-H1):
    # chunks of 8 so that the chunked scans cross chunks within L = 20
    linear = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                  linear_value_head_dim=8, linear_conv_kernel_dim=4)
    mamba = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4,
                 mamba_expand=2, mamba_chunk_size=8, mamba_conv_bias=True, mamba_proj_bias=False)
    return {
        "llama": c.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                               max_position_embeddings=64, rope_parameters=llama3,
                               tie_word_embeddings=False, **COMMON),
        "mistral": c.MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                                   max_position_embeddings=64, **COMMON),
        "qwen2": c.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                               sliding_window=8, max_window_layers=1, tie_word_embeddings=True,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                               max_position_embeddings=64, **COMMON),
        "gemma2": c.Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 query_pre_attn_scalar=12, sliding_window=8,
                                 attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                 max_position_embeddings=64, **COMMON),
        "gemma3": c.Gemma3TextConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            max_position_embeddings=64, **COMMON),
        "llama4": c.Llama4TextConfig(
            hidden_size=32, intermediate_size=64, intermediate_size_mlp=64, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, moe_layers=[],
            attention_chunk_size=8, floor_scale=4, attn_scale=0.1, use_qk_norm=True,
            rope_parameters={**llama3, "factor": 16.0},
            max_position_embeddings=64, **COMMON),
        "gpt_neox": c.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, max_position_embeddings=64,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.5},
                                    **COMMON),
        "phi3": c.Phi3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64, original_max_position_embeddings=16,
                             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                              "short_factor": short, "long_factor": long},
                             **COMMON),
        "bloom": c.BloomConfig(hidden_size=48, n_layer=2, n_head=6, **COMMON),
        "qwen3": c.Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               use_sliding_window=True, sliding_window=8, max_window_layers=1,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                               max_position_embeddings=64, **COMMON),
        "olmo2": c.Olmo2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2,
                               rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                               max_position_embeddings=64, **COMMON),
        "smollm3": c.SmolLM3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   no_rope_layer_interval=4,
                                   rope_parameters={"rope_type": "default", "rope_theta": 2e6},
                                   max_position_embeddings=64, **COMMON),
        "olmo3": c.Olmo3Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, sliding_window=8,
            rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5,
                                                "original_max_position_embeddings": 16},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 5e5}},
            max_position_embeddings=64, **COMMON),
        "glm4": c.Glm4Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.5},
                             max_position_embeddings=64, **COMMON),
        "cohere2": c.Cohere2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                                   logit_scale=0.5,
                                   rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
                                   max_position_embeddings=64, **COMMON),
        "exaone4": c.Exaone4Config(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                                   sliding_window_pattern=4,
                                   rope_parameters={**llama3, "rope_theta": 1e6},
                                   max_position_embeddings=64, **COMMON),
        # Qwen3-Next with only its full-attention layers and dense MLPs (no Gated DeltaNet, no experts)
        "qwen3_next": c.Qwen3NextConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, layer_types=["full_attention"] * 2, num_experts=0,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
            max_position_embeddings=64, **COMMON),
        # DeepSeek-V3's dense layers (first_k_dense_replace = num_hidden_layers: no experts): MLA with a
        # low-rank query, YaRN with mscale != mscale_all_dim (an attention factor and a softmax scale)
        "deepseek_v3": c.DeepseekV3Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
            v_head_dim=6, first_k_dense_replace=2, n_routed_experts=4, rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                             "mscale": 1.0, "mscale_all_dim": 0.8},
            max_position_embeddings=64, **COMMON),
        # --- recurrent hybrids (made with transformers 5.18.0) ---
        # Qwen3-Next with both its layer kinds (Gated DeltaNet, then gated full attention) and dense MLPs;
        # 4 value heads over 2 key heads (each key head serves 2 value heads)
        "qwen3_next_linear": c.Qwen3NextConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_experts=0, **linear,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
            max_position_embeddings=64, **COMMON),
        # Qwen3.5's text model: Qwen3-Next's layers with separate in_proj_qkv / _z / _b / _a; its
        # interleaved M-RoPE is plain RoPE for text (the three position rows are equal)
        "qwen3_5": c.Qwen3_5TextConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, **linear,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [1, 1, 0], "mrope_interleaved": True},
            max_position_embeddings=64, **COMMON),
        # Falcon-H1: attention and Mamba-2 side by side in every layer; every muP multiplier != 1
        # (ssm_multipliers scale the in_proj outputs z, x, B, C, dt); mamba_rms_norm off as in the
        # released configs (y * silu(z), no norm: HF 5.18's gated norm squeezes a length-1 input, which
        # then broadcasts across the batch)
        "falcon_h1": c.FalconH1Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, mamba_d_ssm=64, mamba_rms_norm=False, mamba_norm_before_gate=False,
            **{k: v for k, v in mamba.items() if k != "mamba_expand"},
            embedding_multiplier=2.0, lm_head_multiplier=0.5, mlp_multipliers=[0.8, 1.5],
            key_multiplier=0.7, attention_in_multiplier=1.3, attention_out_multiplier=0.6,
            ssm_multipliers=[0.5, 0.8, 1.2, 1.5, 0.7], ssm_in_multiplier=1.4, ssm_out_multiplier=0.6,
            rope_parameters={"rope_type": "default", "rope_theta": 1e11},
            max_position_embeddings=64, **COMMON),
        # Granite 4.0-H without experts (num_local_experts = 0: the shared MLP alone), RoPE on; the
        # gated norm is over the whole Mamba width (no groups)
        "granitemoehybrid": c.GraniteMoeHybridConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, num_local_experts=0, shared_intermediate_size=64,
            layer_types=["mamba", "attention", "mamba"], position_embedding_type="rope",
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            embedding_multiplier=2.0, logits_scaling=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
            **mamba, max_position_embeddings=64, **COMMON),
        # Bamba: Mamba-2 layers and one attention layer (attn_layer_indices), RoPE on half the head
        "bamba": c.BambaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, attn_layer_indices=[1], **mamba,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            max_position_embeddings=64, **COMMON),
        # Nemotron-H "M-*-": Mamba-2, MLP (relu^2, no gate), attention without RoPE, MLP; one mixer
        # per layer; grouped gated norm (n_groups = 2); saved under backbone.*
        "nemotron_h": c.NemotronHConfig(
            hidden_size=32, layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
            mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=8, conv_kernel=4,
            chunk_size=8, max_position_embeddings=64, **COMMON),
        # LFM2: gated short convolutions (width conv_L_cache = 3, as released) and one attention layer
        # with QK-norm; tied embeddings; the MLP width is 2 / 3 * 100 = 66 rounded up to a multiple of
        # 16: 80 (block_auto_adjust_ff_dim)
        "lfm2": c.Lfm2Config(
            hidden_size=32, intermediate_size=100, block_multiple_of=16, block_ffn_dim_multiplier=1.0,
            block_auto_adjust_ff_dim=True, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            layer_types=["conv", "full_attention", "conv"], conv_L_cache=3, conv_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            max_position_embeddings=64, **COMMON),
        # Kimi Linear: Kimi Delta Attention (per-channel decay) then MLA without RoPE (q_lora_rank None);
        # dense MLPs everywhere (mlp_layer_types "dense": the MoE fields are unused)
        "kimi_linear": c.KimiLinearConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4,
            v_head_dim=8, layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"],
            linear_head_dim=8, linear_num_heads=4, linear_conv_kernel_dim=4,
            moe_intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64, **COMMON),
        # --- mixtures of experts (made with transformers 5.18.0); expert widths differ from the hidden
        # size so that every stored expert matrix shows its orientation ---
        # Qwen3-MoE: layer 0 dense (mlp_only_layers), layer 1 eight experts, top-2 renormalised
        "qwen3_moe": c.Qwen3MoeConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, mlp_only_layers=[0], decoder_sparse_step=1,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            max_position_embeddings=64, **COMMON),
        # Mixtral: every layer four experts, top-2 (softmax over the two chosen)
        "mixtral": c.MixtralConfig(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            max_position_embeddings=64, **COMMON),
        # OLMoE: QK-norm over the whole projection, eight experts, top-2 not renormalised
        "olmoe": c.OlmoeConfig(
            hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            max_position_embeddings=64, **COMMON),
        # DeepSeek-V3 with experts: layer 0 dense (first_k_dense_replace), layers 1-2 eight routed
        # experts in 4 groups (the best 2 groups, then the best 2 experts, by sigmoid score plus
        # e_score_correction_bias), one shared expert, routed_scaling_factor 2.5
        "deepseek_v3_moe": c.DeepseekV3Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
            v_head_dim=6, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
            topk_group=2, n_shared_experts=1, moe_intermediate_size=24, routed_scaling_factor=2.5,
            norm_topk_prob=True, rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                             "mscale": 1.0, "mscale_all_dim": 1.0},
            max_position_embeddings=64, **COMMON),
        # gpt-oss: sliding (8) then full attention, per-head sinks, q/k/v/o biases, YaRN; four experts
        # with biases, top-2 softmax, gate/up interleaved in gate_up_proj [E, H, 2I] (gate = even
        # columns), clamped SwiGLU (alpha 1.702, limit 7: the gate_up weights are drawn 4x larger so
        # that the clamp engages)
        "gpt_oss": c.GptOssConfig(
            hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention"], rope_parameters=yarn,
            max_position_embeddings=64, **COMMON),
        # Llama 4 text with experts on every 2nd layer (interleave_moe_layer_step: layers 1 and 3):
        # top-1 sigmoid router scaling the expert's input, a shared expert; chunked attention (8),
        # NoPE on layer 3, QK-norm, attention temperature tuning
        "llama4_moe": c.Llama4TextConfig(
            hidden_size=32, intermediate_size=24, intermediate_size_mlp=64, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, interleave_moe_layer_step=2,
            num_local_experts=4, num_experts_per_tok=1,
            attention_chunk_size=8, floor_scale=4, attn_scale=0.1, use_qk_norm=True,
            rope_parameters={**llama3, "factor": 16.0}, max_position_embeddings=64, **COMMON),
        # GLM-4.5 style: layer 0 dense (first_k_dense_replace), layer 1 eight experts in 2 groups (best
        # group, then top-2 by sigmoid score plus e_score_correction_bias), a shared expert; partial
        # RoPE (half of each head), QK-norm, q/k/v biases
        "glm4_moe": c.Glm4MoeConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, moe_intermediate_size=24, n_routed_experts=8,
            num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
            routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
            max_position_embeddings=64, **COMMON),
        # Qwen3-Next with both layer kinds and experts on every layer: eight experts, top-2
        # renormalised, plus a shared expert scaled by sigmoid(shared_expert_gate(x))
        "qwen3_next_moe": c.Qwen3NextConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=24, shared_expert_intermediate_size=48, norm_topk_prob=True, **linear,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
            max_position_embeddings=64, **COMMON),
        # Granite 4.0-H with experts: four experts (top-2, softmax over the two chosen) plus the shared
        # MLP on every layer, no positional encoding (position_embedding_type "nope")
        "granitemoehybrid_moe": c.GraniteMoeHybridConfig(
            hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48,
            layer_types=["mamba", "attention", "mamba"], position_embedding_type="nope",
            embedding_multiplier=2.0, logits_scaling=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
            **mamba, max_position_embeddings=64, **COMMON),
        # gpt-oss with its experts stored as MXFP4 (see mxfp4_experts): hidden 64 and expert width 96,
        # so each row spans 2 (gate_up) or 3 (down) blocks of 32
        "gpt_oss_mxfp4": c.GptOssConfig(
            hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention"], rope_parameters=yarn,
            max_position_embeddings=64, **COMMON),
        # Nemotron-H as released ("M-M*-" in hybrid_override_pattern's letters): the attention block
        # right after a Mamba-2 block, which has no MLP block of its own
        "nemotron_h_released": c.NemotronHConfig(
            hidden_size=32, layers_block_type=["linear_attention", "mlp", "linear_attention", "full_attention",
                                               "mlp"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
            mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=8, conv_kernel=4,
            chunk_size=8, max_position_embeddings=64, **COMMON),
    }


def redraw(model, seed, gate_up_gain=1.0):
    """Weights with scales that make every term matter (see the module docstring).

    Norm gains are 1 + N(0, 0.1^2) where HF initialises them to ones and N(0, 0.1^2) where it
    initialises them to zeros (Gemma's, Qwen3-Next's and Qwen3.5's (1 + w) norms). The recurrent
    layers' parameters: A = exp(A_log) uniform in [1, 4], dt_bias N(-2, 0.5^2) (softplus 0.13: with
    the input's term, per-step decays between about 0.5 and 0.95), Mamba's skip D uniform in
    [0.5, 1.5]; depthwise convolutions [C, 1, K] N(0, 1 / K); attention sinks N(0, 1). Expert
    weights stacked in one tensor [E, ., .] are N(0, 1 / fan_in) (fan_in = the hidden size for
    gate_up, the expert width for down), gate_up times ``gate_up_gain``; the experts' biases and
    DeepSeek's and GLM's e_score_correction_bias (a buffer) N(0, 0.1^2).
    """
    g = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size

    def randn(shape):
        return torch.randn(shape, generator=g)

    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "A_log":
                p.copy_(torch.log(1.0 + 3.0 * torch.rand(p.shape, generator=g)))
            elif leaf == "dt_bias":
                p.copy_(-2.0 + 0.5 * randn(p.shape))
            elif leaf == "D":
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif leaf == "sinks":
                p.copy_(randn(p.shape))
            elif p.ndim == 3 and ".experts." in name:
                fan_in = hidden if "gate_up" in leaf else p[0].numel() // hidden
                gain = gate_up_gain if "gate_up" in leaf else 1.0
                p.copy_(gain * randn(p.shape) / fan_in ** 0.5)
            elif p.ndim == 3:  # depthwise convolution [C, 1, K]
                p.copy_(randn(p.shape) / p.shape[-1] ** 0.5)
            elif p.ndim == 2 and ".experts." in name and leaf.endswith("_bias"):
                p.copy_(0.1 * randn(p.shape))
            elif p.ndim == 2 and "embed" not in name and "wte" not in name and "word_embeddings" not in name:
                p.copy_(randn(p.shape) / p.shape[1] ** 0.5)
            elif p.ndim == 2:
                p.copy_(randn(p.shape))
            elif name.endswith("bias"):
                p.copy_(0.1 * randn(p.shape))
            else:  # norm gains: 1 + w where HF starts at ones, w where it starts at zeros
                offset = 1.0 if float(p.mean()) > 0.5 else 0.0
                p.copy_(offset + 0.1 * randn(p.shape))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * randn(b.shape))


MXFP4_MODULES_TO_NOT_CONVERT = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                "lm_head"]  # as in the released gpt-oss config.json


def mxfp4_experts(model, seed):
    """Draw gpt-oss's expert matrices as MXFP4 and load their dequantized values into ``model``.

    Each matrix [E, n_in, n_out] (gate_up_proj [E, H, 2I], down_proj [E, I, H]) is stored as the
    released checkpoints store it: ``*_blocks`` uint8 [E, n_out, n_in / 32, 16] (two FP4 e2m1 codes a
    byte, the low nibble first) and ``*_scales`` uint8 [E, n_out, n_in / 32] (the block's power of two
    plus 127). The blocks are uniform bytes; the scales are uniform in [122, 126] for gate_up (the
    weights about 4x the 1 / sqrt(fan_in) scale, so that the SwiGLU clamp engages) and in [120, 124]
    for down. transformers' own ``convert_moe_packed_tensors`` gives the float weights (exact: every
    value is an FP4 value times a power of two). Returns the packed tensors by safetensors name.
    """
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(seed)
    packed = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim != 3 or ".experts." not in name:
                continue
            e, n_in, n_out = p.shape
            lo = 122 if "gate_up" in name else 120
            blocks = torch.randint(0, 256, (e, n_out, n_in // 32, 16), generator=g).to(torch.uint8)
            scales = torch.randint(lo, lo + 5, (e, n_out, n_in // 32), generator=g).to(torch.uint8)
            weight = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            assert weight.shape == p.shape, (name, weight.shape, p.shape)
            p.copy_(weight)
            packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
    return packed


def write_mxfp4(out, packed):
    """Replace the saved float expert matrices with their MXFP4 blocks and scales; mark the config."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    for name in packed:
        tensors.pop(name.rsplit("_", 1)[0], None)
    tensors.update(packed)
    save_file(dict(sorted(tensors.items())), path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"modules_to_not_convert": MXFP4_MODULES_TO_NOT_CONVERT,
                                     "quant_method": "mxfp4"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def reload_logits(out, tokens, mxfp4=False):
    """transformers' own load of the written folder (MXFP4 dequantized on the CPU), in float32: its logits."""
    kwargs = {}
    if mxfp4:
        kwargs["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32,
                                                 **kwargs).eval()
    model.float()  # transformers keeps the dequantized experts in bfloat16 (their values exactly)
    with torch.no_grad():
        return model(tokens).logits.float().numpy()


def main(families):
    """Write the folders of ``families`` (every family when empty); the others stay as they are."""
    torch.manual_seed(0)
    tokens = torch.from_numpy(np.random.default_rng(0).integers(3, V, (2, L))).long()
    every = configs()
    unknown = sorted(set(families) - set(every))
    if unknown:
        raise SystemExit(f"unknown families {unknown}; choose from {', '.join(every)}")
    for i, (family, config) in enumerate(every.items()):  # the seed is the place in this list
        if families and family not in families:
            continue
        config._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                 dtype=torch.float32).eval()
        redraw(model, seed=100 + i, gate_up_gain=4.0 if family == "gpt_oss" else 1.0)
        packed = mxfp4_experts(model, seed=1000 + i) if family.endswith("_mxfp4") else None
        with torch.no_grad():
            logits = model(tokens).logits.float().numpy()
            prefix = np.stack([model(tokens[:, :t + 1]).logits[:, -1].float().numpy()
                               for t in range(L)], axis=1)
            cache, cached = None, []
            for t in range(L):
                step = model(tokens[:, t:t + 1], past_key_values=cache, use_cache=True,
                             position_ids=torch.full((tokens.shape[0], 1), t))
                cache = step.past_key_values
                cached.append(step.logits[:, -1].float().numpy())
            cached = np.stack(cached, axis=1)
        out = os.path.join(HERE, family)
        if os.path.isdir(out):
            shutil.rmtree(out)
        model.save_pretrained(out, safe_serialization=True)
        if packed is not None:
            write_mxfp4(out, packed)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(out, extra)):
                os.remove(os.path.join(out, extra))
        np.savez_compressed(os.path.join(out, "logits.npz"), tokens=tokens.numpy().astype(np.int32),
                            logits=logits.astype(np.float32), prefix_logits=prefix.astype(np.float32),
                            cached_logits=cached.astype(np.float32))
        with open(os.path.join(out, "config.json")) as f:
            arch = json.load(f)["architectures"]
        reloaded = reload_logits(out, tokens, mxfp4=packed is not None)
        print(f"{family}: {type(model).__name__} {arch}, |logits| max {np.abs(logits).max():.2f}, "
              f"full vs prefix {np.abs(logits - prefix).max():.2e}, "
              f"prefix vs HF cached {np.abs(prefix - cached).max():.2e}, "
              f"HF reload of the folder vs full {np.abs(reloaded - logits).max():.2e}")


if __name__ == "__main__":
    main(sys.argv[1:])
