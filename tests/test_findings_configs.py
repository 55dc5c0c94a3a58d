"""The findings grids of the compare config (quick, lm, randomized, interaction) and posenc.studies.findings*."""

import os

import pytest

from helpers import grid_points
from posenc import placements, tasks
from posenc.configs import compare
from posenc.configs.compare_grids import common
from posenc.configs.compare_grids import lm as lm_grids
from posenc.model import ENCODINGS
from posenc.studies import engine, findings, findings_interaction, findings_randomized


def _points(arg, **grid):
    c = compare.get_config(arg)
    c.grid.update(grid)
    return c, grid_points(c)  # every point validated (ConfigError on a bad one)


def test_quick_fits_then_extrapolates_six_encodings_to_8x_with_3_seeds():
    c, points = _points("quick")
    assert {"nope", "sinusoidal", "learned", "rope", "alibi", "t5"} <= set(c.grid.positions)
    # every cell's seeds (at least 3) train together
    groups = engine.groups(points)
    assert len(groups) == len(c.grid.positions) and all(len(g) >= 3 for g in groups)
    r = points[0].run
    task, lengths = r.task, tuple(r.config.eval.lengths)
    # problem sizes 1x, 2x, 4x, 8x the training size (tokens derived from them), scored in size bins
    trained = task.max_size(r.config.task.train_length)
    assert [task.max_size(n) for n in lengths][1:] == [2 * trained + 1, 4 * trained + 3, 8 * trained + 7]
    assert r.config.train.fit_accuracy > 0 and task.eval_sizes == "bin"
    learned = next(p for p in points if p.fields["variant"] == "learned")
    assert learned.run.config.model.position.learned.max_length >= max(lengths)  # rows to 8x, not n/a


@pytest.mark.parametrize("arg", ["lm", "lm_quick"])
def test_lm_grids_train_text_at_L_and_evaluate_to_16L(arg):
    c, points = _points(arg)
    assert set(c.grid.tasks) == {"text"} and len(c.grid.seeds) >= 3
    assert {"sinusoidal", "rope", "alibi", "t5", "kerple_log", "fire", "nope"} <= set(c.grid.positions)
    L = c.base.task.train_length
    assert tuple(c.base.eval.lengths) == tuple(f * L for f in (1, 2, 4, 8, 16))
    assert all(p.run.config.task.name == "text" for p in points)


def test_randomized_quick_pairs_every_encoding_with_its_randomized_variant():
    c, points = _points("randomized_quick")
    assert c.findings == "randomized"
    kinds = {p.fields["variant"] for p in points if not p.fields["variant"].endswith("_randomized")}
    assert {p.fields["variant"] for p in points} == kinds | {f"{k}_randomized" for k in kinds}
    for p in points:
        pos = p.run.config.model.position
        assert pos.randomized == p.fields["variant"].endswith("_randomized")
        if pos.kind == "learned":  # the table holds every position the run can see
            need = pos.randomized_max_position if pos.randomized else max(p.run.config.eval.lengths)
            assert pos.learned.max_length >= need
    levels = {tasks.spec(t)["level"] for t in c.grid.tasks}
    assert "copy" in c.grid.tasks and {"DCF", "CS"} <= levels


@pytest.mark.parametrize("arg", ["randomized", "randomized_quick", "chomsky", "chomsky_quick"])
def test_chomsky_family_grids_scale_token_embeddings_as_the_reference(arg):
    # models/transformer.py of the reference multiplies the embeddings by sqrt(d_model); without it
    # randomized sinusoidal positions swamp the tokens and the model stays at chance.
    c = compare.get_config(arg)
    assert c.base.model.norm.embed_scale is True
    assert compare.get_config("suite_quick").base.model.norm.embed_scale is False


def test_randomized_full_covers_every_chomsky_task_and_every_encoding_but_nope():
    c = compare.get_config("randomized")
    assert set(common.chomsky_tasks()) | {"copy", "reverse"} == set(c.grid.tasks)
    assert set(c.grid.positions) == {k + s for k in ENCODINGS if k != "nope" for s in ("", "_randomized")}
    # validate one point per encoding variant on the longest task lengths (the full grid has ~2000)
    c.grid.update(tasks=(c.grid.tasks[-1],), seeds=(0,))
    assert len(grid_points(c)) == len(c.grid.positions)


