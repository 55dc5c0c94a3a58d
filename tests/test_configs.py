"""configs/default.py and configs/compare.py: fields, variants, lock_config and validation errors."""

import importlib.util
import os

import pytest
from absl import flags
from ml_collections import config_flags

from posenc import registry
from posenc.training import validate_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name):
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


default = load("default")
compare = load("compare")

PUBLIC = ("task.name", "task.train_length", "model.position.kind", "model.norm.kind",
          "model.norm.placement", "model.d_model", "model.num_layers", "model.num_heads",
          "train.steps", "train.batch_size", "train.learning_rate", "train.seed", "eval.lengths")


def get(c, dotted):
    for part in dotted.split("."):
        c = c[part]
    return c


def test_default_has_public_fields_and_validates():
    c = default.get_config()
    for field in PUBLIC:
        get(c, field)
    assert c.task.name == "copy" and c.model.position.kind == "rope"
    assert max(c.eval.lengths) >= 4 * c.task.train_length
    validate_config(c)


@pytest.mark.parametrize("arg, field, value", [
    ("alibi", "model.position.kind", "alibi"),
    ("text", "task.name", "text"),
    ("post", "model.norm.placement", "post"),
    ("randomized", "model.position.randomized", True),
    ("tiny,t5", "model.position.kind", "t5"),
])
def test_default_variants(arg, field, value):
    assert get(default.get_config(arg), field) == value


def test_every_position_kind_is_a_variant():
    for kind in registry.POSITION_KINDS:
        assert default.get_config(kind).model.position.kind == kind


def test_unknown_variant_names_allowed_tokens():
    with pytest.raises(ValueError, match=r"unknown configs/default.py argument 'rop'.*alibi"):
        default.get_config("rop")


def parse(argv):
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "config", flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    fv(argv)
    return fv.config


def test_lock_config_rejects_typo_on_the_command_line():
    path = os.path.join(ROOT, "configs", "default.py")
    c = parse(["prog", f"--config={path}:tiny", "--config.train.steps=7"])
    assert c.train.steps == 7 and c.model.num_layers == 1
    with pytest.raises(Exception, match="stepz"):
        parse(["prog", f"--config={path}", "--config.train.stepz=7"])
    with pytest.raises(AttributeError, match="stepz"):
        c.train.stepz = 3  # locked: new fields are typos


@pytest.mark.parametrize("field, value, message", [
    ("task.name", "copyy", r"unknown task 'copyy'; choose one of: copy"),
    ("model.position.kind", "rop", r"unknown position kind 'rop'; choose one of: alibi"),
    ("model.norm.placement", "middle", r"unknown norm placement 'middle'"),
    ("train.steps", 0, r"train.steps must be a positive integer, got 0"),
    ("train.learning_rate", -1.0, r"train.learning_rate must be > 0"),
    ("train.warmup_steps", 10_000, r"train.warmup_steps must be in \[0, train.steps=5000\]"),
    ("eval.lengths", (), r"eval.lengths must be a non-empty tuple"),
])
def test_validation_errors_name_the_field(field, value, message):
    c = default.get_config()
    *parents, last = field.split(".")
    node = c
    for p in parents:
        node = node[p]
    node[last] = value
    with pytest.raises(ValueError, match=message):
        validate_config(c)


def test_learned_table_shorter_than_training_is_an_error():
    c = default.get_config("learned")
    c.model.position.max_length = 8
    with pytest.raises(ValueError, match=r"max_length=8 is shorter than task.train_length=32"):
        validate_config(c)


def test_compare_quick_grid():
    c = compare.get_config("quick")
    assert {"nope", "sinusoidal", "learned", "rope", "alibi", "t5"} <= set(c.grid.positions)
    assert max(c.base.eval.lengths) >= 4 * c.base.task.train_length
    assert len(c.grid.seeds) >= 2
    validate_config(c.base)


@pytest.mark.parametrize("arg", ["full", "norms", "scaling"])
def test_compare_other_grids_load(arg):
    c = compare.get_config(arg)
    assert len(c.grid.positions) * len(c.grid.placements) >= 2
    for p in c.grid.positions:
        assert p in registry.POSITION_KINDS or p in c.variants


def test_compare_unknown_arg():
    with pytest.raises(ValueError, match="choose one of: quick, full, norms, scaling"):
        compare.get_config("fast")
