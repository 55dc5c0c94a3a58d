"""Corpora of the ``text`` task: the stdlib source (default), your own files, token memmaps.

Three sources, each read into a :class:`Corpus` whose ``data[split]`` is a
1-D NumPy array of token ids (bytes for the first two):

* stdlib (default): the ``.py`` files under ``sysconfig.get_paths()["stdlib"]``
  (skipping ``site-packages``, ``dist-packages``, ``__pycache__`` and the
  test directories ``test`` / ``tests`` / ``idle_test``), read as raw bytes,
  each followed by one NUL byte (``SEPARATOR``: NUL never occurs in the
  stdlib's source, so it marks document boundaries).
* ``path``: one text file, or every regular file under a directory (hidden
  names skipped), in the same layout. Read into memory. Binary files (a NUL
  byte, or more than 30% control characters, in their first 8000 bytes:
  :func:`is_binary`) are skipped with one warning naming them and how many
  (``skipped_files`` in metadata); a binary single file, or a directory
  with no text file left, is refused.
* ``tokens``: a pre-tokenized memmap in nanoGPT's layout (a flat array of
  little-endian ``uint16``, or ``uint8`` / ``uint32``, token ids with no header): either
  a directory holding ``train.bin`` and ``val.bin`` (the splits) or one
  ``.bin`` file. Opened with ``np.memmap``, never read whole into memory.

Splits: for the stdlib and for a directory of files, a file belongs to
"eval" when the first 8 bytes of SHA-256 of its relative path, read as a
fraction of 2**64, fall below ``eval_fraction`` (default 0.1), else to
"train", so the splits share no file and the held-out split is a sample of
the whole corpus (the stdlib of Python 3.12: 82 of its 686 files, 1.8 MB).
Within a split, files follow a second hash of their path (a uniform
sample, not the alphabetical head). The held-out files are read whole;
``max_bytes`` (default 8,000,000) bounds the training split, so every
``max_bytes`` evaluates on the same held-out text. If a directory's files
all fall in one split (few files), and always for a single file or a single
``.bin``, the first ``max_bytes`` are read and the last ``eval_fraction`` of
them is "eval" (``split_rule`` "tail" in metadata). ``train.bin`` /
``val.bin`` are the splits as given (``split_rule`` "files").

Provenance: ``sha256`` hashes the corpus *as used*: the concatenated bytes
(each file with its separator, after truncation) for the first two, the raw
bytes of the ``.bin`` file(s) in split order for memmaps; equal digests mean
the same training and held-out tokens. Each file read also gets its own
SHA-256 over its whole content on disk (:func:`file_sha256`: exactly what
``sha256sum FILE`` prints, whatever ``max_bytes`` kept), with its size
(``Corpus.checksums``). For your own files and memmaps the metadata lists
them, ``files``: ``[{path, sha256, bytes, used_bytes, split}]`` (``path``
relative to ``task.options.path`` / ``tokens`` for a directory, the file's
name for a single file; ``used_bytes`` of it in the corpus, fewer than
``bytes`` where ``max_bytes`` cut it; ``split`` "train", "eval", or
"train+eval" for a file the tail rule splits), so a reader checks a row
against a file with ``sha256sum``. The stdlib's hundreds of files are not
listed in every row (its ``python_version`` and the digest as used name
it); a directory's files that ``max_bytes`` left unread are not listed
either. :func:`describe` says a corpus in one line from its metadata.

A missing or unreadable path, an empty corpus or a split too small for one
token raise ValueError when the corpus is opened.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import sysconfig

import numpy as np
from absl import logging

SEPARATOR = b"\x00"
DEFAULT_MAX_BYTES = 8_000_000
DEFAULT_EVAL_FRACTION = 0.1
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})
TOKEN_DTYPES = ("uint8", "uint16", "uint32")  # uint32: vocabularies past 65536 ids (posenc.hf)
_HASH_CHUNK = 1 << 24  # bytes per read when hashing a memmap (16 MiB)
_SNIFF = 8000  # bytes is_binary reads (as git does)
_TEXT_BYTES = bytes({7, 8, 9, 10, 11, 12, 13, 27} | set(range(0x20, 0x100)) - {0x7F})


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


def user_files(root: str) -> list[str]:
    """Relative POSIX paths of every regular, non-hidden file under directory ``root``, sorted."""
    paths = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        rel = os.path.relpath(directory, root)
        for f in files:
            full = os.path.join(directory, f)
            if not f.startswith(".") and os.path.isfile(full):
                path = f if rel == "." else os.path.join(rel, f)
                paths.append(path.replace(os.sep, "/"))
    return sorted(paths)


def file_split(path: str, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> str:
    """"eval" or "train" for a relative path, from SHA-256 of the path (stable everywhere)."""
    h = int.from_bytes(hashlib.sha256(path.encode("utf-8")).digest()[:8], "big")
    return "eval" if h < eval_fraction * 2.0**64 else "train"


def check_fraction(eval_fraction) -> float:
    if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float)) or not (
            0.0 < eval_fraction < 1.0):
        raise ValueError(f"task.options.eval_fraction must be in (0, 1), got {eval_fraction!r} "
                         f"(e.g. {DEFAULT_EVAL_FRACTION}, the default)")
    return float(eval_fraction)


def is_binary(full: str) -> bool:
    """True if the file's first 8000 bytes hold a NUL byte or are more than 30% control characters.

    Text in any ASCII-compatible encoding (UTF-8, Latin-1, ...) passes; images, archives,
    compiled files and token arrays do not. An unreadable file is not binary (reading it
    later says why it cannot be read).
    """
    try:
        with open(full, "rb") as fh:
            head = fh.read(_SNIFF)
    except OSError:
        return False
    if SEPARATOR in head:
        return True
    return bool(head) and len(head.translate(None, _TEXT_BYTES)) > 0.3 * len(head)


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A corpus and its splits.

    ``data[split]`` is a 1-D array of token ids (``np.uint8`` bytes, or the
    memmap's dtype). ``files`` lists ``(path, split, start, stop)``: the
    file's tokens (with its separator, possibly truncated) are
    ``data[split][start:stop]``.
    """

    data: dict
    files: tuple
    sha256: str
    num_bytes: int  # tokens for a memmap (bytes for the byte corpora)
    max_bytes: int | None
    eval_fraction: float
    root: str
    kind: str = "python-stdlib-source"  # | "files" | "token-memmap"
    split_rule: str = "file"
    max_token: int = 255
    skipped: tuple = ()  # the binary files of a directory, left out (relative paths)
    # per entry of ``files``: (SHA-256 hex of the whole file on disk, its size in bytes)
    checksums: tuple = ()
    # split -> device array, filled on first use (outside any trace) and shared by tasks.
    device: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def nbytes(self) -> int:
        return int(sum(d.nbytes for d in self.data.values()))

    def file_records(self) -> list[dict]:
        """Each file read: ``{path, sha256, bytes, used_bytes, split}`` (module docstring, Provenance)."""
        cut = int(self.data["train"].size)
        records = []
        for (path, split, start, stop), (sha, size) in zip(self.files, self.checksums):
            if self.split_rule == "tail":  # one array cut at ``cut``: a file may straddle it
                split = "train" if stop <= cut else "eval" if start >= cut else "train+eval"
            # A memmap is used whole; a byte file's tokens are its bytes and its separator.
            used = size if self.kind == "token-memmap" else min(size, stop - start)
            records.append({"path": path, "sha256": sha, "bytes": size, "used_bytes": used, "split": split})
        return records

    def metadata(self) -> dict:
        counts = {s: sum(1 for f in self.files if f[1] == s) for s in ("train", "eval")}
        meta = {
            "corpus": self.kind,
            "sha256": self.sha256,
            "eval_fraction": self.eval_fraction,
            "split_rule": self.split_rule,
            "num_files": len(self.files),
            "train_files": counts["train"],
            "eval_files": counts["eval"],
        }
        if self.kind == "token-memmap":
            return {**meta, "tokens": self.root, "dtype": str(self.data["train"].dtype),
                    "num_tokens": self.num_bytes, "train_tokens": int(self.data["train"].size),
                    "eval_tokens": int(self.data["eval"].size), "max_token": self.max_token,
                    "files": self.file_records()}
        meta.update(num_bytes=self.num_bytes, max_bytes=self.max_bytes,
                    train_bytes=int(self.data["train"].size), eval_bytes=int(self.data["eval"].size),
                    separator=SEPARATOR.hex())
        if self.kind == "files":
            return {**meta, "path": self.root, "skipped_files": list(self.skipped), "files": self.file_records()}
        return {**meta, "python_version": platform.python_version(),
                "python_implementation": platform.python_implementation(), "stdlib_root": self.root}


