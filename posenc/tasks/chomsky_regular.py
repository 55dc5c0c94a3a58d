"""Regular (R) tasks of the Chomsky hierarchy: even_pairs, modular_arithmetic, cycle_navigation.

Delétang et al. 2023 ("Neural Networks and the Chomsky Hierarchy") and
Ruoss et al. 2023, as defined in google-deepmind/randomized_positional_encodings
``tasks/regular/``; ``parity_check`` is :class:`posenc.tasks.synthetic.Parity`
(the same task). The original models are encoders that read the problem
and emit one class; here a decoder reads ``BOS problem SEP`` and predicts
the class as one token (the only answer token). Size ``n`` is the original
``length``: the number of problem tokens, so the shared size law is
``seq_len(n) = n + 3`` and evaluating at 4x the length gives problems at
least 4x longer. Symbols are named below; symbol ``i`` of a task is token
id ``4 + i`` (``task.symbols``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc.tasks.base import BOS, FIRST_SYMBOL, SEP, Task, check_int, compose

_SOURCE = "Delétang et al. 2023; google-deepmind/randomized_positional_encodings tasks/regular/{}.py"


class _Classify(Task):
    """``BOS x_1..x_n SEP c``: a problem of n symbols and its class as one answer token."""

    level = "R"
    per_size, overhead = 1, 3

    def _layout(self, problem, count, answer, width):
        # problem / answer are symbol indices; ``count`` problem tokens, then the answer.
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + problem, count, False), (SEP, 1, False),
                       (FIRST_SYMBOL + answer, 1, True))


class EvenPairs(_Classify):
    """even_pairs: is the number of "01" and "10" substrings of a bit string even?

    Level R. Bits ``x`` uniform in {0, 1}^n; the answer is
    ``sum_i [x_i != x_{i+1}] mod 2`` ("0" even, "1" odd: the class of the
    original). Symbols ``0 1``. Example (n=5)::

        BOS 0 1 1 0 1 SEP 1          (pairs 01, 10, 01: three, odd)
    """

    names = ("even_pairs",)
    suite = "chomsky"
    description = "BOS bits SEP (number of 01 and 10 pairs) mod 2"
    source = _SOURCE.format("even_pairs")
    symbols = ("0", "1")

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [2] * max_n

    def _example(self, draws, n, max_n, width):
        live = jnp.arange(1, max_n) < n
        odd = jnp.sum((draws[1:] != draws[:-1]) & live) % 2
        return self._layout(draws, n, odd, width)


class ModularArithmetic(_Classify):
    """modular_arithmetic: evaluate ``d op d op ... d`` modulo ``modulus`` (default 5).

    Level R. The expression has ``n`` tokens if ``n`` is odd, else ``n - 1``
    (the original forces an odd length): ``n // 2 + 1`` digits uniform in
    ``[0, modulus)`` and ``n // 2`` operators uniform over ``operators``
    (default all of ``+ - *``), evaluated with the usual precedence (``*``
    first; ``a - b * c`` is ``a - (b * c)``), then reduced mod ``modulus``
    into ``[0, modulus)``. Symbols: digits ``0 .. modulus-1``, then
    ``+ - *``. Example (modulus 5, n=6: five tokens)::

        BOS 1 - 2 * 3 SEP 0          (1 - 6 = -5 = 0 mod 5)

    The product of a run of ``*`` is reduced mod ``modulus`` at each step,
    so long runs never overflow (the original's int32 ``segment_prod`` can
    wrap for runs of 16+ multiplications).
    """

    names = ("modular_arithmetic",)
    suite = "chomsky"
    description = "BOS d op d ... op d SEP value mod 5 (+, -, * with precedence)"
    source = _SOURCE.format("modular_arithmetic")

    def __init__(self, *, modulus: int = 5, operators: str = "+-*", seed: int = 0):
        self.modulus = check_int("modulus", modulus, minimum=2, maximum=10)
        if not isinstance(operators, str) or not operators or set(operators) - set("+-*") or len(
                set(operators)) != len(operators):
            raise ValueError(f"operators must be distinct characters of '+-*', got {operators!r}")
        self.operators = operators
        self.symbols = tuple(str(d) for d in range(self.modulus)) + ("+", "-", "*")
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [self.modulus] * (max_n // 2 + 1) + [len(self.operators)] * (max_n // 2)

    def _example(self, draws, n, max_n, width):
        m = self.modulus
        digits, choice = draws[: max_n // 2 + 1], draws[max_n // 2 + 1:]
        ops = jnp.array(["+-*".index(c) for c in self.operators])[choice]  # 0 '+', 1 '-', 2 '*'
        terms = (n - 1) // 2  # operators: the expression has n tokens for odd n, n - 1 for even n
        count = 2 * terms + 1

        def step(carry, i):
            total, product = carry
            op, d = ops[i], digits[i + 1]
            live = i < terms
            closes = live & (op != 2)  # + or - ends the running product and starts a term
            signed = jnp.where(op == 1, (m - d) % m, d)
            total = jnp.where(closes, (total + product) % m, total)
            product = jnp.where(live, jnp.where(op == 2, product * d % m, jnp.where(closes, signed, product)),
                                product)
            return (total, product), None

        (total, product), _ = jax.lax.scan(step, (jnp.int32(0), digits[0] % m), jnp.arange(max_n // 2))
        value = (total + product) % m
        pos = jnp.arange(max_n)
        expression = jnp.where(pos % 2 == 0, jnp.take(digits, pos // 2, mode="clip"),
                               m + jnp.take(ops, pos // 2, mode="clip"))
        return self._layout(expression, count, value, width)


class CycleNavigation(_Classify):
    """cycle_navigation: the final position on a cycle of ``cycle_length`` (5) after n moves.

    Level R. Moves uniform over -1, 0, +1 (the original's actions 0, 1, 2
    mean ``action - 1``), starting at 0; the answer is the sum of the moves
    mod ``cycle_length``. Symbols: moves ``-1 +0 +1``, then positions
    ``0 .. cycle_length-1``. Example (n=5)::

        BOS +1 -1 +0 -1 -1 SEP 3     (-2 mod 5)
    """

    names = ("cycle_navigation",)
    suite = "chomsky"
    description = "BOS moves in {-1, 0, +1} SEP final position on a 5-cycle"
    source = _SOURCE.format("cycle_navigation")

    def __init__(self, *, cycle_length: int = 5, seed: int = 0):
        self.cycle_length = check_int("cycle_length", cycle_length, minimum=2)
        self.symbols = ("-1", "+0", "+1") + tuple(str(p) for p in range(self.cycle_length))
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [3] * max_n

    def _example(self, draws, n, max_n, width):
        live = jnp.arange(max_n) < n
        position = jnp.sum(jnp.where(live, draws - 1, 0)) % self.cycle_length
        return self._layout(draws, n, 3 + position, width)


__all__ = ["EvenPairs", "ModularArithmetic", "CycleNavigation"]
