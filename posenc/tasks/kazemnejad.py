"""Kazemnejad et al. 2023 tasks: polynomial, summation, lego, count.

"The Impact of Positional Encoding on Length Generalization in
Transformers" (NeurIPS 2023); the definitions (value ranges, sampling) are
those of McGill-NLP/length-generalization ``scripts/dataset_builders/``,
posed to a decoder as ``BOS problem SEP answer`` with one token per number
or name instead of the paper's T5-tokenized sentences (its prompt words
such as "Evaluate at x = ... The answer is" carry no information). Size
``n`` is the builders' length (terms, values, variables, repeats): their
train / test split is by it. Symbol ``i`` is token id ``4 + i``.
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc import checks
from posenc.tasks.base import BOS, EOS, FIRST_SYMBOL, SEP, WORD, Task, check_int, compose, gather, permutation, uniform

_SOURCE = "Kazemnejad et al. 2023; McGill-NLP/length-generalization scripts/dataset_builders/{}"
_NUMBERS = tuple(str(v) for v in range(-3, 10))  # one token per integer -3 .. 9


def _number(v):
    """Symbol index of the integer ``v`` in ``_NUMBERS``."""
    return v + 3


class Polynomial(Task):
    """polynomial: evaluate ``sum_i c_i x^d_i`` at an integer x, modulo 10.

    ``make_poly_dataset.generate_data(num_terms=n, modular=True)``: ``c_i``
    uniform in [-3, 3], ``d_i`` uniform in [0, 3], one ``x`` uniform in
    [-2, 2]; the answer is the value mod 10 in [0, 10) (the s2s_poly
    processor's ``modulo_factor: 10``). Symbols: the integers -3 .. 9, then
    ``x = : +``. Each term is ``c x d`` (``c * x ** d``). Example (n=2;
    2 * (-1)^3 + (-3) * (-1)^0 = -5)::

        BOS x = -1 : 2 x 3 + -3 x 0 SEP 5          seq_len(n) = 4n + 6
    """

    names = ("polynomial",)
    eval_sizes = "bin"
    description = "BOS x = v : c1 x d1 + ... + cn x dn SEP value mod 10"
    source = _SOURCE.format("make_poly_dataset.py")
    symbols = _NUMBERS + ("x", "=", ":", "+")
    per_size, overhead = 4, 6

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [5] + [7] * max_n + [4] * max_n

    def _example(self, draws, n, max_n, width):
        x, coeffs, degrees = draws[0] - 2, draws[1:max_n + 1] - 3, draws[max_n + 1:]
        live = jnp.arange(max_n) < n
        value = jnp.sum(jnp.where(live, coeffs * x ** degrees, 0)) % 10
        j = jnp.arange(4 * max_n)  # term j // 4, field j % 4: c, x, d, +
        term = j // 4
        X, EQ, COLON, PLUS = (len(_NUMBERS) + i for i in range(4))
        fields = jnp.stack([_number(gather(coeffs, term)), jnp.full_like(j, X), _number(gather(degrees, term)),
                            jnp.full_like(j, PLUS)])
        body = jnp.take_along_axis(fields, (j % 4)[None], axis=0)[0]
        head = jnp.array([X, EQ, 0, COLON]).at[2].set(_number(x))
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + head, 4, False),
                       (FIRST_SYMBOL + body, 4 * n - 1, False), (SEP, 1, False),
                       (FIRST_SYMBOL + _number(value), 1, True))


class Summation(Task):
    """summation: the sum of n digits modulo 10.

    ``make_sum_dataset.generate_data(seq_length=n, modular=True)``: values
    uniform in [1, 9]; the answer is their sum mod 10. Symbols: digits
    ``0 .. 9``. Example (n=4)::

        BOS 3 3 1 8 SEP 5                          seq_len(n) = n + 3
    """

    names = ("summation",)
    eval_sizes = "bin"
    description = "BOS v1 .. vn (digits 1-9) SEP sum mod 10"
    source = _SOURCE.format("make_sum_dataset.py")
    symbols = tuple("0123456789")
    per_size, overhead = 1, 3

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [9] * max_n

    def _example(self, draws, n, max_n, width):
        values = draws + 1
        total = jnp.sum(jnp.where(jnp.arange(max_n) < n, values, 0)) % 10
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + values, n, False), (SEP, 1, False),
                       (FIRST_SYMBOL + total, 1, True))


class Lego(Task):
    """lego: resolve a chain of ``a = +1, b = - a, c = + b, ...`` and answer one variable's sign.

    ``make_lego_dataset.generate_data(num_variables=n)`` (from
    yizhangzzz/transformers-lego): values ``v_i`` uniform in {-1, +1};
    variable names a random permutation of the ``variables`` (26) letters;
    clause 0 is ``name_0 = v_0``, clause i is ``name_i = (+ if v_i == v_{i-1}
    else -) name_{i-1}``; the query is ``name_q`` with q uniform in
    ``[ceil(n/2), n-1]`` (the builder makes one example per such q), the
    answer ``v_q`` as its sign ``+`` / ``-``. ``permute=True`` shuffles the
    clauses (the builder's ``permute_clauses``; default False as there).
    Sizes run from 2 (n = 1 has no query) to ``variables``. Symbols: the
    names, then ``= + - 1 , ?``. Example (n=3)::

        BOS q = - 1 , t = - q , c = + t ? c SEP +      seq_len(n) = 5n + 4
    """

    names = ("lego",)
    eval_sizes = "bin"
    description = "BOS x0 = +-1 , x1 = +- x0 , ... ? xq SEP sign of xq"
    source = _SOURCE.format("make_lego_dataset.py")
    smallest = 2
    per_size, overhead = 5, 4

    def __init__(self, *, variables: int = 26, permute: bool = False, seed: int = 0):
        self.variables = check_int("variables", variables, minimum=2)
        self.permute = checks.boolean("permute", permute)
        names = "abcdefghijklmnopqrstuvwxyz"
        self.symbols = (tuple(names[:self.variables]) if self.variables <= 26 else
                        tuple(f"v{i}" for i in range(self.variables))) + ("=", "+", "-", "1", ",", "?")
        self.size_cap = self.variables
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [2] * max_n + [WORD] * self.variables + [WORD] * max_n + [WORD]

    def _example(self, draws, n, max_n, width):
        k = self.variables
        EQ, PLUS, MINUS, ONE, COMMA, QUERY = (k + i for i in range(6))
        values = draws[:max_n]
        names = permutation(draws[max_n:max_n + k])[:max_n]
        live = jnp.arange(max_n) < n
        order = permutation(draws[max_n + k:max_n + k + max_n], live) if self.permute else jnp.arange(max_n)
        q = uniform(draws[-1], (n + 1) // 2, n - 1)
        prev = jnp.concatenate([values[:1], values[:-1]])
        sign = jnp.where(jnp.arange(max_n) == 0, jnp.where(values == 1, PLUS, MINUS),
                         jnp.where(values == prev, PLUS, MINUS))
        rhs = jnp.where(jnp.arange(max_n) == 0, ONE, jnp.concatenate([names[:1], names[:-1]]))
        j = jnp.arange(5 * max_n)  # clause order[j // 5], field j % 5: name, =, sign, rhs, ","
        c = gather(order, j // 5)
        fields = jnp.stack([gather(names, c), jnp.full_like(j, EQ), gather(sign, c), gather(rhs, c),
                            jnp.full_like(j, COMMA)])
        body = jnp.take_along_axis(fields, (j % 5)[None], axis=0)[0]
        answer = jnp.where(gather(values, q) == 1, PLUS, MINUS)
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + body, 5 * n - 1, False),
                       (FIRST_SYMBOL + QUERY, 1, False), (FIRST_SYMBOL + gather(names, q), 1, False),
                       (SEP, 1, False), (FIRST_SYMBOL + answer, 1, True))


class Count(Task):
    """count: how many tokens follow ``BOS`` (mod 10 by default).

    ``make_count_dataset.py``: ``kind="multi_char"`` draws n tokens
    uniformly from 26 names (the builder's ``generate_count_task_data_multi_char``),
    ``"single_char"`` repeats one random name n times (``..._repeat_single_char``).
    With ``modular=True`` (the builder's ``--modular``) the answer is
    ``n mod 10``, one digit; with False it is the decimal digits of n
    (most significant first) then EOS, a non-linear size law. Symbols: the
    names ``a .. z``, then digits. Example (n=12, multi_char)::

        BOS q c c x a m b q w e r t SEP 2                 seq_len(n) = n + 3
    """

    names = ("count",)
    eval_sizes = "bin"
    description = "BOS n tokens SEP n mod 10"
    source = _SOURCE.format("make_count_dataset.py")
    symbols = tuple("abcdefghijklmnopqrstuvwxyz") + tuple("0123456789")
    KINDS = ("multi_char", "single_char")

    def __init__(self, *, kind: str = "multi_char", modular: bool = True, seed: int = 0):
        self.kind = checks.choice("kind", kind, self.KINDS)
        self.modular = checks.boolean("modular", modular)
        super().__init__(seed=seed)

    @property
    def law(self) -> str:
        return "n + 3" if self.modular else "n + len(str(n)) + 3"

    def seq_len(self, n: int) -> int:
        return n + 3 if self.modular else n + len(str(n)) + 3

    def _bounds(self, max_n):
        return [26] * max_n

    def _example(self, draws, n, max_n, width):
        tokens = draws if self.kind == "multi_char" else jnp.full_like(draws, draws[0])
        digit = FIRST_SYMBOL + 26
        if self.modular:
            return compose(width, (BOS, 1, False), (FIRST_SYMBOL + tokens, n, False), (SEP, 1, False),
                           (digit + n % 10, 1, True))
        places = len(str(max_n))
        count = jnp.sum((n >= 10 ** jnp.arange(places)).astype(jnp.int32))  # decimal digits of n
        powers = 10 ** jnp.maximum(count - 1 - jnp.arange(places), 0)
        digits = (n // powers) % 10
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + tokens, n, False), (SEP, 1, False),
                       (digit + digits, count, True), (EOS, 1, True))


__all__ = ["Polynomial", "Summation", "Lego", "Count"]
