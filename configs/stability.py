"""Training stability across learning rates (Wortsman et al. 2023): placements, norms, logit controls.

    python -m posenc stability --config stability:quick --workdir /tmp/stability
    python -m posenc stability --config stability --workdir /tmp/stability_full
    python -m posenc stability --config stability:depth --workdir /tmp/stability_depth
    python -m posenc stability --config stability:methods_smoke --workdir /tmp/stability_methods

A grid sizes x variants x learning rates x seeds of byte-level language
models (the text task), each trained from the same initialisation per seed
and size, AdamW with independent weight decay 1e-4. Per run: the eval loss
at initialisation and at the end, whether training diverged (a NaN / Inf
loss or gradient), the max attention logit (final and over training) and
the output-logit mean. table.md: LR sensitivity per variant and size (the
paper's definition, posenc.diagnostics.lr_sensitivity), each variant minus
the pre-norm baseline paired by seed, and the final loss (with the largest
attention logit) per learning rate for each size.

Args:
    smoke          one tiny size, baseline and QK-norm at learning rates 1e-3 and 1e9 (one
                   diverges; seconds; the engine's tests)
    methods_smoke  the baseline and every method variant (METHODS) at width 8, 2 layers,
                   2 steps, one learning rate and seed: each variant builds and trains
                   (about 10 s a variant on 2 CPU cores)
    quick          widths 32 and 64 (2 layers), learning rates 3e-4, 3e-3, 3e-2, 3e-1,
                   200 steps, three seeds trained together (vmap_seeds); every variant
    methods_quick  the quick grid with the baseline and the method variants (METHODS) only
    depth          the depth sweep: width 32 at 4, 8 and 16 layers, baseline (pre-norm), lns,
                   hybrid_norm, hybrid_norm_star; the quick learning rates, 500 steps, three
                   seeds. Per depth (a size column): LR sensitivity, the paired difference
                   from pre-norm and the final loss per learning rate
    full           (default) widths 64, 128, 256 at 2 layers and 128 at 4 layers,
                   learning rates 3e-4, 1e-3, ..., 3e-1 (7, log-spaced as the paper),
                   2000 steps, three seeds; every variant

Variants (dotted fields on top of the pre-LN LayerNorm baseline, GPT-2 as the paper's
models) and the claim each tests:
    qk_norm, z_loss, qk_norm_z_loss   LayerNorm on q and k (Dehghani et al. 2023), PaLM z-loss
                   1e-4: lower LR sensitivity, bounded attention logits (Wortsman et al. 2023)
    post_ln, sandwich, deepnorm, softcap   the other placements; attention logits
                   50 tanh(z / 50) (Gemma 2)
    qk_clip        train.qk_clip 100 (Kimi K2 report): the max attention logit stays bounded
                   (max_attention_logit_max <= ~100) without a worse final loss
    derf, dyt      model.norm.kind derf / dyt in place of LayerNorm, with the official GPT-2
                   recipe (alpha 1, embeddings times sqrt(d_model)) (Chen et al. 2025; Zhu et
                   al. 2025): matches (DyT) or beats (Derf) the norm it replaces (final loss,
                   LR sensitivity)
    v_norm         model.norm.v_norm (Gemma 4 value norm): value heads RMS-normalised
    hybrid_norm, hybrid_norm_star   placement hybrid / hybrid_star (HybridNorm, Zhuo et al.
                   2025): trains more stably than pre-norm (lower LR sensitivity, fewer
                   diverged runs); in the depth sweep, deeper helps at least as much
    lns            placement lns (LayerNorm Scaling, Sun et al. 2025): deep pre-norm layers
                   become useful: the final loss falls further with depth than pre-norm's
                   (depth arg: 4 -> 8 -> 16 layers)
    gated_attention, gated_attention_headwise   model.attention_gate elementwise / headwise
                   (Qiu et al. 2025): removes attention sinks and massive activations and
                   improves stability (lower LR sensitivity, smaller max attention logit)
    sinks          model.attention_sinks learned (gpt-oss): a learned sink logit per head
    ngpt           placement ngpt (nGPT, Loshchilov et al. 2025, Fig. 1: the same loss in 4-20x
                   fewer steps): a lower final loss than pre-norm at the same steps
    hyper_connections, mhc   four residual streams (model.residual_streams 4) joined by dynamic
                   hyper-connections (Zhu et al. 2025: DHC x4, Fig. 1 with OLMoE-1B-7B and Table 5
                   with OLMo-7B) and by mHC (model.hyper_connections mhc; Xie et al. 2025, as
                   DeepSeek-V4): hyper-connections beat one stream (a lower final loss than
                   pre-norm at the same learning rate), and mHC trains at least as stably as HC
                   (its Sinkhorn-projected stream mixing bounds the residual path's gain)
    moe, moe_router_z_loss   a mixture of experts in every MLP (8 SwiGLU experts of the dense width,
                   top-2 renormalised as Mixtral, the Switch load-balancing loss 0.01) and the same with
                   ST-MoE's router z-loss 1e-3 (Zoph et al. 2022, Table 3): the z-loss trains the MoE
                   more stably (lower LR sensitivity, fewer diverged runs than moe) at no worse final loss
    minicpm_multipliers   MiniCPM-2B's multipliers (Hu et al. 2024): embeddings times 12,
                   residual branches times 1.4 / sqrt(num_layers), the final hidden state
                   times dim_model_base / d_model with the smallest width of the grid standing
                   for MiniCPM-2B's (ratio 9): the size-dependent two in size_variants

Fields:
    base            the run config (the default config's fields)
    learning_rates  peak learning rates (warmup 5%, then cosine, as the paper)
    variants        name -> dotted fields on top of base (VARIANTS)
    sizes           name -> dotted fields (width / depth) of each model size
    size_variants   size -> variant -> dotted fields that depend on the size (minicpm_fields)
    seeds           train.seed values
    run_variants    the variants entries to run (empty: every one)
"""