@pytest.mark.parametrize("arg", ["interaction", "interaction_quick"])
def test_interaction_grids(arg):
    c = compare.get_config(arg)
    assert c.findings == "interaction" and set(c.grid.tasks) == {"copy", "text"}
    assert {"rope", "alibi", "nope", "t5"} <= {p.removesuffix("_qknorm") for p in c.grid.positions}
    for p in c.grid.positions:
        want = "rms" if p.endswith("_qknorm") else None
        assert c.variants[p].get("model.norm.qk_norm") == want
    if arg == "interaction":
        assert set(c.grid.placements) == {"pre", "post", "sandwich", "reordered", "deepnorm", "mixln"}
        assert len(c.grid.seeds) >= 3
    # Mix-LN has a post-norm layer and a pre-norm one at this depth (not plain pre-LN)
    mix = c.variants["mixln"]["model.norm.mixln_fraction"]
    assert 1 <= placements.num_post_layers(c.base.model.num_layers, mixln_fraction=mix) < c.base.model.num_layers
    c.grid.update(seeds=(0,))
    points = grid_points(c)
    text = [p for p in points if p.run.config.task.name == "text"]
    assert text and all(p.run.config.train.fit_accuracy == 0 for p in text)  # LM: a fixed budget


# ---------------------------------------------------------------- findings
def _row(task, variant, seed, length, value, *, placement="pre", train_length=8, fitted=None, diverged=False):
    metric = "loss" if task == "text" else "accuracy"
    return {"task": task, "variant": variant, "position": variant.split("_")[0], "placement": placement,
            "seed": seed, "run": f"{task}_{variant}_{placement}_s{seed}", "config_hash": "h",
            "eval_length": length, "train_length": train_length, metric: value, "fitted": fitted,
            "diverged_at_step": 3 if diverged else None}


def _runs(task, variant, ood_by_seed, *, ind=1.0, **kw):
    rows = []
    for seed, ood in enumerate(ood_by_seed):
        rows += [_row(task, variant, seed, 8, ind, **kw), _row(task, variant, seed, 16, ood[0], **kw),
                 _row(task, variant, seed, 32, ood[1], **kw)]
    return rows


def test_randomized_gain_per_encoding_and_overall():
    rows = (_runs("a", "rope", [(0.2, 0.4), (0.4, 0.6)])                 # seed OOD means 0.3, 0.5 -> 0.4
            + _runs("a", "rope_randomized", [(0.6, 0.8), (0.8, 1.0)])    # 0.7, 0.9 -> 0.8: gain +0.4
            + _runs("b", "rope", [(0.5, 0.5), (0.5, 0.5)])
            + _runs("b", "rope_randomized", [(0.6, 0.6), (0.6, 0.6)])    # gain +0.1
            + _runs("a", "alibi", [(0.5, 0.5)])
            + _runs("a", "alibi_randomized", [(0.4, 0.4)], fitted=False))  # nothing fitted: left out
    res = findings_randomized.randomized_gain(rows)
    assert res["tasks"]["a"]["rope"] == pytest.approx(0.4) and res["tasks"]["b"]["rope"] == pytest.approx(0.1)
    mean, half, n = res["per_encoding"]["rope"][:3]
    assert (mean, n) == (pytest.approx(0.25), 2)
    # paired by seed: task a's gains 0.4, 0.4 (an interval of width 0: helps); b's 0.1, 0.1
    assert res["paired"]["a"]["rope"][:3] == (pytest.approx(0.4), pytest.approx(0.0), 2)
    assert res["verdicts"]["a"]["rope"] == "helps" and res["verdicts"]["b"]["rope"] == "helps"
    assert half == pytest.approx(12.7062 * 0.15, rel=1e-4)  # t_0.975,1 s / sqrt(2), s = 0.3 / sqrt(2)
    assert res["missing"] == [("a", "alibi")] and res["per_encoding"]["alibi"] is None
    assert res["overall"][0] == pytest.approx(0.25)
    md = findings_randomized.randomized_markdown(rows)
    assert "+0.400" in md and "[1 unfitted]" in md and "a/alibi" in md
    # --include_unfitted scores the unfitted run too: alibi's gain 0.4 - 0.5
    res = findings_randomized.randomized_gain(rows, include_unfitted=True)
    assert res["tasks"]["a"]["alibi"] == pytest.approx(-0.1) and res["missing"] == []
    assert res["overall"][0] == pytest.approx((0.4 + 0.1 - 0.1) / 3)
    md = findings_randomized.randomized_markdown(rows, include_unfitted=True)
    assert "[1 unfitted, included]" in md and "**-0.100**" in md and "fitted or not" in md


