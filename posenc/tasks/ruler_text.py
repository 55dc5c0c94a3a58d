"""Byte-level building blocks of the RULER tasks (:mod:`posenc.tasks.ruler`, :mod:`posenc.tasks.ruler_aggregate`).

- :class:`Layout`: variable-length byte segments (template text, drawn
  words and numbers, filler, corpus windows) laid end to end under ``jit``
  with traced lengths: one ``searchsorted`` over the segment ends, then one
  gather per position, so an example of S segments costs O(width log S).
- :class:`Plan`: the random integers an example draws, by name.
- Word lists (:data:`ADJECTIVES`, :data:`NOUNS`, :data:`VERBS`; RULER draws
  from the ``wonderwords`` lists, which posenc does not depend on), number,
  UUID and letter-code rendering, and :func:`distinct`: ``count`` distinct
  indices below a modulus from two draws.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc.tasks.base import PAD

ADJECTIVES = tuple("""
able afraid ancient angry brave bright broad brief broken busy calm careful cheap clean clever cold cool
crazy curious dark deep dry eager early easy empty fair famous fancy fast fierce fresh friendly funny gentle
giant glad golden good grand great green happy hard heavy honest huge humble hungry jolly kind large late
lazy little lively long loud lucky mighty modern narrow neat noble odd old plain polite proud quick quiet
rapid rare rich rough round royal sharp shiny short silent silly simple slow small smart smooth soft solid
strange strong sweet swift tall tiny warm wild wise young
""".split())
NOUNS = tuple("""
anchor apple arrow autumn badge bakery banner barrel basket beach bell berry bicycle bird blanket boat book
bottle bridge brush bucket butter cabin cable camera candle canyon carpet castle cattle cave chair cheese
cherry circle city cloud coast coffee coin comet cookie copper cotton crown cup curtain desert diamond dragon
drum eagle engine falcon farm feather fence field flag flower forest fountain garden glacier glass globe
harbor hammer helmet hill honey horse island jacket jungle kettle kitten ladder lake lamp lantern lemon
letter library lion lobster magnet marble meadow mirror monkey moon mountain needle notebook ocean orange
orchard owl palace paper parrot pencil pepper piano pillow planet pocket pond potato puzzle rabbit radio
river rocket saddle sand school shadow shell ship silver sky snow spoon star station stone storm street
sugar summer table teapot thunder tiger tower train tree tunnel turtle umbrella valley village violin wagon
wall water whale wheel window winter wolf wood yard zebra
""".split())
VERBS = tuple("""
accept admire answer arrive bake believe borrow build carry catch climb collect cook count cover dance
deliver design discover dream drive enjoy explain explore fetch fold follow gather greet guide hang hunt
imagine invent jump juggle knock laugh learn listen measure mend notice offer paint plant polish pour print
pull push reach repair rescue search sing skate sketch swim travel wander wash whisper write yawn
""".split())
WORDS = tuple(sorted(set(ADJECTIVES) | set(NOUNS) | set(VERBS)))  # as RULER: sorted(set(nouns + adjs + verbs))
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
HEX = "0123456789abcdef"


def ascii_ids(text: str) -> np.ndarray:
    """The bytes of an ASCII string as int32 ids."""
    return np.frombuffer(text.encode("ascii"), np.uint8).astype(np.int32)


def word_table(words) -> tuple[np.ndarray, np.ndarray, int]:
    """(bytes int32 [W, M], lengths int32 [W], M): the words left-aligned, padded with PAD.

    NumPy arrays: module constants made at import must not start a JAX backend.
    """
    width = max(len(w) for w in words)
    table = np.zeros((len(words), width), np.int32)
    for i, w in enumerate(words):
        table[i, :len(w)] = ascii_ids(w)
    return table, np.asarray([len(w) for w in words], np.int32), width


def prime_below(n: int) -> int:
    """The largest prime < n (n >= 3)."""
    p = n - 1
    while p > 2 and any(p % q == 0 for q in range(2, math.isqrt(p) + 1)):
        p -= 1
    return p


def distinct(start, step, count: int, modulus: int) -> jax.Array:
    """``count`` distinct indices in [0, modulus) (a prime > count): (start + j * (1 + step)) mod modulus.

    ``start`` uniform in [0, modulus), ``step`` uniform in [0, modulus - 1): each index is uniform and
    no two are equal. Accumulated one step at a time, so nothing exceeds 2 * modulus (int32-safe).
    """
    stride = 1 + step

    def body(x, _):
        return (x + stride) % modulus, x

    _, out = jax.lax.scan(body, start % modulus, None, length=count)
    return out


def digits(value, width: int):
    """(ASCII row int32 [width], length): the decimal digits of a traced non-negative int, left-aligned."""
    value = jnp.asarray(value, jnp.int32)
    n = 1 + jnp.sum((value >= 10 ** jnp.arange(1, width)).astype(jnp.int32))
    power = jnp.maximum(n - 1 - jnp.arange(width), 0)
    row = 48 + (value // 10**power) % 10
    return jnp.where(jnp.arange(width) < n, row, PAD).astype(jnp.int32), n


def letters(index, count: int, *, upper: bool):
    """ASCII row int32 [count]: ``index`` (traced, < 26**count) in base 26 as letters, most significant first."""
    power = 26 ** (count - 1 - jnp.arange(count))
    return ((65 if upper else 97) + (index // power) % 26).astype(jnp.int32)


def uuid4(nibbles, variant):
    """ASCII row int32 [36] of ``str(uuid.UUID(int=..., version=4))``: 30 random hex digits, the version
    digit 4 and the variant digit 8 + variant (variant in [0, 4)), dashes at 8, 13, 18, 23."""
    hex_ids = jnp.asarray(ascii_ids(HEX))
    free = jnp.asarray(nibbles, jnp.int32)  # [30]
    digits32 = jnp.concatenate([free[:12], jnp.array([4]), free[12:15], variant[None] + 8, free[15:]])
    chars = hex_ids[digits32]
    dash = jnp.full((1,), ord("-"), jnp.int32)
    return jnp.concatenate([chars[:8], dash, chars[8:12], dash, chars[12:16], dash, chars[16:20], dash,
                            chars[20:]])


def join_row(parts, width: int):
    """(row int32 [width], length): ``parts`` [(ids [M_i], length_i)] concatenated (traced lengths)."""
    k = jnp.arange(width)
    row = jnp.full((width,), PAD, jnp.int32)
    offset = 0
    for ids, n in parts:
        ids = jnp.asarray(ids, jnp.int32)
        inside = (k >= offset) & (k < offset + n)
        row = jnp.where(inside, ids[jnp.clip(k - offset, 0, ids.shape[0] - 1)], row)
        offset = offset + n
    return row, offset


class Plan:
    """The named blocks of random integers one example draws: ``add(name, bound, count)`` then
    ``bounds()`` for ``Task._bounds`` and ``unpack(draws)`` -> {name: int32 [count]} in ``_example``."""

    def __init__(self):
        self.items: list[tuple[str, int, int]] = []

    def add(self, name: str, bound: int, count: int = 1) -> Plan:
        self.items.append((name, int(bound), int(count)))
        return self

    def bounds(self) -> list[int]:
        return [b for _, b, c in self.items for _ in range(c)]

    def unpack(self, draws) -> dict:
        out, i = {}, 0
        for name, _, count in self.items:
            out[name] = draws[i:i + count]
            i += count
        return out


class Layout:
    """Byte segments laid end to end: ``text`` (a template piece), ``put`` (spans of the sources added
    with ``source``), ``corpus`` (spans of a corpus array); ``build(width)`` -> (tokens, answer).

    Every segment is (source index, length, from corpus, is answer); lengths may be traced and zero.
    ``drop_last(mark)`` shortens the last non-empty segment since ``mark`` by one byte: "join with a
    separator" is written as "every element followed by the separator, then drop the final byte".
    """

    def __init__(self):
        self._pieces, self._size = [], 0
        self._texts: dict[str, int] = {}
        self._src, self._len, self._from_corpus, self._answer = [], [], [], []
        self._drops: list[tuple[int, int]] = []

    def source(self, ids) -> int:
        """Add a source array (any shape, read flattened); returns the index of its first element."""
        ids = jnp.asarray(ids, jnp.int32).reshape(-1)
        base = self._size
        self._pieces.append(ids)
        self._size += int(ids.shape[0])
        return base

    def _text_base(self, text: str) -> int:
        if text not in self._texts:
            self._texts[text] = self.source(ascii_ids(text))
        return self._texts[text]

    def put(self, src, length, *, answer: bool = False, from_corpus: bool = False) -> None:
        """Segments reading ``length`` elements from ``src`` (arrays of one shape, or scalars)."""
        src, length = jnp.broadcast_arrays(jnp.asarray(src, jnp.int32), jnp.asarray(length, jnp.int32))
        src, length = src.reshape(-1), length.reshape(-1)
        self._src.append(src)
        self._len.append(length)
        self._from_corpus.append(np.full(src.shape, from_corpus))
        self._answer.append(np.full(src.shape, answer))

    def text(self, text: str, *, answer: bool = False) -> None:
        if text:
            self.put(self._text_base(text), len(text), answer=answer)

    def text_src(self, text: str) -> tuple[int, int]:
        """(source index, length) of a template piece, for segments built as arrays."""
        return self._text_base(text), len(text)

    def corpus(self, start, length) -> None:
        self.put(start, length, from_corpus=True)

    def mark(self) -> int:
        return sum(int(s.shape[0]) for s in self._src)

    def drop_last(self, mark: int) -> None:
        self._drops.append((mark, self.mark()))

    def build(self, width: int, corpus=None):
        src = jnp.concatenate(self._src)
        lengths = jnp.concatenate(self._len)
        seg_index = jnp.arange(lengths.shape[0])
        for lo, hi in self._drops:
            live = (seg_index >= lo) & (seg_index < hi) & (lengths > 0)
            last = jnp.max(jnp.where(live, seg_index, -1))
            lengths = lengths - ((seg_index == last) & (last >= 0)).astype(jnp.int32)
        from_corpus = np.concatenate(self._from_corpus)
        answer = jnp.asarray(np.concatenate(self._answer))
        ends = jnp.cumsum(lengths)
        pos = jnp.arange(width)
        seg = jnp.searchsorted(ends, pos, side="right")
        inside = seg < lengths.shape[0]
        seg = jnp.clip(seg, 0, lengths.shape[0] - 1)
        index = src[seg] + pos - (ends[seg] - lengths[seg])
        flat = jnp.concatenate(self._pieces)
        tokens = flat[jnp.clip(index, 0, flat.shape[0] - 1)]
        if from_corpus.any():
            from_corpus = jnp.asarray(from_corpus)[seg]
            tokens = jnp.where(from_corpus, corpus[jnp.clip(index, 0, corpus.shape[0] - 1)].astype(jnp.int32), tokens)
        return jnp.where(inside, tokens, PAD).astype(jnp.int32), inside & answer[seg]