from __future__ import annotations

import ml_collections

from posenc.config.schema import unknown_argument
from posenc.configs import default
from posenc.model.spec import placement_fields
from posenc.norms import multipliers

ARGS = ("smoke", "methods_smoke", "quick", "methods_quick", "depth", "full")
QK_CLIP = 100.0  # the Kimi K2 report's threshold
# MiniCPM-2B (Hu et al. 2024): scale_emb 12, scale_depth 1.4, hidden 2304 over dim_model_base 256
MINICPM = {"scale_emb": 12.0, "scale_depth": 1.4, "width_ratio": 2304 / 256}
HC_STREAMS = 4  # the expansion rate of HC's DHC x4 and of mHC's (and DeepSeek-V4's hc_mult) runs
# a mixture of experts in every layer (model.moe): 8 experts of the dense MLP's width, top-2 renormalised
MOE = {"model.mlp": "swiglu", "model.moe.num_experts": 8, "model.moe.num_experts_per_tok": 2,
       "model.moe.norm_topk_prob": True}
ROUTER_Z_LOSS = 1e-3  # ST-MoE's router z-loss weight (c_z, Zoph et al. 2022)

VARIANTS = {
    "baseline": {},
    "qk_norm": {"model.norm.qk_norm": "layer"},
    "z_loss": {"train.z_loss": 1e-4},
    "qk_norm_z_loss": {"model.norm.qk_norm": "layer", "train.z_loss": 1e-4},
    "post_ln": {"model.norm.placement": "post"},
    "sandwich": {"model.norm.placement": "sandwich"},
    "deepnorm": {"model.norm.placement": "deepnorm"},
    "softcap": {"model.norm.attn_softcap": 50.0},
    "qk_clip": {"train.qk_clip": QK_CLIP},
    # the official GPT-2 recipe of DyT / Derf (zlab-princeton/Derf, language model/model_derf.patch):
    # alpha 1 at every norm, the embeddings times sqrt(d_model) (there a learned scalar starting at
    # sqrt(d_model); here fixed). Without the scale, Derf stalled at 3.43 nats per byte for every
    # learning rate >= 3e-3 (commit 7a87a1b, docs/results.md)
    "derf": {"model.norm.kind": "derf", "model.norm.derf_alpha": 1.0, "model.norm.embed_scale": True},
    "dyt": {"model.norm.kind": "dyt", "model.norm.dyt_alpha": 1.0, "model.norm.embed_scale": True},
    "v_norm": {"model.norm.v_norm": True},
    "hybrid_norm": {"model.norm.placement": "hybrid"},
    "hybrid_norm_star": {"model.norm.placement": "hybrid_star"},
    "lns": {"model.norm.placement": "lns"},
    "gated_attention": {"model.attention_gate": "elementwise"},
    "gated_attention_headwise": {"model.attention_gate": "headwise"},
    "sinks": {"model.attention_sinks": "learned"},
    "ngpt": placement_fields("ngpt"),  # the normalized transformer, with the fields it needs (SwiGLU)
    "hyper_connections": {"model.residual_streams": HC_STREAMS},
    "mhc": {"model.residual_streams": HC_STREAMS, "model.hyper_connections": "mhc"},
    "minicpm_multipliers": {"model.embedding_multiplier": MINICPM["scale_emb"]},  # + size_variants
    "moe": MOE,
    "moe_router_z_loss": {**MOE, "model.moe.router_z_loss_coef": ROUTER_Z_LOSS},
}

# The variants added with the norm and logit-control methods (the ``methods_smoke`` arg trains each).
METHODS = ("qk_clip", "derf", "dyt", "v_norm", "hybrid_norm", "hybrid_norm_star", "lns", "gated_attention",
           "gated_attention_headwise", "sinks", "ngpt", "minicpm_multipliers", "hyper_connections", "mhc", "moe",
           "moe_router_z_loss")

