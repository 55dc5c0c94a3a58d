"""Text: stdlib corpus hash and content, own files, token memmaps, host / device windows, jit, errors."""

import hashlib
import importlib.util
import json
import logging
import os
import platform
import time

import jax
import numpy as np
import pytest

import posenc.tasks as tasks
from posenc.tasks import text

SMALL = 400_000  # training bytes: a small corpus keeps the jit constant and the compile small
FRACTION = 0.1


def order(path):
    """The order of files within a split: a second hash of the path (a uniform sample)."""
    return hashlib.sha256(b"order\0" + path.encode()).digest()


def layout(files, read, fraction, max_bytes):
    """(held-out bytes, training bytes) of the file rule, computed from the files alone."""
    held = sorted((p for p in files if text.file_split(p, fraction) == "eval"), key=order)
    train = sorted((p for p in files if text.file_split(p, fraction) == "train"), key=order)
    joined = b"".join(read(p) + b"\x00" for p in train)
    return b"".join(read(p) + b"\x00" for p in held), joined if max_bytes is None else joined[:max_bytes]


@pytest.fixture(scope="module")
def task():
    return tasks.make("text", max_bytes=SMALL, eval_fraction=FRACTION)


def raw_bytes(path):
    with open(os.path.join(text.stdlib_root(), path), "rb") as fh:
        return fh.read()


def test_hash_is_stable_and_matches_an_independent_read():
    first, second = text.build_corpus(SMALL, FRACTION), text.build_corpus(SMALL, FRACTION)
    assert first.sha256 == second.sha256 and first.num_bytes == second.num_bytes
    # The held-out files whole, then the training files up to max_bytes, each followed by NUL.
    held, train = layout(text.stdlib_files(), raw_bytes, FRACTION, SMALL)
    assert first.data["eval"].tobytes() == held and first.data["train"].tobytes() == train
    assert hashlib.sha256(held + train).hexdigest() == first.sha256
    assert first.num_bytes == len(held) + SMALL
    # Reassembling the splits file by file in corpus order gives the same bytes.
    pieces = [first.data[split][start:stop].tobytes() for _, split, start, stop in first.files]
    assert b"".join(pieces) == held + train
    smaller = text.build_corpus(SMALL - 1, FRACTION)
    assert smaller.sha256 != first.sha256 and smaller.data["eval"].tobytes() == held  # the same held-out text


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
    assert corpus.data["train"].size == SMALL


def test_default_split_holds_about_ten_percent_of_files_and_200_kb():
    files = text.stdlib_files()
    share = np.mean([text.file_split(f) == "eval" for f in files])
    assert 0.05 < share < 0.2
    meta = text.build_corpus(2_000_000).metadata()  # the quick grids' budget: the same held-out split
    assert meta["eval_bytes"] >= 200_000 and meta["eval_files"] >= 20, meta
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
    assert meta["train_bytes"] == meta["max_bytes"] == text.DEFAULT_MAX_BYTES == 8_000_000
    assert meta["train_bytes"] + meta["eval_bytes"] == meta["num_bytes"]
    assert meta["python_version"] == platform.python_version()
    assert meta["name"] == "text" and meta["vocab_size"] == 256 and meta["eval_fraction"] == 0.1
    first, second = tasks.make("text"), tasks.make("text", seed=3)
    assert first.corpus is second.corpus  # read once and cached
    assert first.split_data("train") is second.split_data("train")  # one device copy


def test_errors(task):
    eval_bytes = task.corpus.data["eval"].size
    too_long = eval_bytes  # needs eval_bytes + 1 bytes
    needs = f"length {too_long} needs windows of {too_long + 1} tokens.*'eval'.*max_bytes"
    with pytest.raises(ValueError, match=needs):
        task.batch(jax.random.key(0), 2, too_long, split="eval")
    with pytest.raises(ValueError, match="length 0 is too short for task 'text'.*>= 1"):
        task.batch(jax.random.key(0), 2, 0)
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        task.batch(jax.random.key(0), 2, 8, split="valid")
    allowed = "max_bytes, eval_fraction, path, tokens, token_dtype, vocab_size, device_limit"
    with pytest.raises(ValueError, match=f"unknown option 'bytes' for task 'text'; choose from: {allowed}$"):
        tasks.make("text", bytes=10)
    with pytest.raises(ValueError, match="eval_fraction must be in \\(0, 1\\), got 1.5"):
        tasks.make("text", eval_fraction=1.5)
    with pytest.raises(ValueError, match="max_bytes must be an integer >= 1; got 0"):
        tasks.make("text", max_bytes=0)
    with pytest.raises(ValueError,
                       match="give one of task.options.path \\(text files\\) and task.options.tokens"):
        tasks.make("text", path=text.stdlib_root(), tokens=text.stdlib_root())


