"""Context extension: fine-tuning from a finished run, the LongRoPE search wiring, the study end to end.

One tiny study (extend:smoke: a 1-layer byte-level LM, L = 16,
factor 2, methods default and longrope, budgets 0 and 2) runs once per module; the other tests reuse its
base run and fine-tunes, so most of their steps are compiled already.
"""

import os

import jax
import numpy as np
import pytest

from posenc import studies
from posenc.configs import extend as extend_config
from posenc.model import ModelSpec
from posenc.studies import engine, extend_methods, extend_runs
from posenc.training import finetune, longrope, prepare
from posenc.workdir import files


def tiny_config():
    return extend_config.get_config("smoke")  # head_dim 8: 4 rotary pairs


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("extend"))
    return workdir, studies.run("extend", tiny_config(), workdir)


def run_dir(workdir, name):
    return os.path.join(workdir, "runs", name)


@pytest.mark.slow
def test_every_method_builds_a_valid_config(tiny_study):
    workdir, _ = tiny_study
    base = finetune.load_run(run_dir(workdir, "base_s0"))
    found = longrope.read_factors(os.path.join(run_dir(workdir, "longrope_x2_s0"), "factors.json"))
    fields = {m: extend_methods.method_fields(m, 4, 16, found) for m in extend_config.METHODS}
    assert set(extend_config.METHODS) == set(extend_methods.METHODS)
    zero = prepare.resolve(extend_runs.zero_shot_config(base.resolved.config, fields, 64))
    assert set(zero.eval_variants) == set(extend_methods.METHODS) - {"default", "pose", "drope"}  # those two train
    options = {m: s.position.options["rope"] for m, (_, s) in zero.eval_variants.items()}
    assert options["yarn"]["temperature"] == "paper"
    assert options["yarn_quadratic"]["temperature"] == "quadratic"
    assert options["dynamic"]["factor"] == 1.0 and options["linear"]["factor"] == 4.0
    assert all(o["original_length"] == 16 for m, o in options.items()
               if m not in ("linear", "ntk") and extend_methods.METHODS[m].scaling is not None)
    # the remappings at s = 4, L = 16: the papers' settings (posenc.studies.extend_methods.METHODS)
    assert {k: options["self_extend"][k] for k in ("remap", "group", "window", "scaling")} == dict(
        remap="self_extend", group=8, window=8, scaling="default")
    assert (options["leaky_rerope"]["window"], options["leaky_rerope"]["leaky"]) == (4, 8.0)
    assert (options["dual_chunk"]["chunk"], options["dual_chunk"]["local_window"]) == (12, 2)
    assert (options["streaming_llm"]["sinks"], options["streaming_llm"]["window"]) == (4, 11)
    assert all(o["remap"] == "none" for m, o in options.items() if not extend_methods.METHODS[m].remap)
    points = {p.name for p in engine.expand(studies.study("extend"), _all_methods())[1]}
    assert "finetune_dual_chunk_x2_s0" in points and "finetune_self_extend_x2_s0" not in points
    for m in ("dynamic_yarn", "llama3", "longrope", "dual_chunk"):  # fine-tunes at 64 keep L = 16
        ft = prepare.resolve(extend_runs.finetune_config(tiny_config(), base.resolved.config, fields[m], 64, 5))
        assert ft.config.task.train_length == 64 and ft.config.train.batch_size == 1  # 4 * 16 / 64
        assert ft.spec.position.options["rope"]["original_length"] in (0, 16)  # 0: unused (dual_chunk)


def _all_methods():
    c = tiny_config()
    c.methods = extend_config.METHODS
    return c


