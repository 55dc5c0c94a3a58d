"""Context-sensitive (CS) tasks: duplicate_string, missing_duplicate_string, odds_first,
binary_addition, binary_multiplication, compute_sqrt, bucket_sort.

Delétang et al. 2023 and Ruoss et al. 2023, as defined in
google-deepmind/randomized_positional_encodings ``tasks/cs/`` (options of
``experiments/constants.py``: binary alphabets, bucket sort over 5).
Posed to a decoder as ``BOS problem SEP answer``; size ``n`` is the
original ``length``, the number of problem tokens. Numbers are written in
the original's bit order (little-endian for addition and multiplication,
big-endian for the square root). Symbol ``i`` is token id ``4 + i``.
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc.tasks import binary
from posenc.tasks.base import BOS, EOS, FIRST_SYMBOL, SEP, WORD, Task, compose, gather, uniform
from posenc.tasks.synthetic import Sort, _Transduction

_SOURCE = "Delétang et al. 2023; google-deepmind/randomized_positional_encodings tasks/cs/{}.py"


class DuplicateString(_Transduction):
    """duplicate_string: ``BOS x SEP x x``: the string written twice (``duplication`` = 2).

    Level CS. ``x``: n symbols uniform over ``alphabet`` (2 in the paper);
    the answer is 2n tokens. Example (n=3): ``BOS 1 0 1 SEP 1 0 1 1 0 1``.
    """

    names = ("duplicate_string",)
    suite = "chomsky"
    description = "BOS bits SEP bits bits (the string twice)"
    source = _SOURCE.format("duplicate_string")
    level = "CS"
    per_size, overhead = 3, 2

    def __init__(self, *, alphabet: int = 2, seed: int = 0):
        super().__init__(alphabet=alphabet, seed=seed)

    def _example(self, draws, n, max_n, width):
        x = FIRST_SYMBOL + draws
        return compose(width, (BOS, 1, False), (x, n, False), (SEP, 1, False), (x, n, True), (x, n, True))


class OddsFirst(_Transduction):
    """odds_first: the symbols at odd (0-based) indices, then those at even indices.

    Level CS. ``x``: n symbols uniform over ``alphabet`` (2); the answer is
    the original's code, ``concat(x[1::2], x[::2])`` (its docstring example
    puts ``x[::2]`` first; the code is followed), n tokens.
    Example (n=8)::

        BOS 0 0 1 1 0 1 0 1 SEP 0 1 1 1 0 1 0 0
    """

    names = ("odds_first",)
    suite = "chomsky"
    description = "BOS x SEP x[1::2] x[0::2]"
    source = _SOURCE.format("odds_first")
    level = "CS"

    def __init__(self, *, alphabet: int = 2, seed: int = 0):
        super().__init__(alphabet=alphabet, seed=seed)

    def _answer(self, x, n):
        i = jnp.arange(x.shape[0])
        odd = n // 2
        return gather(x, jnp.where(i < odd, 2 * i + 1, 2 * (i - odd)))


class BucketSort(Sort):
    """bucket_sort: ``BOS x SEP sorted(x)`` over an alphabet of 5 (:class:`Sort`, another default).

    Level CS. ``x``: n symbols uniform over ``alphabet``; the answer is
    ``x`` in ascending order, duplicates kept. Example (n=8):
    ``BOS 1 0 2 0 4 1 1 2 SEP 0 0 1 1 1 2 2 4``.
    """

    names = ("bucket_sort",)
    eval_sizes = "exact"
    suite = "chomsky"
    description = "BOS x SEP sorted(x), alphabet of 5"
    source = _SOURCE.format("bucket_sort")

    def __init__(self, *, alphabet: int = 5, seed: int = 0):
        super().__init__(alphabet=alphabet, seed=seed)


class MissingDuplicateString(Task):
    """missing_duplicate_string: the bit hidden by ``_`` in a string written twice.

    Level CS. ``h = n // 2`` bits ``s`` uniform; the problem is ``s s`` with
    the symbol at a position uniform in ``[0, 2h)`` replaced by ``_``, and a
    trailing ``#`` (the original's empty token) when n is odd; the answer is
    the hidden bit. Sizes start at 2 (the original returns a constant dummy
    at length 1). Symbols ``0 1 _ #`` (the original's ids). Example (n=9)::

        BOS 0 1 1 0 0 _ 1 0 # SEP 1
    """

    names = ("missing_duplicate_string",)
    suite = "chomsky"
    description = "BOS s s with one bit masked (# pad if n odd) SEP the masked bit"
    source = _SOURCE.format("missing_duplicate_string")
    level = "CS"
    symbols = ("0", "1", "_", "#")
    smallest = 2
    per_size, overhead = 1, 3

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [2] * (max_n // 2) + [WORD]

    def _example(self, draws, n, max_n, width):
        h = n // 2
        bits = draws[: max_n // 2]
        pos = jnp.arange(max_n)
        doubled = gather(bits, jnp.where(pos < h, pos, pos - h))
        hidden = uniform(draws[-1], 0, 2 * h - 1)
        problem = jnp.where(pos == hidden, 2, jnp.where(pos >= 2 * h, 3, doubled))
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + problem, n, False), (SEP, 1, False),
                       (FIRST_SYMBOL + gather(doubled, hidden), 1, True))


class _BinaryOperation(Task):
    """``BOS a op b SEP c EOS``: a, b little-endian, c = a op b without leading zeros.

    The original's sampling: ``len(a)`` uniform in ``[1, n - 2]``, ``len(b) =
    n - 1 - len(a)``, each number uniform in ``[1, 2**len - 1]`` written with
    exactly ``len`` bits (zero-padded at the top). Sizes start at 3: below,
    the original writes a single number without an operator.
    """

    level = "CS"
    smallest = 3
    per_size, overhead = 2, 2  # c has at most n - 1 bits

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [WORD] * 3 + [2] * (2 * max_n)

    def _combine(self, a, b):
        raise NotImplementedError

    def _example(self, draws, n, max_n, width):
        len_a = uniform(draws[0], 1, n - 2)
        len_b = n - 1 - len_a
        a = binary.positive(draws[1], draws[3:3 + max_n], len_a)
        b = binary.positive(draws[2], draws[3 + max_n:], len_b)
        c = self._combine(a, b)
        pos = jnp.arange(max_n)
        # a, then the operator (symbol 2), then b.
        problem = jnp.where(pos < len_a, a, jnp.where(pos == len_a, 2, gather(b, pos - len_a - 1)))
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + problem, n, False), (SEP, 1, False),
                       (FIRST_SYMBOL + c, binary.top_bit(c) + 1, True), (EOS, 1, True))


class BinaryAddition(_BinaryOperation):
    """binary_addition: ``BOS a + b SEP (a + b) EOS``, little-endian bits.

    Level CS. See :class:`_BinaryOperation` for the sampling. Symbols
    ``0 1 +``. Example (n=9; 4 + 22 = 26)::

        BOS 0 0 1 + 0 1 1 0 1 SEP 0 1 0 1 1 EOS        seq_len(n) <= 2n + 2
    """

    names = ("binary_addition",)
    suite = "chomsky"
    description = "BOS a + b SEP a+b EOS, little-endian binary"
    source = _SOURCE.format("binary_addition")
    symbols = ("0", "1", "+")

    def _combine(self, a, b):
        zero = jnp.zeros(1, a.dtype)
        return binary.add(jnp.concatenate([a, zero]), jnp.concatenate([b, zero]))


class BinaryMultiplication(_BinaryOperation):
    """binary_multiplication: ``BOS a * b SEP (a * b) EOS``, little-endian bits.

    Level CS. See :class:`_BinaryOperation` for the sampling; the product
    has at most ``len(a) + len(b) = n - 1`` bits. Symbols ``0 1 *``.
    Example (n=9; 4 * 22 = 88)::

        BOS 0 0 1 * 0 1 1 0 1 SEP 0 0 0 1 1 0 1 EOS
    """

    names = ("binary_multiplication",)
    suite = "chomsky"
    description = "BOS a * b SEP a*b EOS, little-endian binary"
    source = _SOURCE.format("binary_multiplication")
    symbols = ("0", "1", "*")

    def _combine(self, a, b):
        return binary.multiply(a, b)


class ComputeSqrt(Task):
    """compute_sqrt: ``BOS x SEP floor(sqrt(x))``, big-endian bits of fixed widths.

    Level CS. ``x`` uniform in ``[1, 2**n - 1]`` written with exactly n
    bits (leading zeros kept); the answer is ``isqrt(x)`` with exactly
    ``ceil(n / 2)`` bits. Non-linear size law ``seq_len(n) = n + ceil(n/2) +
    2``. Symbols ``0 1``. Example (n=6; isqrt(37) = 6)::

        BOS 1 0 0 1 0 1 SEP 1 1 0
    """

    names = ("compute_sqrt",)
    suite = "chomsky"
    description = "BOS x (n bits, big-endian) SEP floor(sqrt(x)) (ceil(n/2) bits)"
    source = _SOURCE.format("compute_sqrt")
    level = "CS"
    symbols = ("0", "1")
    law = "n + ceil(n / 2) + 2"

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def seq_len(self, n: int) -> int:
        return n + (n + 1) // 2 + 2

    def _bounds(self, max_n):
        return [WORD] + [2] * max_n

    def _example(self, draws, n, max_n, width):
        x = binary.positive(draws[0], draws[1:], n)  # little-endian
        half = (n + 1) // 2
        root = binary.isqrt(x, half)
        i = jnp.arange(max_n)
        x_big = gather(x, n - 1 - i)
        root_big = gather(root, half - 1 - i)
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + x_big, n, False), (SEP, 1, False),
                       (FIRST_SYMBOL + root_big, half, True))


__all__ = ["DuplicateString", "MissingDuplicateString", "OddsFirst", "BinaryAddition", "BinaryMultiplication",
           "ComputeSqrt", "BucketSort"]
