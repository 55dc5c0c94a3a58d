"""Decimal addition in the formats the length-generalization papers compare, and multi-operand addition.

Token ids as in :mod:`posenc.tasks.base` (PAD=0, BOS=1, SEP=2 is '=',
EOS=3); digits 0-9 are ids 4-13, '+' is 14, then the task's other symbols
(index hints ``h0 h1 ...``, '>'). The problem size ``n`` is the number of
digits of the longest operand (the papers' sizes are digits, not tokens).

addition (Kazemnejad et al. 2023, McGill-NLP/length-generalization
``make_addition_dataset.py``): ``BOS a + b = c EOS``. One operand has n
digits, the other m ~ U{1..n} (which one is a coin flip); a number of d > 1
digits is uniform over ``[10^(d-1), 10^d)``, of one digit over ``[0, 10)``
(independent digit counts, no leading zeros, as the builder).
``operand_lengths="independent"`` (Cho et al. 2024, HanseulJo/position-coupling
``AdditionDataset``: ``torch.randint(min_n_digits, max_n_digits + 1, size=(2,))``)
draws the two lengths independently, each uniform over the batch's sizes
[smallest, largest] (training: [1 or task.min_size, n_max]; evaluation at
exact sizes: both operands n digits, as their test sets); the problem size is
then the longer operand's digits (no longer uniform at training), and
``zero_pad`` pads to it. ``format``:

- ``msd`` (default, Kazemnejad et al.): a, b and c most significant digit
  first, c without leading zeros. 57 + 8 = 65: ``BOS 5 7 + 8 = 6 5 EOS``;
- ``reversed_output`` (Lee et al. 2023; Cho et al. 2024's format): a and b
  most significant first, c least significant first: ``BOS 5 7 + 8 = 5 6 EOS``;
- ``reversed`` (McLeish et al. 2024, "reverse_all"; Zhou et al. 2024): every
  number least significant first: ``BOS 7 5 + 8 = 5 6 EOS``;
- ``reversed_padded`` (this library's earlier addition): two n-digit
  operands of uniform digits (leading zeros allowed), most significant
  first, and the n + 1 digits of c least significant first.

``zero_pad=True`` (Cho et al. 2024: ``padding=True``) writes both operands
with the longer one's n digits and c with n + 1, zeros in front (in the
written order of each number). seq_len(n) = 3n + 5 (examples may be
shorter: PAD follows).

Index hints (Zhou et al. 2023, 2024; McLeish et al. 2024's cyclic hint
set): ``index_hints=True`` puts a hint token before every digit; the digit of
significance s in a, b and c gets hint ``h[(o + s) % hints]``, o uniform in
[0, hints) at training and 0 at evaluation, so hints align digits of equal
significance. seq_len(n) = 6n + 6.

Position coupling (Cho et al. 2024; HanseulJo/position-coupling
``AdditionDatasetWithCoupledPositions``): ``coupled=True`` adds
``position_ids`` to the batch: BOS, EOS and PAD 0; '+' gets s0; a digit of
significance s (in a, b or c) gets s0 + 1 + s; '=' gets s0 when c is
reversed, else s0 + len(c) + 1. At training s0 is uniform in [1,
max_position - len(c)] (reversed c; [1, max_position - len(c) - 1]
otherwise), at evaluation 1; ``max_position=0`` starts at 1 always. With an
unpadded c the ids of '=' and of c reveal the length of c, as in the
official code.

multi_addition (Cho et al. 2024 multi-operand addition; Cho et al. 2025
with a scratchpad): ``BOS a1 + a2 + ... + ak = c EOS`` with k ~ U{min_operands
.. operands} operands, one of n digits and the others of U{1..n} digits each
(the official ``uniform_fixed_max``), every number written with n + 1 digits
(zeros in front: ``overflow``, exact for k <= 10), operands most
significant first, c least significant first. ``scratchpad=True`` (Cho et
al. 2025, ``MultipleAdditionScratchPadDataset``) answers with every
cumulative sum, ``= s0 > s1 > ... > sk`` (s0 = 0, s_j = a1 + .. + aj), each
n + 1 digits least significant first, all of them answer tokens. Coupled
ids: one level without the scratchpad (``MultipleAdditionDatasetWithCoupledPositions``:
digit of significance s -> s0 + 1 + s, '+' and '=' -> s0, s0 uniform in
[1, max_position - (n + 1)]); two with it (``MultipleAdditionScratchPadDatasetWithCoupledPositions``):
the same first level (every separator s0), and a second level, operand i
(0-based) and the '+' after it -> t0 + i, sum s_j and the separator before
it -> t0 + j, t0 uniform in [1, max_position_operands - k], packed as
``posenc.position_coupling.pack``.
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc import checks
from posenc.encodings import position_coupling as coupling
from posenc.tasks import digits as dg
from posenc.tasks.base import BOS, EOS, FIRST_SYMBOL, SEP, WORD, Task, check_int, uniform

PLUS = FIRST_SYMBOL + 10
GREATER = FIRST_SYMBOL + 11  # '>' between the scratchpad's sums
FORMATS = ("msd", "reversed_output", "reversed", "reversed_padded")
OPERAND_LENGTHS = ("one_at_n", "independent")  # the module docstring
_SOURCE = ("Kazemnejad et al. 2023 (make_addition_dataset.py: the default format); Lee et al. 2023; "
           "McLeish et al. 2024 (mcleish7/arithmetic); Cho et al. 2024 (HanseulJo/position-coupling); "
           "Zhou et al. 2024 (index hints)")


def _unused(task, name, value, default, needs):
    """ValueError for option ``name`` set away from its default where the option it ``needs`` is off."""
    if value != default:
        raise ValueError(f"option {name}={value!r} of task {task!r} needs {needs}; leave it at {default!r}")


class Addition(Task):
    """addition: ``BOS a + b = c EOS`` in one of :data:`FORMATS` (module docstring)."""

    names = ("addition",)
    eval_sizes = "bin"
    description = "BOS a + b = c EOS, operands of up to n digits; most significant digit first by default"
    source = _SOURCE
    split_aware = True
    size_aware = True  # operand_lengths="independent" draws from the batch's smallest size

    def __init__(self, *, format: str = "msd", zero_pad: bool = False, index_hints: bool = False,
                 hints: int = 102, coupled: bool = False, max_position: int = 0,
                 operand_lengths: str = "one_at_n", seed: int = 0):
        self.format = checks.choice("format", format, FORMATS)
        self.operand_lengths = checks.choice("operand_lengths", operand_lengths, OPERAND_LENGTHS)
        self.zero_pad = checks.boolean("zero_pad", zero_pad)
        self.index_hints = checks.boolean("index_hints", index_hints)
        self.hints = check_int("hints", hints, minimum=1)
        self.coupled = checks.boolean("coupled", coupled)
        self.max_position = check_int("max_position", max_position, minimum=0)
        if self.coupled and self.index_hints:
            raise ValueError("task 'addition': coupled=True and index_hints=True are two ways of "
                             "aligning digits; choose one")
        if self.format == "reversed_padded" and self.zero_pad:
            raise ValueError("task 'addition': format='reversed_padded' is zero-padded already; "
                             "zero_pad=True applies to msd, reversed_output and reversed")
        if not self.index_hints:
            _unused("addition", "hints", self.hints, 102, "index_hints=True")
        if not self.coupled:
            _unused("addition", "max_position", self.max_position, 0, "coupled=True")
        if self.format == "reversed_padded" and self.operand_lengths != "one_at_n":
            raise ValueError("task 'addition': format='reversed_padded' has two n-digit operands; "
                             f"operand_lengths={self.operand_lengths!r} applies to msd, reversed_output and reversed")
        self.symbols = tuple("0123456789") + ("+",) + (dg.hint_symbols(self.hints) if self.index_hints
                                                       else ())
        super().__init__(seed=seed)

    digit_tokens = dg.DIGIT_TOKENS

    @property
    def position_levels(self) -> int:
        return int(self.coupled)

    @property
    def law(self) -> str:
        return "6 * n + 6" if self.index_hints else "3 * n + 5"

    @property
    def fresh_draws(self) -> int:
        # the hint offset and the coupled start id: drawn at every visit, as the official __getitem__
        return int(self.index_hints) + int(self.coupled)

    def seq_len(self, n: int) -> int:
        return 6 * n + 6 if self.index_hints else 3 * n + 5

    @property
    def _reverse_output(self) -> bool:
        return self.format != "msd"

    def check_sizes(self, length, split):
        if self.coupled:
            n = self.max_size(length)
            dg.check_max_position(self.name, "max_position", self.max_position,
                                  n + 2 + (not self._reverse_output), size=n, split=split)

    def _bounds(self, max_n):
        cap = max_n + 1
        if self.format == "reversed_padded":
            bounds = [10] * (2 * max_n)
        else:  # each operand: cap digits and a leading digit; the other length; which is longer
            bounds = [10] * cap + [9] + [10] * cap + [9] + [WORD, 2]
        return bounds + [self.hints] * self.index_hints + [WORD] * self.coupled

    def _example(self, draws, n, max_n, width, *, train, smallest):
        cap = max_n + 1
        if self.format == "reversed_padded":
            live = jnp.arange(cap) < n
            a = jnp.where(live, jnp.append(draws[:max_n], 0), 0)
            b = jnp.where(live, jnp.append(draws[max_n:2 * max_n], 0), 0)
            rest = draws[2 * max_n:]
            wa = wb = n
        elif self.operand_lengths == "independent":  # la = n and lb, each uniform in [smallest, max_n]
            la, lb = n, uniform(draws[2 * cap + 2], smallest, max_n)
            n = jnp.maximum(la, lb)
        else:
            other = uniform(draws[2 * cap + 2], 1, n)
            swap = draws[2 * cap + 3] == 1
            la, lb = jnp.where(swap, other, n), jnp.where(swap, n, other)
        if self.format != "reversed_padded":
            a, b = dg.number(draws[:cap + 1], la), dg.number(draws[cap + 1:2 * cap + 2], lb)
            rest = draws[2 * cap + 4:]
            wa, wb = (n, n) if self.zero_pad else (la, lb)
        c = dg.add_many(jnp.stack([a, b]))
        padded = self.zero_pad or self.format == "reversed_padded"
        wc = n + 1 if padded else dg.length_of(c)
        rev_in, rev_out = self.format == "reversed", self._reverse_output
        hints = None
        if self.index_hints:
            hints = (FIRST_SYMBOL + 11, self.hints, rest[0] if train else 0)
            rest = rest[1:]
        s0 = dg.start(rest[0] if self.coupled else 0, train, self.max_position,
                      self.max_position - wc - (0 if rev_out else 1))
        ids = lambda sig: s0 + 1 + sig  # noqa: E731
        eq = s0 if rev_out else s0 + wc + 1
        tokens, answer, pos = dg.lay_out(
            width, (BOS, 1, False, 0),
            _part(dg.written(a, wa, reverse=rev_in, ids=ids, hints=hints), False),
            (PLUS, 1, False, s0),
            _part(dg.written(b, wb, reverse=rev_in, ids=ids, hints=hints), False),
            (SEP, 1, False, eq),
            _part(dg.written(c, wc, reverse=rev_out, ids=ids, hints=hints), True),
            (EOS, 1, True, 0))
        return (tokens, answer, pos) if self.coupled else (tokens, answer)


def _part(number, is_answer):
    """(tokens, count, ids) of :func:`digits.written` as a part of :func:`digits.lay_out`."""
    tokens, count, ids = number
    return tokens, count, is_answer, ids


class MultiAddition(Task):
    """multi_addition: ``BOS a1 + .. + ak = c EOS`` or its scratchpad of cumulative sums (module docstring)."""

    names = ("multi_addition",)
    description = "BOS a1 + ... + ak = sum EOS (k operands of up to n digits; scratchpad of partial sums)"
    source = ("Cho et al. 2024, 2025 (HanseulJo/position-coupling src/data/addition.py: "
              "MultipleAdditionDataset, MultipleAdditionScratchPadDataset)")
    split_aware = True
    digit_tokens = dg.DIGIT_TOKENS

    def __init__(self, *, operands: int = 3, min_operands: int = 2, scratchpad: bool = False,
                 coupled: bool = False, max_position: int = 0, max_position_operands: int = 0,
                 seed: int = 0):
        self.operands = check_int("operands", operands, minimum=2, maximum=10)
        self.min_operands = check_int("min_operands", min_operands, minimum=2, maximum=self.operands)
        self.scratchpad = checks.boolean("scratchpad", scratchpad)
        self.coupled = checks.boolean("coupled", coupled)
        self.max_position = check_int("max_position", max_position, minimum=0)
        self.max_position_operands = check_int("max_position_operands", max_position_operands, minimum=0)
        if not self.coupled:
            _unused("multi_addition", "max_position", self.max_position, 0, "coupled=True")
        if not (self.coupled and self.scratchpad):
            _unused("multi_addition", "max_position_operands", self.max_position_operands, 0,
                    "coupled=True and scratchpad=True")
        self.symbols = tuple("0123456789") + ("+",) + ((">",) if self.scratchpad else ())
        super().__init__(seed=seed)

    @property
    def position_levels(self) -> int:
        return (2 if self.scratchpad else 1) if self.coupled else 0

    def _tokens(self, n, k):
        sums = k + 1 if self.scratchpad else 1
        return 1 + k * (n + 1) + (k - 1) + sums * (n + 2) + 1

    @property
    def law(self) -> str:
        return f"{self.seq_len(1) - self.seq_len(0)} * n + {self.seq_len(0)}"  # linear in n

    def seq_len(self, n: int) -> int:
        return self._tokens(n, self.operands)

    def check_sizes(self, length, split):
        if self.coupled:
            n = self.max_size(length)
            dg.check_max_position(self.name, "max_position", self.max_position, n + 2, size=n,
                                  split=split)
            if self.scratchpad:
                dg.check_max_position(self.name, "max_position_operands", self.max_position_operands,
                                      self.operands + 1, size=n, split=split)

    @property
    def fresh_draws(self) -> int:
        return 2 * int(self.coupled)  # the two levels' start ids, drawn at every visit

    def _bounds(self, max_n):
        K, cap = self.operands, max_n + 1
        # per operand: digits, leading digit, length; then which operand is longest, the count, offsets
        return ([10] * cap + [9]) * K + [WORD] * K + [WORD, WORD] + [WORD] * (2 * self.coupled)

    def _example(self, draws, n, max_n, width, *, train):
        K, cap = self.operands, max_n + 1
        nums = draws[:K * (cap + 1)].reshape(K, cap + 1)
        lengths = uniform(draws[K * (cap + 1):K * (cap + 2)], 1, n)
        longest, count = draws[K * (cap + 2)], draws[K * (cap + 2) + 1]
        o1, o2 = (draws[K * (cap + 2) + 2], draws[K * (cap + 2) + 3]) if self.coupled else (0, 0)
        k = uniform(count, self.min_operands, K)
        lengths = jnp.where(jnp.arange(K) == longest % k, n, lengths)
        live = jnp.arange(K) < k
        numbers = jnp.stack([jnp.where(live[i], dg.number(nums[i], lengths[i]), 0) for i in range(K)])
        w = n + 1  # the official overflow: digits of (10^n - 1) * k, n + 1 for k <= 10
        s0 = dg.start(o1, train, self.max_position, self.max_position - w)
        t0 = dg.start(o2, train, self.max_position_operands if self.scratchpad else 0,
                      self.max_position_operands - k)
        two = self.coupled and self.scratchpad

        def ids(level2):  # the ids of a number whose second level is level2
            return lambda sig: (coupling.pack([s0 + 1 + sig, jnp.full_like(sig, level2)]) if two
                                else s0 + 1 + sig)

        sep_id = lambda level2: coupling.pack([s0, level2]) if two else s0  # noqa: E731
        parts = [(BOS, 1, False, 0)]
        for i in range(K):
            parts.append(_part(dg.written(numbers[i], jnp.where(live[i], w, 0), reverse=False,
                                          ids=ids(t0 + i)), False))
            parts.append((PLUS, jnp.where(i + 1 < k, 1, 0), False, sep_id(t0 + i)))
        if self.scratchpad:  # '=' s0 '>' s1 ... '>' sk: '=' is part of the problem, the rest answer
            partials = dg.prefix_sums(numbers)
            for j in range(K + 1):
                partial = partials[j]
                on = j <= k
                parts.append((SEP, 1, False, sep_id(t0)) if j == 0 else
                             (GREATER, jnp.where(on, 1, 0), True, sep_id(t0 + j)))
                parts.append(_part(dg.written(partial, jnp.where(on, w, 0), reverse=True,
                                              ids=ids(t0 + j)), True))
        else:
            parts.append((SEP, 1, False, s0))
            parts.append(_part(dg.written(dg.add_many(numbers), w, reverse=True, ids=ids(0)), True))
        parts.append((EOS, 1, True, 0))
        tokens, answer, pos = dg.lay_out(width, *parts)
        return (tokens, answer, pos) if self.coupled else (tokens, answer)


__all__ = ["FORMATS", "PLUS", "Addition", "MultiAddition"]