@pytest.mark.slow
def test_study_rows_table_and_plots(tiny_study):
    workdir, rows = tiny_study
    # 2 methods x (zero-shot + 1 budget) x eval lengths (16, 32), Self-Extend zero-shot only
    assert len(rows) == 10
    for r in rows:
        for f in ("method", "factor", "finetune_steps", "finetune_tokens", "eval_length", "train_length",
                  "target_length", "loss", "accuracy", "seed"):
            assert f in r, f
        assert r["train_length"] == 16 and r["target_length"] == 32 and r["factor"] == 2.0
        assert r["finetune_tokens"] == r["finetune_steps"] * 2 * 32  # batch 4 * 16 / 32 = 2
        assert np.isfinite(r["loss"])
    assert {(r["method"], r["finetune_steps"]) for r in rows} == {
        (m, n) for m in ("default", "longrope") for n in (0, 2)} | {("self_extend", 0)}
    # Self-Extend (window 8, group 4) changes the distances beyond 8 at both lengths
    zero = {(r["method"], r["eval_length"]): r["loss"] for r in rows if not r["finetune_steps"]}
    assert all(zero[("self_extend", n)] != zero[("default", n)] for n in (16, 32))
    table = open(os.path.join(workdir, "table.md")).read()
    assert "### factor 2 (target 32)" in table and "| longrope |" in table and "| self_extend |" in table
    for name in ("extend_loss_vs_length.png", "extend_loss_vs_tokens.png"):
        assert os.path.getsize(os.path.join(workdir, "plots", name)) > 1000
    # the zero-shot default method at L is the base model itself
    base_rows = files.read_jsonl(os.path.join(run_dir(workdir, "base_s0"), "results.jsonl"))
    zero = next(r for r in rows if r["method"] == "default" and not r["finetune_steps"]
                and r["eval_length"] == 16)
    assert zero["loss"] == pytest.approx(base_rows[0]["loss"], rel=1e-6)
    # a rerun trains nothing and returns the same rows
    assert studies.run("extend", tiny_config(), workdir) == rows


def _final_params(run_dir):
    return finetune.load_run(run_dir).params


@pytest.fixture(scope="module")
def continued(tiny_study, tmp_path_factory):
    """The default method with budgets 2 and 4 on the tiny study's base run (``base_run``)."""
    c = tiny_config()
    c.base_run = run_dir(tiny_study[0], "base_s0")
    c.methods, c.finetune_steps = ("default",), (2, 4)
    workdir = str(tmp_path_factory.mktemp("continued"))
    rows = studies.run("extend", c, workdir)
    return workdir, c.base_run, [r for r in rows if r["finetune_steps"] == 4]


@pytest.mark.slow
def test_a_continued_budget_equals_fine_tuning_it_from_the_base(continued, tmp_path):
    workdir, base_run, rows = continued
    base = finetune.load_run(base_run)
    chained = os.path.join(run_dir(workdir, "finetune_default_x2_s0"), "n4")
    config = finetune.load_run(chained).resolved
    direct = finetune.finetune(base, config, str(tmp_path / "direct"))
    a, b = _final_params(chained), _final_params(str(tmp_path / "direct"))
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
    assert {r["eval_length"]: r["loss"] for r in direct} == {r["eval_length"]: r["loss"] for r in rows}
    assert all(r["base_hash"] == base.resolved.hash for r in direct)
    # the fine-tune moved the parameters away from the base's
    assert not np.allclose(np.asarray(jax.tree.leaves(a)[0]), np.asarray(jax.tree.leaves(base.params)[0]))


@pytest.mark.slow
def test_continuing_needs_a_constant_learning_rate(continued):
    workdir = continued[0]
    shorter = finetune.load_run(os.path.join(run_dir(workdir, "finetune_default_x2_s0"), "n2")).resolved
    longer = finetune.load_run(os.path.join(run_dir(workdir, "finetune_default_x2_s0"), "n4")).resolved
    finetune.check_continuable(shorter, longer)
    cosine = [prepare.plain_copy(r.config) for r in (shorter, longer)]
    for c in cosine:
        c.train.min_lr_ratio = 0.1  # cosine decay to 10%: step t's learning rate depends on steps
    with pytest.raises(ValueError, match="min_lr_ratio=1.0"):
        finetune.check_continuable(*map(prepare.resolve, cosine))
    with pytest.raises(ValueError, match="differs from this one in more than train.steps"):
        finetune.check_continuable(shorter, prepare.resolve(cosine[1]))
    with pytest.raises(ValueError, match="must be below"):
        finetune.check_continuable(longer, shorter)


