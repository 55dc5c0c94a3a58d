"""Training stability across learning rates (Wortsman et al. 2023): placements, QK-norm, z-loss, soft-capping.

    python -m posenc stability --config stability:quick --workdir /tmp/stability
    python -m posenc stability --config stability --workdir /tmp/stability_full

A grid sizes x variants x learning rates x seeds of byte-level language
models (the text task), each trained from the same initialisation per seed
and size. Per run: the eval loss at initialisation and at the end, whether
training diverged (a NaN / Inf loss or gradient), the max attention logit
(final and over training) and the output-logit mean. table.md: LR
sensitivity per variant (the paper's definition, posenc.diagnostics.
lr_sensitivity) and the final loss per learning rate.

Args:
    smoke   one tiny size, baseline and QK-norm at learning rates 1e-3 and 1e9 (one diverges;
            seconds; the engine's tests)
    quick   widths 32 and 64 (2 layers), learning rates 3e-4, 3e-3, 3e-2, 3e-1,
            200 steps, three seeds trained together (vmap_seeds).
    full    (default) widths 64, 128, 256 at 2 layers and 128 at 4 layers,
            learning rates 3e-4, 1e-3, ..., 3e-1 (7, log-spaced as the paper),
            2000 steps, three seeds.

Fields:
    base            the run config (the default config's fields); the baseline is
                    pre-LN with LayerNorm (GPT-2, as the paper's models)
    learning_rates  peak learning rates (warmup 5%, then cosine, as the paper)
    variants        name -> dotted fields on top of base: baseline, qk_norm
                    (LayerNorm on q and k, Dehghani et al. 2023), z_loss (1e-4,
                    PaLM), qk_norm_z_loss, post_ln, sandwich, deepnorm, softcap
                    (attention logits 50 tanh(z / 50), Gemma 2)
    sizes           name -> dotted fields (width / depth) of each model size
    seeds           train.seed values
"""

from __future__ import annotations

import ml_collections

from posenc.config.schema import unknown_argument
from posenc.configs import default

ARGS = ("smoke", "quick", "full")

VARIANTS = {
    "baseline": {},
    "qk_norm": {"model.norm.qk_norm": "layer"},
    "z_loss": {"train.z_loss": 1e-4},
    "qk_norm_z_loss": {"model.norm.qk_norm": "layer", "train.z_loss": 1e-4},
    "post_ln": {"model.norm.placement": "post"},
    "sandwich": {"model.norm.placement": "sandwich"},
    "deepnorm": {"model.norm.placement": "deepnorm"},
    "softcap": {"model.norm.attn_softcap": 50.0},
}


def _size(d_model: int, num_layers: int) -> dict:
    return {"model.d_model": d_model, "model.num_layers": num_layers}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The stability study ``arg`` (one of ARGS)."""
    arg = arg or "full"
    if arg not in ARGS:
        raise unknown_argument("stability config", arg, ARGS)
    c = ml_collections.ConfigDict()
    c.name = arg
    b = c.base = default.get_config("text")
    b.model.update(num_heads=4)
    b.model.norm.kind = "layer"
    b.task.train_length = 64
    # Wortsman et al. 2023: AdamW with independent weight decay 1e-4 (not multiplied by the peak
    # learning rate, so the learning-rate grid does not change the decay)
    b.train.update(weight_decay=1e-4, weight_decay_mode="independent")
    b.eval.update(lengths=(64,), batch_size=8, num_batches=2)
    c.variants = default.fields(VARIANTS)
    if arg == "smoke":  # the engine's tests: seconds per run on 2 cores
        b.task.train_length = 16
        # no clipping, so that 1e9 overflows to NaN / Inf within a few steps
        b.train.update(steps=8, batch_size=4, warmup_steps=1, log_every=1, checkpoint_every=4,
                       clip_norm=0.0, progress=False)
        b.eval.update(lengths=(16,), batch_size=4, num_batches=1)
        c.learning_rates = (1e-3, 1e9)
        c.variants = default.fields({"baseline": {}, "qk_norm": {"model.norm.qk_norm": "layer"}})
        c.sizes = default.fields({"d16": _size(16, 1)})
        c.seeds = (0,)
    elif arg == "quick":
        b.train.update(steps=200, batch_size=16, warmup_steps=10, log_every=10, checkpoint_every=200,
                       progress=False)
        c.learning_rates = (3e-4, 3e-3, 3e-2, 3e-1)
        c.sizes = default.fields({"d32": _size(32, 2), "d64": _size(64, 2)})
        c.seeds = (0, 1, 2)  # trained together (vmap_seeds)
    else:
        b.task.options.max_bytes = 8_000_000
        b.train.update(steps=2000, batch_size=32, warmup_steps=100, log_every=50,
                       checkpoint_every=1000, progress=False)
        c.learning_rates = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
        c.sizes = default.fields({"d64": _size(64, 2), "d128": _size(128, 2), "d256": _size(256, 2),
                                  "d128_l4": _size(128, 4)})
        c.seeds = (0, 1, 2)
    return c
