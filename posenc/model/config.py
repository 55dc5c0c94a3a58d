"""The model section of every config: one place that lists every field.

Configs in ``configs/`` start from :func:`model_config` and override fields;
``--config.model.<field>=...`` overrides them on the command line.
"""

from __future__ import annotations

import ml_collections


def position_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model.position``; each encoding reads its own."""
    return ml_collections.ConfigDict(
        dict(
            kind="rope",  # posenc.registry.POSITION_KINDS
            # explicit per-layer kinds (overrides kind / irope schedule); () = same kind everywhere
            layer_kinds=(),
            # absolute: learned table rows (evaluation past it is an error)
            max_length=2048,
            sinusoidal_layout="interleaved",  # interleaved | concat
            # randomized positions (Ruoss et al. 2023), used in training only
            randomized=False,
            randomized_max_position=2048,
            # RoPE family
            rope_base=10000.0,
            rotary_fraction=1.0,
            rope_layout="half",  # half | interleaved
            scaling="default",  # posenc.rope.KINDS
            scaling_factor=1.0,
            original_length=0,  # 0: the task's training length
            beta_fast=32.0,
            beta_slow=1.0,
            yarn_truncate=True,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            # iRoPE
            nope_every=4,
            nope_floor_scale=8192.0,
            nope_attn_scale=0.1,
            # xPos
            xpos_scale_base=512.0,
            # T5
            t5_num_buckets=32,
            t5_max_distance=128,
            # Shaw
            shaw_max_distance=16,
            # FIRE
            fire_hidden=32,
            fire_c=0.1,
            fire_threshold=512.0,
            # CoPE
            cope_npos=64,
        )
    )


def norm_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model.norm``."""
    return ml_collections.ConfigDict(
        dict(
            kind="rms",  # posenc.registry.NORM_KINDS
            placement="pre",  # posenc.registry.PLACEMENTS
            eps=1e-6,
            mixln_fraction=0.25,
            dyt_alpha=0.5,
            qk_norm="none",  # posenc.registry.QK_NORMS
            attn_softcap=0.0,  # 0 = off
            final_softcap=0.0,  # 0 = off
            embed_scale=False,  # multiply token embeddings by sqrt(d_model)
        )
    )


def model_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model`` with small CPU-friendly defaults."""
    return ml_collections.ConfigDict(
        dict(
            vocab_size=32,
            d_model=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=0,  # 0: same as num_heads; fewer: grouped-query attention
            head_dim=0,  # 0: d_model // num_heads
            mlp="gelu",  # gelu | swiglu
            mlp_ratio=4.0,
            dropout=0.0,
            tie_embeddings=True,
            dtype="float32",  # compute dtype: float32 | bfloat16 (params stay float32)
            attention_block=512,  # query / key block of the memory-efficient attention
            attention_impl="auto",  # auto | dense | blocked
            attention_causal_block=64,  # dense causal attention: query blocks skip keys past their diagonal (0 = off)
            position=position_config(),
            norm=norm_config(),
        )
    )
