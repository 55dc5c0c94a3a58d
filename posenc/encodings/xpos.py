"""xPos: RoPE with an exponential per-pair decay (Sun et al. 2022, "A Length-Extrapolatable Transformer").

Pair i of a query at position m is multiplied by zeta_i^((m - c) / scale_base)
and pair i of a key at position n by zeta_i^(-(n - c) / scale_base), on top of
the RoPE rotation, with

    zeta_i = (2i + gamma d) / ((1 + gamma) d),   i = 0..d/2-1,  d = rotary dim

(gamma = 0.4, scale_base = 512 in the paper and in torchscale's ``XPOS``) and
c a common integer offset. The logit reads

    q_m . k_n = sum_i zeta_i^((m - n) / scale_base) (R_m q)_i . (R_n k)_i,

which depends only on n - m, whatever c: the offset only keeps the two
factors inside float range, and (p - c) is exact integer arithmetic, so any
c gives the same logits.

Range. zeta_0 = gamma / (1 + gamma) (2/7 at the default, for every d) is the
fastest-changing factor. A factor is allowed to grow up to 2^96
(:data:`MAX_LOG2_SCALE`), i.e. on the growing side |p - c| <= :func:`max_distance`
(27,195 at scale_base 512, gamma 0.4): a query at most that far before c,
a key at most that far after c. The shrinking side is unlimited (far keys
of a query decay to 0, their true weight): with the other factor <= 2^96, a
factor flushed to zero (FTZ on CPU / TPU) costs at most 2^-30 |q| |k|.
Hence:

- full forward (torchscale centres its positions the same way):
  :func:`apply_pair` with c = (max key + min query) // 2 works for positions
  spanning up to 2 max_distance = 54,390 (defaults); beyond, call it per
  (query block, key block), which is exact for any length;
- decoding (queries at the end of a cache): c = the query position, and the
  cache may be any length.

Beyond the range, concrete inputs raise ValueError; under jit the
out-of-range factors are NaN, never a wrong finite number. A pair whose key
lies more than ~36K (defaults) after its query has a true weight above
float32 range (inf); causal attention masks it (use ``jnp.where``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.encodings.rope import rope

__all__ = ["MAX_LOG2_SCALE", "apply", "apply_pair", "max_distance", "pair_offset", "scale"]

MAX_LOG2_SCALE = 96  # a factor stays <= 2^96: |x| 2^96 is finite and flushing its partner costs <= 2^-30


def _check(scale_base, gamma):
    checks.number("scale_base", scale_base, positive=True)
    checks.number("gamma", gamma, positive=True)


def max_distance(*, scale_base=512.0, gamma=0.4) -> int:
    """Largest |p - offset| on the growing side: floor(scale_base 96 ln 2 / ln((1 + gamma) / gamma)).

    27,195 at the defaults; it does not depend on the rotary dim (zeta_0 =
    gamma / (1 + gamma) for every d). A full forward through
    :func:`apply_pair` may span 2 * max_distance positions.
    """
    _check(scale_base, gamma)
    return int(math.floor(scale_base * MAX_LOG2_SCALE * math.log(2.0) / math.log((1 + gamma) / gamma)))


def _zeta(rotary_dim: int, gamma: float) -> jax.Array:
    i2 = jnp.arange(0, rotary_dim, 2, dtype=jnp.float32)  # 2i
    return (i2 + gamma * rotary_dim) / ((1 + gamma) * rotary_dim)


def _positions(positions, name="positions") -> jax.Array:
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array; got dtype {positions.dtype}")
    return positions.astype(jnp.int32)


def _relative(positions, offset) -> jax.Array:
    """positions - offset, int32 [..., L]; offset: int or int array [...] (one per leading row)."""
    offset = jnp.asarray(offset)
    if not jnp.issubdtype(offset.dtype, jnp.integer):
        raise ValueError(f"offset must be an integer or an integer array [...]; got dtype {offset.dtype}")
    return positions - offset.astype(jnp.int32)[..., None]


def scale(positions, rotary_dim, *, scale_base=512.0, gamma=0.4, offset=0):
    """xPos query scale zeta_i^((p - offset) / scale_base), float32 [..., L, rotary_dim // 2].

    zeta_i = (2i + gamma d) / ((1 + gamma) d) with d = rotary_dim; keys use
    the inverse. positions: integer [..., L]; offset: int or int [...]. The
    plain formula, unchecked: :func:`apply` / :func:`apply_pair` guard the range.
    """
    if not checks.is_int(rotary_dim) or rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even integer; got {rotary_dim!r}")
    _check(scale_base, gamma)
    rel = _relative(_positions(positions), offset).astype(jnp.float32)
    return _zeta(int(rotary_dim), gamma) ** (rel[..., None] / scale_base)


def _concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _factor(positions, offset, d, *, is_key, scale_base, gamma):
    """The xPos factor of queries (zeta^((p-c)/sb)) or keys (zeta^((c-p)/sb)), NaN past the range."""
    rel = _relative(positions, offset)
    grow = rel if is_key else -rel  # how far the factor has grown past 1, in positions
    limit = max_distance(scale_base=scale_base, gamma=gamma)
    if _concrete(positions, offset) and np.size(positions):
        # numpy, not jnp: under jit even arithmetic on concrete arrays is traced
        host = np.asarray(positions, np.int64) - np.asarray(offset, np.int64)[..., None]
        worst = int(np.max(host if is_key else -host))
    else:
        worst = None
    if worst is not None and worst > limit:
        side, where = ("key", "after") if is_key else ("query", "before")
        raise ValueError(
            f"xPos {side} position {worst} {where} the offset exceeds max_distance = {limit} "
            f"(scale_base={scale_base}, gamma={gamma}: zeta^(distance / scale_base) must stay <= "
            f"2^{MAX_LOG2_SCALE} in float32); use apply_pair, whose offset lies between the queries "
            "and the keys, or apply xPos per (query block, key block)")
    e = (-rel if is_key else rel).astype(jnp.float32)[..., None] / scale_base
    s = _zeta(d, gamma) ** e
    return jnp.where((grow > limit)[..., None], jnp.nan, s)


def apply(x, positions, inv_freq, *, is_key, scale_base=512.0, gamma=0.4, layout="interleaved", offset=0,
          angles="exact"):
    """Apply xPos (Sun et al. 2022) to queries or keys: RoPE rotation times the per-pair factor.

    Queries (is_key=False) are multiplied by zeta^((p - offset) / scale_base),
    keys (is_key=True) by zeta^(-(p - offset) / scale_base); pass the same
    offset to both (any common integer gives the same logits). The rotation
    uses the positions themselves (``angles`` as in :func:`posenc.rope.apply`).
    The default layout "interleaved" is torchscale's (rotate_every_two).

    Args:
      x: [..., L, H, Dh]; positions: integer [..., L]; inv_freq: [d/2],
        d = 2 len(inv_freq) <= Dh (dims from d on pass through unscaled).
      offset: int or integer array [...] (one per leading row of positions).
        Queries more than :func:`max_distance` before it, or keys more than
        that after it, raise ValueError (concrete) or give NaN (traced).

    Returns:
      Array like x.
    """
    if not isinstance(is_key, bool):
        raise ValueError(f"is_key must be True (keys) or False (queries); got {is_key!r}")
    _check(scale_base, gamma)
    cos, sin = rope.cos_sin(positions, inv_freq, angles=angles)  # validates positions and inv_freq
    s = _factor(_positions(positions), offset, 2 * cos.shape[-1], is_key=is_key, scale_base=scale_base,
                gamma=gamma)
    return rope.rotate(x, (cos * s)[..., None, :], (sin * s)[..., None, :], layout=layout)


def pair_offset(q_positions, k_positions) -> jax.Array:
    """(max key position + min query position) // 2 per leading row, int32 [...].

    The midpoint of the allowed offsets: the full forward's centre (as
    torchscale), the query position when decoding one query after a cache.
    """
    qp, kp = _positions(q_positions, "q_positions"), _positions(k_positions, "k_positions")
    if qp.ndim < 1 or kp.ndim < 1:
        raise ValueError("q_positions and k_positions must have shape [..., L]")
    lo = jnp.min(qp, axis=-1)
    return lo + jnp.floor_divide(jnp.max(kp, axis=-1) - lo, 2)  # never max + min: int32 overflows past 2^30


def apply_pair(q, k, q_positions, k_positions, inv_freq, *, offset=None, scale_base=512.0, gamma=0.4,
               layout="interleaved", angles="exact"):
    """xPos for queries and keys with one common offset: (q', k') with q'_m . k'_n as in the module doc.

    offset=None uses :func:`pair_offset`: exact for any positions whose keys
    end at most 2 * max_distance after the first query (54,390 at the
    defaults; decoding: any cache length). Call it per (query block, key
    block) for longer spans.

    Shapes: q [..., Lq, H, Dh], k [..., Lk, H, Dh], q_positions int [..., Lq],
    k_positions int [..., Lk], inv_freq [d/2]; offset int or int [...].
    Returns (q', k') like q and k.
    """
    _check(scale_base, gamma)
    qp, kp = _positions(q_positions, "q_positions"), _positions(k_positions, "k_positions")
    if offset is None:
        offset = pair_offset(qp, kp)
        if _concrete(qp, kp) and qp.size and kp.size:
            # numpy, not jnp: under jit even arithmetic on concrete arrays is traced
            span = int(np.max(np.asarray(kp, np.int64).max(-1) - np.asarray(qp, np.int64).min(-1)))
            limit = max_distance(scale_base=scale_base, gamma=gamma)
            if span > 2 * limit:
                raise ValueError(
                    f"xPos keys end {span} positions after the first query, more than 2 * max_distance = "
                    f"{2 * limit} (scale_base={scale_base}, gamma={gamma}) that one float32 offset can "
                    "cover; apply xPos per (query block, key block)")
    kw = dict(scale_base=scale_base, gamma=gamma, layout=layout, offset=offset, angles=angles)
    return (apply(q, qp, inv_freq, is_key=False, **kw), apply(k, kp, inv_freq, is_key=True, **kw))
