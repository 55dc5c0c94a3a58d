"""RULER needle-in-a-haystack tasks, byte level (Hsieh et al. 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?"; hsiehjackson/RULER ``scripts/data/synthetic/niah.py``, templates in
``constants.py``, task settings in ``scripts/synthetic.yaml``).

The prompt is RULER's template with its answer prefix (the ``base`` model template), byte for byte::

    Some special magic numbers are hidden within the following text. Make sure to memorize it. I will
    quiz you about the numbers afterwards.
    <context>
    What are all the special magic numbers for <query> mentioned in the provided text? The special
    magic numbers for <query> mentioned in the provided text are <answer>

singular ("A special magic number ... is") when queries * values == 1, as RULER rewrites it. The
context holds ``keys * values`` needles ``One of the special magic numbers for <key> is: <value>.``
(shuffled); ``queries`` of the keys are asked for (``keys`` is raised to ``queries``, as RULER does)
and the answer is all their values, ``", "``-joined, in query order and, for one key, in context
order. Keys and values are ``words`` (adjective-noun, e.g. ``quiet-harbor``), ``numbers`` (7 digits,
10^6 .. 10^7 - 1) or ``uuids`` (version 4, lowercase). Haystacks (size n):

- ``noise`` (RULER ``repeat``): n copies of "The grass is green. ... There and back again."; with the
  needles, one element per line; each needle goes before a distinct filler sentence drawn uniformly
  (``random.sample(range(n), ...)``), so n >= the number of needles.
- ``needle``: n distractor needles with random keys and values, one per line, the needles inserted as
  for ``noise``.
- ``essay``: n bytes of a corpus (``path``, default the stdlib corpus of the ``text`` task, train
  split), whitespace collapsed to single spaces as RULER does to its essays (``re.sub(r"\\s+", " ")``,
  after NUL document separators become spaces), a window starting at a word boundary drawn uniformly.
  Each needle goes at depth ``f`` drawn without replacement from RULER's grid
  ``round(linspace(0, 100, 40))`` percent: at the first word boundary at or after byte ``int(n * f)``,
  followed by a space (preceded by one at the very end).

Depth: ``depth=None`` (default, training) places every needle as above; ``depth=f`` in [0, 1] puts the
needle of the first queried key (its first value) at depth f (noise / needle: before filler sentence
``round(f * n)``, f = 1 after the last; essay: at byte ``int(n * f)``) and the others as above.
``eval_sweep`` sweeps depth over 0, 0.25, 0.5, 0.75, 1, and the number of needles (keys, values or
queries) where the task varies it.

Differences from RULER, made for byte-level models and ``jit``: sizes are filler sentences /
distractors / bytes (RULER grows its haystack until the tokenizer count fits ``max_seq_length``);
keys come from posenc's own word lists (:mod:`posenc.tasks.ruler_text`; RULER uses the ``wonderwords``
lists) and are distinct within an example, distractors included (RULER: independent draws); the essay
haystack is a random window of the corpus at byte depths and word boundaries (RULER: the first words of
Paul Graham's essays, sentence boundaries from nltk); the answer order is fixed by the context (RULER's
metric ignores order); the answer follows the prompt after one space. Tokens are raw bytes (vocabulary
256, NUL padding), as the ``text`` and ``passkey`` tasks, so a byte-level language model can be scored.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.tasks import corpus as corpus_lib
from posenc.tasks.base import WORD, Task, check_int, permutation
from posenc.tasks.ruler_text import (
    ADJECTIVES,
    FILLER,
    NOUNS,
    Layout,
    Plan,
    digits,
    distinct,
    join_row,
    prime_below,
    uuid4,
    word_table,
)

TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
            "{type_needle_v} for {query} mentioned in the provided text?")
ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
TYPES = ("numbers", "uuids", "words")
HAYSTACKS = ("essay", "needle", "noise")
GRID = tuple(int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int))  # RULER DEPTHS
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
NEEDLE_COUNTS = (1, 2, 4, 8)
_ADJ, _ADJ_LEN, _ADJ_W = word_table(ADJECTIVES)
_NOUN, _NOUN_LEN, _NOUN_W = word_table(NOUNS)
_KEY_POOL = prime_below(len(ADJECTIVES) * len(NOUNS))
_NUMBER_POOL = prime_below(9 * 10**6)
_SEARCH = 64  # bytes searched for the first word boundary of an essay window
_WIDTH = {"numbers": 7, "uuids": 36, "words": _ADJ_W + 1 + _NOUN_W}


def prompt(*, value_type: str = "numbers", queries: int = 1, values: int = 1) -> str:
    """RULER's template + answer prefix with the type filled in (singular when queries * values == 1)."""
    template = TEMPLATE + ANSWER_PREFIX
    type_needle_v = value_type
    if queries * values == 1:
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        template = template.replace("answers", "answer")
        type_needle_v = type_needle_v[:-1]
    return template.replace("{type_needle_v}", type_needle_v)


