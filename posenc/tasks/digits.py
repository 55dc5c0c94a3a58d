"""Decimal numbers as digit arrays, and laying out examples whose tokens carry position ids.

Shared by the arithmetic tasks (:mod:`~posenc.tasks.arithmetic`,
:mod:`~posenc.tasks.multiplication`). A number is an int32 array of digits,
least significant first, zero past its length, of a static capacity; every
operation works on traced lengths (inside ``vmap``) without Python loops
over traced values. Digits ``0 .. 9`` are token ids ``FIRST_SYMBOL + 0 ..
9`` in every arithmetic task (:data:`DIGIT_TOKENS`, which is also the
default digit set of the ``abacus`` encoding).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc.tasks.base import FIRST_SYMBOL, PAD, gather, segment, uniform

DIGIT_TOKENS = tuple(range(FIRST_SYMBOL, FIRST_SYMBOL + 10))


def number(draws, length):
    """A random number of exactly ``length`` digits (no leading zero; one digit may be 0).

    ``draws`` int32 [cap + 1]: ``cap`` draws of bound 10, then one of bound 9
    (the leading digit). As Kazemnejad et al.'s and Cho et al.'s builders:
    uniform over ``[10^(length-1), 10^length)``, over ``[0, 10)`` for one digit.
    Returns digits int32 [cap], least significant first.
    """
    cap = draws.shape[0] - 1
    i = jnp.arange(cap)
    digits = jnp.where(i < length, draws[:cap], 0)
    lead = jnp.where(length > 1, draws[cap] + 1, digits[0])
    return jnp.where(i == length - 1, lead, digits)


def carry(columns):
    """Digits of numbers given by column sums [..., cap] (least significant first): carries propagated.

    One ``lax.scan`` over the digit axis for every leading index at once; a
    column may hold any non-negative int (a sum of k numbers, digit
    products). The caller leaves room for the top carry.
    """
    columns = jnp.moveaxis(jnp.asarray(columns), -1, 0)

    def step(c, s):
        total = s + c
        return total // 10, total % 10

    _, digits = jax.lax.scan(step, jnp.zeros(columns.shape[1:], columns.dtype), columns)
    return jnp.moveaxis(digits, 0, -1)


def add_many(numbers):
    """Digits of the sum of numbers [k, cap] (least significant first), capacity ``cap``."""
    return carry(jnp.sum(numbers, axis=0))


def prefix_sums(numbers):
    """Digits of the sums of the first j numbers, j = 0 .. k: [k + 1, cap] (row 0 is zero)."""
    columns = jnp.cumsum(numbers, axis=0)
    return carry(jnp.concatenate([jnp.zeros_like(columns[:1]), columns]))


def times_digits(x, ds):
    """Digits of ``x * d`` for each digit d of ``ds`` [m]: [m, cap] (leave room for one more digit)."""
    return carry(ds[:, None] * x[None, :])


def shift(x, places):
    """Digits of ``x * 10^places`` (traced ``places``; digits pushed past the capacity are dropped)."""
    i = jnp.arange(x.shape[0])
    return jnp.where(i >= places, gather(x, i - places), 0)


def length_of(x):
    """Significant digits of ``x`` (1 for zero)."""
    i = jnp.arange(x.shape[0])
    return jnp.maximum(jnp.max(jnp.where(x != 0, i + 1, 0)), 1)


def significance(count, capacity, *, reverse: bool):
    """Significance of the i-th written digit of a ``count``-digit number: int32 [capacity].

    Most significant first (``reverse=False``): ``count - 1 - i``; least
    significant first: ``i``.
    """
    i = jnp.arange(capacity)
    return i if reverse else count - 1 - i


def start(word, train, max_position, high):
    """The first coupled id: uniform in ``[1, high]`` at training with ``max_position`` > 0, else 1.

    Cho et al. draw ``torch.randint(1, high + 1)`` at training and start at 1
    at evaluation (``randomize=False``); ``high`` is traced.
    """
    if not train or not max_position:
        return jnp.ones((), jnp.int32)
    return uniform(word, 1, jnp.maximum(high, 1)).astype(jnp.int32)


def lay_out(width, *parts):
    """Lay ``parts`` end to end: (tokens int32 [width], answer bool [width], ids int32 [width]).

    Each part is ``(tokens, count, is_answer, ids)``: ``tokens`` and ``ids``
    scalars (repeated) or arrays (their first ``count`` entries), ``count``
    traced or static. Positions past the last part are PAD with id 0.
    """
    pos = jnp.arange(width)
    tokens = jnp.full((width,), PAD, jnp.int32)
    answer = jnp.zeros((width,), bool)
    ids = jnp.zeros((width,), jnp.int32)
    offset = 0
    for values, count, is_answer, part_ids in parts:
        inside, index = segment(pos, offset, count)
        for name, v in (("tokens", values), ("ids", part_ids)):
            v = jnp.asarray(v, jnp.int32)
            v = gather(v, index) if v.ndim else v
            if name == "tokens":
                tokens = jnp.where(inside, v, tokens)
            else:
                ids = jnp.where(inside, v, ids)
        if is_answer:
            answer = answer | inside
        offset = offset + count
    return tokens, answer, ids


def written(digits, count, *, reverse: bool, ids=None, hints=None):
    """A number as a part of :func:`lay_out`: its tokens, length and ids, optionally with index hints.

    ``digits`` [cap] least significant first, ``count`` the written digits
    (more than the significant ones: zero padding); ``ids`` a function of
    the significance (coupled positions) or None (0). ``hints``: None, or
    ``(first_hint_token, num_hints, offset)``: each digit is preceded by the
    hint token ``first + (offset + significance) % num_hints`` (Zhou et al.
    2023; 2024), so digits of equal significance share a hint.
    Returns (tokens, count, ids) with 2 tokens per digit under hints.
    """
    cap = digits.shape[0]
    sig = significance(count, cap, reverse=reverse)
    tokens = FIRST_SYMBOL + gather(digits, sig)
    pos = jnp.zeros((cap,), jnp.int32) if ids is None else ids(sig)
    if hints is None:
        return tokens, count, pos
    first, num, offset = hints
    hint = first + (offset + sig) % num
    return jnp.stack([hint, tokens], -1).reshape(-1), 2 * count, jnp.repeat(pos, 2)


def check_max_position(task, name, value, needed, *, size, split):
    """At training, ``value`` (a task's max_position, 0 = no offset) must leave room: ValueError."""
    if split == "train" and value and value < needed:
        raise ValueError(f"{name} {value} is too small for size-{size} problems of task {task!r}: "
                         f"their coupled ids need {name} >= {needed} (0: no random offset)")


def hint_symbols(count):
    """Names of ``count`` index-hint symbols: h0, h1, ..."""
    return tuple(f"h{i}" for i in range(count))
