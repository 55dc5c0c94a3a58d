"""Byte-level stdlib text: corpus hash and content, file-disjoint splits, real windows, jit, errors."""

import hashlib
import json
import os
import platform
import time

import jax
import numpy as np
import pytest

import posenc.tasks as tasks
from posenc.tasks import text

SMALL = 400_000  # bytes: a small corpus keeps the jit constant and the compile small
FRACTION = 0.3  # a large eval share so the small corpus has eval files


@pytest.fixture(scope="module")
def task():
    return tasks.make("text", max_bytes=SMALL, eval_fraction=FRACTION)


def raw_bytes(path):
    with open(os.path.join(text.stdlib_root(), path), "rb") as fh:
        return fh.read()


def test_hash_is_stable_and_matches_an_independent_read():
    first, second = text.build_corpus(SMALL, FRACTION), text.build_corpus(SMALL, FRACTION)
    assert first.sha256 == second.sha256 and first.num_bytes == second.num_bytes == SMALL
    # The corpus is the sorted files, each followed by NUL, truncated: recompute its hash directly.
    joined = b"".join(raw_bytes(p) + b"\x00" for p in sorted(text.stdlib_files()))[:SMALL]
    assert hashlib.sha256(joined).hexdigest() == first.sha256
    # Reassembling the splits file by file in corpus order gives the same bytes.
    pieces = [first.data[split][start:stop].tobytes() for _, split, start, stop in first.files]
    assert b"".join(pieces) == joined
    assert text.build_corpus(SMALL - 1, FRACTION).sha256 != first.sha256


def test_file_list_is_sorted_stdlib_source_without_tests_or_site_packages():
    files = text.stdlib_files()
    assert files == sorted(files) and len(files) > 100
    assert all(f.endswith(".py") for f in files)
    for f in files:
        assert not set(f.split("/")[:-1]) & text.EXCLUDED_DIRS, f
    assert "os.py" in files and "json/decoder.py" in files


def test_splits_are_disjoint_by_file(task):
    corpus = task.corpus
    by_split = {s: {p for p, split, _, _ in corpus.files if split == s} for s in ("train", "eval")}
    assert by_split["train"] and by_split["eval"]
    assert not by_split["train"] & by_split["eval"]
    for i, (path, split, start, stop) in enumerate(corpus.files):
        assert split == text.file_split(path, FRACTION)
        content = raw_bytes(path) + b"\x00"
        piece = corpus.data[split][start:stop].tobytes()
        # Only the last file may be cut by max_bytes.
        assert piece == content if i < len(corpus.files) - 1 else content.startswith(piece)
    assert sum(c.size for c in corpus.data.values()) == SMALL


def test_default_split_holds_about_five_percent_of_files():
    files = text.stdlib_files()
    share = np.mean([text.file_split(f) == "eval" for f in files])
    assert 0.02 < share < 0.10
    # Stable per path, and monotone in the fraction (a larger eval set contains the smaller).
    assert all(text.file_split(f, 0.5) == "eval" for f in files if text.file_split(f) == "eval")


@pytest.mark.parametrize("split", ["train", "eval"])
def test_windows_are_real_slices_of_their_split(task, split):
    batch = task.batch(jax.random.key(0), 8, 64, split=split)
    inputs, targets, mask = (np.asarray(batch[k]) for k in ("inputs", "targets", "mask"))
    assert inputs.shape == targets.shape == mask.shape == (8, 64)
    assert inputs.dtype == targets.dtype == np.int32 and mask.dtype == np.float32
    np.testing.assert_array_equal(mask, 1.0)
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
    data = task.corpus.data[split].tobytes()
    for row_in, row_t in zip(inputs, targets):
        window = np.concatenate([row_in[:1], row_t]).astype(np.uint8).tobytes()
        assert window in data
    assert 0 <= inputs.min() and inputs.max() < task.vocab_size == 256


def test_determinism_and_single_trace_per_shape(task):
    traces = []

    def batch(key, batch_size, length):
        traces.append((batch_size, length))
        return task.batch(key, batch_size, length)

    jitted = jax.jit(batch, static_argnums=(1, 2))
    a, b, c = (jitted(jax.random.key(k), 4, 32) for k in (1, 1, 2))
    assert traces == [(4, 32)]
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    assert not np.array_equal(a["inputs"], c["inputs"])
    np.testing.assert_array_equal(a["inputs"], task.batch(jax.random.key(1), 4, 32)["inputs"])
    # min_size is accepted and ignored: text has no problem size.
    np.testing.assert_array_equal(task.batch(jax.random.key(1), 4, 32, min_size=7)["inputs"], a["inputs"])
    assert task.max_size(32) == 32


def test_metadata_records_hash_size_and_python_version():
    start = time.perf_counter()
    corpus = text.build_corpus()  # the default 8 MB corpus, uncached
    assert time.perf_counter() - start < 10.0  # "a few seconds at most"; generous for a busy CPU
    meta = json.loads(json.dumps(tasks.make("text").metadata()))
    assert meta["sha256"] == corpus.sha256 and len(meta["sha256"]) == 64
    assert meta["num_bytes"] == meta["max_bytes"] == text.DEFAULT_MAX_BYTES == 8_000_000
    assert meta["train_bytes"] + meta["eval_bytes"] == meta["num_bytes"]
    assert meta["python_version"] == platform.python_version()
    assert meta["name"] == "text" and meta["vocab_size"] == 256 and meta["eval_fraction"] == 0.05
    first, second = tasks.make("text"), tasks.make("text", seed=3)
    assert first.corpus is second.corpus  # read once and cached
    assert first.split_data("train") is second.split_data("train")  # one device copy


def test_errors(task):
    eval_bytes = task.corpus.data["eval"].size
    too_long = eval_bytes  # needs eval_bytes + 1 bytes
    with pytest.raises(ValueError, match=f"length {too_long} needs windows of {too_long + 1} bytes.*'eval'"):
        task.batch(jax.random.key(0), 2, too_long, split="eval")
    with pytest.raises(ValueError, match="length 0 is too short for task 'text'.*>= 1"):
        task.batch(jax.random.key(0), 2, 0)
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        task.batch(jax.random.key(0), 2, 8, split="valid")
    with pytest.raises(ValueError, match="unknown option 'bytes' for task 'text'; choose from: max_bytes, eval_fraction"):
        tasks.make("text", bytes=10)
    with pytest.raises(ValueError, match="eval_fraction must be in \\(0, 1\\), got 1.5"):
        tasks.make("text", eval_fraction=1.5)
    with pytest.raises(ValueError, match="max_bytes must be an integer >= 1, got 0"):
        tasks.make("text", max_bytes=0)