def test_best_placement_and_whether_it_depends_on_the_encoding(tmp_path):
    rows = []
    for variant, scores in (("rope", {"pre": 0.9, "post": 0.5}), ("alibi", {"pre": 0.3, "post": 0.8})):
        for placement, s in scores.items():
            rows += _runs("copy", variant, [(s, s), (s + 0.01, s + 0.01), (s - 0.01, s - 0.01)],
                          placement=placement)
    rows += _runs("copy", "nope", [(0.7, 0.7)], placement="pre") + _runs("copy", "nope", [(0.1, 0.1)],
                                                                         placement="post", diverged=True)
    # text: lower log-perplexity is better
    rows += _runs("text", "rope", [(2.0, 2.2), (2.1, 2.1)], placement="pre")
    rows += _runs("text", "rope", [(1.5, 1.7), (1.6, 1.6)], placement="post")
    res = findings_interaction.best_placements(rows)
    assert res["copy"]["rope"]["best"] == "pre" and res["copy"]["rope"]["clear"]
    assert res["copy"]["alibi"]["best"] == "post" and res["copy"]["alibi"]["clear"]
    assert res["copy"]["nope"]["best"] == "pre" and res["copy"]["nope"]["cells"]["post"]["diverged"] == 1
    assert res["text"]["rope"]["best"] == "post"
    md = findings_interaction.interaction_markdown(rows)
    assert ("depends on the encoding, each clear of its runner-up by a paired seed interval: "
            "alibi: post, rope: pre") in md
    assert res["copy"]["rope"]["paired"][:3] == (pytest.approx(0.4), pytest.approx(0.0), 3)
    written = findings.write("interaction", rows, str(tmp_path))
    assert [os.path.basename(p) for p in written] == [
        "findings.md", "findings_interaction_copy.png", "findings_interaction_text.png"]
    copied = findings.copy_figures(str(tmp_path), str(tmp_path / "figs"), "grid")
    assert [os.path.basename(p) for p in copied] == ["findings_grid_interaction_copy.png",
                                                     "findings_grid_interaction_text.png"]
    with pytest.raises(ValueError, match="the plots of .* are: findings_interaction_copy"):
        findings.copy_figures(str(tmp_path), str(tmp_path / "figs"), "grid", ["copy_accuracy"])
    with pytest.raises(ValueError, match="choose one of"):
        findings.write("gain", rows, str(tmp_path))
    assert findings.write("", rows, str(tmp_path)) == []


def test_a_difference_within_seed_noise_is_unresolved_even_when_means_differ():
    # per-seed gains +0.3, -0.1, +0.1: mean +0.1, but the paired interval includes zero
    rows = (_runs("a", "rope", [(0.5, 0.5), (0.5, 0.5), (0.5, 0.5)])
            + _runs("a", "rope_randomized", [(0.8, 0.8), (0.4, 0.4), (0.6, 0.6)]))
    res = findings_randomized.randomized_gain(rows)
    assert res["tasks"]["a"]["rope"] == pytest.approx(0.1) and res["verdicts"]["a"]["rope"] == "unresolved"
    assert "unresolved" in findings_randomized.randomized_markdown(rows)
    # the same means with seeds that agree: resolved
    rows = (_runs("a", "rope", [(0.5, 0.5), (0.4, 0.4), (0.6, 0.6)])
            + _runs("a", "rope_randomized", [(0.6, 0.6), (0.5, 0.5), (0.7, 0.7)]))
    assert findings_randomized.randomized_gain(rows)["verdicts"]["a"]["rope"] == "helps"


def test_frontier_quick_scores_the_new_arms_at_exact_sizes_with_the_2x_target():
    c, points = _points("frontier_quick")
    arms = {p.fields["variant"] for p in points}
    assert arms == {"rope", "nope", "alibi", "pope", "hard_alibi", "rope_gated", "nope_gated", "rope_sinks"}
    groups = engine.groups(points)
    assert len(groups) == len(arms) and all(len(g) == 3 for g in groups)
    by_arm = {p.fields["variant"]: p.run.config for p in points}
    assert by_arm["rope_gated"].model.attention_gate == "elementwise" == by_arm["nope_gated"].model.attention_gate
    assert by_arm["nope_gated"].model.position.kind == "nope"
    assert by_arm["rope_sinks"].model.attention_sinks == "learned"
    assert by_arm["rope"].model.attention_gate == "none" and by_arm["rope"].model.attention_sinks == "none"
    r = points[0].run
    assert [r.task.max_size(n) for n in r.config.eval.lengths] == [8, 16, 32]
    assert r.config.eval.sizes == "exact" and r.config.eval.decode and r.config.train.fit_accuracy > 0
    assert c.findings == "sizes" and c.targets["size"] == 16
    assert set(c.targets["below"]) == {"rope", "nope"} and "pope" in c.targets["at_least"]
    # the Hard-ALiBi arm nearer the paper's heads, run on demand: half of 8 heads windowed
    _, extra = _points("frontier_quick", positions=("hard_alibi_h8",))
    m = extra[0].run.config.model
    assert (m.position.kind, m.num_heads, m.d_model) == ("hard_alibi", 8, by_arm["rope"].model.d_model)
    assert m.position.hard_alibi.num_windowed is None  # None: num_heads // 2 = 4 (windows of 1-4 keys)


def test_frontier_lm_quick_is_lm_quick_with_the_new_arms():
    c, points = _points("frontier_lm_quick")
    lm = compare.get_config("lm_quick")
    assert c.base.to_dict() == lm.base.to_dict()
    assert set(c.grid.positions) == set(lm_grids.FRONTIER_POSITIONS)
    assert len(points) == 3 * len(lm_grids.FRONTIER_POSITIONS)
