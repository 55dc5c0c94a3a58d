"""Byte-level language modelling on the Python standard library's own source.

A real-text counterpart of the synthetic tasks that needs no download: the
``.py`` files under ``sysconfig.get_paths()["stdlib"]`` (skipping
``site-packages``, ``dist-packages``, ``__pycache__`` and test directories
``test`` / ``tests`` / ``idle_test``), read as raw bytes in sorted relative
path order, each followed by one NUL byte (``SEPARATOR``; NUL never occurs in
the stdlib's source, so it marks document boundaries unambiguously), and the
concatenation truncated to ``max_bytes``. The corpus differs between Python
versions, so ``metadata()`` records its SHA-256, byte count and the Python
version; equal hashes mean comparable results.

Split: a file belongs to "eval" when the first 8 bytes of SHA-256 of its
relative path, read as a fraction of 2**64, fall below ``eval_fraction``
(default 0.05), else to "train"; each split is the concatenation of its
files (with separators) in corpus order, so the splits share no file.

Vocabulary: the 256 byte values, token id = byte value (no special tokens).
``batch`` draws ``batch_size`` random windows of ``length + 1`` bytes from
the split (uniform start offsets; windows may span a file boundary), with
``inputs = w[:-1]``, ``targets = w[1:]`` and ``mask`` all ones: every
position is predicted, as in the language-modelling evaluations of length
extrapolation (Press et al. 2022 ALiBi; Chi et al. 2022 KERPLE: perplexity
at lengths beyond training). Example window (length 8)::

    w        i m p o r t   o s        (bytes 105 109 112 ...)
    inputs   i m p o r t   o
    targets  m p o r t   o s
    mask     1 1 1 1 1 1 1 1

The corpus is read once per ``(max_bytes, eval_fraction)`` and cached
(:func:`load_corpus`); both splits are copied to the device once, when the
first task on the corpus is made, and ``batch`` closes over them (under ``jit`` they are compile-time
constants: one copy per compiled length).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import sysconfig

import jax
import jax.numpy as jnp
import numpy as np

from posenc.tasks.base import check_int, check_split

SEPARATOR = b"\x00"
DEFAULT_MAX_BYTES = 8_000_000
DEFAULT_EVAL_FRACTION = 0.05
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})


def stdlib_root() -> str:
    """The standard library directory of the running Python."""
    return sysconfig.get_paths()["stdlib"]


def stdlib_files(root: str | None = None) -> list[str]:
    """Relative POSIX paths of the corpus's ``.py`` files under ``root``, sorted."""
    root = stdlib_root() if root is None else root
    paths = []
    for directory, subdirs, files in os.walk(root):
        # Prune in place so os.walk never descends into excluded trees.
        subdirs[:] = [d for d in subdirs if d not in EXCLUDED_DIRS]
        rel = os.path.relpath(directory, root)
        for f in files:
            if f.endswith(".py"):
                path = f if rel == "." else os.path.join(rel, f)
                paths.append(path.replace(os.sep, "/"))
    return sorted(paths)