@pytest.mark.slow
def test_fine_tune_config_must_take_the_base_parameters(tiny_study, tmp_path):
    workdir, _ = tiny_study
    base = finetune.load_run(run_dir(workdir, "base_s0"))
    c = prepare.plain_copy(base.resolved.config)
    c.model.d_model = 32
    with pytest.raises(prepare.ConfigError, match=r"\['wk'\].* is \(16, 2, 8\) in the base run and "
                                                r"\(32, 2, 16\) in the config"):
        finetune.finetune(base, c, str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="no config.json"):
        finetune.load_run(str(tmp_path))


@pytest.mark.slow
def test_longrope_fitness_is_the_model_with_those_factors(tiny_study):
    workdir, _ = tiny_study
    base = finetune.load_run(run_dir(workdir, "base_s0"))
    model = finetune.model_with(base.params, base.resolved.spec)
    fitness = longrope.perplexity_fitness(model, base.resolved.task, 32, factor=2.0, original_length=16,
                                          batch_size=2, seed=0)
    lam = np.array([1.0, 1.2, 1.7, 2.3])
    # the same parameters in a model built from the config fields of those factors
    c = prepare.plain_copy(base.resolved.config)
    c.model.position.rope.update(scaling="longrope", factor=2.0, original_length=16,
                                 short_factor=tuple(lam), long_factor=tuple(lam))
    other = finetune.model_with(base.params, ModelSpec.from_config(c.model, train_length=16))
    batch = base.resolved.task.batch(jax.random.key(0), 2, 32, split="train")
    from posenc.training import step
    loss = step.masked_metrics(other(batch["inputs"]), batch["targets"], batch["mask"])["loss"]
    assert fitness(lam) == pytest.approx(float(np.exp(loss)), rel=1e-5)
    assert fitness(np.ones(4)) != pytest.approx(fitness(np.array([1.0, 4.0, 16.0, 64.0])), rel=1e-4)

    found = longrope.read_factors(os.path.join(run_dir(workdir, "longrope_x2_s0"), "factors.json"))
    long = np.asarray(found["long_factor"])
    assert np.all(np.diff(long) >= 0) and np.all(long >= 1.0) and np.all(long <= 2.5)
    assert found["short_factor"] == [1.0] * 4 and found["search"]["short"] is None
    summary = found["search"]["long"]
    assert summary["fitness"] <= min(summary["seeds"].values())  # never worse than PI, NTK, YaRN
    assert summary["fitness"] == pytest.approx(fitness(long), rel=1e-6)
    again = longrope.search(model, base.resolved, factor=2.0, target_length=32, batch_size=2, seed=0,
                            population_size=4, parents_size=2, mutation_numbers=2, crossover_size=2,
                            iterations=2)
    assert again["long_factor"] == found["long_factor"]  # deterministic from the seed
    fields = longrope.rope_fields(found)
    assert fields["model.position.rope.long_factor"] == tuple(found["long_factor"])


@pytest.mark.slow
def test_passkey_on_a_text_model(tiny_study):
    workdir, _ = tiny_study
    base = finetune.load_run(run_dir(workdir, "base_s0"))
    (row,) = finetune.evaluate_on(base.params, base.resolved, "passkey", [260],
                                  eval_fields=dict(batch_size=2, num_batches=1))
    assert row["task"] == "passkey" and row["eval_length"] == 260
    assert 0.0 <= row["exact_match"] <= 1.0 and np.isfinite(row["loss"])
    with pytest.raises(ValueError, match="same vocabulary"):
        finetune.evaluate_on(base.params, base.resolved, "copy", [16])


def test_config_args():
    for arg in extend_config.ARGS:
        c = extend_config.get_config(arg)
        engine.expand(studies.study("extend"), c)
        if arg not in ("smoke", "retrieval", "retrieval_full"):
            assert set(c.methods) == set(extend_methods.METHODS)
        assert c.finetune.min_lr_ratio == 1.0  # budgets continue each other
        prepare.resolve(c.base)
    c = extend_config.get_config("quick")
    c.methods = ("yarn", "pi")
    with pytest.raises(prepare.ConfigError, match="methods entry"):
        engine.validate(studies.study("extend"), c)
    c = extend_config.get_config("quick")
    c.retrieval_tasks = ("passkey", "niah")
    with pytest.raises(prepare.ConfigError, match=r"retrieval_tasks entry: unknown task 'niah'"):
        engine.validate(studies.study("extend"), c)
    with pytest.raises(ValueError, match="unknown extend config argument"):
        extend_config.get_config("tiny")


