"""The stability study: the LR-sensitivity definition, a tiny grid end to end, divergence logs."""

import math
import os

import ml_collections
import numpy as np
import pytest

from posenc import diagnostics, studies
from posenc.configs import default
from posenc.configs import stability as stability_config
from posenc.studies import engine, stability_report
from posenc.studies import stability as study
from posenc.training import loop
from posenc.workdir import files


def paper_lr_sensitivity(final_losses, initial_loss):
    """Wortsman et al. 2023 (arXiv 2309.14322), "LR sensitivity", transcribed:

        E_{eta in [a, b]} [ min(l(A(eta)), l_0) - l* ],   l* = min_{eta in [a, b]} l(A(eta))

    l(A(eta)): the final loss with learning rate eta, l_0: the loss at
    initialisation, the expectation a mean over the log-spaced grid; a
    diverged run (NaN / inf loss) is no better than l_0.
    """
    clipped = [initial_loss if not math.isfinite(l) else min(l, initial_loss) for l in final_losses]
    best = min(l for l in final_losses if math.isfinite(l))
    return sum(clipped) / len(clipped) - best


def test_lr_sensitivity_is_the_papers_definition():
    rng = np.random.default_rng(0)
    for _ in range(50):
        l0 = float(rng.uniform(3.0, 6.0))
        losses = list(rng.uniform(1.0, 8.0, size=int(rng.integers(2, 8))))
        for i in rng.choice(len(losses), size=int(rng.integers(0, 2)), replace=False):
            losses[i] = float(rng.choice([np.nan, np.inf]))  # diverged
        losses[int(rng.integers(len(losses)))] = float(rng.uniform(1.0, l0))  # some LR beats init
        assert diagnostics.lr_sensitivity(losses, l0) == pytest.approx(paper_lr_sensitivity(losses, l0),
                                                                     rel=1e-12, abs=1e-12)
    # Where no learning rate beats initialisation the paper's formula is negative (mean l0 - l* < 0);
    # the library keeps its lower bound 0 (every run counts as l0: nothing to be sensitive about).
    assert paper_lr_sensitivity([5.0, 6.0], 4.0) == pytest.approx(-1.0)
    assert diagnostics.lr_sensitivity([5.0, 6.0], 4.0) == 0.0


def test_configs_validate():
    for arg in ("quick", "full"):
        c = stability_config.get_config(arg)
        assert {"baseline", "qk_norm", "z_loss", "qk_norm_z_loss", "post_ln", "sandwich", "deepnorm",
                "softcap", *stability_config.METHODS} == set(c.variants)
        assert len(c.sizes) >= 2
        lrs = sorted(c.learning_rates)
        assert lrs[0] == pytest.approx(3e-4) and lrs[-1] == pytest.approx(3e-1)
        assert np.ptp(np.diff(np.log10(lrs))) < 0.1  # log-spaced (3e-4, 1e-3, 3e-3, ...: half-decades)
        c.learning_rates, c.seeds = (lrs[-1],), (0,)
        _, points = engine.expand(studies.study("stability"), c)  # every variant at every size validates
        assert len(points) == len({p.name for p in points}) == len(c.sizes) * len(c.variants)
        assert {p.run.config.train.weight_decay_mode for p in points} == {"independent"}
    with pytest.raises(ValueError, match="unknown stability config argument"):
        stability_config.get_config("fast")


METHOD_FIELDS = {  # variant -> (resolved field, value): each method's one switch
    "qk_clip": ("train.qk_clip", 100.0), "derf": ("model.norm.kind", "derf"), "dyt": ("model.norm.kind", "dyt"),
    "ngpt": ("model.norm.placement", "ngpt"),
    "v_norm": ("model.norm.v_norm", True), "hybrid_norm": ("model.norm.placement", "hybrid"),
    "hybrid_norm_star": ("model.norm.placement", "hybrid_star"), "lns": ("model.norm.placement", "lns"),
    "gated_attention": ("model.attention_gate", "elementwise"),
    "gated_attention_headwise": ("model.attention_gate", "headwise"),
    "sinks": ("model.attention_sinks", "learned"), "minicpm_multipliers": ("model.embedding_multiplier", 12.0),
    "hyper_connections": ("model.residual_streams", 4), "mhc": ("model.hyper_connections", "mhc"),
    "moe": ("model.moe.num_experts", 8), "moe_router_z_loss": ("model.moe.router_z_loss_coef", 1e-3)}