# The depth sweep: pre-norm against the placements whose claims are about depth.
DEPTH_VARIANTS = ("baseline", "lns", "hybrid_norm", "hybrid_norm_star")


def _size(d_model: int, num_layers: int) -> dict:
    return {"model.d_model": d_model, "model.num_layers": num_layers}


def minicpm_fields(sizes: dict) -> dict:
    """``{size: {"minicpm_multipliers": fields}}``: MiniCPM's residual multiplier scale_depth /
    sqrt(num_layers) and logit multiplier dim_model_base / d_model per size, the smallest width of
    ``sizes`` standing for MiniCPM-2B's width (its hidden / dim_model_base ratio, 9)."""
    smallest = min(s["model.d_model"] for s in sizes.values())
    out = {}
    for name, s in sizes.items():
        m = multipliers.minicpm(hidden_size=s["model.d_model"], num_layers=s["model.num_layers"],
                                scale_emb=MINICPM["scale_emb"], scale_depth=MINICPM["scale_depth"],
                                dim_model_base=smallest / MINICPM["width_ratio"])
        out[name] = default.fields({"minicpm_multipliers": {"model.residual_multiplier": m.residual,
                                                            "model.logits_multiplier": m.logits}})
    return out


def _grid(c, sizes: dict, variants) -> None:
    c.sizes = default.fields(sizes)
    c.variants = default.fields({v: VARIANTS[v] for v in variants})
    c.size_variants = ml_collections.ConfigDict(minicpm_fields(sizes) if "minicpm_multipliers" in variants
                                                else {})


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The stability study ``arg`` (one of ARGS)."""
    arg = arg or "full"
    if arg not in ARGS:
        raise unknown_argument("stability config", arg, ARGS)
    c = ml_collections.ConfigDict()
    c.name = arg
    c.run_variants = ()  # every variant; e.g. --config.run_variants='("baseline", "mhc")'
    b = c.base = default.get_config("text")
    b.model.update(num_heads=4)
    b.model.norm.kind = "layer"
    b.task.train_length = 64
    # Wortsman et al. 2023: AdamW with independent weight decay 1e-4 (not multiplied by the peak
    # learning rate, so the learning-rate grid does not change the decay)
    b.train.update(weight_decay=1e-4, weight_decay_mode="independent")
    b.eval.update(lengths=(64,), batch_size=8, num_batches=2)
    if arg == "smoke":  # the engine's tests: seconds per run on 2 cores
        b.task.train_length = 16
        # no clipping, so that 1e9 overflows to NaN / Inf within a few steps
        b.train.update(steps=8, batch_size=4, warmup_steps=1, log_every=1, checkpoint_every=4,
                       clip_norm=0.0, progress=False)
        b.eval.update(lengths=(16,), batch_size=4, num_batches=1)
        c.learning_rates = (1e-3, 1e9)
        _grid(c, {"d16": _size(16, 1)}, ("baseline", "qk_norm"))
        c.seeds = (0,)
    elif arg == "methods_smoke":  # every method variant trains 2 steps at the smallest size (tests)
        b.task.train_length = 8
        b.model.num_heads = 2
        b.train.update(steps=2, batch_size=2, warmup_steps=1, log_every=1, checkpoint_every=2,
                       steps_per_call=1, progress=False)
        b.eval.update(lengths=(8,), batch_size=2, num_batches=1)
        c.learning_rates = (1e-3,)
        _grid(c, {"d8_l2": _size(8, 2)}, ("baseline", *METHODS))
        c.seeds = (0,)
    elif arg in ("quick", "methods_quick"):
        b.train.update(steps=200, batch_size=16, warmup_steps=10, log_every=10, checkpoint_every=200,
                       progress=False)
        c.learning_rates = (3e-4, 3e-3, 3e-2, 3e-1)
        _grid(c, {"d32": _size(32, 2), "d64": _size(64, 2)},
              VARIANTS if arg == "quick" else ("baseline", *METHODS))
        c.seeds = (0, 1, 2)  # trained together (vmap_seeds)
    elif arg == "depth":  # LayerNorm Scaling / HybridNorm: does depth still help at small width?
        b.train.update(steps=500, batch_size=16, warmup_steps=25, log_every=25, checkpoint_every=500,
                       progress=False)
        c.learning_rates = (3e-4, 3e-3, 3e-2, 3e-1)
        _grid(c, {f"d32_l{n}": _size(32, n) for n in (4, 8, 16)}, DEPTH_VARIANTS)
        c.seeds = (0, 1, 2)
    else:
        b.task.options.max_bytes = 8_000_000
        b.train.update(steps=2000, batch_size=32, warmup_steps=100, log_every=50,
                       checkpoint_every=1000, progress=False)
        c.learning_rates = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
        _grid(c, {"d64": _size(64, 2), "d128": _size(128, 2), "d256": _size(256, 2),
                  "d128_l4": _size(128, 4)}, VARIANTS)
        c.seeds = (0, 1, 2)
    return c
