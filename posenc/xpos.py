"""xPos: RoPE with an exponential per-pair decay (Sun et al. 2022, "A Length-Extrapolatable Transformer").

Pair i of a query at position m is multiplied by zeta_i^(m / scale_base) and
pair i of a key at position n by zeta_i^(-n / scale_base), on top of the RoPE
rotation, with

    zeta_i = (2i + gamma d) / ((1 + gamma) d),   i = 0..d/2-1,  d = rotary dim

(gamma = 0.4, scale_base = 512 in the paper and in torchscale's ``XPOS``).
The logit then reads

    q_m . k_n = sum_i zeta_i^((m - n) / scale_base) (R_m q)_i . (R_n k)_i,

which depends on positions only through n - m: the RoPE term is relative and
the decay zeta^((m-n)/scale_base) shrinks as a key falls further behind the
query (zeta_i < 1).

Positions convention. The exponents use `positions` exactly as passed.
torchscale instead centres the scale exponent (positions run from
-(length + offset) // 2) so that zeta^(+-p / scale_base) stays inside float
range; with gamma = 0.4 the smallest zeta is 2/7, so float32 overflows for
|p| / scale_base > ~70, i.e. |p| > ~36 000 at scale_base 512. Because the
logit depends only on n - m, subtracting one common integer from the query
and the key positions (e.g. half the evaluation length, as torchscale does)
gives the same logits with half the exponent; callers evaluating beyond
~36K tokens should do so. The rotation is shifted by the same constant,
which leaves RoPE logits unchanged too.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

from posenc import rope


def _check(scale_base, gamma):
    for name, value in (("scale_base", scale_base), ("gamma", gamma)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
            raise ValueError(f"{name} must be a positive number; got {value!r}")


def _zeta(rotary_dim: int, gamma: float) -> jax.Array:
    i2 = jnp.arange(0, rotary_dim, 2, dtype=jnp.float32)  # 2i
    return (i2 + gamma * rotary_dim) / ((1 + gamma) * rotary_dim)


def scale(positions, rotary_dim, *, scale_base=512.0, gamma=0.4):
    """xPos query scale zeta_i^(p / scale_base), float32 [..., L, rotary_dim // 2].

    zeta_i = (2i + gamma d) / ((1 + gamma) d) with d = rotary_dim; keys use
    the inverse, zeta_i^(-p / scale_base). positions: integer [..., L].
    """
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, numbers.Integral) \
            or rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even integer; got {rotary_dim!r}")
    _check(scale_base, gamma)
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be an integer array; got dtype {positions.dtype}")
    p = positions.astype(jnp.float32)
    return _zeta(int(rotary_dim), gamma) ** (p[..., None] / scale_base)


def apply(x, positions, inv_freq, *, is_key, scale_base=512.0, gamma=0.4, layout="interleaved"):
    """Apply xPos (Sun et al. 2022): RoPE rotation times zeta^(+-p / scale_base).

    Queries (is_key=False) are multiplied by :func:`scale`, keys (is_key=True)
    by its inverse, so q_m . k_n = sum_i zeta_i^((m-n)/scale_base) (R_m q)_i . (R_n k)_i.
    The default layout "interleaved" is torchscale's (rotate_every_two).

    Args:
      x: [..., L, H, Dh]; positions: integer [..., L]; inv_freq: [d/2],
      d = 2 len(inv_freq) <= Dh (dims from d on pass through unscaled).

    Returns:
      Array like x.
    """
    if not isinstance(is_key, bool):
        raise ValueError(f"is_key must be True (keys) or False (queries); got {is_key!r}")
    _check(scale_base, gamma)
    theta = rope.angles(positions, inv_freq)  # validates positions and inv_freq
    d = 2 * theta.shape[-1]
    positions = jnp.asarray(positions)
    # Keys use zeta^(-p / scale_base) directly (not 1 / scale) so that the
    # query and key factors are computed the same way.
    s = scale(-positions if is_key else positions, d, scale_base=scale_base, gamma=gamma)
    cos = (jnp.cos(theta) * s)[..., None, :]
    sin = (jnp.sin(theta) * s)[..., None, :]
    return rope.rotate(x, cos, sin, layout=layout)
