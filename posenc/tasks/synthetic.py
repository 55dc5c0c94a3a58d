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

Position coupling (Cho et al. 2024; HanseulJo/position-coupling
``CopyDatasetWithCoupledPositions``): copy and reverse with ``coupled=True``
add ``position_ids`` to the batch, so that each answer token shares the id
of the input token it copies. BOS and PAD get 0; copy: x_i -> s0 + 1 + i,
SEP -> s0, y_j -> s0 + 1 + j; reverse: x_i -> s0 + i, SEP -> s0 + n,
y_j -> s0 + n - 1 - j. At training s0 is uniform in [1, max_position - n],
at evaluation 1 (``max_position=0``: 1 always).

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

from posenc import checks
from posenc.tasks.base import BOS, FIRST_SYMBOL, PAD, SEP, WORD, Task, check_int, gather, segment, uniform


class _Transduction(Task):
    """``BOS x_1..x_n SEP f(x)_1..f(x)_n`` over an alphabet of ``alphabet`` symbols."""

    per_size, overhead = 2, 2
    coupled, max_position = False, 0

    def __init__(self, *, alphabet: int = 16, seed: int = 0):
        self.alphabet = check_int("alphabet", alphabet, minimum=2)
        self.symbols = tuple(str(i) for i in range(self.alphabet))
        super().__init__(seed=seed)

    def _answer(self, x, n):
        """The answer symbols for problem ``x[:n]`` (entries past ``n`` are ignored)."""
        raise NotImplementedError

    def _bounds(self, max_n):
        return [self.alphabet] * max_n + [WORD] * self.coupled

    def _ids(self, pos, n, s0):
        """Coupled ids of sequence positions ``pos`` (copy and reverse define them)."""
        raise NotImplementedError

    def _example(self, draws, n, max_n, width, *, train=False):
        x = draws[:max_n]
        y = self._answer(x, n)
        pos = jnp.arange(width)
        in_x, ix = segment(pos, 1, n)
        in_y, iy = segment(pos, n + 2, n)
        tokens = jnp.full((width,), PAD, jnp.int32)
        tokens = jnp.where(pos == 0, BOS, tokens)
        tokens = jnp.where(in_x, FIRST_SYMBOL + gather(x, ix), tokens)
        tokens = jnp.where(pos == n + 1, SEP, tokens)
        tokens = jnp.where(in_y, FIRST_SYMBOL + gather(y, iy), tokens)
        if not self.coupled:
            return tokens, in_y
        s0 = jnp.ones((), jnp.int32)
        if train and self.max_position:  # torch.randint(1, max_position - n + 1)
            s0 = uniform(draws[max_n], 1, jnp.maximum(self.max_position - n, 1)).astype(jnp.int32)
        ids = jnp.where((pos > 0) & (pos < 2 * n + 2), self._ids(pos, n, s0), 0)
        return tokens, in_y, ids


class _Coupled(_Transduction):
    """A transduction with optional coupled position ids (copy, reverse)."""

    split_aware = True

    def __init__(self, *, alphabet: int = 16, coupled: bool = False, max_position: int = 0,
                 seed: int = 0):
        self.coupled = checks.boolean("coupled", coupled)
        self.max_position = check_int("max_position", max_position, minimum=0)
        if not self.coupled and self.max_position:
            raise ValueError(f"option max_position={max_position!r} of task {self.names[0]!r} needs "
                             "coupled=True; leave it at 0")
        super().__init__(alphabet=alphabet, seed=seed)

    @property
    def position_levels(self) -> int:
        return int(self.coupled)

    def batch(self, key, batch_size, length, *, min_size=None, split="train"):
        n = self.max_size(length)
        if self.coupled and split == "train" and self.max_position and self.max_position < n + 1:
            raise ValueError(f"max_position {self.max_position} is too small for size-{n} problems of "
                             f"task {self.name!r}: their coupled ids need max_position >= {n + 1} "
                             "(0: no random offset)")
        return super().batch(key, batch_size, length, min_size=min_size, split=split)


class Copy(_Coupled):
    """copy: ``BOS x SEP x`` (Kazemnejad et al. 2023; Delétang et al.'s ``duplicate_string`` writes x twice)."""

    names = ("copy",)
    eval_sizes = "bin"
    description = "BOS x SEP x: copy a string of `alphabet` symbols"
    source = "Kazemnejad et al. 2023 (McGill-NLP/length-generalization, make_copy_dataset.py)"

    def _answer(self, x, n):
        return x

    def _ids(self, pos, n, s0):
        # x_i at pos 1 + i, SEP at n + 1, y_j at n + 2 + j (CopyDatasetWithCoupledPositions, in order)
        return jnp.where(pos <= n, s0 + pos, jnp.where(pos == n + 1, s0, s0 + pos - n - 1))


class Reverse(_Coupled):
    """reverse: ``BOS x SEP reversed(x)`` (Delétang et al. 2023; Kazemnejad et al. 2023)."""

    names = ("reverse",)
    eval_sizes = "bin"
    description = "BOS x SEP reversed(x)"
    source = "Kazemnejad et al. 2023 (McGill-NLP/length-generalization, make_reverse_dataset.py)"
    level = "DCF"

    def _answer(self, x, n):
        # y_i = x_{n-1-i}; indices past n are clipped and masked by the caller.
        return gather(x, n - 1 - jnp.arange(x.shape[0]))

    def _ids(self, pos, n, s0):
        # x_i -> s0 + i, SEP -> s0 + n, y_j (= x_{n-1-j}) -> s0 + n - 1 - j (reverse_output=True)
        return jnp.where(pos <= n + 1, s0 + pos - 1, s0 + 2 * n + 1 - pos)


class Sort(_Transduction):
    """sort: ``BOS x SEP sorted(x)`` (Delétang et al. 2023; Ruoss et al. 2023)."""

    names = ("sort",)
    eval_sizes = "bin"
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
    suite = "chomsky"
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