def _text_corpus(path):
    return corpus_lib.load_corpus() if path is None else corpus_lib.load_path_corpus(path)


@functools.lru_cache(maxsize=4)
def essay_corpus(path: str | None = None) -> np.ndarray:
    """The train split of the ``text`` task's corpus (stdlib, or ``path``) with NUL -> space and every run of
    whitespace collapsed to one space, as uint8 bytes."""
    data = bytes(np.asarray(_text_corpus(path).data["train"], np.uint8)).replace(b"\x00", b" ")
    return np.frombuffer(re.sub(rb"\s+", b" ", data), np.uint8)


@functools.lru_cache(maxsize=4)
def _essay_device(path):
    return jax.device_put(essay_corpus(path))


class Niah(Task):
    """Needle in a haystack, RULER's generator at byte level (module docstring); subclasses set defaults."""

    smallest = 1
    symbols = ()
    traced_options = ("depth",)  # the depth sweep shares one evaluation program per length

    def __init__(self, *, haystack: str = "noise", key_type: str = "words", value_type: str = "numbers",
                 keys: int = 1, values: int = 1, queries: int = 1, depth: float | None = None,
                 path: str | None = None, seed: int = 0):
        self.haystack = checks.choice("haystack", haystack, HAYSTACKS)
        self.key_type = checks.choice("key_type", key_type, TYPES)
        self.value_type = checks.choice("value_type", value_type, TYPES)
        self.keys = check_int("keys", keys, minimum=1)
        self.values = check_int("values", values, minimum=1)
        self.queries = check_int("queries", queries, minimum=1)
        self.depth = None if depth is None else checks.number("depth", depth, minimum=0.0, maximum=1.0)
        if path is not None and haystack != "essay":
            raise ValueError(f"path is the corpus of the essay haystack; got path={path!r} with haystack={haystack!r}")
        self.path = path
        self.num_keys = max(self.keys, self.queries)  # RULER: num_needle_k = max(num_needle_k, num_needle_q)
        self.num_needles = self.num_keys * self.values
        if haystack == "essay" and self.num_needles > len(GRID):
            raise ValueError(f"the essay haystack places at most {len(GRID)} needles (RULER's depth grid); "
                             f"got keys * values = {self.num_needles}")
        if haystack == "needle" and self.key_type != "uuids":
            pool = _KEY_POOL if self.key_type == "words" else _NUMBER_POOL
            self.size_cap = pool - 1 - self.num_keys  # distractor keys differ from the needles' keys
        self.smallest = 0 if haystack == "essay" else self.num_needles
        self.text = prompt(value_type=self.value_type, queries=self.queries, values=self.values)
        self._corpus = _essay_device(path) if haystack == "essay" else None
        super().__init__(seed=seed)

    # ----------------------------------------------------------------- sizes
    @property
    def vocab_size(self) -> int:
        return 256

    def render(self, ids) -> str:
        return bytes(int(i) for i in np.asarray(ids).ravel()).decode("latin-1")

    @property
    def law(self) -> str:
        per = {"noise": len(FILLER) + 1, "needle": self._needle_max() + 1, "essay": 1}[self.haystack]
        return f"{per} * n + {self.seq_len(0)}"

    def _needle_max(self) -> int:
        return len(NEEDLE.format(type_needle_v=self.value_type, key="", value="")) + _WIDTH[
            self.key_type] + _WIDTH[self.value_type]

    def seq_len(self, n: int) -> int:
        q, answers = self.queries, self.queries * self.values
        query = q * _WIDTH[self.key_type] + (2 * q + 2 if q > 1 else 0)
        static = len(self.text.replace("{context}", "").replace("{query}", ""))
        answer = 1 + answers * _WIDTH[self.value_type] + 2 * (answers - 1)
        needles = self.num_needles * (self._needle_max() + 1)
        if self.haystack == "noise":
            context = n * (len(FILLER) + 1) + needles - 1
        elif self.haystack == "needle":
            context = (n + self.num_needles) * (self._needle_max() + 1) - 1
        else:
            context = n + needles
        return static + 2 * query + context + answer

    # ---------------------------------------------------------------- draws
    def _plan(self, max_n: int) -> Plan:
        plan = Plan()
        distractors = max_n if self.haystack == "needle" else 0
        for role, kind, count in (("key", self.key_type, self.num_keys + distractors),
                                  ("value", self.value_type, self.num_needles + distractors)):
            if kind == "uuids":
                plan.add(f"{role}_nibbles", 16, 30 * count).add(f"{role}_variant", 4, count)
            elif role == "key":
                pool = _KEY_POOL if kind == "words" else _NUMBER_POOL
                plan.add("key_start", pool).add("key_step", pool - 1)
            elif kind == "words":
                plan.add("value_adj", len(ADJECTIVES), count).add("value_noun", len(NOUNS), count)
            else:
                plan.add("value_number", 9 * 10**6, count)
        plan.add("query", WORD, self.num_keys)
        if self.haystack == "essay":
            plan.add("grid", WORD, len(GRID)).add("window", WORD)
        else:
            plan.add("slots", WORD, max_n)
        return plan

    def _bounds(self, max_n):
        if self._corpus is not None and self._corpus.shape[0] < max_n + _SEARCH + 3:
            raise ValueError(f"the essay corpus holds {self._corpus.shape[0]} bytes after collapsing whitespace: "
                             f"too few for a haystack of {max_n} bytes; use a larger path corpus or a shorter length")
        return self._plan(max_n).bounds()

    def metadata(self) -> dict:
        meta = super().metadata()
        if self.haystack == "essay":  # the corpus differs between machines (Python version, your files)
            meta["corpus"] = _text_corpus(self.path).metadata()
        return meta

    def _strings(self, d, role: str, kind: str, count: int):
        """(table int32 [count, M], lengths [count]) of keys or values."""
        width = _WIDTH[kind]
        if kind == "uuids":
            nib = d[f"{role}_nibbles"].reshape(count, 30)
            return jax.vmap(uuid4)(nib, d[f"{role}_variant"]), jnp.full((count,), 36, jnp.int32)
        if role == "key":
            pool = _KEY_POOL if kind == "words" else _NUMBER_POOL
            index = distinct(d["key_start"][0], d["key_step"][0], count, pool)
            adj, noun, number = index // len(NOUNS), index % len(NOUNS), 10**6 + index
        else:
            adj, noun = d.get("value_adj"), d.get("value_noun")
            number = None if kind == "words" else 10**6 + d["value_number"]
        if kind == "numbers":
            return jax.vmap(lambda v: digits(v, width))(number)
        return jax.vmap(lambda a, b: join_row([(jnp.asarray(_ADJ)[a], jnp.asarray(_ADJ_LEN)[a]),
                                                          (jnp.array([ord("-")]), 1),
                                                          (jnp.asarray(_NOUN)[b], jnp.asarray(_NOUN_LEN)[b])],
                                                         width))(adj, noun)

    # -------------------------------------------------------------- example
    def _example(self, draws, n, max_n, width):
        d = self._plan(max_n).unpack(draws)
        k, v, total = self.num_keys, self.values, self.num_needles
        distractors = max_n if self.haystack == "needle" else 0
        key_rows, key_len = self._strings(d, "key", self.key_type, k + distractors)
        value_rows, value_len = self._strings(d, "value", self.value_type, total + distractors)
        out = Layout()
        key_base, value_base = out.source(key_rows), out.source(value_rows)
        kw, vw = key_rows.shape[1], value_rows.shape[1]
        # needle i holds key i // v and value i; distractor s holds key k + s and value total + s
        needle_key = jnp.concatenate([jnp.arange(total) // v, k + jnp.arange(distractors)])
        needle_value = jnp.arange(total + distractors)
        queried = permutation(d["query"])[: self.queries]  # random.sample(range(k), q)
        target = jnp.arange(total) == queried[0] * v  # the needle a fixed depth places

        if self.haystack == "essay":
            ctx, rank = self._essay_context(out, d, n, max_n, target)
            needle_segments = self._needle_segments(out, needle_key, needle_value, key_len, value_len,
                                                    key_base, kw, value_base, vw, "")
        else:
            ctx, rank = None, self._line_order(d, n, max_n, target)
        prefix, rest = self.text.split("{context}")
        out.text(prefix)
        if ctx is None:
            self._line_context(out, rank, n, max_n, needle_key, needle_value, key_len, value_len,
                               key_base, kw, value_base, vw)
        else:
            ctx(needle_segments)
        question, answer_prefix, tail = rest.split("{query}")
        out.text(question)
        self._query(out, queried, key_len, key_base, kw)
        out.text(answer_prefix)
        self._query(out, queried, key_len, key_base, kw)
        out.text(tail + " ")
        # answers: per queried key its v values in context order
        needle_rank = rank[:total].reshape(k, v)[queried]  # [q, v]
        value_index = (queried[:, None] * v + jnp.argsort(needle_rank, axis=1)).reshape(-1)
        seps = np.array([2] * (self.queries * v - 1) + [0])
        comma, _ = out.text_src(", ")
        srcs = jnp.stack([value_base + value_index * vw, jnp.full_like(value_index, comma)], axis=1)
        lens = jnp.stack([value_len[value_index], jnp.asarray(seps)], axis=1)
        out.put(srcs, lens, answer=True)
        return out.build(width, self._corpus)

    def _needle_segments(self, out, needle_key, needle_value, key_len, value_len, key_base, kw, value_base,
                         vw, end):
        """(src [N, 5], lengths [N, 5]) of "One of ... for <key> is: <value>." + end, for every needle."""
        head = out.text_src(NEEDLE.split("{key}")[0].replace("{type_needle_v}", self.value_type))
        mid, close = out.text_src(" is: "), out.text_src("." + end)
        count = needle_key.shape[0]
        src = jnp.stack([jnp.full(count, head[0]), key_base + needle_key * kw, jnp.full(count, mid[0]),
                         value_base + needle_value * vw, jnp.full(count, close[0])], axis=1)
        lengths = jnp.stack([jnp.full(count, head[1]), key_len[needle_key], jnp.full(count, mid[1]),
                             value_len[needle_value], jnp.full(count, close[1])], axis=1)
        return src, lengths

    def _line_order(self, d, n, max_n, target):
        """Context rank of every needle, then of every haystack line: needles before drawn sentences."""
        total = self.num_needles
        slot = jnp.arange(max_n)
        if self.depth is None:
            slots = permutation(d["slots"], slot < n)[:total]
        else:
            fixed = jnp.round(self.depth * n).astype(jnp.int32)
            others = permutation(d["slots"], (slot < n) & (slot != fixed))[: max(total - 1, 1)]
            order = jnp.cumsum(~target) - 1  # the other needles take the drawn slots in turn
            slots = jnp.where(target, fixed, others[jnp.clip(order, 0, max(total - 2, 0))])
        keys = jnp.concatenate([2 * slots, 2 * slot + 1 + jnp.where(slot < n, 0, 4 * max_n + 4)])
        order = jnp.argsort(keys, stable=True)
        return jnp.argsort(order)  # rank of element i (needles first, then lines)

    def _line_context(self, out, rank, n, max_n, needle_key, needle_value, key_len, value_len, key_base, kw,
                      value_base, vw):
        total = self.num_needles
        src, lengths = self._needle_segments(out, needle_key, needle_value, key_len, value_len, key_base, kw,
                                             value_base, vw, "")
        needles_src, needles_len = src[:total], lengths[:total]
        if self.haystack == "noise":
            filler = out.text_src(FILLER)
            lines_src = jnp.zeros((max_n, 5), jnp.int32).at[:, 0].set(filler[0])
            lines_len = jnp.zeros((max_n, 5), jnp.int32).at[:, 0].set(filler[1])
        else:
            lines_src, lines_len = src[total:], lengths[total:]
        live = jnp.concatenate([jnp.ones(total, bool), jnp.arange(max_n) < n])
        elem_src = jnp.concatenate([needles_src, lines_src])
        elem_len = jnp.where(live[:, None], jnp.concatenate([needles_len, lines_len]), 0)
        newline, _ = out.text_src("\n")
        last = total + n - 1
        sep_len = (live & (rank != last)).astype(jnp.int32)
        order = jnp.argsort(rank)
        seg_src = jnp.concatenate([elem_src, jnp.full((elem_src.shape[0], 1), newline)], axis=1)[order]
        seg_len = jnp.concatenate([elem_len, sep_len[:, None]], axis=1)[order]
        out.put(seg_src, seg_len)

    def _essay_context(self, out, d, n, max_n, target):
        """A writer of the essay context and the needles' context ranks."""
        corpus = self._corpus
        total = self.num_needles
        search = _SEARCH
        size = max_n + search + 2
        start0 = d["window"][0] % max(int(corpus.shape[0]) - size, 1)
        ahead = jax.lax.dynamic_slice(corpus, (start0,), (search,)) == ord(" ")
        start = start0 + jnp.where(ahead.any(), jnp.argmax(ahead) + 1, 0)
        window = jax.lax.dynamic_slice(corpus, (start,), (max_n + 1,))
        pos = jnp.arange(max_n + 1)
        boundary = (pos == 0) | (pos == n) | ((pos < n) & (jnp.roll(window, 1) == ord(" ")))
        grid = jnp.asarray(GRID, jnp.float32)[permutation(d["grid"])[:total]] / 100.0
        fraction = grid if self.depth is None else jnp.where(target, self.depth, grid)
        goal = jnp.floor(n * fraction).astype(jnp.int32)  # int(len * depth / 100)
        at = jnp.argmax(boundary[None, :] & (pos[None, :] >= goal[:, None]), axis=1)
        # needle j takes the j-th drawn depth (a random assignment, as RULER's shuffled needles)
        order = jnp.lexsort((jnp.arange(total), at))
        rank = jnp.argsort(order)

        def write(needle_segments):
            src, lengths = needle_segments
            src, lengths = src[:total][order], lengths[:total][order]
            p = at[order]
            space, _ = out.text_src(" ")
            begin = jnp.concatenate([jnp.zeros(1, jnp.int32), p])
            end = jnp.concatenate([p, jnp.full(1, n)])
            chunk_src, chunk_len = start + begin, end - begin
            out.corpus(chunk_src[:1], chunk_len[:1])
            for j in range(total):  # needle j (in context order), then the haystack up to the next needle
                at_end = p[j] == n
                out.put(space, at_end.astype(jnp.int32))
                out.put(src[j], lengths[j])
                out.put(space, 1 - at_end.astype(jnp.int32))
                out.corpus(chunk_src[j + 1:j + 2], chunk_len[j + 1:j + 2])

        return write, rank

    def _query(self, out, queried, key_len, key_base, kw):
        q = self.queries
        seps = [", "] * max(q - 2, 0) + ([", and "] if q > 1 else []) + [""]
        for j in range(q):
            out.put(key_base + queried[j] * kw, key_len[queried[j]])
            out.text(seps[j])


class NiahSingle(Niah):
    """niah_single: one needle in noise (RULER niah_single_1; essay / uuids: niah_single_2 / _3)."""

    names = ("niah_single",)
    description = "byte-level RULER needle in a haystack: one key, one value, noise haystack"
    source = "Hsieh et al. 2024 (RULER); hsiehjackson/RULER scripts/data/synthetic/niah.py, niah_single_1"
    eval_sweep = {"depth": DEPTHS}

    def __init__(self, *, haystack: str = "noise", key_type: str = "words", value_type: str = "numbers",
                 keys: int = 1, values: int = 1, queries: int = 1, depth: float | None = None,
                 path: str | None = None, seed: int = 0):
        super().__init__(haystack=haystack, key_type=key_type, value_type=value_type, keys=keys, values=values,
                         queries=queries, depth=depth, path=path, seed=seed)


class NiahMultikey(Niah):
    """niah_multikey: 4 keys, one asked (RULER niah_multikey_1; needle haystack: _2, uuids: _3)."""

    names = ("niah_multikey",)
    description = "byte-level RULER needle in a haystack: 4 keys (distractor needles), one asked"
    source = "Hsieh et al. 2024 (RULER); hsiehjackson/RULER scripts/data/synthetic/niah.py, niah_multikey_1"
    eval_sweep = {"depth": DEPTHS, "keys": NEEDLE_COUNTS}

    def __init__(self, *, haystack: str = "essay", key_type: str = "words", value_type: str = "numbers",
                 keys: int = 4, values: int = 1, queries: int = 1, depth: float | None = None,
                 path: str | None = None, seed: int = 0):
        super().__init__(haystack=haystack, key_type=key_type, value_type=value_type, keys=keys, values=values,
                         queries=queries, depth=depth, path=path, seed=seed)


class NiahMultivalue(Niah):
    """niah_multivalue: one key with 4 values, all asked (RULER niah_multivalue)."""

    names = ("niah_multivalue",)
    description = "byte-level RULER needle in a haystack: one key with 4 values, all asked"
    source = "Hsieh et al. 2024 (RULER); hsiehjackson/RULER scripts/data/synthetic/niah.py, niah_multivalue"
    eval_sweep = {"depth": DEPTHS, "values": NEEDLE_COUNTS}

    def __init__(self, *, haystack: str = "essay", key_type: str = "words", value_type: str = "numbers",
                 keys: int = 1, values: int = 4, queries: int = 1, depth: float | None = None,
                 path: str | None = None, seed: int = 0):
        super().__init__(haystack=haystack, key_type=key_type, value_type=value_type, keys=keys, values=values,
                         queries=queries, depth=depth, path=path, seed=seed)


class NiahMultiquery(Niah):
    """niah_multiquery: 4 keys, all asked (RULER niah_multiquery)."""

    names = ("niah_multiquery",)
    description = "byte-level RULER needle in a haystack: 4 keys, all asked"
    source = "Hsieh et al. 2024 (RULER); hsiehjackson/RULER scripts/data/synthetic/niah.py, niah_multiquery"
    eval_sweep = {"depth": DEPTHS, "queries": NEEDLE_COUNTS}

    def __init__(self, *, haystack: str = "essay", key_type: str = "words", value_type: str = "numbers",
                 keys: int = 1, values: int = 1, queries: int = 4, depth: float | None = None,
                 path: str | None = None, seed: int = 0):
        super().__init__(haystack=haystack, key_type=key_type, value_type=value_type, keys=keys, values=values,
                         queries=queries, depth=depth, path=path, seed=seed)


__all__ = ["Niah", "NiahSingle", "NiahMultikey", "NiahMultivalue", "NiahMultiquery", "TEMPLATE", "ANSWER_PREFIX",
           "NEEDLE", "GRID", "DEPTHS", "prompt", "essay_corpus"]