@pytest.mark.slow
def test_a_study_killed_anywhere_resumes_to_the_same_rows(tiny_study, tmp_path):
    import random

    from helpers import kill_during_a_point, leftovers, study_command
    from posenc.studies import rows as rows_lib

    _, reference = tiny_study
    workdir = str(tmp_path / "killed")
    rng = random.Random(int(os.environ.get("POSENC_KILL_SEED", "0")))
    killed, said = kill_during_a_point(study_command("extend", "smoke", workdir), rng)
    assert killed, "".join(said[-20:])
    kill_during_a_point(study_command("extend", "smoke", workdir), rng, kill=False)
    assert rows_lib.without_volatile(studies.load_rows(workdir)) == rows_lib.without_volatile(reference)
    assert leftovers(workdir) == []


def test_a_hugging_face_checkpoint_is_extended_zero_shot(tmp_path):
    pytest.importorskip("safetensors")
    from posenc import hf

    model_dir = os.path.join(os.path.dirname(__file__), "data", "hf_models", "llama")
    tokens = tmp_path / "corpus.bin"
    np.random.default_rng(0).integers(0, 96, 6000).astype(np.uint16).tofile(tokens)  # the fixture's 96 ids
    c = tiny_config()
    c.base_hf = model_dir
    c.base.task.options = {"tokens": str(tokens)}
    c.base.task.train_length = 8
    c.base.eval.update(batch_size=2, num_batches=1, tokens=16)  # two windows of 8, one of 16
    c.methods, c.factors, c.finetune_steps = ("default", "linear", "yarn", "streaming_llm"), (2,), (0,)
    workdir = str(tmp_path / "ext")
    rows = studies.run("extend", c, workdir)
    assert {(r["method"], r["eval_length"]) for r in rows} == {(m, n) for m in c.methods for n in (8, 16)}
    # the default method is the checkpoint itself: its loss on the first held-out windows of 8 tokens
    model = hf.load(model_dir)
    run = extend_runs.hf_base(c)
    batch = run.task.sequential_batch(0, 2, 8, split="eval")
    from posenc.training import step

    loss = step.masked_metrics(model(batch["inputs"]), batch["targets"], batch["mask"])["loss"]
    base_row = next(r for r in rows if r["method"] == "default" and r["eval_length"] == 8)
    assert base_row["loss"] == pytest.approx(float(loss), rel=1e-5)
    linear = next(r for r in rows if r["method"] == "linear" and r["eval_length"] == 16)
    assert np.isfinite(linear["loss"]) and linear["finetune_steps"] == 0
    # StreamingLLM (4 sinks, 3 recent keys: a cache of L = 8) is the checkpoint itself at 8, not at 16
    sl = {r["eval_length"]: r["loss"] for r in rows if r["method"] == "streaming_llm"}
    base16 = next(r["loss"] for r in rows if r["method"] == "default" and r["eval_length"] == 16)
    assert sl[8] == pytest.approx(base_row["loss"], rel=1e-5) and sl[16] != pytest.approx(base16, rel=1e-4)
    with pytest.raises(prepare.ConfigError, match="base_run and base_hf both name a base model"):
        c.base_run = workdir
        engine.validate(studies.study("extend"), c)


def test_the_paired_table_compares_each_method_with_extrapolation_seed_by_seed():
    from posenc.studies import extend_report

    def row(method, seed, em, sweep=None):
        return dict(task="passkey", method=method, seed=seed, factor=4.0, finetune_steps=0, eval_length=64,
                    target_length=64, exact_match=em, sweep=sweep)

    rows = [row("default", s, 0.1 * s) for s in range(3)] + [row("self_extend", s, 0.1 * s + 0.5 + 0.01 * s)
                                                             for s in range(3)]
    rows += [row("self_extend", s, 1.0, {"depth": 0.0}) for s in range(3)]
    text = extend_report.paired_markdown(rows)
    line = next(x for x in text.splitlines() if x.startswith("| self_extend"))
    # differences 0.50, 0.51, 0.52: mean 0.51, t_{0.975,2} * 0.01 / sqrt(3) = 0.0248
    assert line.startswith("| self_extend | 0.610 [") and "| 0.510 [0.485, 0.535] | yes | 1.000 |" in line
    assert "| default | 0.100 [" in text and "depth 0 |" in text