def describe(meta: dict, most: int = 4) -> str:
    """A corpus in one line, from its metadata (a text row's ``task_metadata``): where it is and its hashes.

    A single file: its path, SHA-256 (``sha256sum``'s, the first 12 hex digits: the rows hold all
    64) and size; a directory: its path and its first ``most`` files' digests; the stdlib: the
    Python version and directory. Then the digest of the corpus as used. Rows written before
    files were listed give the path and the digest as used.
    """
    short = lambda sha: sha[:12]  # noqa: E731
    files = meta.get("files") or []
    kind = meta.get("corpus")
    if kind == "python-stdlib-source":
        where = (f"the {meta.get('python_implementation', 'Python')} {meta.get('python_version', '?')} standard "
                 f"library source (`{meta.get('stdlib_root', '?')}`)")
    else:
        root = meta.get("tokens" if kind == "token-memmap" else "path", "?")
        where = f"`{root}`" + (" (token memmap)" if kind == "token-memmap" else "")
        if len(files) == 1 and os.path.basename(str(root)) == files[0]["path"]:
            where += f": sha256 {short(files[0]['sha256'])}, {files[0]['bytes']:,} bytes"
        elif files:
            named = "; ".join(f"{f['path']} sha256 {short(f['sha256'])} ({f['split']})" for f in files[:most])
            more = f"; {len(files) - most} more in task_metadata.files" if len(files) > most else ""
            where += f", {len(files)} files: {named}{more}"
    return f"{where}; as used: sha256 {short(meta.get('sha256') or '?')}"


