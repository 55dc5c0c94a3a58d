"""The arithmetic grids of the compare config, tables per task variant and in problem sizes, findings "sizes"."""

import pytest

from helpers import grid_points
from posenc.config.schema import ConfigError
from posenc.configs import compare
from posenc.studies import compare_report, engine, findings, findings_sizes

# what an arm may change besides the encoding: its task-side recipe (coupled ids, index hints) and,
# with index hints (two tokens per digit, the hint symbols), the token lengths of the same problem
# sizes and the vocabulary
RECIPE = ("task.options.coupled", "task.options.max_position", "task.options.index_hints",
          "task.train_length", "eval.lengths", "model.vocab_size")


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "options" or (k == "options" and prefix == "task."):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _points(arg):
    return compare.get_config(arg), grid_points(compare.get_config(arg))


def test_arithmetic_quick_sizes_arms_formats_and_seeds():
    c, points = _points("arithmetic_quick")
    assert set(c.grid.positions) == {"abacus", "position_coupling", "fire_randomized_hints", "rope", "nope",
                                     "fire"}
    assert len(points) == 2 * 6 * 3
    groups = engine.groups(points)
    assert len(groups) == 12 and all(len(g) == 3 for g in groups)  # 3 seeds trained together per cell
    formats = set()
    for p in points:
        r, cfg = p.run, p.run.config
        task = r.task
        # trained on operands of up to 8 digits, evaluated at exactly 8, 16 and 24 digits
        assert task.max_size(cfg.task.train_length) == 8
        assert [task.max_size(n) for n in cfg.eval.lengths] == [8, 16, 24]
        assert cfg.eval.sizes == "exact" and cfg.eval.decode and cfg.train.fit_accuracy > 0
        formats.add(task.format)
        if p.fields["variant"] == "fire_randomized_hints":
            assert task.index_hints and cfg.model.position.randomized and cfg.model.position.kind == "fire"
        if p.fields["variant"] == "position_coupling":
            assert task.coupled and task.position_levels == 1
            # every id of a 24-digit evaluation example has a row of the table
            assert cfg.model.position.position_coupling.max_position >= 24 + 2
        if p.fields["variant"] == "abacus":  # rows 1 .. max_k + 9 trained: every 24-digit index (<= 25)
            assert cfg.model.position.abacus.max_k + 9 >= 25
    assert formats == {"reversed", "msd"}
    assert c.findings == "sizes" and c.targets["size"] == 16


def test_arithmetic_arms_differ_only_by_the_encoding_and_its_recipe():
    _, points = _points("arithmetic_quick")
    by_cell = {}
    for p in points:
        by_cell.setdefault((p.run.task.format, p.run.config.train.seed), []).append(p)
    for cell in by_cell.values():
        flats = [_flat(p.run.config.to_dict()) for p in cell]
        keys = set().union(*flats)
        differ = {k for k in keys if len({repr(f.get(k)) for f in flats}) > 1}
        assert differ and {k for k in differ if not k.startswith("model.position.")} <= {*RECIPE, "name"}, differ
    # between the two tables, only the format
    a = _flat(by_cell[("reversed", 0)][0].run.config.to_dict())
    b = _flat(by_cell[("msd", 0)][0].run.config.to_dict())
    assert {k for k in a if a[k] != b.get(k)} - {"name"} == {"task.options.format"}


@pytest.mark.parametrize("arg, train, largest", [("arithmetic", 20, 100), ("arithmetic_cho", 30, 200)])
def test_arithmetic_full_grids_validate_with_the_papers_sizes(arg, train, largest):
    c, points = _points(arg)
    r = points[0].run
    assert r.task.max_size(r.config.task.train_length) == train
    assert max(r.task.max_size(n) for n in r.config.eval.lengths) == largest
    coupled = next(p for p in points if p.fields["variant"] == "position_coupling").run.config
    assert coupled.model.position.position_coupling.max_position >= largest + 2


def test_cho_small_is_their_run_coupling_script():
    """compare:arithmetic_cho_small against HanseulJo/position-coupling
    scripts/addition/run_coupling.sh (small run) and configs/training/default.yaml."""
    _, points = _points("arithmetic_cho_small")
    assert sorted({p.fields["variant"] for p in points}) == ["nope", "position_coupling", "rope"]
    for p in points:
        r, c = p.run, p.run.config
        assert r.task.max_size(c.task.train_length) == 5  # n_train=5
        assert sorted(r.task.max_size(n) for n in c.eval.lengths) == [5, 10, 15]  # n_test=10, and 15
        assert (c.task.options.format, c.task.options.zero_pad) == ("reversed_output", True)
        assert (r.spec.num_layers, r.spec.num_heads, r.spec.d_model, r.spec.head_dim) == (1, 4, 512, 128)
        assert (r.spec.mlp, r.spec.mlp_hidden) == ("geglu", 2048)  # gated-gelu, d_ff 2048
        assert (c.model.norm.kind, c.model.norm.placement) == ("rms", "sandwich")  # rmsnorm, pre_post
        t = c.train
        assert (t.learning_rate, t.weight_decay, t.batch_size, t.steps) == (1e-4, 0.0, 1000, 50000)
        assert (t.b1, t.b2, t.eps, t.clip_norm, t.min_lr_ratio) == (0.9, 0.999, 1e-8, 1.0, 0.1)
        assert t.warmup_steps == 0.01 * t.steps and t.fit_accuracy == 0.0
    coupled = next(p for p in points if p.fields["variant"] == "position_coupling").run.config
    assert coupled.model.position.position_coupling.max_position == 17  # maxpos=17
    assert coupled.task.options.coupled


