"""Shared token ids and the batching logic of every synthetic task.

Token ids (all synthetic tasks share them; the text task uses raw bytes):

    PAD = 0   padding after the example (target mask 0)
    BOS = 1   first token of every example
    SEP = 2   separates the problem from the answer ('=' in addition)
    EOS = 3   end of the answer where its length is not implied (addition)
    4 ...     the task's symbols (FIRST_SYMBOL + i is symbol i)

Causal format: a size-``n`` example is a token sequence ``s`` of
``seq_len(n)`` tokens, right-padded with PAD to ``length + 1`` tokens. The
model reads ``inputs = s[:length]`` and predicts ``targets = s[1:]``
(``targets[:, t]`` is the token after ``inputs[:, t]``); ``mask[:, t]`` is 1.0
exactly where ``targets[:, t]`` is an answer token. The last token of an
example is only ever a target, so an example fits when
``seq_len(n) <= length + 1``.

Sizes: each example draws ``n`` uniformly from ``[min_size, max_size(length)]``;
``min_size`` defaults to the task's ``smallest`` size at training
(``split="train"``) and to ``max_size(length)`` at evaluation
(``split="eval"``: every example at exactly the largest size that fits, as
DeepMind's per-length evaluation, Delétang et al. 2023). Evaluation in size
bins (Kazemnejad et al. 2023) passes the bin's smallest size as
``min_size``; a task declares which of the two its paper uses
(``eval_sizes``: "exact" or "bin"; :func:`eval_bins`).

Coupled positions: a task with position coupling (Cho et al. 2024) also
returns ``position_ids`` int32 [B, length], the position id of each input
token, assigned by the task's structure (``posenc.position_coupling``); the
training and evaluation steps feed them to the model as its positions. Its
``_example`` returns them as a third array, and a task whose examples differ
between the splits (a random offset at training only) sets
``split_aware = True`` and takes ``train`` (a Python bool) in ``_example``.

Operand sizes: a task whose example reads the smallest size of the batch's
range (``[min_size, max_size(length)]``; addition's independent operand
lengths) sets ``size_aware = True`` and takes ``smallest`` in ``_example``.

Fixed training sets (``train.dataset_size``, :mod:`posenc.training.dataset`):
:meth:`Task.examples` gives the examples of given keys, one key per row, so
that an example is the same at every visit; the last :attr:`Task.fresh_draws`
random words of an example (a task's training-time offsets: coupled start
ids, index-hint offsets) are drawn anew at every visit, as the official
datasets draw them in ``__getitem__``.

Multi-axis positions: a task with ``position_axes = A`` (the grid tasks) returns
``axis_positions`` int32 [B, length, A] (its ``_example``'s third array [width, A]):
ids on A axes built like Qwen2-VL's ``get_rope_index`` (``posenc.mrope.position_ids``).
Training feeds them to a model whose units read several axes
(``Encoding.position_axes``); one-axis models read 0 .. L-1.

Size laws: ``seq_len(n)`` is the most tokens a size-``n`` example takes
(BOS to its last answer token; an example may be shorter, padded with PAD).
By default it is linear, ``per_size * n + overhead``; a task may override
``seq_len`` with any non-decreasing law (``law`` names it in metadata), and
``max_size`` inverts it by search.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.tasks.registry import Registered

PAD, BOS, SEP, EOS = 0, 1, 2, 3
FIRST_SYMBOL = 4
NUM_SPECIAL = 4
SPECIALS = ("PAD", "BOS", "SEP", "EOS")
SPLITS = ("train", "eval")
WORD = 2**31  # bound of the random words used for shuffles (argsort keys) and traced-bound draws

_COMPILED: dict = {}


def check_split(split) -> str:
    """Return ``split`` if it is "train" or "eval", else raise ValueError."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
    return split


