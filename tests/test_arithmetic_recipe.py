"""compare:arithmetic_cpu and compare:arithmetic_ladder: the official recipe's fields, arms and budgets."""

from helpers import grid_points
from posenc.configs import compare
from posenc.configs.compare_grids import arithmetic as grids
from posenc.studies import engine
from posenc.training import dataset

# what an arm may set besides the encoding: its task-side recipe (coupled ids) and Abacus's looped layer
RECIPE = ("task.options.coupled", "task.options.max_position", "model.recurrences")


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and not (prefix == "task." and k == "options"):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, dict):
            out.update({f"{prefix}{k}.{o}": x for o, x in v.items()})
        else:
            out[f"{prefix}{k}"] = v
    return out


def _official(cfg, steps):
    t = cfg.train
    assert (t.dataset_size, t.fit_accuracy, t.weight_decay, t.b2, t.steps) == (100_000, 0.0, 0.0, 0.95, steps)
    assert cfg.task.options.operand_lengths == "independent" and cfg.task.options.format == "reversed"
    assert cfg.task.options.zero_pad and cfg.eval.sizes == "exact" and cfg.eval.decode


def test_arithmetic_cpu_trains_the_official_recipe_on_1_to_16_digits():
    c = compare.get_config("arithmetic_cpu")
    points = grid_points(c)
    assert len(points) == 4 * 3 and all(len(g) == 3 for g in engine.groups(points))
    by_arm = {}
    for p in points:
        cfg, task = p.run.config, p.run.task
        _official(cfg, grids.CPU_STEPS)
        assert task.max_size(cfg.task.train_length) == 16
        assert [task.max_size(n) for n in cfg.eval.lengths] == [16, 24, 32, 48]
        assert cfg.train.eval_every == grids.CPU_STEPS // 10 and cfg.train.select_length == cfg.eval.lengths[-1]
        by_arm.setdefault(p.fields["variant"], _flat(cfg.to_dict()))
    assert by_arm["abacus"]["model.position.abacus.max_k"] == 100 and by_arm["abacus"]["model.recurrences"] > 1
    assert by_arm["position_coupling"]["model.position.position_coupling.max_position"] >= 2 * 49
    for arm in ("position_coupling", "abacus", "nope"):
        differ = {k for k in set(by_arm[arm]) | set(by_arm["rope"]) if by_arm[arm].get(k) != by_arm["rope"].get(k)}
        assert all(k.startswith("model.position.") or k in RECIPE for k in differ), (arm, differ)
    assert c.findings == "sizes" and c.targets["size"] == 32


def test_arithmetic_ladder_points_are_budgets_of_training_examples():
    c = compare.get_config("arithmetic_ladder")
    points = grid_points(c)
    assert len(points) == len(grids.LADDER_BUDGETS) * 2 * 3
    seen = {}
    for p in points:
        cfg = p.run.config
        _official(cfg, cfg.train.steps)
        assert cfg.train.eval_every == 0 and cfg.train.select_length == 0
        examples = dataset.examples_seen(cfg.train.steps, cfg.train.batch_size, cfg.train.dataset_size)
        seen.setdefault(p.fields["task_variant"], set()).add(examples)
    assert seen == {f"examples_{n}": {n} for n in grids.LADDER_BUDGETS}  # the rows' train_examples
    assert grids.LADDER_BUDGETS[0] == 100_000 and c.findings == "ladder"


def test_the_quick_grid_keeps_todays_recipe():
    for p in grid_points(compare.get_config("arithmetic_quick")):
        cfg = p.run.config
        assert (cfg.train.dataset_size, cfg.train.eval_every, cfg.train.select_length, cfg.model.recurrences) == (
            0, 0, 0, 1)
        assert p.run.task.operand_lengths == "one_at_n"
