"""Recall and state tracking: mqar (Zoology), flip_flop (Liu et al. 2023), induction (Olsson et al. 2022).

Token ids as in :mod:`posenc.tasks.base` (symbol ``i`` is id ``4 + i``).
These are streams rather than one problem and one answer: the answer
tokens (mask 1) are spread through the sequence, each a deterministic
function of what came before it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.tasks.base import BOS, FIRST_SYMBOL, SEP, WORD, Task, check_int, compose, gather, permutation, unit


class Mqar(Task):
    """mqar: multi-query associative recall with power-law query gaps (Arora et al. 2023, Zoology).

    ``zoology/data/multiquery_ar.py``: n key-value pairs with distinct keys
    (uniform over ``keys``) and distinct values (uniform over ``values``)
    are listed, then a region of ``slots * n`` two-token slots; key i is
    queried in slot ``g_i``, where the gaps ``g_1, g_2, ...`` are drawn
    without replacement with ``P(g) ~ (g + 1)**(power_a - 1)`` (``power_a``
    0.01: most queries come early; 1.0 is uniform) and assigned to the keys
    in context order, as in the original. A queried slot holds ``key
    value`` (the value is the answer); every other slot holds two random
    key/value tokens (``random_non_queries=True``, the original's default)
    or ``_ _``. Example (n=2, slots=2)::

        BOS k3 v7 k1 v2 SEP k1 v2 k5 v0 k3 v7 v4 k2      seq_len(n) = (2 + 2 slots) n + 2
        answers:                v2            v7

    Size n is the number of pairs (capped by ``keys`` and ``values``). The
    original's input holds a random token where this sequence holds the
    value: in a causal decoder the value is the next token's target, so the
    loss (mask 1 on the value after a queried key) is the same.
    """

    names = ("mqar",)
    description = "BOS k1 v1 .. kn vn SEP slots with queried keys (power-law gaps) followed by their values"
    source = "Arora et al. 2023 (Zoology); HazyResearch/zoology zoology/data/multiquery_ar.py"

    def __init__(self, *, keys: int = 64, values: int = 64, slots: int = 4, power_a: float = 0.01,
                 random_non_queries: bool = True, seed: int = 0):
        self.keys = check_int("keys", keys, minimum=1)
        self.values = check_int("values", values, minimum=1)
        self.slots = check_int("slots", slots, minimum=1)
        self.power_a = checks.number("power_a", power_a, positive=True, maximum=1.0)
        self.random_non_queries = checks.boolean("random_non_queries", random_non_queries)
        self.symbols = (tuple(f"k{i}" for i in range(self.keys)) + tuple(f"v{i}" for i in range(self.values))
                        + ("_",))
        self.size_cap = min(self.keys, self.values)
        self.per_size, self.overhead = 2 + 2 * self.slots, 2
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        space = self.slots * max_n
        return ([WORD] * self.keys + [WORD] * self.values + [WORD] * space
                + [self.keys + self.values] * (2 * space))

    def _example(self, draws, n, max_n, width):
        k, v, space_max = self.keys, self.values, self.slots * max_n
        key_words, value_words = draws[:k], draws[k:k + v]
        gumbel_words, filler = draws[k + v:k + v + space_max], draws[k + v + space_max:]
        ks = permutation(key_words)[:max_n]
        vs = k + permutation(value_words)[:max_n]
        context = jnp.stack([ks, vs], axis=1).reshape(-1)
        # Sampling without replacement with P(g) ~ (g+1)**(a-1): the Gumbel top-k, in draw order.
        g = jnp.arange(space_max)
        scores = (self.power_a - 1.0) * jnp.log1p(g.astype(jnp.float32)) - jnp.log(-jnp.log(unit(gumbel_words)))
        scores = jnp.where(g < self.slots * n, scores, -jnp.inf)
        gaps = jnp.argsort(-scores)[:max_n]
        pair_at = jnp.full(space_max + 1, -1).at[jnp.where(jnp.arange(max_n) < n, gaps, space_max)].set(
            jnp.arange(max_n))[:space_max]
        blank = k + v
        filler = filler if self.random_non_queries else jnp.full_like(filler, blank)
        j = jnp.arange(2 * space_max)
        pair = gather(pair_at, j // 2)
        queried = pair >= 0
        region = jnp.where(queried, jnp.where(j % 2 == 0, gather(ks, pair), gather(vs, pair)), filler)
        tokens, _ = compose(width, (BOS, 1, False), (FIRST_SYMBOL + context, 2 * n, False), (SEP, 1, False),
                            (FIRST_SYMBOL + region, 2 * self.slots * n, False))
        pos = jnp.arange(width)
        offset = pos - (2 * n + 2)
        answer = (offset >= 0) & (offset % 2 == 1) & (gather(queried, offset) & (offset < 2 * self.slots * n))
        return tokens, answer


class FlipFlop(Task):
    """flip_flop: a stream of ``w b`` (write), ``r b`` (read) and ``i b`` (ignore) instructions.

    Liu et al. 2023 ("Exposing Attention Glitches with Flip-Flop Language
    Modeling"), FFL(p_ignore): n instruction-bit pairs; the first
    instruction is ``w`` and the last ``r``; the others are ``i`` with
    probability ``p_ignore`` (0.8 in distribution) and ``w`` or ``r`` with
    ``(1 - p_ignore) / 2`` each. Bits after ``w`` and ``i`` are uniform;
    the bit after ``r`` is the last written bit and is the answer (the
    deterministic tokens the paper scores). ``eval_sweep`` covers the
    paper's splits: dense (0.1), in distribution (0.8) and sparse (0.98).
    Symbols ``w r i 0 1``. Example (n=5)::

        BOS w 1 i 0 r 1 w 0 r 0                           seq_len(n) = 2n + 1
        answers:       1       0
    """

    names = ("flip_flop",)
    description = "BOS (w|r|i bit)*n: after each r, the last written bit"
    source = "Liu et al. 2023, arXiv 2306.00946 (official data: huggingface synthseq/flipflop)"
    symbols = ("w", "r", "i", "0", "1")
    smallest = 2
    per_size, overhead = 2, 1
    eval_sweep = {"p_ignore": (0.1, 0.8, 0.98)}

    def __init__(self, *, p_ignore: float = 0.8, seed: int = 0):
        self.p_ignore = checks.number("p_ignore", p_ignore, minimum=0.0, maximum=1.0)
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [WORD] * max_n + [2] * max_n

    def _example(self, draws, n, max_n, width):
        u, bits = unit(draws[:max_n]), draws[max_n:]
        i = jnp.arange(max_n)
        drawn = jnp.where(u < self.p_ignore, 2, jnp.where(u < self.p_ignore + (1.0 - self.p_ignore) / 2, 0, 1))
        instr = jnp.where(i == 0, 0, jnp.where(i == n - 1, 1, drawn))  # 0 w, 1 r, 2 i
        last_write = jax.lax.cummax(jnp.where(instr == 0, i, -1), axis=0)
        data = jnp.where(instr == 1, gather(bits, last_write), bits)
        stream = jnp.stack([instr, 3 + data], axis=1).reshape(-1)
        tokens, _ = compose(width, (BOS, 1, False), (FIRST_SYMBOL + stream, 2 * n, False))
        pos = jnp.arange(width)
        step = (pos - 1) // 2
        answer = (pos >= 1) & (pos <= 2 * n) & (pos % 2 == 0) & (gather(instr, step) == 1)
        return tokens, answer


class Induction(Task):
    """induction: after ``... A B ... SEP A`` predict ``B``, the token after A's previous occurrence.

    Olsson et al. 2022 (induction heads). n tokens uniform over
    ``alphabet``; the query ``A`` is the token at a position uniform in
    ``[0, n-2]`` (so it has a successor); the answer is the token that
    follows the last occurrence of ``A`` among the first n - 1 tokens.
    Sizes start at 2. Example (n=8)::

        BOS 3 7 1 3 5 2 7 4 SEP 3 5                       seq_len(n) = n + 4
    """

    names = ("induction",)
    description = "BOS random tokens SEP A -> the token after A's last occurrence"
    source = "Olsson et al. 2022, In-context Learning and Induction Heads"
    smallest = 2
    per_size, overhead = 1, 4

    def __init__(self, *, alphabet: int = 32, seed: int = 0):
        self.alphabet = check_int("alphabet", alphabet, minimum=2)
        self.symbols = tuple(str(i) for i in range(self.alphabet))
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [self.alphabet] * max_n + [WORD]

    def _example(self, draws, n, max_n, width):
        x = draws[:max_n]
        i = jnp.arange(max_n)
        query = gather(x, draws[-1] % jnp.maximum(n - 1, 1))
        last = jnp.max(jnp.where((x == query) & (i < n - 1), i, -1))
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + x, n, False), (SEP, 1, False),
                       (FIRST_SYMBOL + query, 1, False), (FIRST_SYMBOL + gather(x, last + 1), 1, True))


__all__ = ["Mqar", "FlipFlop", "Induction"]
