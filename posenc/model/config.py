"""The model section of every config, built from the registered units.

``model_config()`` gives ``config.model`` with small CPU-friendly defaults:
model-wide fields, ``model.norm`` and ``model.position``, where every
registered encoding with options has its own section
``model.position.<name>`` (e.g. ``model.position.t5.num_buckets``), taken
from the unit's ``Option`` declarations. Configs in ``configs/`` start from it
and override fields; ``--config.model.<field>=...`` overrides them on the
command line. :class:`posenc.model.spec.ModelSpec` validates it.
"""

from __future__ import annotations

import ml_collections

from posenc.model import encoding, options

RANDOMIZED_PER = ("batch", "example")


def position_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model.position``: the kind, per-layer kinds, randomized positions, sections."""
    fields = dict(
        kind="rope",  # any name of posenc.model.ENCODINGS
        # explicit per-layer kinds (overrides kind in the layers); () = kind everywhere
        layer_kinds=(),
        # rules changing the kind or options of some layers (posenc.model.layer_options), e.g.
        # ({"every": 6, "offset": 5, "rope.base": 1e6},): Gemma 3's global layers
        layers=(),
        # randomized positions (Ruoss et al. 2023): at training and at evaluation, as the reference
        randomized=False,
        randomized_max_position=2048,
        randomized_per="batch",  # batch (the reference: one draw per batch) | example
    )
    for name, cls in sorted(encoding.ENCODINGS.items()):
        if options.options_of(cls):
            fields[name] = options.section(cls)
    return ml_collections.ConfigDict(fields)


def norm_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model.norm``."""
    return ml_collections.ConfigDict(
        dict(
            kind="rms",  # posenc.registry.NORM_KINDS
            placement="pre",  # posenc.registry.PLACEMENTS
            eps=1e-6,
            mixln_fraction=0.25,  # placement mixln only
            dyt_alpha=0.5,  # kind dyt only
            qk_norm="none",  # posenc.registry.QK_NORMS
            qk_norm_after_rope=False,  # normalise the rotated q, k (Llama 4), not the projections
            qk_norm_layers="all",  # all | positional (layers with a position term: Llama 4) | nope
            attn_softcap=0.0,  # 0 = off
            final_softcap=0.0,  # 0 = off
            embed_scale=False,  # multiply token embeddings by sqrt(d_model)
            embed_norm=False,  # a norm of model.norm.kind right after the embedding (BLOOM)
        )
    )


LOGIT_SCALES = ("none", "ssmax", "logn", "temperature")
LAYER_RULES = ("all", "positional", "nope")


def logit_scale_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model.logit_scale``: length-aware scaling of the queries (posenc.logit_scale)."""
    return ml_collections.ConfigDict(
        dict(
            # none | ssmax (s log n, s learned per head and layer) | logn (Qwen:
            # max(1, log n / log L_train)) | temperature (Llama 4, from the position);
            # n = the number of keys the query sees (its window or chunk included)
            kind="none",
            layers="all",  # all | positional | nope: the layers it applies to
            train_length=0,  # logn: L_train (0: the task's training length)
            floor_scale=8192.0,  # temperature
            attn_scale=0.1,  # temperature
            ssmax_init=0.43,  # ssmax: initial s (the value of the paper's Figure 1)
            ssmax_bias=False,  # ssmax: s log n + b, b learned per head (init 0)
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
            # gelu (tanh approximation) | gelu_erf (exact, GPT-NeoX) | swiglu | geglu (tanh gate, Gemma)
            mlp="gelu",
            mlp_ratio=4.0,
            mlp_hidden=0,  # MLP width (0: int(mlp_ratio * d_model))
            bias="none",  # biases: none | qkv (Qwen2) | attention (q, k, v, out) | all (+ MLP: GPT-NeoX)
            parallel_residual=False,  # x + attn(N1 x) + mlp(N2 x) (GPT-NeoX, GPT-J); placement pre
            attention_scale=0.0,  # multiplier of q . k (0: 1 / sqrt(head_dim); T5: 1; Gemma: 1 / sqrt(s))
            dropout=0.0,
            tie_embeddings=True,
            dtype="float32",  # compute dtype: float32 | bfloat16 (params stay float32)
            attention_block=512,  # query / key block of the memory-efficient attention
            attention_impl="auto",  # auto | dense | blocked
            attention_causal_block=64,  # dense causal attention: query blocks skip keys past their diagonal (0 = off)
            # the span of each layer: full | window (keys j with i - W < j <= i) | chunk (keys in
            # the query's chunk of C, Llama 4); global_every=k keeps layers k-1, 2k-1, ... full
            attention_span="full",
            attention_window=0,  # W of the window layers
            attention_chunk=0,  # C of the chunk layers
            global_every=0,
            layer_spans=(),  # explicit per-layer spans (instead of attention_span / global_every)
            logit_scale=logit_scale_config(),
            position=position_config(),
            norm=norm_config(),
        )
    )