def _order_key(path: str) -> bytes:
    # A second hash, independent of the split's: files in this order are a uniform sample.
    return hashlib.sha256(b"order\0" + path.encode("utf-8")).digest()


def file_sha256(path) -> tuple[str, int]:
    """``(SHA-256 hex, size in bytes)`` of a file's bytes on disk, read in chunks: what ``sha256sum`` prints."""
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256")
        return digest.hexdigest(), fh.tell()


def _read(root, path, budget, digest):
    """``(chunk, (sha256, size))``: the file's first ``budget`` bytes of content + separator, and the
    whole file's own digest and size (the rest of a cut file is hashed in chunks, not kept)."""
    full = root if path is None else os.path.join(root, path)
    try:
        with open(full, "rb") as fh:
            head = fh.read() if budget is None else fh.read(budget)
            own = hashlib.sha256(head)
            if budget is not None and len(head) == budget:  # cut (or exactly full): hash what is left
                while block := fh.read(_HASH_CHUNK):
                    own.update(block)
            size = fh.tell()
    except OSError as e:
        raise ValueError(f"cannot read corpus file {full!r}: {e.strerror or e}") from None
    chunk = head + SEPARATOR if budget is None else (head + SEPARATOR)[:budget]
    digest.update(chunk)
    return chunk, (own.hexdigest(), size)


