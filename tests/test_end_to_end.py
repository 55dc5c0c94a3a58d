"""Tiny end-to-end runs: train + eval + resume parity, reruns, NaN guard, and a 2-encoding comparison."""

import importlib.util
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from posenc.config import overrides
from posenc.model import Decoder
from posenc.training import finish, loop, optim, prepare
from posenc.training import step as step_lib
from posenc.workdir import files, records, results
from posenc.workdir.checkpoint import Checkpointer


def load(name):
    return importlib.import_module(f"posenc.configs.{name}")


def tiny():
    return load("default").get_config("tiny")  # 20 steps, checkpoints at 10 and 20, evals at 16, 32


def restored_params(config, workdir):
    r = prepare.resolve(config)
    model = Decoder(r.spec, rngs=nnx.Rngs(99))
    opt = nnx.Optimizer(model, optim.make_optimizer(r.train.optimizer), wrt=nnx.Param)
    _, state = nnx.split((model, opt))
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
    state, record = ckpt.restore(state)
    ckpt.close()
    leaves = [jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
              for x in jax.tree.leaves(state)]
    return leaves, record


METRICS = ("loss", "accuracy", "exact_match", "train_loss")


def test_resume_matches_uninterrupted_run(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    rows_a = loop.run(tiny(), a)
    assert [r["eval_length"] for r in rows_a] == [16, 32]
    for r in rows_a:
        results.validate_row(r)
        assert r["steps"] == 20 and r["position"] == "rope" and r["task"] == "copy"
    # "killed" after step 7 (checkpointed; mid log window and between regular checkpoints)
    assert loop.run(tiny(), b, max_steps_this_run=7) is None
    assert Checkpointer(os.path.join(b, "checkpoints")).latest_step() == 7
    assert not os.path.exists(os.path.join(b, "results.jsonl"))
    rows_b = loop.run(tiny(), b)
    assert [[r[k] for k in METRICS] for r in rows_a] == [[r[k] for k in METRICS] for r in rows_b]
    pa, ra = restored_params(tiny(), a)
    pb, rb = restored_params(tiny(), b)
    assert ra["step"] == rb["step"] == 20
    for x, y in zip(pa, pb):
        np.testing.assert_array_equal(x, y)
    # rerun of a complete run: reports, never duplicates rows
    again = loop.run(tiny(), b)
    assert [[r[k] for k in METRICS] for r in again] == [[r[k] for k in METRICS] for r in rows_b]
    assert len(files.read_jsonl(os.path.join(b, "results.jsonl"))) == 2
    config = json.load(open(os.path.join(b, "config.json")))
    assert config["config_hash"] == rows_b[0]["config_hash"]
    assert config["config"]["model"]["vocab_size"] == 20  # from the task (4 specials + 16 symbols)


def test_workdir_with_another_config_is_refused(tmp_path):
    c = tiny()
    c.train.tensorboard = True
    loop.run(c, str(tmp_path), max_steps_this_run=1)
    events = os.listdir(tmp_path / "tensorboard")
    assert any(e.startswith("events.out.tfevents") for e in events)
    c.train.learning_rate = 0.5
    with pytest.raises(ValueError, match="holds a run of another config"):
        loop.run(c, str(tmp_path))


def test_nan_stops_with_step_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    real = step_lib.train_chunk_fn

    def poisoned(spec, buffer, **kw):
        fn = real(spec, buffer, **kw)

        def chunk(graphdef, state, root, t0, n):
            state, metrics = fn(graphdef, state, root, t0, n)
            bad = int(t0) + np.arange(buffer) >= 12  # the 13th step diverges, and every later one
            if bad[:int(n)].any():
                metrics = dict(metrics, loss=np.where(bad, np.nan, metrics["loss"]))
                state = jax.tree.map(lambda x: x * np.nan if x.dtype == np.float32 else x, state)
            return state, metrics

        return chunk

    monkeypatch.setattr(step_lib, "train_chunk_fn", poisoned)
    with pytest.raises(records.NonFiniteError,
                       match=r"non-finite loss \(nan\) at step 13; .* last good checkpoint is step 10") as e:
        loop.run(tiny(), str(tmp_path))
    assert e.value.step == 13
    ckpt = Checkpointer(os.path.join(tmp_path, "checkpoints"))
    assert ckpt.all_steps() == [10]
    leaves, record = restored_params(tiny(), str(tmp_path))
    assert all(np.isfinite(x).all() for x in leaves if x.dtype == np.float32)
    assert np.isfinite(record["metrics"]["loss"])
    # grids record divergence as a result: the run then counts as complete
    rows = finish.record_divergence(prepare.resolve(tiny()), str(tmp_path), e.value)
    assert [(r["eval_length"], r["loss"], r["diverged_at_step"]) for r in rows] == [(16, None, 13), (32, None, 13)]
    assert prepare.completed_rows(tiny(), str(tmp_path)) == rows


def test_compare_grid_skips_complete_runs_and_writes_report(tmp_path, monkeypatch):
    from posenc import studies

    c = load("compare").get_config("quick")
    c.base = tiny()
    c.variants = overrides.fields({})  # the plain learned table of tiny(): 16 rows
    c.grid.positions = ("learned", "alibi")
    c.grid.seeds = (0,)
    rows = studies.run("compare", c, str(tmp_path))
    assert sorted((r["variant"], r["eval_length"]) for r in rows) == [
        ("alibi", 16), ("alibi", 32), ("learned", 16), ("learned", 32)]
    learned_long = next(r for r in rows if r["variant"] == "learned" and r["eval_length"] == 32)
    assert learned_long["accuracy"] is None and "learned encodes 16 positions" in learned_long["not_applicable"]
    table = open(tmp_path / "table.md").read()
    assert "| learned |" in table and "n/a" in table and "| alibi |" in table
    for name in ("copy_accuracy.png", "copy_exact_match.png", "copy_loss.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    assert sorted(os.listdir(tmp_path / "runs")) == ["copy_alibi_rms-pre_s0", "copy_learned_rms-pre_s0"]

    def no_training(*a, **k):
        raise AssertionError("a complete run was trained again")

    monkeypatch.setattr(step_lib, "train_step_fn", no_training)
    monkeypatch.setattr(step_lib, "train_chunk_fn", no_training)
    again = studies.run("compare", c, str(tmp_path))
    assert again == rows
    assert len(files.read_jsonl(os.path.join(tmp_path, "results.jsonl"))) == 4


def test_grid_expansion_and_overrides():
    from helpers import grid_points
    from posenc.studies import engine

    c = load("compare").get_config("scaling")
    points = {p.fields["variant"]: p.run for p in grid_points(c) if p.run.config.train.seed == 0}
    rope = points["rope"]
    assert rope.config.model.position.kind == "rope"
    assert set(rope.eval_variants) == {"pi", "ntk", "dynamic_ntk", "yarn", "llama3", "dynamic_yarn",
                                       "yarn_quadratic", "longrope_yarn_start"}
    assert rope.eval_variants["yarn_quadratic"][1].position.options["rope"]["temperature"] == "quadratic"
    assert rope.eval_variants["yarn"][1].position.options["rope"]["scaling"] == "yarn"
    assert points["rope_yarn_trained"].spec.position.options["rope"]["factor"] == 4.0
    assert points["alibi"].config.model.position.kind == "alibi" and not points["alibi"].eval_variants
    names = [p.name for p in grid_points(c)]
    assert len(names) == len(set(names)) == len(c.grid.positions) * len(c.grid.seeds)
    # runs of one cell are grouped by their config, not by their names (vmapped when grid.vmap_seeds)
    c.grid.vmap_seeds = True
    cells = engine.groups(grid_points(c))
    assert [sorted(p.run.config.train.seed for p in g) for g in cells] == [[0, 1]] * 3
    c.grid.vmap_seeds = False
    with pytest.raises(ValueError, match="unknown config field 'train.stepz'; did you mean 'train.steps'"):
        overrides.apply(rope.config, {"train.stepz": 3})
    c.grid.positions = ("rope", "alibi")
    c.variants = overrides.fields({"rope": {"model.position.rope.beta_fast": 3.0}})
    with pytest.raises(prepare.ConfigError, match="grid point copy_rope_rms-pre_s0: model.position.rope.beta_fast"):
        grid_points(c)  # every point is validated before any run starts


def test_fit_then_extrapolate_stops_when_the_training_length_is_fitted(tmp_path):
    c = tiny()
    c.task.train_length = 8
    c.model.position.kind = "alibi"
    c.train.update(steps=400, learning_rate=1e-2, warmup_steps=10, log_every=10, checkpoint_every=100,
                   fit_accuracy=0.5, fit_check_every=10)
    rows = loop.run(c, str(tmp_path))
    for r in rows:
        assert r["fitted"] is True and r["steps_to_fit"] == r["steps_trained"] < 400
        assert r["steps_to_fit"] % 10 == 0 and r["fit_accuracy"] >= 0.5
    # the fitted run resumes as finished (no more training) and reports the same rows
    again = loop.run(c, str(tmp_path))
    assert [x["steps_to_fit"] for x in again] == [x["steps_to_fit"] for x in rows]
    # a fixed budget (fit_accuracy 0) records no fit
    plain = loop.run(tiny(), str(tmp_path / "plain"))
    assert all(r["fitted"] is None and r["steps_to_fit"] is None for r in plain)