def _get(config, dotted):
    for key in dotted.split("."):
        config = config[key]
    return config


def test_every_method_variant_expands_to_valid_points():
    """Each method is its one field on the baseline at every size of quick, depth and methods_smoke;
    MiniCPM's residual and logit multipliers follow each size's depth and width."""
    assert set(METHOD_FIELDS) == set(stability_config.METHODS)
    for arg in ("methods_smoke", "quick", "depth"):
        c = stability_config.get_config(arg)
        c.learning_rates, c.seeds = (c.learning_rates[0],), (c.seeds[0],)
        _, points = engine.expand(studies.study("stability"), c)
        by = {(p.fields["size"], p.fields["variant"]): p.run.config for p in points}
        smallest = min(int(r.model.d_model) for r in by.values())
        for (size, variant), r in by.items():
            base = by[(size, "baseline")]
            if variant in METHOD_FIELDS:
                field, value = METHOD_FIELDS[variant]
                assert _get(r, field) == value != _get(base, field), (arg, variant)
            if variant == "minicpm_multipliers":
                assert r.model.residual_multiplier == pytest.approx(1.4 / math.sqrt(r.model.num_layers))
                assert r.model.logits_multiplier == pytest.approx(smallest / 9 / r.model.d_model)
            else:
                assert (r.model.residual_multiplier, r.model.logits_multiplier) == (1.0, 1.0)
            assert r.train.weight_decay_mode == "independent" and r.train.weight_decay == 1e-4
    depth = stability_config.get_config("depth")
    assert set(depth.variants) == {"baseline", "lns", "hybrid_norm", "hybrid_norm_star"}
    assert sorted(int(s["model.num_layers"]) for s in depth.sizes.values()) == [4, 8, 16]
    assert {int(s["model.d_model"]) for s in depth.sizes.values()} == {32} and len(depth.seeds) >= 3
    smoke = stability_config.get_config("methods_smoke")
    assert set(smoke.variants) == {"baseline", *stability_config.METHODS} and smoke.base.train.steps == 2
    # methods_quick: the quick grid (base, sizes, learning rates, seeds) restricted to the methods
    quick, methods = stability_config.get_config("quick"), stability_config.get_config("methods_quick")
    assert set(methods.variants) == {"baseline", *stability_config.METHODS}
    assert {k: methods.variants[k] for k in methods.variants} == {k: quick.variants[k] for k in methods.variants}
    for key in ("base", "sizes", "size_variants"):
        assert methods[key].to_dict() == quick[key].to_dict(), key
    assert (methods.learning_rates, methods.seeds) == (quick.learning_rates, quick.seeds)


def test_size_variants_must_name_a_size_and_variants():
    c = stability_config.get_config("methods_smoke")
    c.size_variants = ml_collections.ConfigDict(stability_config.minicpm_fields({"d99": stability_config._size(8, 2)}))
    with pytest.raises(ValueError, match="size_variants.d99 must be a sizes entry"):
        engine.expand(studies.study("stability"), c)
    c.size_variants = ml_collections.ConfigDict({"d8_l2": default.fields({"nope": {"model.residual_multiplier": 0.5}})})
    with pytest.raises(ValueError, match="size_variants.d8_l2 must be a sizes entry"):
        engine.expand(studies.study("stability"), c)


def test_run_variants_selects_entries_and_names_a_bad_one():
    c = stability_config.get_config("methods_smoke")
    c.run_variants = ("mhc", "baseline")
    _, points = engine.expand(studies.study("stability"), c)
    assert [p.fields["variant"] for p in points] == ["baseline", "mhc"]  # in the variants' order
    c.run_variants = ("baseline", "hc")
    with pytest.raises(ValueError, match="run_variants names 'hc', not a variants entry; choose from baseline"):
        engine.expand(studies.study("stability"), c)


