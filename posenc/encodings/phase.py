"""Range-reduced rotation angles p * f (mod 2 pi) of integer positions, in float32.

The float32 product p * f is off by up to |p f| 2^-24 rad (0.06 rad at
p f = 10^6): rotary logits then drift with the absolute position. Here the
angle is reduced modulo 2 pi exactly, for every int32 position, with float32
arithmetic only (no x64, so it runs as is on TPU / GPU):

1. per frequency (d/2 values): the turn rate f / (2 pi) of each base-2^12
   digit of the position, R_k = frac(2^(12 k) f / (2 pi)) for k = 0, 1, 2,
   from exact 12-bit x 12-bit products of f with a 96-bit 1/(2 pi) and exact
   fixed-point sums; each R_k is kept as three pieces on the grids 2^-12,
   2^-24 and 2^-48;
2. per position: p = d2 2^24 + d1 2^12 + d0 (d0, d1 in [0, 4096), d2 signed),
   turns = frac(sum_k d_k R_k) with every product of a digit and a 12-bit
   piece exact and every partial sum exact modulo 1;
3. angle = 2 pi * turns, in [-pi, pi].

Only exact operations (short products, ``x - round(x)``, sums on a fixed
grid) carry the large parts, so compiler reassociation or fused multiply-add
cannot change the result. Error: |angle - (p f mod 2 pi)| <= 3e-7 rad
(:data:`MAX_ERROR`) for every int32 p and |f| <= 2^20, with f the float32
value of the frequency. The derivative in f is p (a custom JVP), as for the
plain product.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MAX_ERROR", "MAX_FREQUENCY", "reduced_angles", "turn_table"]

MAX_ERROR = 3e-7  # rad: 2^-26 turns of rounding in the sum plus half an ulp of the float32 angle (tested)
MAX_FREQUENCY = 2.0**20  # |f| up to which the 96 bits of 1/(2 pi) suffice for MAX_ERROR
_BITS = 12  # digit / chunk width: a 12-bit by 12-bit product is exact in float32 (24-bit significand)
_CHUNKS = 8  # 96 bits of 1/(2 pi)


def _atan_inv(x: int, one: int) -> int:
    """atan(1 / x) * one in integer arithmetic (Taylor series)."""
    total, term, n, sign = 0, one // x, 1, 1
    while term:
        total += sign * (term // n)
        term //= x * x
        n += 2
        sign = -sign
    return total


def _inv_two_pi_chunks() -> tuple[float, ...]:
    """1/(2 pi) as _CHUNKS float32-exact pieces of 12 bits each (Machin's formula for pi)."""
    bits = _BITS * _CHUNKS
    one = 1 << (bits + 64)  # 64 guard bits
    pi = 16 * _atan_inv(5, one) - 4 * _atan_inv(239, one)
    k = (one << bits) // (2 * pi)  # floor(2^bits / (2 pi))
    mask = (1 << _BITS) - 1
    return tuple(float(((k >> (_BITS * (_CHUNKS - 1 - j))) & mask) * 2.0 ** (-_BITS * (j + 1)))
                 for j in range(_CHUNKS))


_INV_TWO_PI = _inv_two_pi_chunks()
_TWO_PI_HI = np.float32(2 * np.pi)
_TWO_PI_LO = np.float32(2 * np.pi - np.float64(_TWO_PI_HI))


def _frac(x):
    """x - round(x), in [-0.5, 0.5]: exact for every float."""
    return x - jnp.round(x)


def _split(x):
    """x = hi + lo with hi the top 12 significant bits of x (a bit mask) and lo the other 12."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFFF000)
    hi = jax.lax.bitcast_convert_type(bits, jnp.float32)
    return hi, x - hi


def turn_table(inv_freq) -> tuple:
    """Per-digit turn rates R_k = frac(2^(12 k) f / (2 pi)), k = 0, 1, 2, as three exact pieces.

    Returns (a1, a2, a3), each float32 [3, F] (row k for digit k): a1 on the
    grid 2^-12 with |a1| <= 1/2, a2 on 2^-24 with |a2| <= 2^-13, a3 on 2^-48
    with |a3| < 2^-24 (so that a digit < 2^12 times a1 or a2 is exact), and
    a1 + a2 + a3 = R_k within 2^-45.
    """
    f = jnp.asarray(inv_freq, jnp.float32)
    parts = jnp.stack(_split(f))  # [2, F], 12 bits each
    scale = jnp.asarray([2.0 ** (_BITS * k) for k in range(3)], jnp.float32)[:, None, None, None]
    chunks = jnp.asarray(_INV_TWO_PI, jnp.float32)[None, None, :, None]
    x = _frac((parts[None, :, None] * scale) * chunks)  # [3, 2, 8, F]: 12-bit x 12-bit products, exact
    grids = []
    for m in range(1, 5):  # fixed-point pieces on the grids 2^-12, 2^-24, 2^-36, 2^-48
        step = 2.0 ** (_BITS * m)
        g = jnp.round(x * step) * (1 / step)  # powers of two: exact (a division may not be, e.g. on TPU)
        x = x - g
        grids.append(jnp.sum(g, axis=(1, 2)))  # 16 terms on one grid: the sum is exact
    g1, g2, g3, g4 = grids
    # Carry each grid's excess into the one above, so the pieces meet the bounds above.
    c = jnp.round(g4 * 2.0**36) * 2.0**-36
    g3, g4 = g3 + c, g4 - c
    c = jnp.round(g3 * 2.0**24) * 2.0**-24
    g2, g3 = g2 + c, g3 - c
    c = jnp.round(g2 * 2.0**12) * 2.0**-12
    g1, g2 = g1 + c, g2 - c
    return _frac(g1), g2, g3 + g4


@jax.jit  # many small ops: one compiled kernel per shape also when called eagerly
def _reduced(positions, inv_freq):
    p = positions.astype(jnp.int32)[..., None]
    digits = (p & 0xFFF, (p >> _BITS) & 0xFFF, p >> (2 * _BITS))  # arithmetic shift keeps the sign
    turns = jnp.zeros(jnp.broadcast_shapes(p.shape, inv_freq.shape), jnp.float32)
    small = turns
    a1, a2, a3 = turn_table(inv_freq)
    for k, d in enumerate(digits):
        d = d.astype(jnp.float32)
        # turns and every added term lie in [-1/2, 1/2] on the grid 2^-24: exact sums mod 1.
        turns = _frac(turns + _frac(d * a1[k]))
        turns = _frac(turns + d * a2[k])
        small = small + d * a3[k]  # < 2^-12 per digit: rounding here is ~2^-37 turns
    turns = _frac(turns + small)
    return turns * _TWO_PI_HI + turns * _TWO_PI_LO  # 2 pi in two pieces: its float32 rounding is 9e-8 rad at pi


@jax.custom_jvp
def _reduced_angles(positions, inv_freq):
    return _reduced(positions, inv_freq)


@_reduced_angles.defjvp
def _reduced_angles_jvp(primals, tangents):
    positions, inv_freq = primals
    # d(p f)/df = p; the reduction subtracts a locally constant multiple of 2 pi.
    return _reduced(positions, inv_freq), positions.astype(jnp.float32)[..., None] * tangents[1]


def reduced_angles(positions, inv_freq) -> jax.Array:
    """(positions * inv_freq) mod 2 pi in [-pi, pi], float32 [..., L, F], error <= MAX_ERROR.

    positions: integer [..., L] (int32 range); inv_freq: float [F] (any
    values, zeros included; |f| <= MAX_FREQUENCY for the stated bound).
    Works under jit / vmap / grad (d angle / d inv_freq = positions).
    """
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be an integer array; got dtype {positions.dtype}")
    return _reduced_angles(positions.astype(jnp.int32), jnp.asarray(inv_freq, jnp.float32))
