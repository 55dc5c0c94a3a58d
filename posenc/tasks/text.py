"""Language modelling on a corpus: the Python stdlib source by default, or your own text or tokens.

A real-text counterpart of the synthetic tasks that needs no download. The
corpus (:mod:`posenc.tasks.corpus`) is one of

* the stdlib's ``.py`` source as bytes (default; ``max_bytes`` 8,000,000);
* ``path=``: a text file or a directory of text files, as bytes;
* ``tokens=``: a nanoGPT-style ``.bin`` memmap (``token_dtype`` "uint16"
  default, "uint8", or "uint32" for vocabularies past 65536 ids), a file or a directory with ``train.bin`` /
  ``val.bin``, for corpora larger than memory.

Vocabulary: bytes are their own ids (256, no special tokens); for a memmap
the ids are the stored tokens and ``vocab_size`` is the option, else the
largest stored id + 1 (256 for "uint8"). The corpus differs between
machines (Python version, your files), so ``metadata()`` records its
SHA-256 and sizes (and the Python version for the stdlib); equal hashes
mean comparable results.

``batch`` draws ``batch_size`` windows of ``length + 1`` tokens from the
split at start offsets ``jax.random.randint(key, (B,), 0, N - length)``
(uniform; windows may span a document boundary), with ``inputs = w[:-1]``,
``targets = w[1:]`` and ``mask`` all ones: every position is predicted, as
in the language-modelling evaluations of length extrapolation (Press et al.
2022 ALiBi; Chi et al. 2022 KERPLE: perplexity at lengths beyond
training). Example window (length 8)::

    w        i m p o r t   o s        (bytes 105 109 112 ...)
    inputs   i m p o r t   o
    targets  m p o r t   o s
    mask     1 1 1 1 1 1 1 1

Evaluation uses ``sequential_batch`` instead: consecutive non-overlapping
windows from the start of the split (window ``w`` holds tokens ``[w L, (w
+ 1) L]``), the same held-out tokens for every run.

Where the windows come from: a corpus of at most ``device_limit`` bytes
(default 256 MiB; the 8 MB stdlib corpus is far below) is copied to the
device once, when the first task on it is made, and ``batch`` slices it
there (under ``jit`` the splits are compile-time constants: one copy per
compiled length). A larger corpus stays on the host: ``batch`` draws the
same start offsets on the device and a ``jax.pure_callback`` slices the
windows out of the memmap (reading only those ``B * (length + 1)`` tokens),
so batches are still a pure function of the key, work under ``jit`` and
``vmap``, and equal those of the device path for the same corpus. Splits of
2**31 tokens or more draw each offset from two 32-bit words instead
(``(hi * 2**32 + lo) mod (N - length)``), which int32 offsets cannot reach.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.tasks import corpus as corpus_lib
from posenc.tasks.base import check_int, check_split
from posenc.tasks.corpus import (  # noqa: F401  (re-exported: the stdlib corpus's helpers)
    DEFAULT_EVAL_FRACTION, DEFAULT_MAX_BYTES, EXCLUDED_DIRS, SEPARATOR, Corpus, build_corpus, file_split,
    load_corpus, stdlib_files, stdlib_root)
from posenc.tasks.registry import Registered

DEVICE_LIMIT = 2**28  # bytes: corpora up to this size are copied to the device
_INT32_SPAN = 2**31


class Text(Registered):
    """text: random windows of a corpus: stdlib source, your files or a token memmap (module docstring)."""

    names = ("text",)
    description = "language modelling on the Python stdlib source (bytes), your own files or a token memmap"
    source = ("Press et al. 2022 (ALiBi) and Chi et al. 2022 (KERPLE) perplexity-vs-length protocol; "
              "nanoGPT .bin layout for token memmaps")
    level = None

    def __init__(self, *, max_bytes: int | None = None, eval_fraction: float = DEFAULT_EVAL_FRACTION,
                 path: str | None = None, tokens: str | None = None, token_dtype: str = "uint16",
                 vocab_size: int | None = None, device_limit: int = DEVICE_LIMIT, seed: int = 0):
        self.seed = check_int("seed", seed, minimum=0)
        if max_bytes is not None:
            max_bytes = check_int("max_bytes", max_bytes, minimum=1)
        self.device_limit = check_int("device_limit", device_limit, minimum=0)
        if path is not None and tokens is not None:
            raise ValueError("give one of path (text files) and tokens (a token memmap), not both")
        if tokens is not None:
            if max_bytes is not None:
                raise ValueError("max_bytes applies to byte corpora (the stdlib or path), not to tokens")
            self.corpus = corpus_lib.open_tokens(tokens, checks.choice("token_dtype", token_dtype,
                                                                       corpus_lib.TOKEN_DTYPES), eval_fraction)
        elif path is not None:
            self.corpus = corpus_lib.load_path_corpus(path, max_bytes, eval_fraction)
        else:
            self.corpus = load_corpus(DEFAULT_MAX_BYTES if max_bytes is None else max_bytes,
                                      corpus_lib.check_fraction(eval_fraction))
        self.max_bytes, self.eval_fraction = max_bytes, self.corpus.eval_fraction
        # As given (str, so metadata stays JSON); the corpus records the absolute path.
        self.path, self.tokens = (None if p is None else os.fspath(p) for p in (path, tokens))
        self.token_dtype = token_dtype
        wide = tokens is not None and token_dtype in ("uint16", "uint32")
        natural = {"uint16": 65536, "uint32": 2 ** 31}.get(token_dtype, 256) if wide else 256
        if vocab_size is not None:
            vocab_size = check_int("vocab_size", vocab_size, minimum=self.corpus.max_token + 1, maximum=natural)
        self.vocab_size = (self.corpus.max_token + 1 if wide else 256) if vocab_size is None else vocab_size
        self._user_vocab = vocab_size
        self.on_device = self.corpus.nbytes <= self.device_limit
        if self.on_device:
            # On the device once per corpus, outside any trace, so an outer jit sees concrete arrays.
            for s in ("train", "eval"):
                if s not in self.corpus.device:
                    self.corpus.device[s] = jax.device_put(np.asarray(self.corpus.data[s]))
        self._windows_jit = jax.jit(self._windows, static_argnums=(1, 2, 3))

    def options(self) -> dict:
        opts = super().options()
        opts["vocab_size"] = self._user_vocab
        return opts

    def max_size(self, length: int) -> int:
        """Every one of the ``length`` positions is predicted: the window size."""
        return self._check_length(length)

    def min_length(self) -> int:
        return 1

    def _check_length(self, length) -> int:
        if not checks.is_int(length) or length < 1:
            raise ValueError(f"length {length!r} is too short for task 'text': it needs length >= 1")
        return int(length)

    def split_data(self, split: str) -> jax.Array:
        """The split's tokens as a device array (only for corpora within ``device_limit``)."""
        if not self.on_device:
            raise ValueError(f"this corpus has {self.corpus.nbytes} bytes > device_limit "
                             f"{self.device_limit}: it stays on the host")
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
                f"length {length} needs windows of {length + 1} tokens but the {split!r} split "
                f"holds {available}; use a larger corpus"
                + (f" or raise max_bytes (now {self.corpus.max_bytes})" if self.tokens is None else "")
            )
        if self.seed:
            key = jax.random.fold_in(key, self.seed)
        return self._windows_jit(key, batch_size, length, split)

    def sequential_batch(self, index, batch_size: int, length: int, *, split: str = "eval",
                         count: int | None = None, stride: int | None = None) -> dict:
        """Batch ``index`` of the split's consecutive windows, from its first token.

        Row ``r`` is window ``w = index * batch_size + r``, tokens ``[w S, w S + L]``
        (``L + 1`` tokens; ``inputs = w[:-1]``, ``targets = w[1:]``) with step
        ``S = stride or L``. Non-overlapping (``stride`` None, Press et al.
        2022's main tables): the targets of windows 0, 1, 2, ... tile the split
        with no overlap and no gap. Sliding (``stride`` S < L, their
        appendix): every window after the first scores only its last S targets,
        so each token is scored once, with up to L - S tokens of context.
        ``count`` windows are scored (default: every whole window); rows past
        them repeat window 0 with mask 0. No key: the same windows for every run
        and task seed; ``index`` may be traced.
        """
        batch_size = check_int("batch_size", batch_size, minimum=1)
        step = length if stride is None else check_int("stride", stride, minimum=1, maximum=length)
        available = (self.corpus.data[check_split(split)].size - 1 - length) // step + 1
        if available < 1:
            raise ValueError(f"length {length} needs windows of {length + 1} tokens but the {split!r} split "
                             f"holds {self.corpus.data[split].size}; use a larger corpus")
        count = available if count is None else int(count)
        if count > available:
            raise ValueError(f"{count} windows of {length} tokens (step {step}) need "
                             f"{(count - 1) * step + length + 1} tokens; the {split!r} split holds "
                             f"{self.corpus.data[split].size}")
        w = jnp.asarray(index, jnp.int32) * batch_size + jnp.arange(batch_size, dtype=jnp.int32)
        valid = w < count
        w = jnp.where(valid, w, 0)
        if self.on_device:
            data = self.split_data(split)
            windows = jax.vmap(lambda s: jax.lax.dynamic_slice(data, (s,), (length + 1,)))(w * step)
        else:
            windows = _host_sequential(self.corpus.data[split], w, length, step)
        windows = windows.astype(jnp.int32)
        scored = jnp.arange(length)[None, :] >= (length - step)  # the targets no earlier window scored
        scored = scored | (w[:, None] == 0)
        mask = (valid[:, None] & scored).astype(jnp.float32)
        return {"inputs": windows[:, :-1], "targets": windows[:, 1:], "mask": mask}

    def scored_windows(self, tokens: int, length: int, stride: int | None = None) -> int:
        """How many windows score the first ``tokens`` targets of the held-out split at ``length``.

        ValueError when ``tokens`` is not a whole number of windows' worth of targets or the
        split holds fewer than ``tokens`` + 1 tokens.
        """
        step = length if stride is None else stride
        first = length  # the first window scores all of its targets
        if tokens < first or (tokens - first) % step:
            raise ValueError(f"eval.tokens={tokens} is not {first} + a multiple of {step} (the windows of "
                             f"length {length}{'' if stride is None else f', stride {stride}'})")
        need, have = tokens + 1, int(self.corpus.data["eval"].size)
        if need > have:
            raise ValueError(f"eval.tokens={tokens} needs {need} held-out tokens; the held-out split holds "
                             f"{have} (raise eval_fraction, use a larger corpus or lower eval.tokens)")
        return 1 + (tokens - first) // step

    def _windows(self, key, batch_size, length, split):
        span = self.corpus.data[split].shape[0] - length  # number of valid start offsets
        if self.on_device:
            data = self.split_data(split)
            starts = jax.random.randint(key, (batch_size,), 0, span, dtype=jnp.int32)
            windows = jax.vmap(lambda s: jax.lax.dynamic_slice(data, (s,), (length + 1,)))(starts)
        else:
            windows = _host_windows(self.corpus.data[split], key, batch_size, length, span)
        windows = windows.astype(jnp.int32)
        return {
            "inputs": windows[:, :-1],
            "targets": windows[:, 1:],
            "mask": jnp.ones((batch_size, length), jnp.float32),
        }

    def metadata(self) -> dict:
        """Task name, options and the corpus facts (hash, sizes; Python version for the stdlib)."""
        return {**self.describe(), "vocab_size": self.vocab_size, "seed": self.seed,
                "batches_from": "device" if self.on_device else "host", **self.corpus.metadata()}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items() if v is not None)
        return f"Text({opts}, seed={self.seed})"


