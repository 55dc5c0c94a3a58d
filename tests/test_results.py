"""Results rows, config hashes, atomic JSONL writing and the comparison table."""

import json
import math
import os

import ml_collections
import numpy as np
import pytest

from posenc.studies import compare_plots
from posenc.studies import compare_report as report
from posenc.workdir import files, results


def row(**kw):
    base = dict(task="copy", position="rope", norm="rms", placement="pre", seed=0, train_length=16,
                eval_length=16, loss=0.5, accuracy=0.9, exact_match=0.5, steps=10, config_hash="a" * 64)
    base.update(kw)
    return base


def cfg(**train):
    c = ml_collections.ConfigDict({"task": {"name": "copy"},
                                   "train": {"learning_rate": 1e-3, "log_every": 10, "steps": 5}})
    c.train.update(train)
    return c


def test_config_hash_is_sha256_and_ignores_volatile_fields():
    import hashlib

    h = results.config_hash(cfg())
    # sha256 of the sorted compact JSON without the bookkeeping fields (train.log_every here)
    plain = json.dumps({"task": {"name": "copy"}, "train": {"learning_rate": 1e-3, "steps": 5}},
                       sort_keys=True, separators=(",", ":"))
    assert h == hashlib.sha256(plain.encode()).hexdigest()
    assert results.config_hash(cfg(log_every=99)) == h  # logging cadence is not the experiment
    c = cfg()
    c.mesh = {"data": 4, "fsdp": True}
    assert results.config_hash(c) == h  # nor is the device layout
    assert results.config_hash(cfg(learning_rate=2e-3)) != h
    assert results.config_hash(cfg(steps=6)) != h
    # nor is the evaluation: a trained run evaluated at other lengths keeps its identity
    c = cfg()
    c.eval = {"lengths": (32, 64), "batch_size": 8}
    assert results.config_hash(c) == h
    # tuples and lists hash alike (config.json round trips turn tuples into lists)
    a = ml_collections.ConfigDict({"task": {"lengths": (1, 2)}})
    b = ml_collections.ConfigDict({"task": {"lengths": [1, 2]}})
    assert results.config_hash(a) == results.config_hash(b) != results.config_hash(
        ml_collections.ConfigDict({"task": {"lengths": [1, 3]}}))


def test_make_row_validates_and_cleans():
    r = results.make_row(**row(loss=float("nan"), accuracy=None))
    assert r["loss"] is None and r["accuracy"] is None  # JSON has no NaN
    with pytest.raises(ValueError, match=r"missing fields \['eval_length'\]"):
        results.make_row(**{k: v for k, v in row().items() if k != "eval_length"})
    with pytest.raises(ValueError, match="'seed' must be an int"):
        results.make_row(**row(seed="0"))
    with pytest.raises(ValueError, match="config_hash"):
        results.make_row(**row(config_hash="abc"))


def test_write_and_read_jsonl_round_trip(tmp_path):
    path = str(tmp_path / "r.jsonl")
    rows = [row(eval_length=n) for n in (16, 32)]
    files.write_jsonl(path, rows)
    assert files.read_jsonl(path) == rows
    assert files.read_jsonl(str(tmp_path / "missing.jsonl")) == []


def test_killed_writer_leaves_old_file_intact(tmp_path, monkeypatch):
    path = str(tmp_path / "r.jsonl")
    files.write_jsonl(path, [row()])
    before = open(path).read()

    def killed(*args):
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        files.write_jsonl(path, [row(eval_length=n) for n in range(1, 100)])
    assert open(path).read() == before
    assert os.listdir(tmp_path) == ["r.jsonl"]  # no temporary file left behind


def test_merge_rows_never_duplicates():
    old = [row(eval_length=16, loss=1.0), row(eval_length=32)]
    new = [row(eval_length=16, loss=0.25)]
    merged = results.merge_rows(old, new)
    assert [(r["eval_length"], r["loss"]) for r in merged] == [(16, 0.25), (32, 0.5)]
    assert results.merge_rows(merged, merged) == merged


def test_table_mean_and_interval_over_seeds():
    rows = [row(seed=0, accuracy=0.8, exact_match=0.0), row(seed=1, accuracy=1.0, exact_match=1.0),
            row(seed=0, eval_length=32, accuracy=0.2), row(seed=1, eval_length=32, accuracy=0.4),
            row(position="learned", eval_length=32, accuracy=None, loss=None, exact_match=None)]
    s = report.summarize(rows)["copy"]
    mean, half, n = s["rope"][16]["accuracy"][:3]
    # two seeds: t_{0.975, 1} = 12.706, sample std 0.1414, half-width 12.706 * 0.1414 / sqrt(2) = 1.2706
    assert (n, mean) == (2, pytest.approx(0.9)) and half == pytest.approx(12.7062047 * 0.1, rel=1e-6)
    assert s["learned"][32]["accuracy"] is None
    md = report.table_markdown(rows)
    assert "| encoding | 16* | 32 |" in md and "95% t-interval over seeds" in md and "2 seed(s)" in md
    # the intervals 0.9 -+ 1.271 and 0.3 -+ 1.271, clipped to [0, 1]; the seeds' min-max beside
    assert "| rope | 0.900 [0.000, 1.000] {0.80-1.00} (EM 0.50) | 0.300 [0.000, 1.000] {0.20-0.40} (EM 0.50) |" in md
    assert "| learned |  | n/a |" in md
    label = report.table_markdown([row(randomized=True, eval_variant="pi4")])
    assert "| rope+randomized@pi4 |" in label
    bad = dict(row(seed=1, loss=None, accuracy=None, exact_match=None), diverged_at_step=3)
    assert "| rope | 0.900 (EM 0.50) [1 diverged] |" in report.table_markdown([row(), bad])  # n = 1: no interval
    assert "| rope | diverged |" in report.table_markdown([bad])


