"""Seeds trained together (one vmapped step) equal their separate runs: metrics, logs, checkpoints,
resume, divergence of one seed, and the compare grid."""

import importlib.util
import os

import numpy as np
import pytest

from posenc.training import finish, loop, multiseed, prepare
from posenc.training import step as step_lib
from posenc.workdir import files, records
from posenc.workdir.checkpoint import Checkpointer

# batched matmuls of the vmapped step may sum in another order than the single step's
TOL = dict(rtol=2e-5, atol=1e-6)
METRICS = ("loss", "accuracy", "exact_match", "train_loss")


def load(name):
    return importlib.import_module(f"posenc.configs.{name}")


def config(seed):
    c = load("default").get_config("tiny")
    c.train.update(steps=8, log_every=4, checkpoint_every=4, warmup_steps=2, learning_rate=3e-3, seed=seed)
    c.eval.lengths = (16,)
    return c


def params(workdir):
    from test_end_to_end import restored_params

    return restored_params(config(0), workdir)


def assert_rows_close(a, b):
    assert [r["eval_length"] for r in a] == [r["eval_length"] for r in b]
    for x, y in zip(a, b):
        assert x["config_hash"] == y["config_hash"] and x["seed"] == y["seed"]
        np.testing.assert_allclose([x[k] for k in METRICS], [y[k] for k in METRICS], **TOL)


