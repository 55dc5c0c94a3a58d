"""Training diagnostics: attention logits and entropy, output-logit statistics, LR sensitivity.

Attention logits and weights are ``[..., H, Lq, Lk]``, output logits
``[..., V]``; every statistic is a float32 scalar computed in float32
(Wortsman et al. 2023 track the largest attention logit and the LR
sensitivity of final losses).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

_F32 = jnp.float32


def max_attention_logit(logits, mask=None):
    """Largest attention logit over valid entries (Wortsman et al. 2023 track its growth).

    Args:
      logits: ``[..., H, Lq, Lk]`` pre-softmax.
      mask: broadcastable to ``logits`` (True = attended), or None.
    Returns:
      float32 scalar (-inf if every entry is masked).
    """
    x = jnp.asarray(logits).astype(_F32)
    if mask is not None:
        x = jnp.where(mask, x, -jnp.inf)
    return jnp.max(x)


def attention_entropy(weights, mask=None):
    """Mean attention entropy ``-sum_j p_ij log p_ij`` over heads and valid queries.

    Collapse of this entropy signals attention-logit growth (Zhai et al.
    2023; Wortsman et al. 2023). Terms with ``p = 0`` count as 0, with
    finite gradients.

    Args:
      weights: ``[..., H, Lq, Lk]`` softmax output.
      mask: broadcastable to ``weights`` (True = attended), or None. Masked
        entries are left out; a query with no attended key is left out of
        the mean.
    Returns:
      float32 scalar in nats (uniform over ``Lk`` keys: ``log Lk``).
    """
    p = jnp.asarray(weights).astype(_F32)
    valid = p > 0
    if mask is not None:
        valid = valid & jnp.asarray(mask, bool)
    # log of a safe value so the unused branch of where() has no NaN gradient.
    plogp = jnp.where(valid, p * jnp.log(jnp.where(valid, p, 1.0)), 0.0)
    ent = -jnp.sum(plogp, axis=-1)
    if mask is None:
        return jnp.mean(ent)
    q_valid = jnp.any(jnp.broadcast_to(jnp.asarray(mask, bool), p.shape), axis=-1).astype(_F32)
    return jnp.sum(ent * q_valid) / jnp.maximum(jnp.sum(q_valid), 1.0)


def logit_stats(logits):
    """Output-logit diagnostics: ``mean`` of the logits and mean ``log_z`` (logsumexp).

    ``log_z`` drifting away from 0 precedes output-logit divergence
    (Wortsman et al. 2023); z-loss counteracts it.

    Args:
      logits: ``[..., V]``.
    Returns:
      dict(mean=float32 scalar, log_z=float32 scalar).
    """
    x = jnp.asarray(logits).astype(_F32)
    return {"mean": jnp.mean(x), "log_z": jnp.mean(jax.nn.logsumexp(x, axis=-1))}


def lr_sensitivity(final_losses, initial_loss):
    """Learning-rate sensitivity (Wortsman et al. 2023).

    ``mean over eta of (min(L(eta), L0) - L*)`` with ``L0`` the loss at
    initialisation and ``L* = min over eta of min(L(eta), L0)``. A run that
    diverged (NaN or inf final loss) counts as ``L0``. Lower is more robust.

    Args:
      final_losses: final losses over the LR grid (sequence, array, or dict
        lr -> loss); concrete values.
      initial_loss: ``L0``, finite.
    Returns:
      Python float.
    """
    if isinstance(final_losses, dict):
        final_losses = list(final_losses.values())
    losses = np.asarray(final_losses, np.float64).reshape(-1)
    if losses.size == 0:
        raise ValueError("final_losses is empty; give one final loss per learning rate")
    l0 = float(initial_loss)
    if not math.isfinite(l0):
        raise ValueError(f"initial_loss must be finite; got {initial_loss!r}")
    clipped = np.where(np.isfinite(losses), np.minimum(losses, l0), l0)
    return float(np.mean(clipped - clipped.min()))
