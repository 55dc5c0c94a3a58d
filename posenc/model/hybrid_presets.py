"""Presets of the hybrid families: recurrent mixers and attention, as dotted ``model.*`` fields.

Part of ``posenc.model.presets.PRESETS`` (applied the same way). Each holds
the layer pattern (``model.layer_types``, with ``model.num_layers`` one
period of it), the mixer kinds and their structural options
(``model.recurrent.*``: projection layout, norm form), and the attention
layers' position encoding, norms and MLP, as the published checkpoints'
configs have them; sizes (widths, heads, state sizes) stay the config's small
ones, which the checkpoint loaders replace with the checkpoint's. What a
family has that posenc's layers do not (a preset can only approximate it) is
said beside it.
"""

from __future__ import annotations

_PRE_RMS = {"model.norm.kind": "rms", "model.norm.placement": "pre", "model.mlp": "swiglu"}

# Qwen3-Next: 3 Gated DeltaNet : 1 gated full-attention layer; the attention's output gate inside q_proj,
# per-head QK RMSNorm, RoPE 1e7 on the first quarter of each head; RMSNorms with (1 + w) gains (the
# QK-norm's (1 + w) is the loader's to fold). Its mixture-of-experts MLPs are model.moe's.
_QWEN3_NEXT = {**_PRE_RMS, "model.norm.kind": "rms_offset", "model.norm.eps": 1e-6,
               "model.tie_embeddings": False, "model.num_layers": 4,
               "model.layer_types": ("gated_deltanet",) * 3 + ("attention",),
               "model.position.kind": "rope", "model.position.rope.base": 1e7,
               "model.position.rope.rotary_fraction": 0.25,
               "model.attention_gate": "elementwise", "model.norm.qk_norm": "rms"}

PRESETS: dict[str, dict] = {
    "qwen3_next": {**_QWEN3_NEXT, "model.recurrent.gated_deltanet.projections": "qkvz"},
    # Qwen3.5 (text): Qwen3-Next's layers with the delta rule's projections split (in_proj_qkv, _z, _b, _a);
    # its interleaved M-RoPE on text ids is RoPE
    "qwen3_5": {**_QWEN3_NEXT, "model.recurrent.gated_deltanet.projections": "split"},
    # Falcon-H1: every layer attention (RoPE 1e11) and Mamba-2 side by side; the SSM branch without its
    # gated norm (mamba_rms_norm False: y * silu(z)); the multipliers are each checkpoint's
    # (model.recurrent.parallel_mamba2.*; key_multiplier and mlp_multipliers fold into wk, w1 and w2)
    "falcon_h1": {**_PRE_RMS, "model.norm.eps": 1e-5, "model.tie_embeddings": False, "model.num_layers": 1,
                  "model.layer_types": ("parallel_mamba2",), "model.position.kind": "rope",
                  "model.position.rope.base": 1e11, "model.recurrent.mamba2.norm": "none"},
    # Granite 4.0-H (granitemoehybrid, dense: shared_mlp only): 9 Mamba-2 : 1 NoPE attention layer (Granite
    # 4.0-H Small's attention at 5, 15, 25, 35), the gated norm over the whole inner width, tied head; its
    # Granite multipliers are each checkpoint's (model.embedding_multiplier, ...)
    "granitemoehybrid": {**_PRE_RMS, "model.norm.eps": 1e-5, "model.tie_embeddings": True,
                         "model.num_layers": 10,
                         "model.layer_types": ("mamba2",) * 5 + ("attention",) + ("mamba2",) * 4,
                         "model.position.kind": "nope"},
    # Bamba-9B: attention at layers 9, 18, 27 of 32 (here one period: 9 Mamba-2, then attention), RoPE on
    # half of each head
    "bamba": {**_PRE_RMS, "model.norm.eps": 1e-5, "model.tie_embeddings": False, "model.num_layers": 10,
              "model.layer_types": ("mamba2",) * 9 + ("attention",),
              "model.position.kind": "rope", "model.position.rope.base": 10000.0,
              "model.position.rope.rotary_fraction": 0.5},
    # Nemotron-H: NoPE attention among Mamba-2 layers with the group-wise gated norm; its pattern
    # M-M-M-M*- ... makes each mixer and MLP a layer of its own (here a layer is a mixer and an MLP: 4 Mamba-2,
    # then attention) and its MLP is a squared ReLU (here the config's MLP)
    "nemotron_h": {"model.norm.kind": "rms", "model.norm.placement": "pre", "model.norm.eps": 1e-5,
                   "model.tie_embeddings": False, "model.num_layers": 5,
                   "model.layer_types": ("mamba2",) * 4 + ("attention",),
                   "model.position.kind": "nope", "model.recurrent.mamba2.norm": "grouped"},
    # LFM2 (350M's first layers: attention at 2, 5, 8, 10, 12, 14): gated short convolutions and RoPE 1e6
    # attention with per-head QK RMSNorm, tied head
    "lfm2": {**_PRE_RMS, "model.norm.eps": 1e-5, "model.tie_embeddings": True, "model.num_layers": 6,
             "model.layer_types": ("short_conv", "short_conv", "attention") * 2,
             "model.position.kind": "rope", "model.position.rope.base": 1e6, "model.norm.qk_norm": "rms"},
    # Kimi Linear (its dense layers): 3 KDA : 1 multi-head latent attention layer without position (NoPE MLA,
    # its rotary part left unrotated); the MLA widths here are small (the checkpoint's: kv_lora_rank 512,
    # 128 + 64 query / key widths, 128 values)
    "kimi_linear": {**_PRE_RMS, "model.norm.eps": 1e-5, "model.tie_embeddings": False, "model.num_layers": 4,
                    "model.layer_types": ("kda",) * 3 + ("attention",), "model.position.kind": "nope",
                    "model.num_kv_heads": 0, "model.mla.kv_lora_rank": 32, "model.mla.qk_nope_head_dim": 16,
                    "model.mla.qk_rope_head_dim": 8, "model.mla.v_head_dim": 16},
}