def _concatenate(root, paths, max_bytes, eval_fraction, kind, skipped=()):
    """Read ``paths`` under ``root`` into a byte Corpus (file split, tail fallback)."""
    digest = hashlib.sha256()
    splits = {p: file_split(p, eval_fraction) for p in paths} if len(paths) > 1 else {}
    rule = "file" if len(set(splits.values())) == 2 or (kind == "python-stdlib-source" and splits) else "tail"
    if rule == "file":
        parts, files, checksums = {"train": [], "eval": []}, [], []
        offsets = {"train": 0, "eval": 0}
        for split in ("eval", "train"):  # the held-out files whole, then training files up to max_bytes
            for path in sorted((p for p in paths if splits[p] == split), key=_order_key):
                budget = None if split == "eval" or max_bytes is None else max_bytes - offsets["train"]
                if budget is not None and budget <= 0:
                    break
                chunk, checksum = _read(root, path, budget, digest)
                parts[split].append(chunk)
                files.append((path, split, offsets[split], offsets[split] + len(chunk)))
                checksums.append(checksum)
                offsets[split] += len(chunk)
        data = {s: np.frombuffer(b"".join(c), dtype=np.uint8) for s, c in parts.items()}
        total = offsets["train"] + offsets["eval"]
    else:
        chunks, names, checksums, total = [], [], [], 0
        for path in paths:
            if max_bytes is not None and total >= max_bytes:
                break
            chunk, checksum = _read(root, path, None if max_bytes is None else max_bytes - total, digest)
            chunks.append(chunk)
            checksums.append(checksum)
            names.append(os.path.basename(root) if path is None else path)
            total += len(chunks[-1])
        joined = np.frombuffer(b"".join(chunks), dtype=np.uint8)
        cut = _tail_cut(joined.size, eval_fraction, root)
        data = {"train": joined[:cut], "eval": joined[cut:]}
        files, start = [], 0
        for name, chunk in zip(names, chunks):
            files.append((name, "train" if start < cut else "eval", start, start + len(chunk)))
            start += len(chunk)
    return Corpus(data, tuple(files), digest.hexdigest(), total, max_bytes, eval_fraction, root,
                  kind=kind, split_rule=rule, skipped=tuple(skipped), checksums=tuple(checksums))


def _tail_cut(size, eval_fraction, where):
    cut = int(round(size * (1.0 - eval_fraction)))
    if cut < 1 or cut >= size:
        raise ValueError(f"corpus {where!r} has {size} tokens: too few to split into train and eval "
                         f"at task.options.eval_fraction={eval_fraction}; use a larger corpus")
    return cut


def build_corpus(max_bytes: int = DEFAULT_MAX_BYTES, eval_fraction: float = DEFAULT_EVAL_FRACTION,
                 root: str | None = None) -> Corpus:
    """Read the stdlib corpus from disk (uncached; see :func:`load_corpus`)."""
    from posenc.tasks.base import check_int

    max_bytes = check_int("max_bytes", max_bytes, minimum=1)
    eval_fraction = check_fraction(eval_fraction)
    root = stdlib_root() if root is None else root
    return _concatenate(root, stdlib_files(root), max_bytes, eval_fraction, "python-stdlib-source")


def check_path(path, option="path") -> str:
    """``path`` as an absolute path if it names a readable file or directory, else ValueError."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"{option} must be a file or directory path, got {path!r}")
    full = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if not os.path.exists(full):
        raise ValueError(f"{option} {os.fspath(path)!r} does not exist")
    if not os.access(full, os.R_OK | (os.X_OK if os.path.isdir(full) else 0)):
        raise ValueError(f"{option} {os.fspath(path)!r} is not readable")
    return full


def _fingerprint(full, paths):
    """What the cache of a path corpus is keyed on: names, sizes and modification times."""
    stats = [os.stat(full if p is None else os.path.join(full, p)) for p in paths]
    return tuple((p, s.st_size, s.st_mtime_ns) for p, s in zip(paths, stats))


def path_files(full) -> list:
    """The corpus files of a checked path: ``[None]`` for a single file, else relative paths."""
    if os.path.isfile(full):
        return [None]
    paths = user_files(full)
    if not paths:
        raise ValueError(f"task.options.path {full!r} holds no readable files (hidden names are skipped)")
    return paths


def _named(paths, most=10) -> str:
    shown = ", ".join(paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def text_files(full, paths) -> tuple[list, list]:
    """``(text, binary)``: ``paths`` (of :func:`path_files`) split by :func:`is_binary`.

    ValueError if no text file is left: a binary single file, or a directory of binary files.
    """
    if paths == [None]:
        if is_binary(full):
            raise ValueError(f"task.options.path {full!r} is not a text file (a NUL byte or over 30% control "
                             f"characters in its first {_SNIFF} bytes): give text files, or token ids as "
                             "task.options.tokens (a .bin memmap)")
        return paths, []
    binary = [p for p in paths if is_binary(os.path.join(full, p))]
    skip = set(binary)
    text = [p for p in paths if p not in skip]
    what = f"(a NUL byte or over 30% control characters in the first {_SNIFF} bytes)"
    if not text:
        raise ValueError(f"task.options.path {full!r} holds no text files: every one of its {len(paths)} "
                         f"files is binary {what}: {_named(binary)}")
    if binary:
        logging.warning("task.options.path %s: skipped %d binary file%s of %d %s: %s", full, len(binary),
                        "" if len(binary) == 1 else "s", len(paths), what, _named(binary))
    return text, binary


@functools.lru_cache(maxsize=8)
def _load_path(full, fingerprint, max_bytes, eval_fraction):
    del fingerprint  # part of the cache key only
    text, binary = text_files(full, path_files(full))
    return _concatenate(full, text, max_bytes, eval_fraction, "files", binary)


def load_path_corpus(path, max_bytes=None, eval_fraction=DEFAULT_EVAL_FRACTION) -> Corpus:
    """The byte corpus of a file or directory, cached per (path, file sizes and times, options)."""
    full = check_path(path, "task.options.path")
    return _load_path(full, _fingerprint(full, path_files(full)), max_bytes, check_fraction(eval_fraction))


@functools.lru_cache(maxsize=4)
def load_corpus(max_bytes: int = DEFAULT_MAX_BYTES, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> Corpus:
    """:func:`build_corpus` of the running Python's stdlib, cached per arguments."""
    return build_corpus(max_bytes, eval_fraction)


