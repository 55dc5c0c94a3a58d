"""Deterministic context-free (DCF) tasks: stack_manipulation, reverse_string, brackets, solve_equation.

Delétang et al. 2023 and Ruoss et al. 2023, as defined in
google-deepmind/randomized_positional_encodings ``tasks/dcf/`` (with the
options of ``experiments/constants.py``). Posed to a decoder as
``BOS problem SEP answer``; size ``n`` is the original ``length``, the
number of problem tokens. Symbol ``i`` is token id ``4 + i``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.tasks.base import BOS, EOS, FIRST_SYMBOL, SEP, WORD, Task, check_int, compose, uniform
from posenc.tasks.synthetic import Reverse

_SOURCE = "Delétang et al. 2023; google-deepmind/randomized_positional_encodings tasks/dcf/{}.py"


class StackManipulation(Task):
    """stack_manipulation: run POP / PUSH 0 / PUSH 1 on a bit stack, answer the final stack.

    Level DCF. The problem is a stack of ``s`` bits given bottom to top
    (``s`` uniform in ``[1, n-1]``; ``s = 1`` when n = 1) followed by
    ``n - s`` actions uniform over POP, PUSH0, PUSH1 (a POP on an empty
    stack does nothing). The answer is the final stack top to bottom, then
    EOS (the original's termination token); it holds 0 to n bits. Symbols
    ``0 1 POP PUSH0 PUSH1`` (the original's input ids). Example (n=7)::

        BOS 0 1 1 0 PUSH1 POP POP SEP 1 1 0 EOS      seq_len(n) <= 2n + 3
    """

    names = ("stack_manipulation",)
    suite = "chomsky"
    description = "BOS stack(bottom..top) actions SEP final stack(top..bottom) EOS"
    source = _SOURCE.format("stack_manipulation")
    level = "DCF"
    symbols = ("0", "1", "POP", "PUSH0", "PUSH1")
    per_size, overhead = 2, 3

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [WORD] + [2] * max_n + [3] * max_n

    def _example(self, draws, n, max_n, width):
        bits, actions = draws[1:max_n + 1], 2 + draws[max_n + 1:]
        s = jnp.where(n == 1, 1, uniform(draws[0], 1, n - 1))
        pos = jnp.arange(max_n)
        problem = jnp.where(pos < s, bits, jnp.take(actions, pos - s, mode="clip"))

        def act(i, carry):
            stack, height = carry
            a = actions[i]
            live = i < n - s
            push = live & (a >= 3)
            stack = jnp.where(push, stack.at[height].set(a - 3), stack)
            height = jnp.where(push, height + 1, jnp.where(live & (a == 2), jnp.maximum(height - 1, 0), height))
            return stack, height

        stack = jnp.zeros(max_n + 1, jnp.int32).at[:max_n].set(jnp.where(pos < s, bits, 0))
        stack, height = jax.lax.fori_loop(0, max_n, act, (stack, s))
        top_down = jnp.take(stack, height - 1 - jnp.arange(max_n + 1), mode="clip")
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + problem, n, False), (SEP, 1, False),
                       (FIRST_SYMBOL + top_down, height, True), (EOS, 1, True))


class ReverseString(Reverse):
    """reverse_string: ``BOS x SEP reversed(x)`` over bits (the paper's binary alphabet).

    Level DCF. ``x``: n symbols uniform over ``alphabet``;
    :class:`posenc.tasks.synthetic.Reverse` with ``alphabet=2`` by default.
    Example (n=6): ``BOS 0 1 1 0 1 0 SEP 0 1 0 1 1 0``.
    """

    names = ("reverse_string",)
    eval_sizes = "exact"
    suite = "chomsky"
    description = "BOS bits SEP reversed bits"
    source = _SOURCE.format("reverse_string")

    def __init__(self, *, alphabet: int = 2, seed: int = 0):
        super().__init__(alphabet=alphabet, seed=seed)


def bracket_expression(split_words, ops, digits, n, max_n, *, modulus, num_ops):
    """A random bracketed expression of exactly ``n`` characters and its value mod ``modulus``.

    The generator of ``modular_arithmetic_brackets.generate_one_expression_and_result``
    without recursion: a stack of pending segments ``(start, length)`` is
    filled in pre-order, one node per step (a tree of n characters has at
    most n nodes). A segment of length 1 / 2 / 3 / 4 is ``d``, ``-d``,
    ``(d)``, ``(-d)``; a longer one is ``(L op R)`` with ``len(L)`` uniform
    in ``[1, length - 4]``. Values are then combined children first
    (reverse pre-order). Returns (characters int32 [max_n], value): digit
    ``d`` is ``d``, and ``+ - * ( )`` are ``modulus + 0 .. 4``.
    """
    plus, minus, lpar, rpar = modulus, modulus + 1, modulus + 3, modulus + 4
    dummy = max_n  # writes of inactive steps land in this extra slot
    ops = ops % num_ops  # 0 '+', 1 '-', 2 '*'
    # Leaf forms by length (rows 1-4; row 0 unused): offsets and characters, -1 = the digit.
    leaf_off = jnp.array([[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 2, 0], [0, 1, 2, 3]])
    leaf_chr = jnp.array([[0, 0, 0, 0], [-1, 0, 0, 0], [minus, -1, 0, 0], [lpar, -1, rpar, 0],
                          [lpar, minus, -1, rpar]])
    leaf_use = jnp.array([0, 1, 2, 3, 4])[:, None] > jnp.arange(4)

    def fill(k, carry):
        chars, stack, sp, node_len, child = carry
        active = sp > 0
        start, length, parent, side = stack[jnp.maximum(sp - 1, 0)]
        sp = jnp.where(active, sp - 1, sp)
        child = child.at[jnp.where(active & (parent >= 0), 2 * parent + side, 2 * dummy)].set(k)
        inner = length >= 5
        l_len = uniform(split_words[k], 1, length - 4)
        leaf = jnp.clip(length, 0, 4)
        off = jnp.where(inner, jnp.stack([0, 1 + l_len, length - 1, 0]), leaf_off[leaf])
        chr_ = jnp.where(inner, jnp.stack([lpar, plus + ops[k], rpar, 0]), leaf_chr[leaf])
        use = active & jnp.where(inner, jnp.arange(4) < 3, leaf_use[leaf])
        chars = chars.at[jnp.where(use, start + off, dummy)].set(jnp.where(chr_ < 0, digits[k], chr_))
        node_len = node_len.at[k].set(jnp.where(active, length, -1))
        # Push the right segment, then the left one, so the left subtree is filled next.
        rows = jnp.array([[start + 2 + l_len, length - 3 - l_len, k, 1], [start + 1, l_len, k, 0]])
        push = active & inner
        stack = stack.at[jnp.where(push, sp + jnp.arange(2), dummy)].set(rows)
        return chars, stack, jnp.where(push, sp + 2, sp), node_len, child

    stack = jnp.zeros((max_n + 1, 4), jnp.int32).at[0].set(jnp.array([0, n, -1, 0]))
    carry = (jnp.zeros(max_n + 1, jnp.int32), stack, jnp.int32(1), jnp.full(max_n, -1, jnp.int32),
             jnp.zeros(2 * max_n + 2, jnp.int32))
    chars, _, _, node_len, child = jax.lax.fori_loop(0, max_n, fill, carry)

    def combine(i, value):
        k = max_n - 1 - i
        a, b, d = value[child[2 * k]], value[child[2 * k + 1]], digits[k]
        inner = jnp.stack([a + b, a - b, a * b])[ops[k]] % modulus
        length = node_len[k]
        v = jnp.where(length >= 5, inner, jnp.where((length == 2) | (length == 4), (modulus - d) % modulus, d))
        return value.at[k].set(jnp.where(length >= 1, v, 0))

    value = jax.lax.fori_loop(0, max_n, combine, jnp.zeros(max_n, jnp.int32))
    return chars[:max_n], value[0]


class ModularArithmeticBrackets(Task):
    """modular_arithmetic_brackets: evaluate a random bracketed expression mod ``modulus`` (5).

    Level DCF. The expression has exactly ``n`` characters, drawn by the
    original's recursive generator (:func:`bracket_expression`; operators
    ``+ - *`` uniform with ``mult=True``, the setting of the paper's
    experiments, or ``+ -``), digits uniform in ``[0, modulus)``. The
    answer is its value in ``[0, modulus)``. Symbols: digits, then
    ``+ - * ( )``. Example (n=8)::

        BOS ( ( - 3 ) * 2 ) SEP 4        ((-3)*2 = -6 = 4 mod 5)      seq_len(n) = n + 3
    """

    names = ("modular_arithmetic_brackets",)
    suite = "chomsky"
    description = "BOS bracketed +,-,* expression of n characters SEP its value mod 5"
    source = _SOURCE.format("modular_arithmetic_brackets")
    level = "DCF"
    per_size, overhead = 1, 3

    def __init__(self, *, modulus: int = 5, mult: bool = True, seed: int = 0):
        self.modulus = check_int("modulus", modulus, minimum=2, maximum=10)
        self.mult = checks.boolean("mult", mult)
        self.symbols = tuple(str(d) for d in range(self.modulus)) + ("+", "-", "*", "(", ")")
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [WORD] * max_n + [3 if self.mult else 2] * max_n + [self.modulus] * max_n

    def _example(self, draws, n, max_n, width):
        splits, ops, digits = draws[:max_n], draws[max_n:2 * max_n], draws[2 * max_n:]
        chars, value = bracket_expression(splits, ops, digits, n, max_n, modulus=self.modulus,
                                          num_ops=3 if self.mult else 2)
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + chars, n, False), (SEP, 1, False),
                       (FIRST_SYMBOL + value, 1, True))


class SolveEquation(Task):
    """solve_equation: the digit ``x`` stands for in ``expression = value`` (mod ``modulus``).

    Level DCF. A bracketed ``+ -`` expression of ``n - 2`` characters (the
    generator of modular_arithmetic_brackets, ``mult=False`` as in the
    original) has one digit replaced by ``x``: the first digit at or after
    a position uniform in ``[0, n - 2)``, cyclically (the original's
    search). The problem is ``expression = v`` with ``v`` its value before
    the replacement, n characters in all; the answer is the replaced digit
    (unique: x enters with coefficient +1 or -1). Sizes start at 3 (the
    original returns an all-zero dummy below). Symbols: digits, then
    ``+ - ( ) x =``. Example (n=10)::

        BOS ( x - ( - 2 ) ) = 0 SEP 3      (3 + 2 = 5 = 0 mod 5)     seq_len(n) = n + 3
    """

    names = ("solve_equation",)
    suite = "chomsky"
    description = "BOS bracketed +,- equation in x of n characters SEP x mod 5"
    source = _SOURCE.format("solve_equation")
    level = "DCF"
    smallest = 3
    per_size, overhead = 1, 3

    def __init__(self, *, modulus: int = 5, seed: int = 0):
        self.modulus = check_int("modulus", modulus, minimum=2, maximum=10)
        self.symbols = tuple(str(d) for d in range(self.modulus)) + ("+", "-", "(", ")", "x", "=")
        super().__init__(seed=seed)

    def _bounds(self, max_n):
        return [WORD] * max_n + [2] * max_n + [self.modulus] * max_n + [WORD]

    def _example(self, draws, n, max_n, width):
        m = self.modulus
        splits, ops, digits = draws[:max_n], draws[max_n:2 * max_n], draws[2 * max_n:3 * max_n]
        size = n - 2
        chars, value = bracket_expression(splits, ops, digits, size, max_n, modulus=m, num_ops=2)
        pos = jnp.arange(max_n)
        is_digit = (chars < m) & (pos < size)
        start = uniform(draws[-1], 0, size - 1)
        after = jnp.min(jnp.where(is_digit & (pos >= start), pos, max_n))
        first = jnp.min(jnp.where(is_digit, pos, max_n))
        at = jnp.where(after < max_n, after, first)
        solution = chars[at]
        # Renumber: the brackets alphabet is digits + - * ( ) ; this one is digits + - ( ) x =.
        chars = jnp.where(chars >= m + 3, chars - 1, chars)
        chars = jnp.where(pos == at, m + 4, chars)
        problem = jnp.where(pos == size, m + 5, jnp.where(pos == size + 1, value, chars))
        return compose(width, (BOS, 1, False), (FIRST_SYMBOL + problem, n, False), (SEP, 1, False),
                       (FIRST_SYMBOL + solution, 1, True))


__all__ = ["StackManipulation", "ReverseString", "ModularArithmeticBrackets", "SolveEquation",
           "bracket_expression"]
