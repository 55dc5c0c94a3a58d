"""Regenerate tests/data/hf_models/<family>/: tiny random-weight HF checkpoints and their logits.

Not run by the test suite (it needs torch and transformers). Made in a separate environment:

    python3.11 -m venv /work/hfenv
    /work/hfenv/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors==0.8.0
    /work/hfenv/bin/python tests/data/make_hf_fixtures.py [family ...]

Named families are rewritten and the other folders left as they are (no name: every family). Each
family's weights are drawn with the seed of its place in ``configs()``, so new families go last.
The committed fixtures were made with transformers 5.24.0, torch 2.13.0 (CPU), safetensors 0.8.0
and Python 3.11.7 (qwen3, olmo2, smollm3, olmo3, glm4, cohere2, exaone4, qwen3_next and deepseek_v3: Python 3.11.2 with
the same transformers, torch and safetensors). Gemma 3 text (``Gemma3TextConfig``,
``Gemma3ForCausalLM``) is in transformers since 4.50 and Llama 4 text (``Llama4TextConfig``,
``Llama4ForCausalLM``) since 4.51; this script writes the 5.x config form (``rope_parameters``, per
layer type for Gemma 3 and OLMo 3), so it needs 5.x (posenc.hf reads the 4.x form too).

Each model comes from its HF config with ``AutoModelForCausalLM.from_config`` (no download),
eager attention, float32. The weights are drawn again with larger scales than HF's init (linear
weights N(0, 1 / fan_in), embeddings N(0, 1), norm gains 1 + N(0, 0.1^2), biases N(0, 0.1^2)) so
that every term moves the logits. Each folder holds ``config.json`` and ``model.safetensors`` (as
``save_pretrained`` writes them) and ``logits.npz``:

- ``tokens`` int32 [2, L], L = 20: past the sliding windows and chunks (8) and Phi-3's original
  length (16);
- ``logits`` float32 [2, L, V]: one forward pass over all L tokens;
- ``prefix_logits`` float32 [2, L, V]: row t is the last position of a forward pass over the first
  t + 1 tokens;
- ``cached_logits`` float32 [2, L, V]: HF's own cached decoding, one token per call from an empty
  cache. It equals ``prefix_logits`` except where RoPE depends on the length (Phi-3's LongRoPE past
  its original length: HF keeps the keys and hidden states computed before the switch).
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
    }


def redraw(model, seed):
    """Weights with scales that make every term matter (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and "embed" not in name and "wte" not in name and "word_embeddings" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:  # norm gains; Gemma's and Qwen3-Next's (1 + w) norms start at w = 0
                offset = 0.0 if type(model).__name__.startswith(("Gemma", "Qwen3Next")) else 1.0
                p.copy_(offset + 0.1 * torch.randn(p.shape, generator=g))


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
        redraw(model, seed=100 + i)
        with torch.no_grad():
            logits = model(tokens).logits.float().numpy()
            prefix = np.stack([model(tokens[:, :t + 1]).logits[:, -1].float().numpy()
                               for t in range(L)], axis=1)
            cache, cached = None, []
            for t in range(L):
                step = model(tokens[:, t:t + 1], past_key_values=cache, use_cache=True)
                cache = step.past_key_values
                cached.append(step.logits[:, -1].float().numpy())
            cached = np.stack(cached, axis=1)
        out = os.path.join(HERE, family)
        if os.path.isdir(out):
            shutil.rmtree(out)
        model.save_pretrained(out, safe_serialization=True)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(out, extra)):
                os.remove(os.path.join(out, extra))
        np.savez_compressed(os.path.join(out, "logits.npz"), tokens=tokens.numpy().astype(np.int32),
                            logits=logits.astype(np.float32), prefix_logits=prefix.astype(np.float32),
                            cached_logits=cached.astype(np.float32))
        with open(os.path.join(out, "config.json")) as f:
            arch = json.load(f)["architectures"]
        print(f"{family}: {type(model).__name__} {arch}, |logits| max {np.abs(logits).max():.2f}, "
              f"full vs prefix {np.abs(logits - prefix).max():.2e}, "
              f"prefix vs HF cached {np.abs(prefix - cached).max():.2e}")


if __name__ == "__main__":
    main(sys.argv[1:])
