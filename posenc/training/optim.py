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

import jax
import optax


def learning_rate_schedule(spec) -> optax.Schedule:
    """Warmup + cosine schedule of an :class:`~posenc.training.specs.OptimizerSpec`."""
    steps, warmup = spec.steps, spec.warmup_steps
    if steps <= 0:
        raise ValueError(f"train.steps must be > 0, got {steps}")
    if not 0 <= warmup <= steps:
        raise ValueError(f"train.warmup_steps must be in [0, train.steps={steps}], got {warmup}")
    peak = spec.learning_rate
    if not peak > 0:
        raise ValueError(f"train.learning_rate must be > 0, got {peak}")
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=peak,
        warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1),
        end_value=peak * spec.min_lr_ratio,
    )


def _decay_mask(params):
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def decay_rate(spec) -> float:
    """The weight decay optax's adamw multiplies by the learning rate ``lr_t``.

    ``coupled`` (optax / PyTorch AdamW): each step decays a matrix by ``lr_t * weight_decay``.
    ``independent`` (Wortsman et al. 2023, 3.2.2): by ``weight_decay * lr_t / learning_rate``,
    the schedule's factor alone, not the peak learning rate, so a grid over learning rates
    keeps the same decay: adamw's ``weight_decay / learning_rate``.
    """
    if spec.weight_decay_mode == "independent":
        return spec.weight_decay / spec.learning_rate
    return spec.weight_decay


@functools.cache
def make_optimizer(spec) -> optax.GradientTransformation:
    """``clip_by_global_norm(clip_norm)`` then AdamW on the warmup + cosine schedule.

    ``spec``: an :class:`~posenc.training.specs.OptimizerSpec`. Equal specs return the same
    transformation object, so models that differ only in seed share a graph definition
    and the jitted train step compiles once per process.
    """
    chain = []
    if spec.clip_norm > 0:
        chain.append(optax.clip_by_global_norm(spec.clip_norm))
    chain.append(
        optax.adamw(
            learning_rate_schedule(spec),
            b1=spec.b1,
            b2=spec.b2,
            eps=spec.eps,
            weight_decay=decay_rate(spec),
            mask=_decay_mask,
        )
    )
    return optax.chain(*chain)
