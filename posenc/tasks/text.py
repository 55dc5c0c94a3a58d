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
SHA-256 as used and sizes (and the Python version for the stdlib); equal
hashes mean comparable results. Your files and memmaps are listed too,
each with its own SHA-256 (what ``sha256sum`` prints), size and split
(``files``; :mod:`posenc.tasks.corpus`, Provenance).

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
+ 1) L]``), the same held-out tokens for every run. Every evaluation length
scores the same first ``eval.tokens`` targets (:meth:`Text.eval_tokens`),
a whole number of windows at each length: ``eval.tokens="auto"`` (the
default) takes the largest such count the held-out split holds, at most
``AUTO_MAX_TOKENS`` (2**17): the largest multiple of every length's window
(their least common multiple; sliding windows: of ``eval.stride``, from
the lengths) with one more token for the last target.

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

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from posenc import checks
from posenc.tasks import corpus as corpus_lib
from posenc.tasks.base import check_int, check_split
from posenc.tasks.corpus import (  # noqa: F401  (re-exported: the stdlib corpus's helpers)
    DEFAULT_EVAL_FRACTION,
    DEFAULT_MAX_BYTES,
    EXCLUDED_DIRS,
    SEPARATOR,
    Corpus,
    build_corpus,
    file_split,
    load_corpus,
    stdlib_files,
    stdlib_root,
)
from posenc.tasks.registry import Registered

DEVICE_LIMIT = 2**28  # bytes: corpora up to this size are copied to the device
_INT32_SPAN = 2**31
AUTO = "auto"  # eval.tokens: the held-out split's whole windows at every length (Text.eval_tokens)
AUTO_MAX_TOKENS = 2**17  # eval.tokens="auto" scores at most this many targets per length


