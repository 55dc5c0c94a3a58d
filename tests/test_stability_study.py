"""The stability study: the LR-sensitivity definition, a tiny grid end to end, divergence logs."""

import math
import os

import numpy as np
import pytest

from posenc import diagnostics, studies
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
                "softcap"} <= set(c.variants)
        assert len(c.sizes) >= 2
        lrs = sorted(c.learning_rates)
        assert lrs[0] == pytest.approx(3e-4) and lrs[-1] == pytest.approx(3e-1)
        assert np.ptp(np.diff(np.log10(lrs))) < 0.1  # log-spaced (3e-4, 1e-3, 3e-3, ...: half-decades)
        c.learning_rates, c.seeds = (lrs[-1],), (0,)
        _, points = engine.expand(studies.study("stability"), c)  # every variant at every size validates
        assert len(points) == len({p.name for p in points}) == len(c.sizes) * len(c.variants)
    with pytest.raises(ValueError, match="unknown stability config argument"):
        stability_config.get_config("fast")


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
