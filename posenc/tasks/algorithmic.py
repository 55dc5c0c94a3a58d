"""Associative recall.

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

Addition is in :mod:`posenc.tasks.arithmetic`.
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc.tasks.base import BOS, FIRST_SYMBOL, PAD, SEP, WORD, Task, check_int, gather, segment


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
