"""RULER multi-hop tracing and aggregation tasks, byte level (Hsieh et al. 2024; hsiehjackson/RULER
``scripts/data/synthetic/variable_tracking.py``, ``common_words_extraction.py``,
``freq_words_extraction.py``, templates in ``constants.py``).

Prompts are RULER's templates with their answer prefixes, byte for byte; the answer follows after one
space (variable tracking's prefix already ends with one). Tokens are raw bytes (vocabulary 256).

**variable_tracking** (``vt``): ``chains`` chains of ``hops`` + 1 assignments, ``VAR ABCDE = 12345``
then ``VAR FGHIJ = VAR ABCDE `` (with RULER's trailing space), are inserted one chain after the other
at sorted distinct positions of n noise lines ("The grass is green. ... There and back again.\\n"),
everything joined by spaces; the question asks for every variable holding the first chain's value
and the answer is that chain's variables in order, space-joined. Names are 5 uppercase letters,
values 5 digits; RULER's in-context example (a second, shorter instance before the question) is left
out (it would cost about 2,000 bytes), names and chain values are distinct by construction (RULER
redraws names until distinct; values are independent draws there), and the smallest size is hops + 2
lines (RULER cuts the noise into sentences below that). ``eval_sweep``: hops and chains, which the
RULER paper varies.

**common_words** (``cwe``): ``common`` words repeated ``common_repeats`` times and n others
``uncommon_repeats`` times, shuffled, listed as ``1. word 2. word ...``; the answer is the common words
as ``1. w 2. w ...`` in order of first appearance (RULER lists them in draw order, which the context
does not show; its metric ignores order). Words come from posenc's own list of 320 English words
(RULER: ``wonderwords``), so n <= 320 - common. RULER uses 30 / 3 repeats from 4096 tokens and 6 / 1
below; posenc fixes the repeats per task (defaults 6 / 1: a length sweep must not change the task)
and leaves out RULER's in-context example; the template's "10" is ``common``.

**frequent_words** (``fwe``): n words drawn from a Zipf law, rank k appearing ``int(n * k**-alpha /
zeta(alpha))`` times (RULER's float64 formula), rank 1 being the noise word ``...`` and the others
random ``word_length``-letter lowercase codes, shuffled and space-joined; the answer is ranks 2, 3, 4,
most frequent first, space-joined. RULER's vocabulary of max_seq_length // 50 codes is here every rank
with a non-zero count (the others never appear), and the smallest n is the one from which ranks 2-5
always have strictly decreasing counts (so the answer and its order are determined).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.tasks.base import WORD, Task, check_int, permutation
from posenc.tasks.ruler_text import FILLER, WORDS, Layout, Plan, digits, distinct, letters, prime_below, word_table

VT_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
               "Question: Find all variables that are assigned the value {query} in the text above.")
VT_ANSWER_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
                    "are assgined the value {query}, they are: ")
CWE_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
                "ones that appear most often.\n{context}\n"
                "Question: What are the 10 most common words in the above list?")
CWE_ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
                "the dots '....'. What are the three most frequently appeared words in the above coded text?")
FWE_ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
NOISE = FILLER + "\n"
_NAME_POOL = prime_below(26**5)
_VALUE_POOL = prime_below(99999 - 10000)  # np.random.randint(10000, 99999)
_WORDS, _WORD_LEN, _WORD_W = word_table(WORDS)


class _Bytes(Task):
    symbols = ()

    @property
    def vocab_size(self) -> int:
        return 256

    def render(self, ids) -> str:
        return bytes(int(i) for i in np.asarray(ids).ravel()).decode("latin-1")

    @property
    def law(self) -> str:
        return "RULER byte layout (seq_len)"

    def _bounds(self, max_n):
        return self._plan(max_n).bounds()


class VariableTracking(_Bytes):
    """variable_tracking: follow chains of variable assignments through noise (module docstring)."""

    names = ("variable_tracking", "vt")
    description = "byte-level RULER variable tracking: the variables assigned a value through chains in noise"
    source = "Hsieh et al. 2024 (RULER); hsiehjackson/RULER scripts/data/synthetic/variable_tracking.py"
    eval_sweep = {"hops": (1, 2, 4, 8), "chains": (1, 2, 4)}

    def __init__(self, *, chains: int = 1, hops: int = 4, seed: int = 0):
        self.chains = check_int("chains", chains, minimum=1, maximum=8)
        self.hops = check_int("hops", hops, minimum=1)
        self.smallest = self.hops + 2
        self.text = (VT_TEMPLATE + VT_ANSWER_PREFIX).replace("{num_v}", str(self.hops + 1))
        super().__init__(seed=seed)

    def seq_len(self, n: int) -> int:
        h, c = self.hops, self.chains
        static = len(self.text.replace("{context}", "").replace("{query}", ""))
        context = (n * (len(NOISE) + 1)
                   + c * (len("VAR ABCDE = 12345") + 1 + h * (len("VAR ABCDE = VAR FGHIJ ") + 1)) - 1)
        return static + 2 * 5 + context + 5 * (h + 1) + h

    def _plan(self, max_n):
        plan = Plan().add("name_start", _NAME_POOL).add("name_step", _NAME_POOL - 1)
        plan.add("value_start", _VALUE_POOL).add("value_step", _VALUE_POOL - 1)
        for c in range(self.chains):
            plan.add(f"positions{c}", WORD, max_n + c * (self.hops + 1))
        return plan

    def _example(self, draws, n, max_n, width):
        d = self._plan(max_n).unpack(draws)
        c_count, links = self.chains, self.hops + 1
        names = distinct(d["name_start"][0], d["name_step"][0], c_count * links, _NAME_POOL)
        values = 10000 + distinct(d["value_start"][0], d["value_step"][0], c_count, _VALUE_POOL)
        out = Layout()
        name_base = out.source(jax.vmap(lambda i: letters(i, 5, upper=True))(names))
        value_rows = jax.vmap(lambda v: digits(v, 5)[0])(values)
        value_base = out.source(value_rows)
        # sort keys: noise line s at s * 2^(C+1); chain c's element j just before the element at the
        # grown list's index p (RULER: sentences.insert(p + j, chain[j])): that element's key - 2^(C-c)
        unit = 2 ** (c_count + 1)
        keys = jnp.concatenate([jnp.where(jnp.arange(max_n) < n, jnp.arange(max_n) * unit, 2**30),
                                jnp.full(c_count * links, 2**30)])
        for c in range(c_count):
            size = n + c * links
            slots = jnp.arange(max_n + c * links)
            picked = jnp.sort(permutation(d[f"positions{c}"], slots < size)[:links])
            current = jnp.sort(keys)
            new = current[picked] - 2 ** (c_count - c)
            keys = keys.at[max_n + c * links + jnp.arange(links)].set(new)
        order = jnp.argsort(keys, stable=True)
        live = jnp.concatenate([jnp.arange(max_n) < n, jnp.ones(c_count * links, bool)])
        # element segments: A, own name, B, value or previous name, C, separator
        var, eq, eq_var, space = (out.text_src(t)[0] for t in ("VAR ", " = ", " = VAR ", " "))
        noise = out.text_src(NOISE)
        chain = jnp.arange(c_count * links) // links
        link = jnp.arange(c_count * links) % links
        own = name_base + 5 * jnp.arange(c_count * links)
        other = jnp.where(link == 0, value_base + 5 * chain, own - 5)
        seg_src = jnp.concatenate([
            jnp.stack([jnp.full(max_n, noise[0])] + [jnp.zeros(max_n, jnp.int32)] * 4, axis=1),
            jnp.stack([jnp.full(c_count * links, var), own, jnp.where(link == 0, eq, eq_var), other,
                       jnp.full(c_count * links, space)], axis=1)])
        seg_len = jnp.concatenate([
            jnp.stack([jnp.full(max_n, noise[1])] + [jnp.zeros(max_n, jnp.int32)] * 4, axis=1),
            jnp.stack([jnp.full(c_count * links, 4), jnp.full(c_count * links, 5),
                       jnp.where(link == 0, 3, 7), jnp.full(c_count * links, 5),
                       (link > 0).astype(jnp.int32)], axis=1)])
        seg_len = jnp.where(live[:, None], seg_len, 0)
        sep = jnp.where(live, 1, 0)[:, None]
        prefix, rest = self.text.split("{context}")
        question, answer_prefix, tail = rest.split("{query}")
        out.text(prefix)
        mark = out.mark()
        out.put(jnp.concatenate([seg_src, jnp.full((seg_src.shape[0], 1), space)], axis=1)[order],
                jnp.concatenate([seg_len, sep], axis=1)[order])
        out.drop_last(mark)
        for piece in (question, answer_prefix):
            out.text(piece)
            out.put(value_base, 5)
        out.text(tail)
        seps = np.array([1] * (links - 1) + [0])
        out.put(jnp.stack([name_base + 5 * jnp.arange(links), jnp.full(links, space)], axis=1),
                jnp.stack([jnp.full(links, 5), jnp.asarray(seps)], axis=1), answer=True)
        return out.build(width)


class CommonWords(_Bytes):
    """common_words: the words listed most often in a numbered list (module docstring)."""

    names = ("common_words", "cwe")
    description = "byte-level RULER common words extraction: the words repeated most in a numbered list"
    source = "Hsieh et al. 2024 (RULER); hsiehjackson/RULER scripts/data/synthetic/common_words_extraction.py"
    smallest = 0

    def __init__(self, *, common: int = 10, common_repeats: int = 6, uncommon_repeats: int = 1, seed: int = 0):
        self.common = check_int("common", common, minimum=1, maximum=len(WORDS) - 1)
        self.common_repeats = check_int("common_repeats", common_repeats, minimum=2)
        self.uncommon_repeats = check_int("uncommon_repeats", uncommon_repeats, minimum=1,
                                          maximum=self.common_repeats - 1)
        self.size_cap = len(WORDS) - self.common
        self.text = (CWE_TEMPLATE + CWE_ANSWER_PREFIX).replace("10", str(self.common))
        super().__init__(seed=seed)

    def _entries(self, n: int) -> int:
        return self.common * self.common_repeats + n * self.uncommon_repeats

    def seq_len(self, n: int) -> int:
        listed = _numbered(self._entries(n)) + self._entries(n) * (_WORD_W + 1) - 1
        answer = _numbered(self.common) + self.common * (_WORD_W + 1) - 1
        return len(self.text.replace("{context}", "")) + listed + 1 + answer

    def _plan(self, max_n):
        return Plan().add("words", WORD, len(WORDS)).add("order", WORD, self._entries(max_n))

    def _example(self, draws, n, max_n, width):
        d = self._plan(max_n).unpack(draws)
        chosen = permutation(d["words"])  # random.sample(words, common + n): common first
        common, cr = self.common, self.common_repeats
        total_max, total = self._entries(max_n), common * cr + n * self.uncommon_repeats
        e = jnp.arange(total_max)
        word_of_entry = jnp.where(e < common * cr, chosen[e % common],
                                  chosen[common + (e - common * cr) % jnp.maximum(n, 1)])
        listed = word_of_entry[permutation(d["order"], e < total)]  # shuffled list of words (live first)
        live = e < total
        out = Layout()
        num_w = len(str(total_max))
        number_rows, number_len = jax.vmap(lambda i: digits(i + 1, num_w))(e)
        number_base = out.source(number_rows)
        word_base = out.source(_WORDS)
        dot, space = out.text_src(". ")[0], out.text_src(" ")[0]
        prefix, tail = self.text.split("{context}")
        out.text(prefix)
        mark = out.mark()
        src = jnp.stack([number_base + num_w * e, jnp.full(total_max, dot), word_base + _WORD_W * listed,
                         jnp.full(total_max, space)], axis=1)
        lengths = jnp.stack([number_len, jnp.full(total_max, 2), jnp.asarray(_WORD_LEN)[listed],
                             jnp.ones(total_max, jnp.int32)], axis=1)
        out.put(src, jnp.where(live[:, None], lengths, 0))
        out.drop_last(mark)
        out.text(tail + " ")
        # the common words in order of first appearance
        first = jnp.argmax(live[None, :] & (listed[None, :] == chosen[:common, None]), axis=1)
        ranked = chosen[:common][jnp.argsort(first)]
        seps = np.array([1] * (common - 1) + [0])
        answer_src = jnp.stack([number_base + num_w * jnp.arange(common), jnp.full(common, dot),
                                word_base + _WORD_W * ranked, jnp.full(common, space)], axis=1)
        answer_len = jnp.stack([number_len[:common], jnp.full(common, 2), jnp.asarray(_WORD_LEN)[ranked],
                                jnp.asarray(seps)], axis=1)
        out.put(answer_src, answer_len, answer=True)
        return out.build(width)


def _numbered(count: int) -> int:
    """Bytes of the numbers "1. " .. "count. " (digits and ". ")."""
    return sum(len(str(i)) + 2 for i in range(1, count + 1))


def zeta(s: float) -> float:
    """Riemann zeta(s) for s > 1 (Euler-Maclaurin with 100 terms; float64 precision)."""
    n = 100
    head = math.fsum(k ** -s for k in range(1, n))
    return head + n ** (1 - s) / (s - 1) + n ** -s / 2 + s * n ** (-s - 1) / 12 - s * (s + 1) * (s + 2) * n ** (
        -s - 3) / 720


@functools.lru_cache(maxsize=64)
def zipf_counts(max_n: int, alpha: float) -> np.ndarray:
    """int32 [max_n + 1, K]: RULER's counts int(n * k**-alpha / zeta(alpha)) of ranks k = 1..K at each n."""
    z = zeta(alpha)
    ranks = 1
    while int(max_n * (ranks + 1) ** -alpha / z) >= 1:
        ranks += 1
    k = np.arange(1, ranks + 1)
    return np.stack([(n * (k ** -alpha) / z).astype(int) for n in range(max_n + 1)]).astype(np.int32)