@pytest.mark.slow
def test_methods_smoke_runs_end_to_end(tmp_path):
    """Two of methods_smoke's variants (one with size_variants) train and report (about 20 s)."""
    c = stability_config.get_config("methods_smoke")
    stability_config._grid(c, {"d8_l2": stability_config._size(8, 2)}, ("baseline", "minicpm_multipliers"))
    rows = studies.run("stability", c, str(tmp_path))
    assert [(r["variant"], r["num_layers"], r["steps"]) for r in rows] == [
        ("baseline", 2, 2), ("minicpm_multipliers", 2, 2)]
    for r in rows:
        assert not r["diverged"] and r["loss"] < r["initial_loss"] < 6.0
    assert rows[0]["initial_loss"] != rows[1]["initial_loss"]  # the multipliers change the initial model
    run = files.read_json(os.path.join(tmp_path, "runs", rows[1]["run"], "config.json"))
    assert run["config"]["model"]["residual_multiplier"] == pytest.approx(1.4 / math.sqrt(2))
    assert "| minicpm_multipliers |" in open(os.path.join(tmp_path, "table.md")).read()


@pytest.mark.slow
def test_hyper_connection_variants_train(tmp_path):
    """methods_smoke's hyper-connection variants build four streams and train (about 20 s)."""
    c = stability_config.get_config("methods_smoke")
    stability_config._grid(c, {"d8_l2": stability_config._size(8, 2)}, ("hyper_connections", "mhc"))
    rows = studies.run("stability", c, str(tmp_path))
    assert [r["variant"] for r in rows] == ["hyper_connections", "mhc"]
    for r in rows:
        assert not r["diverged"] and r["loss"] < r["initial_loss"] < 6.0
        run = files.read_json(os.path.join(tmp_path, "runs", r["run"], "config.json"))["config"]["model"]
        assert (run["residual_streams"], run["hyper_connections"]) == (4, r["variant"].replace(
            "hyper_connections", "dynamic"))


def tiny_config():
    return stability_config.get_config("smoke")


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("stability"))
    return workdir, studies.run("stability", tiny_config(), workdir)


@pytest.mark.slow
def test_tiny_grid_rows_table_and_plots(tiny_study):
    workdir, rows = tiny_study
    assert len(rows) == 4
    for r in rows:
        for f in ("variant", "learning_rate", "seed", "d_model", "num_layers", "loss", "diverged",
                  "initial_loss", "max_attention_logit", "max_attention_logit_max", "output_logit_mean"):
            assert f in r, f
        assert r["d_model"] == 16 and r["num_layers"] == 1
        assert r["max_attention_logit_max"] >= r["max_attention_logit"]
        assert (r["loss"] is None) == r["diverged"]
        if not r["diverged"]:
            assert r["loss"] < r["initial_loss"]
    by = {(r["variant"], r["learning_rate"]): r for r in rows}
    assert not by[("baseline", 1e-3)]["diverged"] and by[("baseline", 1e9)]["diverged"]
    # The initialisation does not depend on the learning rate: one initial loss per cell.
    for v in ("baseline", "qk_norm"):
        assert by[(v, 1e-3)]["initial_loss"] == by[(v, 1e9)]["initial_loss"]
    # ... and it is the eval loss of the untrained model.
    p = next(p for p in engine.expand(studies.study("stability"), tiny_config())[1]
             if p.fields["variant"] == "baseline")
    from posenc.training import evaluate
    model = loop.init_state(p.run)[0]
    r = p.run
    assert evaluate.evaluate_length(model, r.task, r.config, r.spec, 16)["loss"] == pytest.approx(
        by[("baseline", 1e-3)]["initial_loss"], rel=1e-6)
    assert by[("qk_norm", 1e9)]["diverged_at_step"] and by[("qk_norm", 1e9)]["final_loss"] is None

    table = open(os.path.join(workdir, "table.md")).read()
    sens = stability_report.sensitivities(rows)[("d16", "baseline")][0]
    expected = diagnostics.lr_sensitivity([by[("baseline", 1e-3)]["loss"], float("nan")],
                                        by[("baseline", 1e-3)]["initial_loss"])
    assert sens == pytest.approx(expected)
    assert f"| baseline | {expected:.3f} |" in table
    assert "| baseline | " in table and "diverged" in table
    for name in ("stability_loss_vs_lr.png", "stability_attention_logit.png"):
        assert os.path.getsize(os.path.join(workdir, "plots", name)) > 1000
    assert files.read_jsonl(os.path.join(workdir, "results.jsonl")) == rows


