"""ALiBi: attention with linear biases.

Press et al. 2021, "Train Short, Test Long: Attention with Linear Biases
Enables Input Length Extrapolation". The bias is added to the logits after
the 1/sqrt(d) scaling and is not itself scaled.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.encodings.absolute import relative_distances


def _check_num_heads(num_heads) -> int:
    return checks.integer("num_heads", num_heads, minimum=1)


def _power_of_two_slopes(n: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def _slopes(n: int) -> list[float]:
    if n & (n - 1) == 0:
        return _power_of_two_slopes(n)
    # Official rule for other head counts: all slopes of the nearest lower
    # power of two c, then every other slope of 2c, up to n in total.
    c = 2 ** math.floor(math.log2(n))
    return _power_of_two_slopes(c) + _slopes(2 * c)[0::2][: n - c]


def slopes(num_heads: int) -> jax.Array:
    """Per-head ALiBi slopes.

    Power of two n: ``2^(-8 (h + 1) / n)`` for h = 0..n-1 (a geometric
    sequence from 2^(-8/n) to 2^-8). Otherwise, with c = 2^floor(log2 n):
    ``slopes(c) + slopes(2c)[0::2][:n - c]`` (the official repository's rule).

    Shapes: -> float32 [num_heads].
    """
    return jnp.asarray(_slopes(_check_num_heads(num_heads)), jnp.float32)


def bias(q_positions, k_positions, slopes, *, causal: bool = True) -> jax.Array:
    """ALiBi attention bias.

    causal:    ``bias[h, i, j] = -slopes[h] * (i - j)``. Keys after the query
               (j > i) get the same formula (a positive value); they are
               masked by the causal mask, so the value there is irrelevant
               but defined.
    symmetric: ``bias[h, i, j] = -slopes[h] * |i - j|`` (bidirectional use).

    Shapes: q_positions int [..., Lq], k_positions int [..., Lk], slopes [H]
    -> float32 [..., H, Lq, Lk].
    """
    slopes = jnp.asarray(slopes)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must have shape [H], got {slopes.shape}")
    d = relative_distances(q_positions, k_positions).astype(jnp.float32)
    if not causal:
        d = jnp.abs(d)
    return -slopes.astype(jnp.float32)[:, None, None] * d[..., None, :, :]
