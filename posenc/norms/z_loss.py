"""The auxiliary z-loss on output logits ``[..., V]`` (Chowdhery et al. 2022, PaLM), in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def z_loss(logits, *, weight=1e-4, mask=None):
    """Auxiliary z-loss ``weight * mean(logsumexp(logits)^2)`` (Chowdhery et al. 2022).

    Pushes the softmax normaliser log Z towards 0 so output logits cannot
    drift (PaLM: weight 1e-4; OLMo 2: 1e-5).

    Args:
      logits: ``[..., V]``.
      weight: the coefficient lambda.
      mask: ``[...]`` (bool or 0/1), True where the position counts; None = all.
    Returns:
      float32 scalar, the mean over unmasked positions (0 if none).
    """
    log_z = _logsumexp(logits)
    sq = jnp.square(log_z)
    if mask is None:
        return weight * jnp.mean(sq)
    m = jnp.broadcast_to(jnp.asarray(mask, _F32), sq.shape)
    return weight * jnp.sum(sq * m) / jnp.maximum(jnp.sum(m), 1.0)


def _logsumexp(logits):
    return jax.nn.logsumexp(jnp.asarray(logits).astype(_F32), axis=-1)
