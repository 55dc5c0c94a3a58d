"""Associative recall and multi-digit addition.

Token ids as in :mod:`posenc.tasks.base` (PAD=0, BOS=1, SEP=2, EOS=3, task
symbols from 4). ``.`` is PAD below.

recall (associative recall: Ba et al. 2016 "Using Fast Weights"; Olsson et
al. 2022 induction heads; multi-query associative recall, Arora et al. 2023
"Zoology"). Keys ``k`` are ids ``4 .. 4+keys-1``, values ``v`` the next
``values`` ids. The context lists n pairs with distinct keys; after SEP every
key is queried once, in random order, each query followed by its value::

    BOS k3 v7 k1 v2 SEP k1 v2 k3 v7 .      seq_len(n) = 4n + 2
    mask (on targets): 1 on each answer v after a query key, 0 elsewhere

The model sees the query ``q_i`` and predicts ``a_i``; only the ``a_i`` are
answer tokens. ``n`` is capped at ``keys`` (keys are distinct), so raise
``keys`` to evaluate on longer contexts.

addition (Kazemnejad et al. 2023; Lee et al. 2023 "Teaching Arithmetic to
Small Transformers"; Zhou et al. 2024): two n-digit operands (digits drawn
uniformly, leading zeros allowed), written most significant digit first
(``reverse_operands=True`` writes them least significant first), then '='
(SEP), then the n + 1 digits of the sum (the top digit is the carry, possibly
0) and EOS. With ``reverse_output=True`` (default, the standard for
extrapolation studies since the sum is then produced in carry order) the
sum is written least significant digit first. Digits 0-9 are ids 4-13, '+'
is id 14. Example 57 + 68 = 125 (n=2)::

    BOS 5 7 + 6 8 = 5 2 1 EOS              seq_len(n) = 3n + 5
    answer tokens: 5 2 1 EOS
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.tasks.base import BOS, EOS, FIRST_SYMBOL, PAD, SEP, WORD, Task, check_int, gather, segment


class Recall(Task):
    """recall: ``BOS k1 v1 .. kn vn SEP q1 a1 .. qn an`` with a_i = value of key q_i."""

    names = ("recall",)
    description = "associative recall: BOS k1 v1 .. kn vn SEP then each key queried, answer its value"
    source = "Ba et al. 2016; Olsson et al. 2022; Arora et al. 2023 (Zoology)"
    per_size, overhead = 4, 2

    def __init__(self, *, keys: int = 64, values: int = 16, seed: int = 0):
        self.keys = check_int("keys", keys, minimum=1)
        self.values = check_int("values", values, minimum=2)
        self.symbols = tuple(f"k{i}" for i in range(self.keys)) + tuple(f"v{i}" for i in range(self.values))
        self.size_cap = self.keys
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [WORD] * self.keys + [self.values] * max_n + [WORD] * max_n

    def _example(self, draws, n, max_n, width):
        key_noise, vs, order_noise = jnp.split(draws, [self.keys, self.keys + max_n])
        # Distinct keys: the first max_n entries of a random permutation of the key alphabet.
        ks = jnp.argsort(key_noise)[:max_n]
        # Query order: a random permutation of 0..n-1 (the unused tail sorts last;
        # argsort is stable, so a live tie with the filler still comes first).
        order = jnp.argsort(jnp.where(jnp.arange(max_n) < n, order_noise, WORD - 1))
        key_ids = FIRST_SYMBOL + ks
        value_ids = FIRST_SYMBOL + self.keys + vs

        pos = jnp.arange(width)
        in_ctx, ic = segment(pos, 1, 2 * n)
        in_qry, iq = segment(pos, 2 * n + 2, 2 * n)
        pair = gather(order, iq // 2)
        ctx = jnp.where(ic % 2 == 0, gather(key_ids, ic // 2), gather(value_ids, ic // 2))
        qry = jnp.where(iq % 2 == 0, gather(key_ids, pair), gather(value_ids, pair))
        tokens = jnp.full((width,), PAD, jnp.int32)
        tokens = jnp.where(pos == 0, BOS, tokens)
        tokens = jnp.where(in_ctx, ctx, tokens)
        tokens = jnp.where(pos == 2 * n + 1, SEP, tokens)
        tokens = jnp.where(in_qry, qry, tokens)
        return tokens, in_qry & (iq % 2 == 1)


PLUS = FIRST_SYMBOL + 10


class Addition(Task):
    """addition: ``BOS a + b = c EOS`` with n-digit a, b and the n + 1 digits of c = a + b."""

    names = ("addition",)
    description = "BOS a + b = c EOS, n-digit operands, sum digits reversed by default"
    source = "Kazemnejad et al. 2023 (make_addition_dataset.py); Lee et al. 2023; Zhou et al. 2024"
    symbols = tuple("0123456789") + ("+",)
    per_size, overhead = 3, 5

    def __init__(self, *, reverse_output: bool = True, reverse_operands: bool = False, seed: int = 0):
        self.reverse_output = checks.boolean("reverse_output", reverse_output)
        self.reverse_operands = checks.boolean("reverse_operands", reverse_operands)
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [10] * (2 * max_n)

    def _example(self, draws, n, max_n, width):
        # Digits least significant first, zero past n so the sum's top digit is the carry.
        live = jnp.arange(max_n + 1) < n
        a = jnp.where(live, jnp.append(draws[:max_n], 0), 0)
        b = jnp.where(live, jnp.append(draws[max_n:], 0), 0)
        c = _add_digits(a, b)

        def written(digits, count, reverse):
            # Index into least-significant-first digits for the written order.
            i = jnp.arange(max_n + 1)
            return gather(digits, i if reverse else count - 1 - i)

        a_w = written(a, n, self.reverse_operands)
        b_w = written(b, n, self.reverse_operands)
        c_w = written(c, n + 1, self.reverse_output)
        pos = jnp.arange(width)
        in_a, ia = segment(pos, 1, n)
        in_b, ib = segment(pos, n + 2, n)
        in_c, icc = segment(pos, 2 * n + 3, n + 1)
        is_eos = pos == 3 * n + 4
        tokens = jnp.full((width,), PAD, jnp.int32)
        tokens = jnp.where(pos == 0, BOS, tokens)
        tokens = jnp.where(in_a, FIRST_SYMBOL + gather(a_w, ia), tokens)
        tokens = jnp.where(pos == n + 1, PLUS, tokens)
        tokens = jnp.where(in_b, FIRST_SYMBOL + gather(b_w, ib), tokens)
        tokens = jnp.where(pos == 2 * n + 2, SEP, tokens)
        tokens = jnp.where(in_c, FIRST_SYMBOL + gather(c_w, icc), tokens)
        tokens = jnp.where(is_eos, EOS, tokens)
        return tokens, in_c | is_eos


def _add_digits(a, b):
    """Digits of a + b, least significant first, for digit arrays of equal length.

    Carry-lookahead without a loop: a carry enters digit i iff the nearest
    digit j < i whose digit sum s_j != 9 has s_j >= 10 (nines propagate).
    """
    s = a + b
    idx = jnp.arange(s.shape[0])
    last = jax.lax.cummax(jnp.where(s != 9, idx, -1), axis=0)
    last_before = jnp.concatenate([jnp.array([-1]), last[:-1]])
    carry = (last_before >= 0) & (gather(s, last_before) >= 10)
    return (s + carry.astype(s.dtype)) % 10
