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

Sizes: at training (``split="train"``) each example draws ``n`` uniformly
from ``[min_size, max_size(length)]``; at evaluation (``split="eval"``) every
example has ``n = max_size(length)``, so evaluating at 4x the training length
tests 4x longer problems (Delétang et al. 2023; Ruoss et al. 2023).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

PAD, BOS, SEP, EOS = 0, 1, 2, 3
FIRST_SYMBOL = 4
NUM_SPECIAL = 4
SPLITS = ("train", "eval")
WORD = 2**31  # bound of the random words used for shuffles (argsort keys)

_COMPILED: dict = {}


def check_split(split) -> str:
    """Return ``split`` if it is "train" or "eval", else raise ValueError."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
    return split


def check_int(name: str, value, *, minimum: int) -> int:
    """Return ``value`` as an int if it is an integer >= ``minimum``, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class Task:
    """A deterministic synthetic task: ``batch(key, B, length)`` -> dict of arrays.

    Subclasses set ``name``, ``vocab_size``, the linear size law
    ``seq_len(n) = per_size * n + overhead`` (tokens of a size-``n`` example,
    BOS to last answer token), optionally ``size_cap`` (the largest ``n`` the
    options allow), and implement ``_bounds(max_n)`` (the random integers an
    example needs) and ``_example(draws, n, max_n, width)`` for one example
    with a traced size ``n``.
    """

    name: str = ""
    vocab_size: int = 0
    per_size: int = 1
    overhead: int = 0
    size_cap: int | None = None

    def __init__(self, *, seed: int = 0):
        self.seed = check_int("seed", seed, minimum=0)
        # One compile per (options, batch_size, length, sizes): tasks that differ
        # only in seed share it, since the seed is folded into the key outside.
        spec = (type(self), tuple(sorted(self.options().items())))
        if spec not in _COMPILED:
            _COMPILED[spec] = jax.jit(self._generate, static_argnums=(1, 2, 3, 4))
        self._generate_jit = _COMPILED[spec]

    # ------------------------------------------------------------------ sizes
    def seq_len(self, n: int) -> int:
        """Tokens of a size-``n`` example, from BOS to its last answer token."""
        return self.per_size * n + self.overhead

    def min_length(self) -> int:
        """The shortest ``length`` that fits a size-1 example."""
        return self.seq_len(1) - 1

    def max_size(self, length: int) -> int:
        """The largest problem size ``n`` whose example fits in ``length`` input tokens."""
        length = self._check_length(length)
        n = (length + 1 - self.overhead) // self.per_size
        return n if self.size_cap is None else min(n, self.size_cap)

    def _check_length(self, length) -> int:
        if isinstance(length, bool) or not isinstance(length, int):
            raise ValueError(f"length must be an integer, got {length!r}")
        if length < self.min_length():
            raise ValueError(
                f"length {length} is too short for task {self.name!r}: a size-1 problem "
                f"needs length >= {self.min_length()}"
            )
        return int(length)

    # ---------------------------------------------------------------- batches
    def batch(self, key, batch_size: int, length: int, *, min_size: int | None = None,
              split: str = "train") -> dict:
        """A batch of ``batch_size`` examples padded to ``length`` tokens.

        Returns ``inputs`` int32 [B, length], ``targets`` int32 [B, length]
        (next tokens) and ``mask`` float32 [B, length] (1.0 on answer tokens).
        Pure jax: jit it with ``jax.jit(task.batch, static_argnums=(1, 2))``
        (pass ``min_size`` / ``split`` through ``functools.partial`` or
        ``static_argnames``); the same key gives the same batch. Every row is
        a real example, so no ``example_mask`` is returned.
        """
        batch_size = check_int("batch_size", batch_size, minimum=1)
        max_n = self.max_size(length)
        check_split(split)
        if min_size is None:
            min_size = 1
        if isinstance(min_size, bool) or not isinstance(min_size, int) or not 1 <= min_size <= max_n:
            raise ValueError(
                f"min_size {min_size!r} is outside [1, {max_n}] (max_size of task "
                f"{self.name!r} at length {length})"
            )
        lo = max_n if split == "eval" else min_size
        if self.seed:
            # Different task seeds give different data from the same trainer key.
            key = jax.random.fold_in(key, self.seed)
        return self._generate_jit(key, batch_size, length, lo, max_n)

    def _generate(self, key, batch_size, length, lo, hi):
        # All randomness of the batch in one draw of 32-bit words, reduced
        # modulo each column's bound (bias < bound / 2**32): one threefry call
        # keeps compiles fast, since every separate random call is its own kernel.
        bounds = np.array([hi - lo + 1, *self._bounds(hi)], dtype=np.uint32)
        words = jax.random.bits(key, (batch_size, bounds.size), dtype=jnp.uint32)
        draws = (words % bounds).astype(jnp.int32)
        sizes = lo + draws[:, 0]
        width = length + 1
        seq, answer = jax.vmap(lambda r, n: self._example(r, n, hi, width))(draws[:, 1:], sizes)
        seq = seq.astype(jnp.int32)
        return {
            "inputs": seq[:, :-1],
            "targets": seq[:, 1:],
            "mask": answer[:, 1:].astype(jnp.float32),
        }

    def _bounds(self, max_n: int) -> list[int]:
        """Exclusive upper bounds of the random integers one example consumes."""
        raise NotImplementedError

    def _example(self, draws, n, max_n, width):
        """One example: (tokens int32 [width], answer bool [width]) for traced size ``n``.

        ``draws`` int32 [len(_bounds(max_n))]: ``draws[j]`` uniform in ``[0, bound_j)``.
        """
        raise NotImplementedError

    def metadata(self) -> dict:
        """JSON-serialisable facts about the task, recorded with results."""
        return {
            "name": self.name,
            "vocab_size": self.vocab_size,
            "seed": self.seed,
            "format": f"seq_len(n) = {self.per_size} * n + {self.overhead}",
            "size_cap": self.size_cap,
            **self.options(),
        }

    def options(self) -> dict:
        """The task's options (the keyword arguments it was made with)."""
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts}{', ' if opts else ''}seed={self.seed})"


def segment(pos, start, n):
    """Boolean mask and offset of positions ``start <= pos < start + n``."""
    inside = (pos >= start) & (pos < start + n)
    return inside, jnp.where(inside, pos - start, 0)


def gather(values, index):
    """``values[index]`` with ``index`` clipped (out-of-segment lanes are masked later)."""
    return jnp.take(values, jnp.clip(index, 0, values.shape[0] - 1), axis=0)