def _scan(files):
    """``(sha256, top, checksums)``: SHA-256 of the files' bytes in order, their largest token and each
    file's own ``(sha256, size in bytes)``, in one pass of chunks."""
    digest, top, checksums = hashlib.sha256(), 0, []
    for mm in files:
        raw, own = mm.view(np.uint8), hashlib.sha256()
        step = _HASH_CHUNK // mm.itemsize * mm.itemsize
        for start in range(0, raw.size, step):
            chunk = raw[start:start + step]
            digest.update(chunk)
            own.update(chunk)
            top = max(top, int(chunk.view(mm.dtype).max()))
        checksums.append((own.hexdigest(), int(raw.size)))
    return digest.hexdigest(), top, tuple(checksums)


@functools.lru_cache(maxsize=8)
def _open_tokens(full, fingerprint, dtype, eval_fraction):
    del fingerprint
    if os.path.isdir(full):
        names = ("train.bin", "val.bin")
        missing = [n for n in names if not os.path.isfile(os.path.join(full, n))]
        if missing:
            raise ValueError(f"task.options.tokens directory {full!r} lacks {', '.join(missing)} (nanoGPT layout: "
                             f"train.bin and val.bin)")
        maps = [_memmap(os.path.join(full, n), dtype) for n in names]
        data = {"train": maps[0], "eval": maps[1]}
        files = (("train.bin", "train", 0, maps[0].size), ("val.bin", "eval", 0, maps[1].size))
        rule = "files"
    else:
        mm = _memmap(full, dtype)
        maps = [mm]
        cut = _tail_cut(mm.size, eval_fraction, full)
        data = {"train": mm[:cut], "eval": mm[cut:]}
        files = ((os.path.basename(full), "train", 0, mm.size),)
        rule = "tail"
    sha, top, checksums = _scan(maps)
    return Corpus(data, files, sha, int(sum(m.size for m in maps)), None, eval_fraction, full,
                  kind="token-memmap", split_rule=rule, max_token=top, checksums=checksums)


def _memmap(path, dtype):
    size = os.path.getsize(path)
    itemsize = np.dtype(dtype).itemsize
    if size == 0 or size % itemsize:
        raise ValueError(f"token file {path!r} has {size} bytes: not a non-empty array of {dtype}")
    try:
        return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")
    except OSError as e:
        raise ValueError(f"cannot read token file {path!r}: {e.strerror or e}") from None


def open_tokens(path, dtype="uint16", eval_fraction=DEFAULT_EVAL_FRACTION) -> Corpus:
    """The token memmap corpus at ``path`` (cached per path, file sizes and times, options)."""
    full = check_path(path, "task.options.tokens")
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"unknown task.options.token_dtype {dtype!r}; choose one of: {', '.join(TOKEN_DTYPES)}")
    names = [n for n in ("train.bin", "val.bin") if os.path.isfile(os.path.join(full, n))]
    if not os.path.isdir(full):
        names = [None]
    return _open_tokens(full, _fingerprint(full, names), dtype, check_fraction(eval_fraction))