def test_targets_are_checked():
    c = compare.get_config("arithmetic_quick")
    c.targets = {"size": 16, "abov": {}}
    with pytest.raises(ConfigError, match="unknown keys"):
        grid_points(c)
    c.targets = {"size": 16, "below": {"rope": 2.0}}
    with pytest.raises(ConfigError, match="below.rope"):
        grid_points(c)


def _row(table, variant, seed, size, em, *, length=None, fitted=True):
    length = length or 3 * size + 4
    return {"task": "addition", "task_variant": table, "variant": variant, "position": variant, "seed": seed,
            "run": f"{table}_{variant}_s{seed}", "config_hash": "h", "placement": "pre", "norm": "rms",
            "eval_length": length, "train_length": 28 if length in (28, 52) else 53, "problem_size": size,
            "problem_size_min": size, "problem_size_max": size, "fitted": fitted,
            "accuracy": em, "exact_match": em, "decoded_accuracy": em, "decoded_exact_match": em}


def _grid_rows():
    rows = []
    for seed, (a, b) in enumerate([(0.95, 0.1), (0.9, 0.0), (1.0, 0.05)]):
        for size in (8, 16):
            rows.append(_row("reversed", "coupled", seed, size, 1.0 if size == 8 else a))
            rows.append(_row("reversed", "rope", seed, size, 1.0 if size == 8 else b))
            # index hints: the same sizes at other token lengths
            rows.append(_row("reversed", "hints", seed, size, 0.5, length=(53 if size == 8 else 101)))
            rows.append(_row("msd", "rope", seed, size, 0.3, fitted=seed != 2))
    return rows


def test_tables_per_task_variant_in_problem_sizes():
    md = compare_report.table_markdown(_grid_rows())
    assert "## msd (addition)" in md and "## reversed (addition)" in md
    reversed_table = md.split("## reversed (addition)")[1]
    # one column per problem size (8 is the training size), every label in it
    assert "| encoding | n=8* | n=16 |" in reversed_table
    assert "| coupled | 1.000" in reversed_table and "| hints | 0.500" in reversed_table
    assert "0.950 [" in reversed_table  # coupled at 16: mean of 0.95, 0.9, 1.0
    # a table of one size law keeps its token lengths
    assert "| encoding | 28* | 52 |" in md.split("## msd (addition)")[1].split("## reversed")[0]


def test_sizes_findings_target_check_and_paired_differences(tmp_path):
    rows = _grid_rows()
    targets = {"size": 16, "at_least": {"coupled": 0.9}, "below": {"rope": 0.2}}
    res = findings_sizes.size_scores(rows)
    cell = res["reversed"]["cells"]["coupled"][16]
    assert cell["stat"].mean == pytest.approx(0.95) and cell["stat"].n == 3
    assert res["msd"]["cells"]["rope"][16]["unfitted"] == 1 and res["msd"]["cells"]["rope"][16]["stat"].n == 2
    md = findings_sizes.sizes_markdown(rows, targets=targets)
    # coupled: mean 0.95 >= 0.9 but its interval (t_0.975,2 * 0.05 / sqrt(3) = 0.124) reaches below 0.9
    assert "| coupled | >= 0.9 | 0.950 [0.826, 1.000]" in md and "met, not the whole interval" in md
    assert "| rope | < 0.2 | 0.050 [0.000, 0.174]" in md and "met, the whole interval" in md
    # paired by seed: 0.85, 0.9, 0.95 -> 0.900 +- 0.124
    assert "coupled - rope: +0.900 [+0.776, +1.024] (excludes 0, 3 seeds)" in md
    assert "At n=16, best: coupled" in md
    # --baseline: the main metric (here decoded accuracy) of every label minus rope's, paired by seed
    rows_acc = [dict(r, decoded_accuracy=r["decoded_accuracy"] / 2) for r in rows]
    md = findings_sizes.sizes_markdown(rows_acc, targets={"baseline": "rope"})
    reversed_part = md.split("reversed: decoded accuracy")[1].split("### msd")[0]
    assert "each label minus rope, paired by seed" in reversed_part
    # size 8: 0.5 - 0.5 in every seed; size 16: (0.9 +- 0.124) / 2
    assert ("| coupled | +0.000 [+0.000, +0.000] (includes 0, 3 seeds) | +0.450 [+0.388, +0.512] (excludes 0, "
            "3 seeds) |") in reversed_part
    assert "| hints | -0.250 [-0.250, -0.250] (excludes 0, 3 seeds) |" in reversed_part
    assert "(no label 'absent' in" in findings_sizes.sizes_markdown(rows_acc, targets={"baseline": "absent"})
    written = findings.write("sizes", rows, str(tmp_path), targets=targets)
    assert written[0].endswith("findings.md") and any(w.endswith("findings_sizes_reversed.png") for w in written)
