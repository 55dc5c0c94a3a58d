"""Optimizer: AdamW with linear warmup, cosine decay and global-norm clipping.

Loshchilov & Hutter 2019 (AdamW); the schedule is the usual GPT one:
``lr(t) = peak * t / warmup`` for ``t < warmup``, then
``end + (peak - end) * (1 + cos(pi * (t - warmup) / (steps - warmup))) / 2``.
Weight decay applies to matrices only (``ndim >= 2``): gains, biases and
scalar gates keep their scale; ``train.weight_decay_mode`` says whether it
scales with the peak learning rate (:func:`decay_rate`).
"""

from __future__ import annotations

import functools
import json

import jax
import optax


def learning_rate_schedule(train) -> optax.Schedule:
    """Warmup + cosine schedule from ``config.train`` (steps, learning_rate, warmup_steps, min_lr_ratio)."""
    steps, warmup = int(train["steps"]), int(train["warmup_steps"])
    if steps <= 0:
        raise ValueError(f"train.steps must be > 0, got {steps}")
    if not 0 <= warmup <= steps:
        raise ValueError(f"train.warmup_steps must be in [0, train.steps={steps}], got {warmup}")
    peak = float(train["learning_rate"])
    if not peak > 0:
        raise ValueError(f"train.learning_rate must be > 0, got {peak}")
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=peak,
        warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1),
        end_value=peak * float(train["min_lr_ratio"]),
    )


def _decay_mask(params):
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


FIELDS = ("steps", "warmup_steps", "learning_rate", "min_lr_ratio", "weight_decay",
          "weight_decay_mode", "clip_norm", "b1", "b2", "eps")
WEIGHT_DECAY_MODES = ("coupled", "independent")


def decay_rate(train) -> float:
    """The weight decay optax's adamw multiplies by the learning rate ``lr_t``.

    ``coupled`` (optax / PyTorch AdamW): each step decays a matrix by ``lr_t * weight_decay``.
    ``independent`` (Wortsman et al. 2023, 3.2.2): by ``weight_decay * lr_t / learning_rate``,
    the schedule's factor alone, not the peak learning rate, so a grid over learning rates
    keeps the same decay: adamw's ``weight_decay / learning_rate``.
    """
    wd = float(train["weight_decay"])
    if train.get("weight_decay_mode", "coupled") == "independent":
        return wd / float(train["learning_rate"])
    return wd


def settings_key(train) -> str:
    """Canonical JSON of the ``config.train`` fields the optimizer depends on."""
    return json.dumps({f: train.get(f, "coupled") if f == "weight_decay_mode" else train[f] for f in FIELDS},
                      sort_keys=True)


@functools.lru_cache(maxsize=64)
def _make(key: str) -> optax.GradientTransformation:
    train = json.loads(key)
    chain = []
    if float(train["clip_norm"]) > 0:
        chain.append(optax.clip_by_global_norm(float(train["clip_norm"])))
    chain.append(
        optax.adamw(
            learning_rate_schedule(train),
            b1=float(train["b1"]),
            b2=float(train["b2"]),
            eps=float(train["eps"]),
            weight_decay=decay_rate(train),
            mask=_decay_mask,
        )
    )
    return optax.chain(*chain)


def make_optimizer(train) -> optax.GradientTransformation:
    """``clip_by_global_norm(clip_norm)`` then AdamW on the warmup + cosine schedule.

    The same ``config.train`` values return the same transformation object, so
    models that differ only in seed share a graph definition and the jitted
    train step compiles once per process.
    """
    return _make(settings_key(train))