def _host_windows(data, key, batch_size, length, span):
    """Windows [B, length + 1] sliced on the host out of ``data`` (a memmap) by a pure callback."""
    if span < _INT32_SPAN:
        draws = jax.random.randint(key, (batch_size,), 0, span, dtype=jnp.int32)
    else:
        draws = jax.random.bits(key, (batch_size, 2), dtype=jnp.uint32)

    def slice_windows(draws):
        draws = np.asarray(draws)
        if span < _INT32_SPAN:
            starts = draws.astype(np.int64)
        else:
            words = draws.astype(np.uint64)
            starts = ((words[..., 0] << np.uint64(32)) | words[..., 1]) % np.uint64(span)
        flat = starts.reshape(-1)
        out = np.empty((flat.size, length + 1), np.int32)
        for i, s in enumerate(flat.tolist()):  # contiguous reads: only the windows leave the disk
            out[i] = data[s:s + length + 1]
        return out.reshape(*starts.shape, length + 1)

    shape = (batch_size, length + 1)
    return jax.pure_callback(slice_windows, jax.ShapeDtypeStruct(shape, jnp.int32), draws,
                             vmap_method="expand_dims")


def _host_sequential(data, w, length, step):
    """Windows [B, length + 1] from token ``w * step`` of ``data`` (a memmap), by a pure callback."""

    def slice_windows(w):
        starts = np.asarray(w).astype(np.int64) * step  # int64: past 2**31 tokens too
        out = np.empty((*starts.shape, length + 1), np.int32)
        for i, s in np.ndenumerate(starts):
            out[i] = data[s:s + length + 1]
        return out

    shape = jax.ShapeDtypeStruct((*w.shape, length + 1), jnp.int32)
    return jax.pure_callback(slice_windows, shape, w, vmap_method="expand_dims")