@pytest.mark.slow
def test_rerun_reads_every_run(tiny_study):
    workdir, rows = tiny_study
    logs = {n: os.path.getmtime(os.path.join(workdir, "runs", n, "results.jsonl"))
            for n in os.listdir(os.path.join(workdir, "runs"))}
    assert studies.run("stability", tiny_config(), workdir) == rows
    assert logs == {n: os.path.getmtime(os.path.join(workdir, "runs", n, "results.jsonl")) for n in logs}


@pytest.mark.slow
def test_a_nan_divergence_keeps_its_train_log(tiny_study):
    workdir, rows = tiny_study
    row = next(r for r in rows if r["variant"] == "baseline" and r["learning_rate"] == 1e9)
    assert row["diverged"] and row["loss"] is None and row["diverged_at_step"] is not None
    log = files.read_jsonl(os.path.join(workdir, "runs", row["run"], "train_log.jsonl"))
    assert log and all(r["step"] < row["diverged_at_step"] for r in log)
    assert row["max_attention_logit_max"] == max(r["max_attention_logit"] for r in log)


def test_a_run_no_better_than_its_initialisation_diverged():
    assert not study.is_diverged(2.9, 5.5)
    assert study.is_diverged(5.5, 5.5) and study.is_diverged(47.6, 5.5)  # finite, but no learning
    assert study.is_diverged(None, 5.5) and study.is_diverged(2.9, 5.5, diverged_at_step=3)


@pytest.mark.slow
def test_a_study_killed_anywhere_resumes_to_the_same_rows(tiny_study, tmp_path):
    import random

    from helpers import kill_during_a_point, leftovers, study_command
    from posenc.studies import rows as rows_lib

    _, reference = tiny_study
    workdir = str(tmp_path / "killed")
    rng = random.Random(int(os.environ.get("POSENC_KILL_SEED", "0")))
    killed, said = kill_during_a_point(study_command("stability", "smoke", workdir), rng)
    assert killed, "".join(said[-20:])
    kill_during_a_point(study_command("stability", "smoke", workdir), rng, kill=False)
    assert rows_lib.without_volatile(studies.load_rows(workdir)) == rows_lib.without_volatile(reference)
    assert leftovers(workdir) == []


def test_report_pairs_each_variant_with_the_baseline_by_seed():
    """Sensitivity cells carry the t-interval; the paired table holds qk_norm - baseline per seed."""
    rows = []
    for seed in range(3):
        for variant, first in (("baseline", 3.0 + 0.1 * seed), ("qk_norm", 2.5)):
            for lr, loss in ((1e-3, first), (1e-2, 2.0)):
                rows.append(dict(size="d16", d_model=16, num_layers=1, variant=variant, seed=seed,
                                 learning_rate=lr, loss=loss, initial_loss=5.0, diverged=False,
                                 max_attention_logit_max=None))
    text = stability_report.table_markdown(rows)
    # baseline sensitivities (1 + 0.1 s) / 2 = 0.50, 0.55, 0.60; qk_norm 0.25; paired -0.25 - 0.05 s
    assert "| baseline | 0.550 [0.426, 0.674] {0.50-0.60} |" in text
    assert "| qk_norm | -0.300 [-0.424, -0.176] * |" in text
    # final loss per learning rate, paired: qk_norm - baseline = -0.5 - 0.1 s at 1e-3 (t-interval of
    # -0.5, -0.6, -0.7: -0.6 +- 4.303 * 0.1 / sqrt(3)), 0 at 1e-2
    assert "| qk_norm | -0.600 [-0.848, -0.352] * | +0.000 [+0.000, +0.000] |" in text
    logits = [dict(r, max_attention_logit_max=(1000.0 if r["variant"] == "baseline" else 10.0) * (1 + r["seed"]))
              for r in rows]
    assert "| qk_norm | -2.00 [-2.00, -2.00] * | -2.00 [-2.00, -2.00] * |" in stability_report.table_markdown(logits)
