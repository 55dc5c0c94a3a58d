"""Decimal multiplication N x M, plain (Cho et al. 2024) or with the scratchpad of Cho et al. 2025.

Token ids as in :mod:`posenc.tasks.base`; digits 0-9 are ids 4-13, '*' 14,
'+' 15, '>' 16. The problem size ``n`` is the digits of the first operand
``a`` (uniform over ``[10^(n-1), 10^n)``, ``[0, 10)`` for n = 1).

Plain (HanseulJo/position-coupling ``NxMMultiplicationDataset``): ``b`` is
``second`` uniform digits written with exactly ``second`` digits (zeros in
front, the official ``{b:0{M}d}``), the product ``c`` with n + second
digits (zeros in front), least significant first::

    BOS a * b = c EOS                                  seq_len(n) = 2n + 2 second + 4

Coupled ids (``NxMMultiplicationDatasetWithCoupledPositions``): with ``e =
s0 + n + second``, the digit of significance s in a, b or c gets e - 1 - s;
'*' and '=' get e; s0 uniform in [1, max_position - n - 1] at training, 1 at
evaluation.

Scratchpad (``scratchpad=True``; ``MultiplicationScratchPadDataset``): ``b``
has m ~ U{1..second} digits (no leading zero), both operands unpadded, most
significant first; the answer lists the partial products p_i = a * b_i (b_i
the digit of significance i of b), each with n + 1 digits, then the
cumulative sums c_i = p_0 + 10 p_1 + ... + 10^i p_i, each with n + m digits,
all least significant first::

    BOS a * b = p0 + p1 + ... = c0 > c1 > ... EOS    (c_{m-1} = a * b)

Coupled ids (``MultiplicationScratchPadDatasetWithCoupledPositions``), three
levels packed by ``posenc.position_coupling.pack``: level 1, a's digit of
significance s and p_i's digit s -> s1 + 1 + s, the separator before p_i
-> s1, 0 elsewhere; level 2, b's digit of significance i, p_i and c_i (and
the separator before each) -> s2 + i, 0 on a and '*'; level 3, p_i's
digit s -> s3 + i + 1 + s (its significance in the product) and the
separator before p_i -> s3 + i, c_i's digit s -> s3 + 1 + s and its
separator s3, 0 on the problem. At training s1, s3 are uniform in [1,
max_position - (n + 1)] and [1, max_position - (n + m)] (the longest
number of each level) and s2 in [1, max_position_operands - m + 1]; 1 at
evaluation.
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc import checks
from posenc.encodings import position_coupling as coupling
from posenc.tasks import digits as dg
from posenc.tasks.arithmetic import _part, _unused
from posenc.tasks.base import BOS, EOS, FIRST_SYMBOL, SEP, WORD, Task, check_int, uniform

TIMES, PLUS, GREATER = FIRST_SYMBOL + 10, FIRST_SYMBOL + 11, FIRST_SYMBOL + 12


class Multiplication(Task):
    """multiplication: ``BOS a * b = c EOS`` (N x second), or its scratchpad (module docstring)."""

    names = ("multiplication",)
    description = "BOS a * b = a*b EOS: n-digit a, second-digit b; optional scratchpad of partial products"
    source = ("Cho et al. 2024, 2025 (HanseulJo/position-coupling src/data/multiplication.py: "
              "NxMMultiplicationDataset, MultiplicationScratchPadDataset)")
    split_aware = True
    digit_tokens = dg.DIGIT_TOKENS

    def __init__(self, *, second: int = 2, scratchpad: bool = False, coupled: bool = False,
                 max_position: int = 0, max_position_operands: int = 0, seed: int = 0):
        self.second = check_int("second", second, minimum=1)
        self.scratchpad = checks.boolean("scratchpad", scratchpad)
        self.coupled = checks.boolean("coupled", coupled)
        self.max_position = check_int("max_position", max_position, minimum=0)
        self.max_position_operands = check_int("max_position_operands", max_position_operands, minimum=0)
        if not self.coupled:
            _unused("multiplication", "max_position", self.max_position, 0, "coupled=True")
        if not (self.coupled and self.scratchpad):
            _unused("multiplication", "max_position_operands", self.max_position_operands, 0,
                    "coupled=True and scratchpad=True")
        self.symbols = tuple("0123456789") + ("*", "+", ">")
        super().__init__(seed=seed)

    @property
    def position_levels(self) -> int:
        return (3 if self.scratchpad else 1) if self.coupled else 0

    @property
    def law(self) -> str:
        return f"{self.seq_len(1) - self.seq_len(0)} * n + {self.seq_len(0)}"  # linear in n

    def seq_len(self, n: int) -> int:
        m = self.second
        if not self.scratchpad:
            return 2 * n + 2 * m + 4
        # BOS a * b = m partials (n + 1 digits) with m - 1 '+', '=', m sums (n + m digits), m - 1 '>', EOS
        return 1 + n + 1 + m + 1 + m * (n + 1) + (m - 1) + 1 + m * (n + m) + (m - 1) + 1

    def check_sizes(self, length, split):
        if self.coupled:
            n, m = self.max_size(length), self.second
            needed = n + 2 if not self.scratchpad else n + m + 1
            dg.check_max_position(self.name, "max_position", self.max_position, needed, size=n,
                                  split=split)
            if self.scratchpad:
                dg.check_max_position(self.name, "max_position_operands", self.max_position_operands,
                                      m, size=n, split=split)

    @property
    def fresh_draws(self) -> int:
        return 3 * int(self.coupled)  # the coupled start ids, drawn at every visit

    def _bounds(self, max_n):
        cap = max_n + self.second + 1
        # a: digits and a leading digit; b: likewise; b's length; the coupled offsets
        return [10] * cap + [9] + [10] * cap + [9] + [WORD] + [WORD] * (3 * self.coupled)

    def _example(self, draws, n, max_n, width, *, train):
        M, cap = self.second, max_n + self.second + 1
        a = dg.number(draws[:cap + 1], n)
        rest = draws[2 * cap + 3:]
        if not self.scratchpad:
            b = jnp.where(jnp.arange(cap) < M, draws[cap + 1:2 * cap + 1], 0)  # M uniform digits
            return self._plain(a, b, n, rest, width, train)
        m = uniform(draws[2 * cap + 2], 1, M)
        b = dg.number(draws[cap + 1:2 * cap + 2], m)
        return self._scratchpad(a, b, n, m, rest, width, train)

    def _plain(self, a, b, n, rest, width, train):
        M = self.second
        c = dg.carry(sum(dg.shift(a * b[i], i) for i in range(M)))  # columns of sum_i 10^i a b_i
        s0 = dg.start(rest[0] if self.coupled else 0, train, self.max_position, self.max_position - n - 1)
        e = s0 + n + M
        ids = lambda sig: e - 1 - sig  # noqa: E731
        tokens, answer, pos = dg.lay_out(
            width, (BOS, 1, False, 0), _part(dg.written(a, n, reverse=False, ids=ids), False),
            (TIMES, 1, False, e), _part(dg.written(b, M, reverse=False, ids=ids), False),
            (SEP, 1, False, e), _part(dg.written(c, n + M, reverse=True, ids=ids), True),
            (EOS, 1, True, 0))
        return (tokens, answer, pos) if self.coupled else (tokens, answer)

    def _scratchpad(self, a, b, n, m, rest, width, train):
        M = self.second
        coupled = self.coupled
        words = rest if coupled else jnp.zeros((3,), jnp.int32)
        s1 = dg.start(words[0], train, self.max_position, self.max_position - jnp.maximum(n + 1, m))
        s2 = dg.start(words[1], train, self.max_position_operands, self.max_position_operands - m + 1)
        s3 = dg.start(words[2], train, self.max_position, self.max_position - jnp.maximum(n + m, n + 1))

        def ids(one, two, three):  # per-level id functions of the significance -> packed ids
            return lambda sig: coupling.pack([one(sig), two(sig), three(sig)])

        zero = lambda sig: jnp.zeros_like(sig)  # noqa: E731
        const = lambda v: (lambda sig: jnp.full_like(sig, v))  # noqa: E731
        sep = lambda one, two, three: coupling.pack([one, two, three])  # noqa: E731
        parts = [(BOS, 1, False, 0),
                 _part(dg.written(a, n, reverse=False, ids=ids(lambda s: s1 + 1 + s, zero, zero)), False),
                 (TIMES, 1, False, 0),
                 _part(dg.written(b, m, reverse=False, ids=ids(zero, lambda s: s2 + s, zero)), False)]
        products = dg.times_digits(a, b[:M])  # p_i = a * b_i
        sums = dg.prefix_sums(jnp.stack([dg.shift(products[i], i) for i in range(M)]))[1:]  # c_i
        for i in range(M):
            on = i < m
            p = products[i]
            parts.append((SEP if i == 0 else PLUS, jnp.where(on, 1, 0), i > 0, sep(s1, s2 + i, s3 + i)))
            parts.append(_part(dg.written(p, jnp.where(on, n + 1, 0), reverse=True,
                                          ids=ids(lambda s: s1 + 1 + s, const(s2 + i),
                                                  lambda s, i=i: s3 + i + 1 + s)), True))
        for j in range(M):
            on = j < m
            parts.append((SEP if j == 0 else GREATER, jnp.where(on, 1, 0), True, sep(0, s2 + j, s3)))
            parts.append(_part(dg.written(sums[j], jnp.where(on, n + m, 0), reverse=True,
                                          ids=ids(zero, const(s2 + j), lambda s: s3 + 1 + s)), True))
        parts.append((EOS, 1, True, 0))
        tokens, answer, pos = dg.lay_out(width, *parts)
        return (tokens, answer, pos) if coupled else (tokens, answer)


__all__ = ["Multiplication"]