# ------------------------------------------------------------- your own text
def write(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return content


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """A directory of 40 small text files (plus hidden ones that are skipped): (root, {relpath: bytes})."""
    root = tmp_path_factory.mktemp("docs")
    rng = np.random.default_rng(0)
    files = {}
    for i in range(40):
        rel = f"{'sub/' if i % 3 == 0 else ''}doc{i:02d}.txt"
        words = rng.choice(["alpha", "beta", "gamma", "delta", "\n"], size=rng.integers(20, 60))
        files[rel] = write(root / rel, (" ".join(words) + f" [{i}]").encode())
    write(root / ".hidden.txt", b"never read")
    write(root / ".git" / "config", b"never read either")
    return root, files


def test_directory_corpus_is_its_files_with_separators_split_by_file(docs):
    root, files = docs
    task = tasks.make("text", path=str(root), eval_fraction=0.3)
    corpus = task.corpus
    held, train = layout(files, files.__getitem__, 0.3, None)
    assert corpus.sha256 == hashlib.sha256(held + train).hexdigest() and corpus.num_bytes == len(held + train)
    assert sorted(f[0] for f in corpus.files) == sorted(files) and corpus.split_rule == "file"
    for rel, split, start, stop in corpus.files:
        assert split == text.file_split(rel, 0.3)
        assert corpus.data[split][start:stop].tobytes() == files[rel] + b"\x00"
    assert {f[1] for f in corpus.files} == {"train", "eval"}
    meta = json.loads(json.dumps(task.metadata()))
    assert meta["corpus"] == "files" and meta["path"] == str(root) and meta["sha256"] == corpus.sha256
    assert meta["num_files"] == 40 and meta["split_rule"] == "file" and meta["vocab_size"] == 256
    for split in ("train", "eval"):
        batch = task.batch(jax.random.key(1), 6, 16, split=split)
        data = corpus.data[split].tobytes()
        for row_in, row_t in zip(np.asarray(batch["inputs"]), np.asarray(batch["targets"])):
            assert np.concatenate([row_in[:1], row_t]).astype(np.uint8).tobytes() in data
    # max_bytes bounds the training files and keeps the held-out ones; the cache notices changed files.
    small = tasks.make("text", path=str(root), max_bytes=500, eval_fraction=0.3).corpus
    assert small.sha256 == hashlib.sha256(held + train[:500]).hexdigest()


def test_single_file_is_split_at_its_tail(tmp_path):
    content = write(tmp_path / "book.txt", bytes(range(32, 127)) * 20)
    task = tasks.make("text", path=str(tmp_path / "book.txt"), eval_fraction=0.25)
    cut = round((len(content) + 1) * 0.75)
    whole = content + b"\x00"
    assert task.corpus.split_rule == "tail" and task.corpus.data["train"].tobytes() == whole[:cut]
    assert task.corpus.data["eval"].tobytes() == whole[cut:]
    write(tmp_path / "book.txt", content[:-1] + b"!")  # an edited file is read again, not served from cache
    assert tasks.make("text", path=str(tmp_path / "book.txt"), eval_fraction=0.25).corpus.sha256 != task.corpus.sha256


def test_bad_paths_raise_when_the_task_is_made(tmp_path):
    with pytest.raises(ValueError, match="path '/nonexistent/corpus' does not exist"):
        tasks.make("text", path="/nonexistent/corpus")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no readable files"):
        tasks.make("text", path=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="tokens '/nonexistent/tokens.bin' does not exist"):
        tasks.make("text", tokens="/nonexistent/tokens.bin")
    (tmp_path / "nano").mkdir()
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "nano" / "train.bin")
    with pytest.raises(ValueError, match="lacks val.bin \\(nanoGPT layout: train.bin and val.bin\\)"):
        tasks.make("text", tokens=str(tmp_path / "nano"))
    write(tmp_path / "odd.bin", b"\x01\x02\x03")
    with pytest.raises(ValueError, match="has 3 bytes: not a non-empty array of uint16"):
        tasks.make("text", tokens=str(tmp_path / "odd.bin"))
    with pytest.raises(ValueError,
                       match="unknown task.options.token_dtype 'int32'; choose one of: uint16, uint32, uint8"):
        tasks.make("text", tokens=str(tmp_path / "odd.bin"), token_dtype="int32")
    with pytest.raises(ValueError, match="max_bytes applies to byte corpora"):
        tasks.make("text", tokens=str(tmp_path / "odd.bin"), max_bytes=10)
    write(tmp_path / "one.txt", b"x")
    with pytest.raises(ValueError, match="has 2 tokens: too few to split"):
        tasks.make("text", path=str(tmp_path / "one.txt"))