def file_split(path: str, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> str:
    """"eval" or "train" for a relative path, from SHA-256 of the path (stable everywhere)."""
    h = int.from_bytes(hashlib.sha256(path.encode("utf-8")).digest()[:8], "big")
    return "eval" if h < eval_fraction * 2.0**64 else "train"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The concatenated corpus and its splits.

    ``files`` lists ``(path, split, start, stop)``: the file's bytes (with its
    separator, possibly truncated) are ``data[split][start:stop]``.
    """

    data: dict  # split -> np.uint8 array
    files: tuple
    sha256: str
    num_bytes: int
    max_bytes: int
    eval_fraction: float
    root: str
    # split -> device array, filled on first use (outside any trace) and shared by tasks.
    device: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def metadata(self) -> dict:
        counts = {s: sum(1 for f in self.files if f[1] == s) for s in ("train", "eval")}
        return {
            "corpus": "python-stdlib-source",
            "python_version": platform.python_version(),
            "python_implementation": platform.python_implementation(),
            "sha256": self.sha256,
            "num_bytes": self.num_bytes,
            "max_bytes": self.max_bytes,
            "num_files": len(self.files),
            "train_bytes": int(self.data["train"].size),
            "eval_bytes": int(self.data["eval"].size),
            "train_files": counts["train"],
            "eval_files": counts["eval"],
            "eval_fraction": self.eval_fraction,
            "separator": SEPARATOR.hex(),
            "stdlib_root": self.root,
        }


def build_corpus(max_bytes: int = DEFAULT_MAX_BYTES, eval_fraction: float = DEFAULT_EVAL_FRACTION,
                 root: str | None = None) -> Corpus:
    """Read the corpus from disk (uncached; see :func:`load_corpus`)."""
    max_bytes = check_int("max_bytes", max_bytes, minimum=1)
    if not isinstance(eval_fraction, (int, float)) or not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")
    root = stdlib_root() if root is None else root
    digest = hashlib.sha256()
    chunks = {"train": [], "eval": []}
    offsets = {"train": 0, "eval": 0}
    files = []
    total = 0
    for path in stdlib_files(root):
        if total >= max_bytes:
            break
        with open(os.path.join(root, path), "rb") as fh:
            chunk = (fh.read() + SEPARATOR)[: max_bytes - total]
        split = file_split(path, eval_fraction)
        digest.update(chunk)
        chunks[split].append(chunk)
        files.append((path, split, offsets[split], offsets[split] + len(chunk)))
        offsets[split] += len(chunk)
        total += len(chunk)
    data = {s: np.frombuffer(b"".join(c), dtype=np.uint8) for s, c in chunks.items()}
    return Corpus(data, tuple(files), digest.hexdigest(), total, max_bytes, float(eval_fraction), root)


@functools.lru_cache(maxsize=4)
def load_corpus(max_bytes: int = DEFAULT_MAX_BYTES, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> Corpus:
    """:func:`build_corpus` of the running Python's stdlib, cached per arguments."""
    return build_corpus(max_bytes, eval_fraction)


class Text:
    """text: random byte windows of the Python stdlib source (see module docstring)."""

    name = "text"
    vocab_size = 256

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES, eval_fraction: float = DEFAULT_EVAL_FRACTION,
                 seed: int = 0):
        self.seed = check_int("seed", seed, minimum=0)
        self.corpus = load_corpus(check_int("max_bytes", max_bytes, minimum=1), eval_fraction)
        # On the device once per corpus, outside any trace, so an outer jit sees concrete arrays.
        for s in ("train", "eval"):
            if s not in self.corpus.device:
                self.corpus.device[s] = jax.device_put(self.corpus.data[s])
        self._windows_jit = jax.jit(self._windows, static_argnums=(1, 2, 3))

    def options(self) -> dict:
        return {"max_bytes": self.corpus.max_bytes, "eval_fraction": self.corpus.eval_fraction}

    def max_size(self, length: int) -> int:
        """Every one of the ``length`` positions is predicted: the window size."""
        return self._check_length(length)

    def _check_length(self, length) -> int:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length {length!r} is too short for task 'text': it needs length >= 1")
        return int(length)

    def split_data(self, split: str) -> jax.Array:
        """The split's bytes as a uint8 device array."""
        return self.corpus.device[check_split(split)]

    def batch(self, key, batch_size: int, length: int, *, min_size: int | None = None,
              split: str = "train") -> dict:
        """``batch_size`` random windows: inputs / targets int32 [B, length], mask ones.

        ``min_size`` is accepted for a uniform trainer interface and ignored
        (text has no problem size).
        """
        batch_size = check_int("batch_size", batch_size, minimum=1)
        length = self._check_length(length)
        check_split(split)
        available = self.corpus.data[split].size
        if available < length + 1:
            raise ValueError(
                f"length {length} needs windows of {length + 1} bytes but the {split!r} split "
                f"holds {available}; raise max_bytes (now {self.corpus.max_bytes})"
            )
        if self.seed:
            key = jax.random.fold_in(key, self.seed)
        return self._windows_jit(key, batch_size, length, split)

    def _windows(self, key, batch_size, length, split):
        data = self.split_data(split)
        starts = jax.random.randint(key, (batch_size,), 0, data.shape[0] - length, dtype=jnp.int32)
        windows = jax.vmap(lambda s: jax.lax.dynamic_slice(data, (s,), (length + 1,)))(starts)
        windows = windows.astype(jnp.int32)
        return {
            "inputs": windows[:, :-1],
            "targets": windows[:, 1:],
            "mask": jnp.ones((batch_size, length), jnp.float32),
        }

    def metadata(self) -> dict:
        """Task name, options and the corpus facts (hash, bytes, Python version)."""
        return {"name": self.name, "vocab_size": self.vocab_size, "seed": self.seed, **self.corpus.metadata()}

    def __repr__(self) -> str:
        return f"Text(max_bytes={self.corpus.max_bytes}, eval_fraction={self.corpus.eval_fraction}, seed={self.seed})"