def test_pose_and_drope_fine_tune_at_the_base_length_without_a_zero_shot_point(tmp_path):
    """PoSE and DroPE train: no zero-shot variant, fine-tunes at L (PoSE's positions over s L; DroPE: NoPE)."""
    c = tiny_config()
    c.methods = ("default", "pose", "drope")
    c.finetune_steps = (0, 2)
    fields = {m: extend_methods.method_fields(m, 2, 16) for m in c.methods}
    assert fields["pose"]["train.pose_length"] == 32 and fields["drope"] == {"model.position.kind": "nope"}
    base = prepare.resolve(c.base)
    zero = prepare.resolve(extend_runs.zero_shot_config(base.config, fields, 32))
    assert set(zero.eval_variants) == set()  # neither is an evaluation variant
    pose = prepare.resolve(extend_runs.finetune_config(c, base.config, fields["pose"], 32, 2, at_target=False))
    assert pose.config.task.train_length == 16 and pose.train.positions.pose_length == 32
    assert pose.config.train.batch_size == base.config.train.batch_size and pose.config.eval.lengths == (16, 32)
    drope = prepare.resolve(extend_runs.finetune_config(c, base.config, fields["drope"], 32, 2, at_target=False))
    assert drope.spec.position.layer_kinds == ("nope",) * base.spec.num_layers
    workdir = str(tmp_path)
    rows = studies.run("extend", c, workdir)
    trained = {(r["method"], r["finetune_steps"], r["eval_length"]) for r in rows}
    assert trained == {("default", 0, 16), ("default", 0, 32), ("default", 2, 16), ("default", 2, 32),
                       ("pose", 2, 16), ("pose", 2, 32), ("drope", 2, 16), ("drope", 2, 32)}
    # DroPE's weights are the base's (RoPE has none): its fine-tune starts from the base's loss at L with NoPE
    assert all(r["loss"] is not None for r in rows)


def test_a_mixture_of_experts_checkpoint_is_extended_zero_shot(tmp_path):
    """The extension study on a loaded MoE model as on a dense one: the tiny gpt-oss (sinks, a sliding
    layer, experts, its own YaRN) as it ships, and with the study's YaRN at 2x its training length."""
    pytest.importorskip("safetensors")
    from posenc import hf

    model_dir = os.path.join(os.path.dirname(__file__), "data", "hf_models", "gpt_oss")
    tokens = tmp_path / "corpus.bin"
    np.random.default_rng(0).integers(0, 96, 6000).astype(np.uint16).tofile(tokens)  # the fixture's 96 ids
    c = tiny_config()
    c.base_hf = model_dir
    c.base.task.options = {"tokens": str(tokens)}
    c.base.task.train_length = 8
    c.base.eval.update(batch_size=2, num_batches=1, tokens=16)
    c.methods, c.factors, c.finetune_steps = ("default", "yarn"), (2,), (0,)
    rows = studies.run("extend", c, str(tmp_path / "ext"))
    assert {(r["method"], r["eval_length"]) for r in rows} == {(m, n) for m in c.methods for n in (8, 16)}
    model, base = hf.load(model_dir), extend_runs.hf_base(c)
    assert base.spec.moe is not None  # the experts were loaded, not a dense stand-in
    batch = base.task.sequential_batch(0, 2, 8, split="eval")
    from posenc.training import step

    loss = step.masked_metrics(model(batch["inputs"]), batch["targets"], batch["mask"])["loss"]
    loss_of = {(r["method"], r["eval_length"]): r["loss"] for r in rows}
    assert loss_of["default", 8] == pytest.approx(float(loss), rel=1e-5)  # the checkpoint itself
    assert all(np.isfinite(v) for v in loss_of.values())
    assert loss_of["yarn", 16] != pytest.approx(loss_of["default", 16], rel=1e-4)  # the study's YaRN acts