def check_eval_tokens(name, value):
    """``value`` (eval.tokens) if it is "auto" or an integer >= 1, else ValueError naming ``name``."""
    if isinstance(value, str) and value == AUTO:
        return AUTO
    if checks.is_int(value) and value >= 1:
        return int(value)
    raise ValueError(f"{name} must be 'auto' or an integer >= 1 (a whole number of windows at every "
                     f"eval.lengths); got {value!r}")


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
            max_bytes = check_int("task.options.max_bytes", max_bytes, minimum=1)
        self.device_limit = check_int("task.options.device_limit", device_limit, minimum=0)
        if path is not None and tokens is not None:
            raise ValueError("give one of task.options.path (text files) and task.options.tokens (a token "
                             "memmap), not both")
        if tokens is not None:
            if max_bytes is not None:
                raise ValueError("task.options.max_bytes applies to byte corpora (the stdlib or "
                                 "task.options.path), not to task.options.tokens: leave it unset")
            dtype = checks.choice("task.options.token_dtype", token_dtype, corpus_lib.TOKEN_DTYPES)
            self.corpus = corpus_lib.open_tokens(tokens, dtype, eval_fraction)
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
            vocab_size = check_int("task.options.vocab_size", vocab_size, minimum=self.corpus.max_token + 1,
                                   maximum=natural)
        self.vocab_size = (self.corpus.max_token + 1 if wide else 256) if vocab_size is None else vocab_size
        self._user_vocab = vocab_size
        self.on_device = self.corpus.nbytes <= self.device_limit
        if self.on_device:
            # On the device once per corpus, outside any trace, so an outer jit sees concrete arrays.
            for s in ("train", "eval"):
                if s not in self.corpus.device:
                    self.corpus.device[s] = jax.device_put(np.asarray(self.corpus.data[s]))
        self._windows_jit = jax.jit(self._windows, static_argnums=(1, 2, 3))
        self._auto_said = set()  # the (lengths, stride) whose eval.tokens="auto" count was logged

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
            field = "task.train_length" if split == "train" else "eval.lengths"
            raise ValueError(
                f"length {length} needs windows of {length + 1} tokens but the {split!r} split "
                f"holds {available}{self._split_origin(split)}; use a larger corpus or a shorter {field}"
                + (f" or raise task.options.max_bytes (now {self.corpus.max_bytes})"
                   if self.corpus.max_bytes is not None else "")
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
                             f"holds {self.corpus.data[split].size}{self._split_origin(split)}; use a larger "
                             "corpus or shorter eval.lengths")
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

    def scored_windows(self, tokens, length: int, stride: int | None = None) -> int:
        """How many windows score the first ``tokens`` targets of the held-out split at ``length``.

        ``tokens``: an integer or "auto" (:meth:`eval_tokens` of this one length). ValueError
        when it is not a whole number of windows' worth of targets or the split holds fewer
        than ``tokens`` + 1 tokens; the message names eval.tokens and a value that works.
        """
        tokens = self.eval_tokens(tokens, (length,), stride)
        step = length if stride is None else stride
        return 1 + (tokens - length) // step

    def eval_tokens(self, tokens, lengths, stride: int | None = None) -> int:
        """The held-out targets every one of ``lengths`` scores: ``tokens`` (eval.tokens) checked, or chosen.

        A count ``T`` is whole windows at length ``L`` when ``T = L + k S`` (``S = stride``, or
        ``L`` for non-overlapping windows) and fits when the held-out split holds ``T + 1``
        tokens. "auto": the largest ``T <= AUTO_MAX_TOKENS`` whole at every length that fits
        (non-overlapping: a multiple of the lengths' least common multiple), the same at
        each, said once in the log. An integer is checked; ValueError naming eval.tokens and
        a value that works (and task.options.eval_fraction when the split is too small).
        """
        lengths = sorted({int(n) for n in lengths})
        have = int(self.corpus.data["eval"].size)
        cap = have - 1  # the last scored target needs its input before it
        if isinstance(tokens, str) and tokens == AUTO:
            chosen = _largest_whole(min(AUTO_MAX_TOKENS, cap), lengths, stride)
            if chosen is None:
                raise ValueError(f"eval.tokens=auto: {self._no_count(lengths, stride, have)}")
            said = (tuple(lengths), stride)
            if said not in self._auto_said:
                self._auto_said.add(said)
                logging.info("eval.tokens auto: %d tokens at every length (the held-out split's %d tokens, "
                             "at most %d; whole %s of %s)", chosen, have, AUTO_MAX_TOKENS,
                             "windows" if stride is None else f"windows every {stride} tokens",
                             _span(lengths))
            return chosen
        tokens = check_eval_tokens("eval.tokens", tokens)
        for n in lengths:
            step = n if stride is None else stride
            if tokens < n or (tokens - n) % step:
                raise ValueError(f"eval.tokens={tokens} is not {n} + a multiple of {step} (the windows of "
                                 f"length {n}{'' if stride is None else f', eval.stride {stride}'}; every "
                                 f"length of {_span(lengths)} scores the same whole windows): "
                                 f"{self._instead(tokens, lengths, stride, have)}")
        if tokens + 1 > have:
            raise ValueError(f"eval.tokens={tokens} needs {tokens + 1} held-out tokens; the held-out split holds "
                             f"{have}{self._split_origin('eval')}: "
                             f"{self._instead(tokens, lengths, stride, have, grow=True)}")
        return tokens

    def _instead(self, tokens, lengths, stride, have, grow=False) -> str:
        """"use eval.tokens=N or auto": the working count nearest ``tokens`` (below it if any)."""
        cap = have - 1
        good = _largest_whole(min(tokens, cap), lengths, stride)
        if good is None:
            above = _smallest_whole(tokens, lengths, stride)
            good = above if above is not None and above <= cap else None
        if good is None:
            return f"no eval.tokens fits: {self._no_count(lengths, stride, have)}"
        return f"use eval.tokens={good} or auto" + (f", or {self._grow('eval')}" if grow else "")

    def _no_count(self, lengths, stride, have) -> str:
        """Why no count of held-out targets is whole windows at every length and fits."""
        if stride is not None and _incongruent(lengths, stride):
            gap = math.gcd(*(n - lengths[0] for n in lengths))
            ok = max(d for d in range(1, min(stride, lengths[0], gap) + 1) if gap % d == 0)
            return (f"with eval.text_protocol='sliding' length L scores L + a multiple of eval.stride={stride} "
                    f"targets, and eval.lengths {tuple(lengths)} differ by amounts that are not multiples of "
                    f"it: use an eval.stride that divides {gap} (e.g. {ok})")
        need = _smallest_whole(1, lengths, stride) + 1
        fit = [n for i, n in enumerate(lengths) if _smallest_whole(1, lengths[:i + 1], stride) + 1 <= have]
        keep = f"keep eval.lengths to {tuple(fit)}" if fit else "use shorter eval.lengths"
        return (f"one whole window at every length of {_span(lengths)} needs {need} held-out tokens; the "
                f"held-out split holds {have}{self._split_origin('eval')}: {keep}, {self._grow('eval')}")

    def _split_origin(self, split) -> str:
        """Where the split's size comes from, e.g. " (task.options.eval_fraction=0.1 of FILE)"."""
        c = self.corpus
        if c.split_rule == "files":
            return f" ({'train.bin' if split == 'train' else 'val.bin'} of task.options.tokens)"
        where = "the stdlib" if c.kind == "python-stdlib-source" else repr(c.root)
        if split == "eval":
            return f" (task.options.eval_fraction={c.eval_fraction} of {where})"
        return f" ({where} less its task.options.eval_fraction={c.eval_fraction})"

    def _grow(self, split) -> str:
        if self.corpus.split_rule == "files":
            return f"use a larger {'val.bin' if split == 'eval' else 'train.bin'}"
        return f"raise task.options.eval_fraction (now {self.corpus.eval_fraction}) or use a larger corpus"

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


def _span(lengths) -> str:
    """eval.lengths as a message says them: "eval.lengths 64..1024" or "eval.lengths (48, 64)"."""
    lengths = sorted(lengths)
    pow2 = all(b == 2 * a for a, b in zip(lengths, lengths[1:])) and len(lengths) > 2
    return f"eval.lengths {lengths[0]}..{lengths[-1]}" if pow2 else f"eval.lengths {tuple(lengths)}"


def _incongruent(lengths, stride) -> bool:
    return len({n % stride for n in lengths}) > 1


def _largest_whole(cap, lengths, stride):
    """The largest count <= ``cap`` of whole windows at every one of ``lengths`` (sorted), or None."""
    if stride is None:
        m = math.lcm(*lengths)
        return cap // m * m if cap >= m else None
    if _incongruent(lengths, stride):
        return None
    top = cap - (cap - lengths[0]) % stride
    return top if top >= lengths[-1] else None


def _smallest_whole(floor, lengths, stride):
    """The smallest count >= ``floor`` of whole windows at every one of ``lengths`` (sorted), or None."""
    if stride is None:
        m = math.lcm(*lengths)
        return max(-(-floor // m), 1) * m
    if _incongruent(lengths, stride):
        return None
    low = max(floor, lengths[-1])
    return low + (lengths[0] - low) % stride


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