def assert_logs_close(a, b):
    la, lb = (files.read_jsonl(os.path.join(d, "train_log.jsonl")) for d in (a, b))
    assert [r["step"] for r in la] == [r["step"] for r in lb] == [4, 8]
    for x, y in zip(la, lb):
        assert sorted(x) == sorted(y)
        np.testing.assert_allclose([x[k] for k in sorted(x)], [y[k] for k in sorted(x)], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
    """Each seed's plain loop.run."""
    base = tmp_path_factory.mktemp("separate")
    return {s: (str(base / f"s{s}"), loop.run(config(s), str(base / f"s{s}"))) for s in (0, 1, 2)}


@pytest.fixture(scope="module")
def together(tmp_path_factory):
    base = tmp_path_factory.mktemp("together")
    dirs = [str(base / f"s{s}") for s in (0, 1)]
    return dirs, multiseed.run_seeds([config(0), config(1)], dirs, names=["a", "b"])


def test_seeds_together_equal_separate_runs(separate, together):
    dirs, outs = together
    for s, d, rows in zip((0, 1), dirs, outs):
        assert_rows_close(rows, separate[s][1])
        assert all(r["seeds_trained_together"] == 2 for r in rows)
        assert files.read_jsonl(os.path.join(d, "results.jsonl")) == rows
        assert_logs_close(d, separate[s][0])
        assert Checkpointer(os.path.join(d, "checkpoints")).all_steps() == [4, 8]
        (pa, ra), (pb, rb) = params(d), params(separate[s][0])
        assert ra["step"] == rb["step"] == 8
        for x, y in zip(pa, pb):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    assert outs[0][0]["name"] == "a" and outs[0][0]["loss"] != outs[1][0]["loss"]
    # complete: rerun reports, never retrains
    assert multiseed.run_seeds([config(0), config(1)], dirs) == outs


def test_killed_group_resumes_exactly_and_mixed_starts(tmp_path, together):
    dirs = [str(tmp_path / f"s{s}") for s in (0, 1, 2)]
    # seeds 0, 1 killed together after step 3; seed 2 alone after step 1
    assert multiseed.run_seeds([config(0), config(1)], dirs[:2], max_steps_this_run=3) == [None, None]
    assert loop.run(config(2), dirs[2], max_steps_this_run=1) is None
    assert [Checkpointer(os.path.join(d, "checkpoints")).latest_step() for d in dirs] == [3, 3, 1]
    assert not os.path.exists(os.path.join(dirs[0], "results.jsonl"))
    outs = multiseed.run_seeds([config(0), config(1), config(2)], dirs)
    for rows, ref in zip(outs[:2], together[1]):  # same program as the uninterrupted group: exact
        assert [[r[k] for k in METRICS] for r in rows] == [[r[k] for k in METRICS] for r in ref]
    assert "seeds_trained_together" not in outs[2][0]  # trained alone (its own start step)
    for x, y in zip(params(dirs[0])[0], params(together[0][0])[0]):
        np.testing.assert_array_equal(x, y)


def test_one_diverging_seed_keeps_the_others(tmp_path, monkeypatch, separate):
    real = step_lib.seeds_train_chunk_fn

    def poisoned(spec, buffer, **kw):
        fn = real(spec, buffer, **kw)

        def chunk(graphdef, states, roots, t0, n):
            states, metrics = fn(graphdef, states, roots, t0, n)
            if roots.shape[0] == 2:  # seed 1 (second) goes NaN at step 2 (0-based 1) and after
                bad = int(t0) + np.arange(buffer) >= 1
                metrics = dict(metrics, loss=metrics["loss"].at[bad, 1].set(np.nan))
            return states, metrics

        return chunk

    monkeypatch.setattr(step_lib, "seeds_train_chunk_fn", poisoned)
    dirs = [str(tmp_path / f"s{s}") for s in (0, 1)]
    outs = multiseed.run_seeds([config(0), config(1)], dirs)
    assert isinstance(outs[1], records.NonFiniteError) and outs[1].step == 2
    assert "non-finite loss (nan) at step 2" in str(outs[1])
    assert Checkpointer(os.path.join(dirs[1], "checkpoints")).all_steps() == []
    assert not os.path.exists(os.path.join(dirs[1], "results.jsonl"))
    # seed 0 trained on alone (in a stack of one) and equals its separate run
    assert_rows_close(outs[0], separate[0][1])
    assert_logs_close(dirs[0], separate[0][0])
    rows = finish.record_divergence(prepare.resolve(config(1)), dirs[1], outs[1])
    assert prepare.completed_rows(config(1), dirs[1]) == rows and rows[0]["diverged_at_step"] == 2


def test_a_fitted_seed_leaves_the_group_and_the_others_go_on(tmp_path):
    def fit_config(seed, target):
        c = config(seed)
        c.train.update(steps=12, fit_check_every=4, fit_accuracy=target)
        return c

    dirs = [str(tmp_path / f"s{s}") for s in (0, 1)]
    # accuracy 0.0 is reached at the first check; 1.0 never is (the budget ends the run)
    c0, c1 = fit_config(0, 1e-9), fit_config(1, 1.0)
    c1.train.fit_accuracy = 1.0
    c0.train.fit_accuracy = 1.0
    with pytest.raises(ValueError, match="differ only in train.seed"):
        multiseed.run_seeds([fit_config(0, 1e-9), fit_config(1, 1.0)], dirs)
    outs = multiseed.run_seeds([fit_config(0, 1e-9), fit_config(1, 1e-9)], dirs)
    for rows in outs:
        assert all(r["fitted"] and r["steps_to_fit"] == 4 == r["steps_trained"] for r in rows)
    assert Checkpointer(os.path.join(dirs[0], "checkpoints")).latest_step() == 4


def test_configs_must_differ_only_in_seed(tmp_path):
    other = config(1)
    other.train.learning_rate = 1e-2
    with pytest.raises(ValueError, match="differ only in train.seed"):
        multiseed.run_seeds([config(0), other], [str(tmp_path / "a"), str(tmp_path / "b")])
    assert not os.path.exists(tmp_path / "a")  # refused before any workdir is claimed
    with pytest.raises(ValueError, match="distinct train.seed"):
        multiseed.run_seeds([config(0), config(0)], [str(tmp_path / "c"), str(tmp_path / "d")])


def test_compare_grid_trains_seeds_together(tmp_path, separate):
    from helpers import grid_points
    from posenc import studies
    from posenc.studies import engine

    c = load("compare").get_config("quick")
    c.base = config(0)
    c.grid.update(positions=("rope",), seeds=(0, 1), vmap_seeds=True)
    points = grid_points(c)
    assert [[p.name for p in g] for g in engine.groups(points)] == [[points[0].name, points[1].name]]
    rows = studies.run("compare", c, str(tmp_path))
    assert [(r["run"], r["seeds_trained_together"]) for r in rows] == [
        ("copy_rope_rms-pre_s0", 2), ("copy_rope_rms-pre_s1", 2)]
    for r, s in zip(rows, (0, 1)):
        assert_rows_close([r], separate[s][1])
    assert files.read_jsonl(os.path.join(tmp_path, "results.jsonl")) == rows
    full = load("compare").get_config("full")
    assert full.grid.vmap_seeds is False  # the default: one by one
    assert all(p.group is None for p in grid_points(full)[:4])
