"""Corpus provenance: each file's own SHA-256 (sha256sum's), size and split in the metadata and the text table."""

import hashlib
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import posenc.tasks as tasks
from posenc.studies import compare_report as report
from posenc.studies import rows as rows_lib
from posenc.tasks import corpus as corpus_lib


def sha256sum(path):
    """What the ``sha256sum`` program prints for ``path`` (None where it is not installed)."""
    program = shutil.which("sha256sum")
    if program is None:
        return None
    return subprocess.run([program, str(path)], check=True, capture_output=True, text=True).stdout.split()[0]


def check_digest(path, sha):
    data = open(path, "rb").read()
    assert sha == hashlib.sha256(data).hexdigest() and len(sha) == 64
    assert sha256sum(path) in (None, sha)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Twelve text files of distinct sizes in two folders (split by path hash at eval_fraction 0.3)."""
    root = tmp_path_factory.mktemp("own")
    files = {}
    for i in range(12):
        rel = f"{'part/' if i % 2 else ''}chapter{i:02d}.txt"
        (root / rel).parent.mkdir(exist_ok=True)
        files[rel] = (f"chapter {i}: " + "words of the book " * (5 + 7 * i)).encode()
        (root / rel).write_bytes(files[rel])
    return root, files


def test_each_file_is_listed_with_its_own_hash_size_and_split(folder):
    root, files = folder
    task = tasks.make("text", path=str(root), eval_fraction=0.3)
    meta = json.loads(json.dumps(task.metadata()))
    listed = {f["path"]: f for f in meta["files"]}
    assert sorted(listed) == sorted(files) and [f["path"] for f in meta["files"]] == [f[0] for f in task.corpus.files]
    for rel, content in files.items():
        record = listed[rel]
        check_digest(root / rel, record["sha256"])
        assert record["bytes"] == record["used_bytes"] == len(content) == os.path.getsize(root / rel)
        assert record["split"] == corpus_lib.file_split(rel, 0.3)
    assert {f["split"] for f in meta["files"]} == {"train", "eval"}
    assert sum(f["split"] == "eval" for f in meta["files"]) == meta["eval_files"]
    # The digest as used is kept: every file's bytes plus its NUL separator, in corpus order.
    used = b"".join(files[f["path"]] + b"\x00" for f in meta["files"])
    assert meta["sha256"] == hashlib.sha256(used).hexdigest() == task.corpus.sha256
    assert meta["sha256"] not in {f["sha256"] for f in meta["files"]}


def test_max_bytes_cuts_a_file_but_its_hash_is_of_the_whole_file(folder):
    root, files = folder
    whole = tasks.make("text", path=str(root), eval_fraction=0.3).metadata()["files"]
    train = [f for f in whole if f["split"] == "train"]
    budget = train[0]["bytes"] + 1 + 10  # the first training file and its separator, then 10 bytes of the next
    meta = tasks.make("text", path=str(root), eval_fraction=0.3, max_bytes=budget).metadata()
    assert [f["path"] for f in meta["files"]] == [f["path"] for f in whole if f["split"] == "eval"] + [
        train[0]["path"], train[1]["path"]]  # the files max_bytes left unread are not listed
    cut = meta["files"][-1]
    assert cut["used_bytes"] == 10 and cut["bytes"] == len(files[cut["path"]]) == train[1]["bytes"]
    assert cut["sha256"] == train[1]["sha256"]
    check_digest(root / cut["path"], cut["sha256"])
    assert meta["train_bytes"] == budget


def test_a_single_file_is_named_by_its_name_and_split_at_its_tail(tmp_path):
    path = tmp_path / "book.txt"
    path.write_bytes(b"It was a bright cold day in April.\n" * 300)
    meta = tasks.make("text", path=str(path), max_bytes=4000, eval_fraction=0.25).metadata()
    (record,) = meta["files"]
    assert record["path"] == "book.txt" and meta["path"] == str(path) and record["split"] == "train+eval"
    assert record["bytes"] == 10_500 and record["used_bytes"] == 4000
    check_digest(path, record["sha256"])
    assert corpus_lib.file_sha256(path) == (record["sha256"], 10_500)


def test_a_tail_split_folder_names_the_split_of_each_file(tmp_path):
    for name, size in (("a.txt", 300), ("b.txt", 60)):
        (tmp_path / name).write_bytes(b"x" * size)
    # Both paths hash to "train" at eval_fraction 0.05, so the folder is split at its tail: b.txt straddles it.
    assert {corpus_lib.file_split(n, 0.05) for n in ("a.txt", "b.txt")} == {"train"}
    meta = tasks.make("text", path=str(tmp_path), eval_fraction=0.05).metadata()
    assert meta["split_rule"] == "tail" and meta["eval_bytes"] == 18  # 5% of 362 bytes
    assert [(f["path"], f["split"], f["bytes"]) for f in meta["files"]] == [
        ("a.txt", "train", 300), ("b.txt", "train+eval", 60)]


def test_memmap_files_are_listed_per_split(tmp_path):
    rng = np.random.default_rng(3)
    train, val = rng.integers(0, 50_000, 3000, dtype=np.uint16), rng.integers(0, 50_000, 400, dtype=np.uint16)
    train.tofile(tmp_path / "train.bin")
    val.tofile(tmp_path / "val.bin")
    meta = tasks.make("text", tokens=str(tmp_path)).metadata()
    assert [(f["path"], f["split"], f["bytes"], f["used_bytes"]) for f in meta["files"]] == [
        ("train.bin", "train", 6000, 6000), ("val.bin", "eval", 800, 800)]
    for f in meta["files"]:
        check_digest(tmp_path / f["path"], f["sha256"])
    assert meta["sha256"] == hashlib.sha256(train.tobytes() + val.tobytes()).hexdigest()
    train.astype(np.uint8).tofile(tmp_path / "one.bin")
    single = tasks.make("text", tokens=str(tmp_path / "one.bin"), token_dtype="uint8").metadata()
    assert [(f["path"], f["split"], f["bytes"]) for f in single["files"]] == [("one.bin", "train+eval", 3000)]
    check_digest(tmp_path / "one.bin", single["files"][0]["sha256"])


def test_the_stdlib_corpus_hashes_its_files_but_rows_name_it_by_python_version():
    corpus = corpus_lib.build_corpus(200_000, 0.1)
    assert len(corpus.checksums) == len(corpus.files) > 10
    for (path, _, _, _), (sha, size) in list(zip(corpus.files, corpus.checksums))[:5]:
        full = os.path.join(corpus.root, path)
        assert (sha, size) == corpus_lib.file_sha256(full) and size == os.path.getsize(full)
    meta = corpus.metadata()
    assert "files" not in meta  # hundreds of files: the Python version and the digest as used name it
    line = corpus_lib.describe(meta)
    assert line == (f"the {meta['python_implementation']} {meta['python_version']} standard library source "
                    f"(`{corpus.root}`); as used: sha256 {corpus.sha256[:12]}")


def test_every_corpus_field_is_documented(folder, tmp_path):
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "t.bin")
    metas = [corpus_lib.build_corpus(100_000, 0.1).metadata(),
             corpus_lib.load_path_corpus(folder[0], None, 0.3).metadata(),
             corpus_lib.open_tokens(tmp_path / "t.bin").metadata()]
    keys = {k for m in metas for k in m} | {f"files[].{k}" for m in metas for f in m.get("files", []) for k in f}
    assert keys == set(rows_lib.TEXT_CORPUS_FIELDS)


def text_rows(meta, seeds=(0, 1)):
    return [dict(task="text", position="rope", norm="rms", placement="pre", seed=s, train_length=64,
                 eval_length=n, loss=1.5 + n / 1000, perplexity=4.0, accuracy=0.4, exact_match=0.0, steps=10,
                 config_hash=f"text-{s}".ljust(64, "0"), task_metadata=meta) for s in seeds for n in (64, 128)]


def test_the_text_table_names_the_corpus_by_path_and_hash(tmp_path, folder):
    path = tmp_path / "book.txt"
    path.write_bytes(b"Call me Ishmael. " * 400)
    meta = json.loads(json.dumps(tasks.make("text", path=str(path)).metadata()))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    md = report.table_markdown(text_rows(meta))
    line = f"Corpus: `{path}`: sha256 {sha[:12]}, 6,800 bytes; as used: sha256 {meta['sha256'][:12]}"
    assert md.count("Corpus: ") == 1 and line in md.splitlines()
    assert md.index(line) < md.index("| encoding |")  # above the table
    # A folder: its path and its files' digests, the first four named.
    meta = json.loads(json.dumps(tasks.make("text", path=str(folder[0]), eval_fraction=0.3).metadata()))
    (line,) = [x for x in report.table_markdown(text_rows(meta)).splitlines() if x.startswith("Corpus: ")]
    first = meta["files"][0]
    assert line.startswith(f"Corpus: `{folder[0]}`, 12 files: {first['path']} sha256 {first['sha256'][:12]} "
                           f"({first['split']}); ")
    assert line.endswith(f"; 8 more in task_metadata.files; as used: sha256 {meta['sha256'][:12]}")
    # Rows written before files were listed: the path and the digest as used.
    old = {k: v for k, v in meta.items() if k != "files"}
    assert f"Corpus: `{folder[0]}`; as used: sha256 {meta['sha256'][:12]}" in report.table_markdown(text_rows(old))
    # Two corpora in one table: one line each; rows without task metadata: none.
    both = report.table_markdown(text_rows(meta, (0,)) + text_rows(old, (1,)))
    assert both.count("Corpus: ") == 2
    bare = [{k: v for k, v in r.items() if k != "task_metadata"} for r in text_rows(meta)]
    assert "Corpus: " not in report.table_markdown(bare)