# --------------------------------------------------------------- token memmaps
@pytest.fixture(scope="module")
def nanogpt(tmp_path_factory):
    """A nanoGPT-layout directory: train.bin and val.bin of uint16 tokens."""
    root = tmp_path_factory.mktemp("nanogpt")
    rng = np.random.default_rng(1)
    train = rng.integers(0, 50257, 5000, dtype=np.uint16)
    val = rng.integers(0, 50257, 700, dtype=np.uint16)
    train.tofile(root / "train.bin")
    val.tofile(root / "val.bin")
    return root, train, val


def windows(batch):
    return np.concatenate([np.asarray(batch["inputs"])[:, :1], np.asarray(batch["targets"])], axis=1)


def is_slice(window, data):
    starts = np.flatnonzero(data[: data.size - window.size + 1] == window[0])
    return any(np.array_equal(data[s:s + window.size], window) for s in starts)


def test_nanogpt_memmap_splits_hash_vocab_and_windows(nanogpt):
    root, train, val = nanogpt
    task = tasks.make("text", tokens=str(root))
    corpus = task.corpus
    assert isinstance(corpus.data["train"], np.memmap) and corpus.split_rule == "files"
    assert corpus.sha256 == hashlib.sha256(train.tobytes() + val.tobytes()).hexdigest()
    assert task.vocab_size == int(max(train.max(), val.max())) + 1
    assert tasks.make("text", tokens=str(root), vocab_size=50304).vocab_size == 50304  # nanoGPT's padded vocab
    with pytest.raises(ValueError, match=f"vocab_size must be an integer in \\[{task.vocab_size}, 65536\\]"):
        tasks.make("text", tokens=str(root), vocab_size=1000)
    meta = json.loads(json.dumps(task.metadata()))
    assert meta["corpus"] == "token-memmap" and meta["dtype"] == "uint16" and meta["num_tokens"] == 5700
    assert meta["train_tokens"] == 5000 and meta["eval_tokens"] == 700 and meta["batches_from"] == "device"
    for split, data in (("train", train), ("eval", val)):
        for w in windows(task.batch(jax.random.key(2), 5, 32, split=split)):
            assert is_slice(w.astype(np.uint16), data)
    with pytest.raises(ValueError, match="length 700 needs windows of 701 tokens but the 'eval' split holds 700"):
        task.batch(jax.random.key(0), 2, 700, split="eval")


def test_single_bin_file_uint8_tail_split(tmp_path):
    data = np.random.default_rng(2).integers(0, 256, 4000, dtype=np.uint8)
    data.tofile(tmp_path / "corpus.bin")
    task = tasks.make("text", tokens=str(tmp_path / "corpus.bin"), token_dtype="uint8", eval_fraction=0.1)
    assert task.vocab_size == 256 and task.corpus.split_rule == "tail"
    np.testing.assert_array_equal(task.corpus.data["train"], data[:3600])
    np.testing.assert_array_equal(task.corpus.data["eval"], data[3600:])


def test_host_windows_equal_device_windows_under_jit_and_vmap(nanogpt, tmp_path):
    root, train, val = nanogpt
    train.tofile(tmp_path / "train.bin")
    val.tofile(tmp_path / "val.bin")
    host = tasks.make("text", tokens=str(tmp_path), device_limit=0)
    assert not host.on_device and host.metadata()["batches_from"] == "host"
    assert host.corpus.device == {}  # nothing was copied to the device
    with pytest.raises(ValueError, match="stays on the host"):
        host.split_data("train")
    device = tasks.make("text", tokens=str(tmp_path))
    assert device.on_device and device.corpus is host.corpus  # one corpus, read once
    key = jax.random.key(4)
    for a, b in ((device.batch(key, 6, 24), host.batch(key, 6, 24)),
                 (jax.jit(device.batch, static_argnums=(1, 2))(key, 6, 24),
                  jax.jit(host.batch, static_argnums=(1, 2))(key, 6, 24))):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    keys = jax.random.split(key, 3)
    a = jax.vmap(lambda k: device.batch(k, 4, 16))(keys)
    b = jax.vmap(lambda k: host.batch(k, 4, 16))(keys)
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    assert a["inputs"].shape == (3, 4, 16) and not np.array_equal(b["inputs"][0], b["inputs"][1])
    reseeded = tasks.make("text", tokens=str(tmp_path), device_limit=0, seed=5).batch(key, 6, 24)
    assert not np.array_equal(reseeded["inputs"], host.batch(key, 6, 24)["inputs"])


