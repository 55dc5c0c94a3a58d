"""Sequence transduction tasks: copy, reverse, sort and parity.

The algorithmic length-generalisation benchmarks of Delétang et al. 2023
("Neural Networks and the Chomsky Hierarchy") and Ruoss et al. 2023
("Randomized Positional Encodings Boost Length Generalization of
Transformers"), in the decoder-only causal form of Kazemnejad et al. 2023
("The Impact of Positional Encoding on Length Generalization in
Transformers", NoPE on copy / reverse / addition). Token ids are in
:mod:`posenc.tasks.base` (PAD=0, BOS=1, SEP=2, EOS=3, symbol ``i`` is
``4 + i``). Below ``a b c`` are symbols and ``.`` is PAD.

copy (n=3, length 8)::

    sequence  BOS a b c SEP a b c .
    inputs    BOS a b c SEP a b c
    targets   a b c SEP a  b c .
    mask      0 0 0  0  1  1 1 0      seq_len(n) = 2n + 2

reverse: ``BOS a b c SEP c b a`` (answer: the input reversed), 2n + 2 tokens.

sort: ``BOS c a b SEP a b c`` (answer: the symbols in ascending id order,
duplicates kept), 2n + 2 tokens.

parity: ``BOS 1 0 1 SEP 0`` over the two symbols 0 / 1 (ids 4 / 5); the
answer is one symbol, the parity of the number of ones, n + 3 tokens. A
negative control: parity is known not to extrapolate with any positional
encoding (Delétang et al. 2023; Anil et al. 2022). ``parity_check`` is the
same task under its name in Delétang et al. (regular; bits of length n,
answer the number of ones mod 2).
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc.tasks.base import BOS, FIRST_SYMBOL, PAD, SEP, Task, check_int, gather, segment


class _Transduction(Task):
    """``BOS x_1..x_n SEP f(x)_1..f(x)_n`` over an alphabet of ``alphabet`` symbols."""

    per_size, overhead = 2, 2

    def __init__(self, *, alphabet: int = 16, seed: int = 0):
        self.alphabet = check_int("alphabet", alphabet, minimum=2)
        self.symbols = tuple(str(i) for i in range(self.alphabet))
        super().__init__(seed=seed)

    def _answer(self, x, n):
        """The answer symbols for problem ``x[:n]`` (entries past ``n`` are ignored)."""
        raise NotImplementedError

    def _bounds(self, max_n):
        return [self.alphabet] * max_n

    def _example(self, draws, n, max_n, width):
        x = draws
        y = self._answer(x, n)
        pos = jnp.arange(width)
        in_x, ix = segment(pos, 1, n)
        in_y, iy = segment(pos, n + 2, n)
        tokens = jnp.full((width,), PAD, jnp.int32)
        tokens = jnp.where(pos == 0, BOS, tokens)
        tokens = jnp.where(in_x, FIRST_SYMBOL + gather(x, ix), tokens)
        tokens = jnp.where(pos == n + 1, SEP, tokens)
        tokens = jnp.where(in_y, FIRST_SYMBOL + gather(y, iy), tokens)
        return tokens, in_y


class Copy(_Transduction):
    """copy: ``BOS x SEP x`` (Kazemnejad et al. 2023; Delétang et al.'s ``duplicate_string`` writes x twice)."""

    names = ("copy",)
    description = "BOS x SEP x: copy a string of `alphabet` symbols"
    source = "Kazemnejad et al. 2023 (McGill-NLP/length-generalization, make_copy_dataset.py)"

    def _answer(self, x, n):
        return x


class Reverse(_Transduction):
    """reverse: ``BOS x SEP reversed(x)`` (Delétang et al. 2023; Kazemnejad et al. 2023)."""

    names = ("reverse",)
    description = "BOS x SEP reversed(x)"
    source = "Kazemnejad et al. 2023 (McGill-NLP/length-generalization, make_reverse_dataset.py)"
    level = "DCF"

    def _answer(self, x, n):
        # y_i = x_{n-1-i}; indices past n are clipped and masked by the caller.
        return gather(x, n - 1 - jnp.arange(x.shape[0]))


class Sort(_Transduction):
    """sort: ``BOS x SEP sorted(x)`` (Delétang et al. 2023; Ruoss et al. 2023)."""

    names = ("sort",)
    description = "BOS x SEP sorted(x)"
    source = "Kazemnejad et al. 2023 (make_sort_dataset.py); Delétang et al. 2023 bucket sort"
    level = "CS"

    def _answer(self, x, n):
        # Push the unused tail past every symbol so the first n sorted entries are x[:n] sorted.
        live = jnp.arange(x.shape[0]) < n
        return jnp.sort(jnp.where(live, x, self.alphabet))


class Parity(Task):
    """parity: ``BOS b_1..b_n SEP (sum b mod 2)`` (Delétang et al. 2023; a negative control)."""

    names = ("parity", "parity_check")
    description = "BOS bits SEP parity bit (negative control: does not extrapolate)"
    source = ("Delétang et al. 2023 parity check (google-deepmind/randomized_positional_encodings "
              "tasks/regular/parity_check.py)")
    level = "R"
    symbols = ("0", "1")
    per_size, overhead = 1, 3

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [2] * max_n

    def _example(self, draws, n, max_n, width):
        bits = draws
        parity = jnp.sum(jnp.where(jnp.arange(max_n) < n, bits, 0)) % 2
        pos = jnp.arange(width)
        in_x, ix = segment(pos, 1, n)
        is_answer = pos == n + 2
        tokens = jnp.full((width,), PAD, jnp.int32)
        tokens = jnp.where(pos == 0, BOS, tokens)
        tokens = jnp.where(in_x, FIRST_SYMBOL + gather(bits, ix), tokens)
        tokens = jnp.where(pos == n + 1, SEP, tokens)
        tokens = jnp.where(is_answer, FIRST_SYMBOL + parity, tokens)
        return tokens, is_answer
