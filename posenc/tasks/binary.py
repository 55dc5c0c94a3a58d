"""Arbitrary-size binary arithmetic on fixed-width bit arrays, for the binary tasks.

Numbers are int32 arrays of 0/1 bits, least significant first, of a static
width; every function works on one number (vmap it for a batch) and under
``jit``. The tasks need numbers of hundreds of bits (a length-500 problem),
far past int32, so nothing here converts to an integer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc.tasks.base import gather

SMALL_BITS = 16  # up to this many bits a number is drawn by one modulo (relative bias < 2**-15)


def add(a, b, *, base: int = 2):
    """Digits of a + b (same width; the top digit must leave room for the carry).

    Carry-lookahead without a loop: a carry enters digit i iff the nearest
    digit j < i whose digit sum s_j != base - 1 has s_j >= base.
    """
    s = a + b
    idx = jnp.arange(s.shape[0])
    last = jax.lax.cummax(jnp.where(s != base - 1, idx, -1), axis=0)
    last_before = jnp.concatenate([jnp.array([-1]), last[:-1]])
    carry = (last_before >= 0) & (gather(s, last_before) >= base)
    return (s + carry.astype(s.dtype)) % base


def subtract(a, b):
    """Bits of a - b for a >= b (same width): borrow-lookahead, the mirror of :func:`add`."""
    d = a - b
    idx = jnp.arange(d.shape[0])
    last = jax.lax.cummax(jnp.where(d != 0, idx, -1), axis=0)
    last_before = jnp.concatenate([jnp.array([-1]), last[:-1]])
    borrow = (last_before >= 0) & (gather(d, last_before) < 0)
    return (d - borrow.astype(d.dtype)) % 2


def greater_equal(a, b):
    """a >= b for bit arrays of the same width: decided by the highest differing bit."""
    idx = jnp.arange(a.shape[0])
    top = jnp.max(jnp.where(a != b, idx, -1))
    return (top < 0) | (gather(a, top) > gather(b, top))


def multiply(a, b):
    """Bits of a * b, width ``len(a) + len(b)``: the column sums, then carries left to right."""
    wa, wb = a.shape[0], b.shape[0]
    cols = jnp.zeros(wa + wb, jnp.int32).at[(jnp.arange(wa)[:, None] + jnp.arange(wb)).ravel()].add(
        (a[:, None] * b[None, :]).ravel())

    def step(carry, c):
        v = c + carry
        return v >> 1, v & 1

    _, bits = jax.lax.scan(step, jnp.int32(0), cols)
    return bits


def isqrt(x, num_pairs):
    """Bits of floor(sqrt(x)) for ``x`` of at most ``2 * num_pairs`` bits (traced ``num_pairs``).

    The digit-by-digit method in base 4: bring down the next pair of bits,
    ``rem = 4 rem + pair``; if ``rem >= 4 root + 1`` subtract it and append
    a 1 to ``root``, else append a 0. Output width ``ceil(width / 2) + 1``.
    """
    pairs_max = (x.shape[0] + 1) // 2
    width = pairs_max + 3  # rem < 2 root + 2 <= 2**(pairs + 1), shifted by 2 bits
    x = jnp.concatenate([x, jnp.zeros(2 * pairs_max - x.shape[0] + 2, x.dtype)])

    def shift(v, k, low):
        return jnp.concatenate([low, v[:-k]])

    def step(carry, i):
        rem, root = carry
        p = num_pairs - 1 - i  # the pair brought down, from the top
        live = p >= 0
        pair = jnp.stack([gather(x, 2 * p), gather(x, 2 * p + 1)])
        rem2 = shift(rem, 2, pair)
        trial = shift(root, 2, jnp.array([1, 0], root.dtype))
        ge = greater_equal(rem2, trial)
        rem2 = jnp.where(ge, subtract(rem2, trial), rem2)
        root2 = shift(root, 1, ge.astype(root.dtype)[None])
        return (jnp.where(live, rem2, rem), jnp.where(live, root2, root)), None

    zeros = jnp.zeros(width, jnp.int32)
    (_, root), _ = jax.lax.scan(step, (zeros, zeros), jnp.arange(pairs_max))
    return root[: pairs_max + 1]


def positive(words, bits, length):
    """A number uniform in ``[1, 2**length - 1]`` (traced ``length``) as ``len(bits)`` bits.

    ``words``: one draw of bound ``2**31`` (used for ``length <= SMALL_BITS``:
    ``1 + word mod (2**length - 1)``); ``bits``: fair bits, used above that,
    where all-zero (probability <= 2**-17) becomes 1.
    """
    width = bits.shape[0]
    i = jnp.arange(width)
    live = i < length
    small_mod = (jnp.int32(1) << jnp.minimum(length, SMALL_BITS)) - 1
    small = 1 + words % jnp.maximum(small_mod, 1)
    small_bits = (small >> jnp.minimum(i, 30)) & 1
    big = jnp.where(live, bits, 0)
    big = jnp.where(jnp.any(big != 0), big, (i == 0).astype(big.dtype))
    return jnp.where(live, jnp.where(length <= SMALL_BITS, small_bits, big), 0)


def top_bit(bits):
    """Index of the highest set bit (-1 for zero): the number has ``top_bit + 1`` bits."""
    return jnp.max(jnp.where(bits != 0, jnp.arange(bits.shape[0]), -1))