def test_offsets_past_int32_come_from_two_words(nanogpt, monkeypatch):
    root, train, _ = nanogpt
    monkeypatch.setattr(text, "_INT32_SPAN", 64)  # as if the split held more than 2**31 tokens
    host = tasks.make("text", tokens=str(root), device_limit=0)
    first = windows(host.batch(jax.random.key(5), 8, 16))
    np.testing.assert_array_equal(first, windows(host.batch(jax.random.key(5), 8, 16)))
    starts = []
    for w in first:
        assert is_slice(w.astype(np.uint16), train)
        starts.append(int(np.flatnonzero(train == w[0])[0]))
    assert len(set(starts)) == 8  # spread over the split, not piled at the start


def test_pathlib_paths_are_accepted_and_metadata_stays_json(docs):
    root, _ = docs
    task = tasks.make("text", path=root, eval_fraction=0.3)  # a pathlib.Path
    assert task.options()["path"] == str(root)
    assert json.loads(json.dumps(task.metadata()))["path"] == str(root)


# ------------------------------------------------- a small own corpus, by default
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def text_config():
    """default:text (eval.lengths 64..1024) with a tiny model and a few steps."""
    module = importlib.import_module("posenc.configs.default")
    c = module.get_config("text")
    c.model.update(d_model=16, num_layers=1, num_heads=2)
    c.train.update(steps=2, warmup_steps=1, batch_size=4, steps_per_call=2, log_every=2, checkpoint_every=2,
                   progress=False)
    return c


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A 220 KB generated text file: its held-out tail (0.1) holds 22000 bytes."""
    path = tmp_path_factory.mktemp("own") / "own.txt"
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta\n", "eta,", "theta."]
    path.write_text(" ".join(rng.choice(words, 40000))[:220_000])
    return str(path)


def resolve_own(path, **eval_fields):
    from posenc.training import prepare

    c = text_config()
    c.task.options = {"path": path}
    c.eval.update(eval_fields)
    return prepare.resolve(c)


def test_a_small_own_corpus_trains_and_evaluates_by_default(own, tmp_path, caplog):
    from posenc.training import loop

    c = text_config()
    c.task.options = {"path": own}
    with caplog.at_level(logging.INFO, logger="absl"):
        rows = loop.run(c, str(tmp_path / "run"))  # eval.tokens as default:text leaves it
    assert c.eval.tokens == "auto" and c.eval.lengths == (64, 128, 256, 512, 1024)
    # the held-out split's 22000 tokens: 21 whole windows of 1024 (21504 targets + 1), at every length
    said = [r.getMessage() for r in caplog.records if "eval.tokens auto" in r.getMessage()]
    assert said == ["eval.tokens auto: 21504 tokens at every length (the held-out split's 22000 tokens, at most "
                    "131072; whole windows of eval.lengths 64..1024)"]
    assert [r["eval_length"] for r in rows] == [64, 128, 256, 512, 1024]
    for r in rows:
        assert r["eval_tokens"] == 21504 and r["eval_windows"] * r["eval_length"] == 21504
        assert np.isfinite(r["loss"]) and r["task_metadata"]["eval_bytes"] == 22000


def test_eval_tokens_auto_is_the_same_whole_windows_at_every_length(own):
    task = tasks.make("text", path=own)
    assert task.corpus.data["eval"].size == 22000
    assert task.eval_tokens("auto", (64, 1024)) == 21504  # 21 * 1024
    assert task.eval_tokens("auto", (48, 64)) == 21888  # 114 * lcm(48, 64) = 114 * 192
    assert task.eval_tokens("auto", (8,)) == 21992
    # sliding windows every 8 tokens: L + a multiple of 8 at every L, at least the longest
    assert task.eval_tokens("auto", (32, 64), stride=8) == 21992
    assert task.eval_tokens("auto", (36, 60), stride=8) == 21996
    for n in (32, 64):
        assert task.scored_windows(21992, n, 8) == 1 + (21992 - n) // 8
    small = tasks.make("text", path=own, eval_fraction=0.001)  # 220 held-out bytes
    assert small.eval_tokens("auto", (64, 128)) == 128
    # the stdlib corpus's held-out split is larger than 2**17: the count stays 2**17 (as before "auto")
    stdlib = tasks.make("text", max_bytes=SMALL)
    assert stdlib.eval_tokens("auto", (64, 128, 256, 512, 1024)) == text.AUTO_MAX_TOKENS == 2**17
    r = resolve_own(own, lengths=(64, 96))
    from posenc.training import evaluate

    plans = [evaluate.plan_length(r.task, r.config, n) for n in (64, 96)]
    assert [p.windows[0] * n for p, n in zip(plans, (64, 96))] == [21888, 21888]  # lcm 192


def test_eval_tokens_refusals_name_the_field_and_a_value_that_works(own):
    from posenc.training import prepare

    with pytest.raises(prepare.ConfigError, match=r"^eval.tokens=10000 is not 64 \+ a multiple of 64 .*"
                                                  r"eval.lengths 64..1024.*: use eval.tokens=9216 or auto$"):
        resolve_own(own, tokens=10000)
    assert resolve_own(own, tokens=9216).config.eval.tokens == 9216
    with pytest.raises(prepare.ConfigError, match=r"^eval.tokens=131072 needs 131073 held-out tokens; the held-out "
                                                  r"split holds 22000 \(task.options.eval_fraction=0.1 of '.*own.txt'"
                                                  r"\): use eval.tokens=21504 or auto, or raise "
                                                  r"task.options.eval_fraction \(now 0.1\) or use a larger corpus$"):
        resolve_own(own, tokens=131072)
    with pytest.raises(prepare.ConfigError, match=r"eval.tokens must be 'auto' or an integer >= 1.*got 'all'"):
        resolve_own(own, tokens="all")
    with pytest.raises(prepare.ConfigError, match=r"task.options.eval_fraction must be in \(0, 1\), got 1.5 "
                                                  r"\(e.g. 0.1, the default\)"):
        tasks_config = text_config()
        tasks_config.task.options = {"path": own, "eval_fraction": 1.5}
        prepare.resolve(tasks_config)
    # a held-out split shorter than the longest window: which lengths fit, and the fields to change
    c = text_config()
    c.task.options = {"path": own, "eval_fraction": 0.003}  # 660 held-out bytes
    with pytest.raises(prepare.ConfigError, match=r"^eval.tokens=auto: one whole window at every length of "
                                                  r"eval.lengths 64..1024 needs 1025 held-out tokens; the held-out "
                                                  r"split holds 660 .*: keep eval.lengths to \(64, 128, 256, 512\), "
                                                  r"raise task.options.eval_fraction \(now 0.003\) or use a larger"):
        prepare.resolve(c)
    # sliding windows: lengths whose scored targets can never coincide
    with pytest.raises(prepare.ConfigError, match=r"eval.stride=8 .* use an eval.stride that divides 4 \(e.g. 4\)"):
        resolve_own(own, lengths=(64, 68), text_protocol="sliding", stride=8)
    assert resolve_own(own, lengths=(64, 68), text_protocol="sliding", stride=4).task.eval_tokens(
        "auto", (64, 68), 4) == 21996


def test_binary_files_in_a_corpus_folder_are_skipped_with_one_warning(tmp_path, caplog):
    root = tmp_path / "mixed"
    texts = {f"doc{i:02d}.txt": write(root / f"doc{i:02d}.txt", f"line {i} of plain text\n".encode() * 30)
             for i in range(12)}
    write(root / "logo.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    write(root / "sub" / "cache.pyc", bytes(range(1, 32)) * 20)  # no NUL, but control characters only
    write(root / "latin1.txt", "caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 10)  # text, not UTF-8
    with caplog.at_level(logging.WARNING, logger="absl"):
        task = tasks.make("text", path=str(root))
    warned = [r.getMessage() for r in caplog.records if "binary" in r.getMessage()]
    assert warned == [f"task.options.path {root}: skipped 2 binary files of 15 (a NUL byte or over 30% control "
                      "characters in the first 8000 bytes): logo.png, sub/cache.pyc"]
    assert sorted(f[0] for f in task.corpus.files) == sorted([*texts, "latin1.txt"])
    assert task.metadata()["skipped_files"] == ["logo.png", "sub/cache.pyc"]
    # nothing textual left, or a binary file given alone: refused
    (only := tmp_path / "only").mkdir()
    write(only / "a.bin", b"\x00\x01" * 100)
    with pytest.raises(ValueError, match=r"task.options.path '.*only' holds no text files: every one of its 1 "
                                         r"files is binary .*: a.bin"):
        tasks.make("text", path=str(only))
    with pytest.raises(ValueError, match=r"task.options.path '.*logo.png' is not a text file .* "
                                         r"task.options.tokens"):
        tasks.make("text", path=str(root / "logo.png"))