class FrequentWords(_Bytes):
    """frequent_words: the three most frequent coded words of a Zipf-distributed text (module docstring)."""

    names = ("frequent_words", "fwe")
    description = "byte-level RULER frequent words extraction: the 3 most frequent coded words of a Zipf text"
    source = "Hsieh et al. 2024 (RULER); hsiehjackson/RULER scripts/data/synthetic/freq_words_extraction.py"

    def __init__(self, *, alpha: float = 2.0, word_length: int = 6, seed: int = 0):
        self.alpha = checks.number("alpha", alpha, minimum=1.01, maximum=8.0)
        self.word_length = check_int("word_length", word_length, minimum=3, maximum=6)
        self.smallest = _smallest_determined(self.alpha)
        self.text = FWE_TEMPLATE + FWE_ANSWER_PREFIX
        super().__init__(seed=seed)

    def seq_len(self, n: int) -> int:
        return len(self.text.replace("{context}", "")) + n * (self.word_length + 1) - 1 + 1 + 3 * (
            self.word_length + 1) - 1

    def _plan(self, max_n):
        pool = _code_pool(self.word_length)
        return Plan().add("start", pool).add("step", pool - 1).add("order", WORD, max_n)

    def _example(self, draws, n, max_n, width):
        d = self._plan(max_n).unpack(draws)
        table = jnp.asarray(zipf_counts(max_n, self.alpha))
        counts = table[n]  # [K]
        ranks = table.shape[1]
        length = self.word_length
        codes = distinct(d["start"][0], d["step"][0], ranks, _code_pool(length))
        out = Layout()
        code_rows = jax.vmap(lambda i: letters(i, length, upper=False))(codes)
        code_rows = code_rows.at[0, :3].set(ord(".")).at[0, 3:].set(0)  # vocab[0] = '...'
        code_base = out.source(code_rows)
        code_len = jnp.full(ranks, length).at[0].set(3)
        ends = jnp.cumsum(counts)
        e = jnp.arange(max_n)
        total = ends[-1]
        rank_of = jnp.clip(jnp.searchsorted(ends, e, side="right"), 0, ranks - 1)
        listed = rank_of[permutation(d["order"], e < total)]
        live = e < total
        space = out.text_src(" ")[0]
        prefix, tail = self.text.split("{context}")
        out.text(prefix)
        mark = out.mark()
        out.put(jnp.stack([code_base + length * listed, jnp.full(max_n, space)], axis=1),
                jnp.where(live[:, None], jnp.stack([code_len[listed], jnp.ones(max_n, jnp.int32)], axis=1), 0))
        out.drop_last(mark)
        out.text(tail + " ")
        out.put(jnp.stack([code_base + length * jnp.arange(1, 4), jnp.full(3, space)], axis=1),
                jnp.stack([jnp.full(3, length), jnp.array([1, 1, 0])], axis=1), answer=True)
        return out.build(width)


@functools.cache
def _code_pool(length: int) -> int:
    return prime_below(26**length)


@functools.cache
def _smallest_determined(alpha: float) -> int:
    """The smallest n from which ranks 2 > 3 > 4 > 5 always have strictly decreasing counts (and rank 4 >= 1)."""
    z = zeta(alpha)
    gap = 4**-alpha - 5**-alpha  # the smallest of the three gaps: from n * gap / z >= 1 on, floors stay apart
    bound = math.ceil(z / gap) + 1
    last_bad = 0
    for n in range(1, bound + 1):
        c = [int(n * k**-alpha / z) for k in (2, 3, 4, 5)]
        if not (c[0] > c[1] > c[2] > c[3] and c[2] >= 1):
            last_bad = n
    return last_bad + 1


__all__ = ["VariableTracking", "CommonWords", "FrequentWords", "zeta", "zipf_counts", "VT_TEMPLATE",
           "VT_ANSWER_PREFIX", "CWE_TEMPLATE", "CWE_ANSWER_PREFIX", "FWE_TEMPLATE", "FWE_ANSWER_PREFIX"]