def check_int(name: str, value, *, minimum: int, maximum: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer in range, else raise ValueError."""
    return checks.integer(name, value, minimum=minimum, maximum=maximum)


class Task(Registered):
    """A deterministic synthetic task: ``batch(key, B, length)`` -> dict of arrays.

    Subclasses declare the registry facts (:mod:`posenc.tasks.registry`),
    ``symbols`` (the names of ids ``FIRST_SYMBOL, FIRST_SYMBOL + 1, ...``;
    ``vocab_size`` is ``NUM_SPECIAL + len(symbols)``), the size law
    (``per_size`` / ``overhead``, or ``seq_len`` and ``law``), ``smallest``
    (the smallest problem size), optionally ``size_cap`` (the largest ``n``
    the options allow), and implement ``_bounds(max_n)`` (the random
    integers an example needs) and ``_example(draws, n, max_n, width)`` for
    one example with a traced size ``n``.
    """

    symbols: tuple[str, ...] = ()
    eval_sizes: str = "exact"  # "exact" | "bin": how its paper samples evaluation sizes (eval_bins)
    per_size: int = 1
    overhead: int = 0
    smallest: int = 1
    size_cap: int | None = None
    split_aware: bool = False  # _example takes train= (the module docstring)
    size_aware: bool = False  # _example takes smallest= (the module docstring)
    position_levels: int = 0  # levels of the coupled position_ids it emits (0: none)
    position_axes: int = 0  # axes of the multi-axis axis_positions it emits (0: none; grid tasks: 3)
    digit_tokens: tuple[int, ...] = ()  # ids of the digits 0-9 (arithmetic tasks; read by Abacus)

    def __init__(self, *, seed: int = 0):
        self.seed = check_int("seed", seed, minimum=0)
        # One compile per (options, batch_size, length, sizes): tasks that differ
        # only in seed share it, since the seed is folded into the key outside.
        spec = (type(self), tuple(sorted(self.options().items())))
        if spec not in _COMPILED:
            _COMPILED[spec] = jax.jit(self._generate, static_argnums=(1, 2, 3, 4, 5))
        self._generate_jit = _COMPILED[spec]

    def with_traced(self, values: dict):
        """The task with traced ``traced_options`` (registry), generating its batches in the caller's trace
        (the compiled generator of ``__init__`` holds the options it was made with)."""
        twin = super().with_traced(values)
        twin._generate_jit = twin._generate
        return twin

    @property
    def vocab_size(self) -> int:
        """Token ids in use: the specials, then one id per symbol."""
        return NUM_SPECIAL + len(self.symbols)

    def token(self, symbol: str) -> int:
        """The id of ``symbol`` (one of ``symbols``)."""
        return FIRST_SYMBOL + self.symbols.index(symbol)

    def render(self, ids) -> str:
        """Token ids as space-separated names (PAD shown as '.'), for reading examples."""
        names = (".", "BOS", "SEP", "EOS", *self.symbols)
        return " ".join(names[int(i)] for i in np.asarray(ids).ravel())

    # ------------------------------------------------------------------ sizes
    @property
    def law(self) -> str:
        """The size law in words: tokens of a size-``n`` example."""
        return f"{self.per_size} * n + {self.overhead}"

    def seq_len(self, n: int) -> int:
        """Most tokens of a size-``n`` example, from BOS to its last answer token."""
        return self.per_size * n + self.overhead

    def min_length(self) -> int:
        """The shortest ``length`` that fits a problem of the smallest size."""
        return self.seq_len(self.smallest) - 1

    def max_size(self, length: int) -> int:
        """The largest problem size ``n`` whose example fits in ``length`` input tokens."""
        length = self._check_length(length)
        fits = lambda n: self.seq_len(n) <= length + 1  # noqa: E731
        lo, hi = self.smallest, self.smallest + 1
        while fits(hi) and (self.size_cap is None or hi <= self.size_cap):
            lo, hi = hi, 2 * hi
        while hi - lo > 1:  # fits(lo) and not fits(hi): bisect the non-decreasing law
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo if self.size_cap is None else min(lo, self.size_cap)

    def _check_length(self, length) -> int:
        if not checks.is_int(length):
            raise ValueError(f"length must be an integer, got {length!r}")
        if length < self.min_length():
            raise ValueError(
                f"length {length} is too short for task {self.name!r}: a size-{self.smallest} problem "
                f"needs length >= {self.min_length()}"
            )
        return int(length)

    # ---------------------------------------------------------------- batches
    def batch(self, key, batch_size: int, length: int, *, min_size: int | None = None,
              split: str = "train") -> dict:
        """A batch of ``batch_size`` examples padded to ``length`` tokens.

        Returns ``inputs`` int32 [B, length], ``targets`` int32 [B, length]
        (next tokens) and ``mask`` float32 [B, length] (1.0 on answer tokens);
        a task with coupled positions also ``position_ids`` int32 [B, length]
        (the id of each input token).
        Pure jax: jit it with ``jax.jit(task.batch, static_argnums=(1, 2))``
        (pass ``min_size`` / ``split`` through ``functools.partial`` or
        ``static_argnames``); the same key gives the same batch. Every row is
        a real example, so no ``example_mask`` is returned.
        """
        batch_size = check_int("batch_size", batch_size, minimum=1)
        lo, max_n = self._size_range(length, min_size, split)
        self.check_sizes(length, split)
        if self.seed:
            # Different task seeds give different data from the same trainer key.
            key = jax.random.fold_in(key, self.seed)
        return self._generate_jit(key, batch_size, int(length), lo, max_n, split)

    def _size_range(self, length, min_size, split) -> tuple[int, int]:
        """``(smallest, largest)`` problem size of a batch at ``length`` (ValueError if ``min_size`` is outside)."""
        max_n = self.max_size(length)
        check_split(split)
        if min_size is None:  # training: every size; evaluation: exactly the largest that fits
            min_size = max_n if split == "eval" else self.smallest
        if not checks.is_int(min_size) or not self.smallest <= min_size <= max_n:
            raise ValueError(
                f"min_size {min_size!r} is outside [{self.smallest}, {max_n}] (sizes of task "
                f"{self.name!r} at length {length})"
            )
        return int(min_size), max_n

    def check_sizes(self, length: int, split: str) -> None:
        """ValueError if the task's options cannot pose the problems of ``length`` (e.g. coupled ids
        past ``max_position``); called by :meth:`batch` and :meth:`examples`. Default: nothing to check."""

    @property
    def fresh_draws(self) -> int:
        """The last random words of an example drawn anew at every visit of a fixed training example
        (:meth:`examples`): its training-time offsets. 0: the example is fixed whole."""
        return 0

    def examples(self, keys, length: int, *, fresh_key=None, min_size: int | None = None,
                 split: str = "train") -> dict:
        """The batch whose row ``i`` is the example of ``keys[i]`` (typed keys [B]), as :meth:`batch`.

        The same key gives the same example whatever its row or batch (a fixed
        training set, :mod:`posenc.training.dataset`); with ``fresh_key`` the
        last :attr:`fresh_draws` words of every row come from it instead. Pure
        jax, not jitted (it runs inside the train step).
        """
        lo, max_n = self._size_range(length, min_size, split)
        self.check_sizes(length, split)
        if self.seed:
            keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, self.seed)
        bounds = self._draw_bounds(lo, max_n)
        words = jax.vmap(lambda k: jax.random.bits(k, (bounds.size,), dtype=jnp.uint32))(keys)
        fresh = self.fresh_draws
        if fresh and fresh_key is not None:
            words = words.at[:, bounds.size - fresh:].set(
                jax.random.bits(fresh_key, (words.shape[0], fresh), dtype=jnp.uint32))
        return self._from_words(words, bounds, int(length), lo, max_n, split)

    def _draw_bounds(self, lo, hi):
        """The bound of every random word of an example: its size, then ``_bounds(hi)``."""
        return np.array([hi - lo + 1, *self._bounds(hi)], dtype=np.uint32)

    def _generate(self, key, batch_size, length, lo, hi, split="train"):
        # All randomness of the batch in one draw of 32-bit words, reduced
        # modulo each column's bound (bias < bound / 2**32): one threefry call
        # keeps compiles fast, since every separate random call is its own kernel.
        bounds = self._draw_bounds(lo, hi)
        words = jax.random.bits(key, (batch_size, bounds.size), dtype=jnp.uint32)
        return self._from_words(words, bounds, length, lo, hi, split)

    def _from_words(self, words, bounds, length, lo, hi, split):
        """The batch of the random ``words`` [B, len(bounds)] (each reduced modulo its bound)."""
        draws = (words % bounds).astype(jnp.int32)
        sizes = lo + draws[:, 0]
        width = length + 1
        flags = {"train": split == "train"} if self.split_aware else {}
        if self.size_aware:
            flags["smallest"] = lo
        seq, answer, *ids = jax.vmap(lambda r, n: self._example(r, n, hi, width, **flags))(
            draws[:, 1:], sizes)
        seq = seq.astype(jnp.int32)
        out = {
            "inputs": seq[:, :-1],
            "targets": seq[:, 1:],
            "mask": answer[:, 1:].astype(jnp.float32),
        }
        if ids:  # coupled positions (or multi-axis ids [B, length, A]): the id of each input token
            out["axis_positions" if self.position_axes else "position_ids"] = ids[0][:, :-1].astype(jnp.int32)
        return out

    def _bounds(self, max_n: int) -> list[int]:
        """Exclusive upper bounds of the random integers one example consumes."""
        raise NotImplementedError

    def _example(self, draws, n, max_n, width):
        """One example: (tokens int32 [width], answer bool [width]) for traced size ``n``.

        ``draws`` int32 [len(_bounds(max_n))]: ``draws[j]`` uniform in ``[0, bound_j)``.
        A task with coupled positions returns ``position_ids`` int [width] as a
        third array; with ``split_aware`` it takes ``train`` as well.
        """
        raise NotImplementedError

    def metadata(self) -> dict:
        """JSON-serialisable facts about the task, recorded with results."""
        return {
            **self.describe(),
            "vocab_size": self.vocab_size,
            "seed": self.seed,
            "size_law": f"seq_len(n) = {self.law}",
            "position_levels": self.position_levels,
            "position_axes": self.position_axes,
            "digit_tokens": list(self.digit_tokens),
            "smallest": self.smallest,
            "size_cap": self.size_cap,
            "symbols": list(self.symbols),
        }

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts}{', ' if opts else ''}seed={self.seed})"


EVAL_SIZES = ("exact", "bin")


def eval_bins(task, lengths, *, mode: str = "default", train_length: int | None = None) -> dict:
    """``{length: (smallest, largest) problem size}`` evaluated at each of ``lengths``.

    ``exact``: every example at ``max_size(length)``. ``bin``: uniform over the sizes
    above the previous length's largest (Kazemnejad et al. 2023's test bins); the
    first bin, at the training length, is the training distribution (from the
    task's smallest size). ``default``: the task's own ``eval_sizes``.
    """
    mode = task.eval_sizes if mode == "default" else checks.choice("eval.sizes", mode, (*EVAL_SIZES, "default"))
    out, previous = {}, None
    for n in sorted(int(x) for x in lengths):
        hi = task.max_size(n)
        if mode == "exact":
            out[n] = (hi, hi)
        else:
            lo = task.smallest if previous is None else min(previous + 1, hi)
            out[n] = (lo, hi)
        previous = hi
    return out


# ------------------------------------------------------------ example helpers
def segment(pos, start, n):
    """Boolean mask and offset of positions ``start <= pos < start + n``."""
    inside = (pos >= start) & (pos < start + n)
    return inside, jnp.where(inside, pos - start, 0)


def gather(values, index):
    """``values[index]`` with ``index`` clipped (out-of-segment lanes are masked later)."""
    return jnp.take(values, jnp.clip(index, 0, values.shape[0] - 1), axis=0)


def compose(width, *parts):
    """Lay ``parts`` end to end from position 0: (tokens int32 [width], answer bool [width]).

    Each part is ``(ids, count, is_answer)``: ``ids`` a scalar (repeated) or an
    array (its first ``count`` entries), ``count`` a traced or static length.
    Positions past the last part are PAD.
    """
    pos = jnp.arange(width)
    tokens = jnp.full((width,), PAD, jnp.int32)
    answer = jnp.zeros((width,), bool)
    offset = 0
    for ids, count, is_answer in parts:
        inside, index = segment(pos, offset, count)
        ids = jnp.asarray(ids, jnp.int32)
        values = gather(ids, index) if ids.ndim else ids
        tokens = jnp.where(inside, values, tokens)
        if is_answer:
            answer = answer | inside
        offset = offset + count
    return tokens, answer


def uniform(word, lo, hi):
    """An integer uniform in ``[lo, hi]`` (traced bounds) from a draw of bound ``WORD``."""
    return lo + word % jnp.maximum(hi - lo + 1, 1)


def unit(word):
    """A float32 uniform in (0, 1) from a draw of bound ``WORD``."""
    return (word.astype(jnp.float32) + 0.5) / float(WORD)


def permutation(words, live=None):
    """A random permutation from argsort of ``words``; with ``live`` (a prefix), live entries come first.

    Dead entries sort as ``WORD - 1``; argsort is stable, so a live tie with them still comes first.
    """
    if live is not None:
        words = jnp.where(live, words, WORD - 1)
    return jnp.argsort(words, stable=True)