def test_text_table_has_both_measures_and_plots_are_written(tmp_path):
    rows = [row(task="text", eval_length=n, loss=1.0 + n / 64 + 0.1 * s, perplexity=float(np.exp(1.0 + n / 64)),
                loss_last_L=1.5 + 0.1 * s, perplexity_last_L=4.5, last_L=64, train_length=64, seed=s)
            for n in (64, 128) for s in (0, 1)]
    md = report.table_markdown(rows)
    assert "## text" in md and "over the last L = 64 tokens of each window" in md
    half = 12.7062047 * float(np.std([0.0, 0.1], ddof=1)) / np.sqrt(2)
    cell = lambda m: f"{m:.3f} [{max(m - half, 0):.3f}, {m + half:.3f}] {{{m - 0.05:.2f}-{m + 0.05:.2f}}}"  # noqa: E731
    assert f"| rope | {cell(2.05)} (ppl 7.39) | {cell(3.05)} (ppl 20.09) |" in md
    assert f"| rope | {cell(1.55)} (ppl 4.50) | {cell(1.55)} (ppl 4.50) |" in md
    paths = compare_plots.write_plots(rows + [row()], str(tmp_path))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["copy_accuracy.png", "copy_exact_match.png", "copy_loss.png", "text_log_perplexity.png"]
    for p in paths:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == names  # no temporary file left behind


def test_write_json_is_valid(tmp_path):
    path = str(tmp_path / "c.json")
    files.write_json(path, {"x": (1, 2), "y": math.inf})
    assert json.load(open(path)) == {"x": [1, 2], "y": None}


def test_decoded_metrics_lead_the_table_with_the_teacher_forced_ones_beside():
    rows = [row(seed=s, accuracy=0.9, decoded_accuracy=0.5 + 0.1 * s, decoded_exact_match=0.25)
            for s in (0, 1)]
    md = report.table_markdown(rows)
    decoded, forced = md.index("decoded accuracy (the answer generated"), md.index("teacher-forced token accuracy")
    assert decoded < forced and "### copy: teacher-forced, for comparison" in md
    assert "| rope | 0.550 [0.000, 1.000] {0.50-0.60} (EM 0.25) |" in md
    assert report.main_metric("copy", rows) == "decoded_accuracy" and report.main_metric("copy", [row()]) == "accuracy"
    agg = report.aggregate(rows + [dict(r, eval_length=32, decoded_accuracy=0.2) for r in rows])
    assert (agg["copy"]["rope"]["metric"] == "decoded_accuracy"
            and agg["copy"]["rope"]["stat"].mean == pytest.approx(0.2))


def test_the_aggregate_weights_each_bin_by_its_sizes():
    rows = [row(eval_length=16, train_length=8, accuracy=0.9, problem_size_min=5, problem_size_max=7),
            row(eval_length=32, train_length=8, accuracy=0.3, problem_size_min=8, problem_size_max=15)]
    # sizes 5-7 (3 of them) at 0.9, sizes 8-15 (8) at 0.3: the mean over the 11 sizes
    assert report.aggregate(rows)["copy"]["rope"]["stat"].mean == pytest.approx((3 * 0.9 + 8 * 0.3) / 11)


def test_an_evaluation_row_is_described_in_the_tables_words():
    """The log says decoded first (the tables' headline), teacher-forced beside it; a text row its
    loss and perplexity, no exact match (a text window has no answer)."""
    from posenc.training import finish, loop

    answers = {"loss": 0.1234, "accuracy": 0.979, "exact_match": 0.9, "decoded_accuracy": 0.833,
               "decoded_exact_match": 0.75}
    assert finish.describe(answers) == ("decoded accuracy=0.8330 exact match=0.7500; teacher-forced "
                                        "accuracy=0.9790 exact match=0.9000; loss=0.1234")
    assert finish.describe({**answers, "decoded_accuracy": None}).startswith("teacher-forced accuracy=0.9790")
    text = {"loss": 1.5, "accuracy": 0.41, "exact_match": 0.0, "perplexity": 4.4817}
    assert finish.describe(text) == "loss=1.5000 perplexity=4.482 next-token accuracy=0.4100"
    assert loop.train_postfix({"loss": 0.5, "accuracy": 0.97}) == "train loss=0.5000 teacher-forced acc=0.970"
