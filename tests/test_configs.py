"""The default and compare configs (configs/): fields, variants, lock_config and validation errors."""

import os
import subprocess
import sys

import pytest

from posenc import rope, rope_scaling
from posenc.configs import compare, default
from posenc.model import ENCODINGS
from posenc.training import ConfigError, resolve


def validate_config(c):
    return resolve(c)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_every_position_kind_is_a_variant_and_validates():
    for kind in ENCODINGS:
        c = default.get_config(f"tiny,{kind}")
        assert c.model.position.kind == kind
        assert set(validate_config(c).config.model.position) & set(ENCODINGS) <= {kind}


def test_unknown_variant_names_allowed_tokens():
    with pytest.raises(ValueError, match=r"unknown default config argument 'rop'.*alibi"):
        default.get_config("rop")


def parse(argv):
    from posenc.config import cli
    from posenc.training.schema import Run

    found, rest = cli.split_overrides(argv)
    spec = next(a.split("=", 1)[1] for a in rest if a.startswith("--config="))
    return cli.load(spec, found, schema=Run)


def test_a_typo_fails_on_the_command_line_in_a_config_file_and_in_code(tmp_path):
    path = os.path.join(ROOT, "configs", "default.py")  # a config given as a file
    c = parse(["prog", f"--config={path}:tiny", "--config.train.steps=7"])
    assert c.train.steps == 7 and c.model.num_layers == 1
    with pytest.raises(ConfigError, match=r"^--config.train.stepz: unknown config field 'train.stepz'; "
                                          r"did you mean 'train.steps'\?"):
        parse(["prog", f"--config={path}", "--config.train.stepz=7"])
    c = default.get_config("tiny")
    c.train.stepz = 3  # a config built in code is a plain ConfigDict
    with pytest.raises(ConfigError, match=r"unknown config field 'train.stepz'; did you mean 'train.steps'"):
        validate_config(c)
    for section, typo in (("eval", "lenghts"), ("task", "train_lenght"), ("mesh", "fsdpp"),
                          ("model.norm", "plcement"), ("model.position.rope", "bse")):
        c = default.get_config("tiny")
        node = get(c, section)
        node[typo] = 1
        with pytest.raises(ConfigError, match=rf"unknown config field '{section}.{typo}'; did you mean"):
            validate_config(c)
    # a config file that unlocks a section and adds a field fails the same way, before any claim
    bad = tmp_path / "bad.py"
    bad.write_text("from posenc.configs import default\n\ndef get_config(arg=None):\n"
                   "    c = default.get_config('tiny')\n    with c.train.unlocked():\n        c.train.stepz = 3\n"
                   "    return c\n")
    with pytest.raises(ConfigError, match="unknown config field 'train.stepz'"):
        validate_config(parse(["prog", f"--config={bad}"]))


@pytest.mark.parametrize("field, value, message", [
    ("task.name", "copyy", r"unknown task 'copyy'; choose one of: copy"),
    ("model.position.kind", "rop", r"unknown position kind 'rop'; choose one of: abacus, alibi"),
    ("model.norm.placement", "middle", r"unknown norm placement 'middle'"),
    ("train.steps", 0, r"train.steps must be an integer >= 1; got 0"),
    ("train.learning_rate", -1.0, r"train.learning_rate must be > 0"),
    ("train.fit_accuracy", 1.5, r"train.fit_accuracy must be a finite number >= 0.0 <= 1.0; got 1.5"),
    ("model.position.rope.scaling", "yarnn", r"unknown model.position.rope.scaling 'yarnn'; choose one of: default"),
    ("model.position.rope.beta_fast", 8.0, r"model.position.rope.beta_fast=8.0 is set, but rope does not use it"),
    ("model.position.t5.num_buckets", 8, r"model.position.t5.num_buckets=8 is set, but no layer uses t5"),
    ("model.norm.mixln_fraction", 0.5, r"model.norm.mixln_fraction=0.5 is set, but only placement 'mixln' uses it"),
    ("model.position.randomized_per", "token",
     r"unknown model.position.randomized_per 'token'; choose one of: batch, example"),
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
    with pytest.raises(ConfigError, match=message):
        validate_config(c)


def test_learned_table_shorter_than_training_is_an_error():
    c = default.get_config("learned")
    c.model.position.learned.max_length = 8
    with pytest.raises(ValueError, match=r"model.position.learned can represent 8 positions, fewer than "
                                         r"task.train_length=32"):
        validate_config(c)


@pytest.mark.parametrize("scaling", rope.KINDS)
def test_every_rope_scaling_works_from_a_config(scaling):
    c = default.get_config("tiny")
    r = c.model.position.rope
    r.scaling = scaling
    if scaling not in ("default", "dynamic_yarn"):
        r.factor = 2.0
    if scaling == "longrope":
        half = (c.model.d_model // c.model.num_heads) // 2
        r.short_factor = tuple(1.0 + 0.1 * i for i in range(half))
        r.long_factor = tuple(2.0 + 0.1 * i for i in range(half))
    if scaling == "proportional":
        r.fraction = 0.5
    spec = validate_config(c).spec
    assert spec.position.options["rope"]["scaling"] == scaling
    if scaling in rope_scaling.NEEDS_ORIGINAL_LENGTH:
        assert spec.position.options["rope"]["original_length"] == c.task.train_length


def test_longrope_without_factors_and_mixed_partial_conventions_are_errors():
    c = default.get_config("tiny")
    c.model.position.rope.update(scaling="longrope", factor=2.0)
    with pytest.raises(ConfigError, match=r"model.position.rope \(scaling 'longrope'\): .*short_factor"):
        validate_config(c)
    c = default.get_config("tiny")
    c.model.position.rope.update(scaling="proportional", rotary_fraction=0.5)
    with pytest.raises(ConfigError, match="cannot be combined with scaling 'proportional'"):
        validate_config(c)


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "posenc", "train", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flag, message", [
    ("--config.model.position.kind=rop",
     "error: model.position.kind: unknown position kind 'rop'; choose one of: abacus, alibi, cope, fire"),
    ("--config.train.stepz=3",
     "error: --config.train.stepz: unknown config field 'train.stepz'; did you mean 'train.steps'?"),
])
def test_a_bad_config_on_the_command_line_is_one_line_and_exit_2(tmp_path, flag, message):
    out = run_cli("--config=default:tiny", f"--workdir={tmp_path}/w", flag,
                  "--jax_cache_dir=")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip().splitlines()[0]]
    assert out.stderr.startswith(message), out.stderr
    assert "Traceback" not in out.stderr
    assert not os.path.exists(tmp_path / "w")  # nothing claimed


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
        assert p in ENCODINGS or p in c.variants


def test_compare_unknown_arg():
    with pytest.raises(ValueError, match="unknown compare config argument 'fast'; choose one of: ") as e:
        compare.get_config("fast")
    listed = str(e.value).split("choose one of: ", 1)[1].split(", ")
    assert set(listed) == set(compare.ARGS) and {"quick", "smoke", "hybrid_quick"} <= set(listed)


def test_full_grid_has_every_encoding_and_the_attention_variants():
    from helpers import grid_points

    c = compare.get_config("full")
    extra = {"gemma3", "swan", "llama4", "rope_window", "p_rope", "rope_ssmax", "rope_logn"}
    assert set(ENCODINGS) | extra <= set(c.grid.positions)
    assert c.variants.gemma3["model.global_every"] == 6 and c.variants.llama4["model.attention_span"] == "chunk"
    c.grid.update(tasks=("copy",), seeds=(0,))
    points = {p.fields["variant"]: p.run for p in grid_points(c)}  # every point validates
    assert points["rope_window"].config.model.attention_window == 16
    assert points["p_rope"].spec.position.options["rope"]["scaling"] == "proportional"


def test_config_by_name_or_by_path():
    """``--config`` takes a packaged config by name (NAME[:ARG]: configs/NAME.py) or a file
    (path/to/file.py[:ARG], and any file that exists); an unknown name is one line naming the packaged ones."""
    from posenc.config import cli

    assert cli.packaged_configs() == ["compare", "default", "extend", "stability"]
    assert cli.load("default").to_dict() == default.get_config().to_dict()
    assert cli.load("default:tiny").to_dict() == default.get_config("tiny").to_dict()
    assert cli.load("default:text,alibi").to_dict() == default.get_config("text,alibi").to_dict()
    assert cli.load("compare:smoke").to_dict() == compare.get_config("smoke").to_dict()
    path = os.path.join(ROOT, "configs", "default.py")
    assert cli.load(f"{path}:tiny").to_dict() == default.get_config("tiny").to_dict()
    assert cli._split_spec("compare:quick") == ("compare", "quick")
    assert cli._split_spec("default") == ("default", None)
    assert cli._split_spec("a/b.py:quick") == ("a/b.py", "quick")
    assert cli._split_spec("a/b") == ("a/b", None)
    with pytest.raises(ConfigError) as e:
        cli.load("defualt:tiny")
    assert str(e.value) == ("--config=defualt:tiny: no packaged config 'defualt' (did you mean 'default'?); "
                            "choose one of: compare, default, extend, stability, or a file: "
                            "path/to/config.py[:ARG]")
    with pytest.raises(ConfigError, match=r"^--config=default:rop: unknown default config argument 'rop' "
                                          r"\(did you mean 'rope'\?\)"):
        cli.load("default:rop")
    with pytest.raises(ConfigError, match=r"^--config=nothere/x.py:tiny: no config file 'nothere/x.py'$"):
        cli.load("nothere/x.py:tiny")


def test_a_config_file_of_ones_own_by_path(tmp_path, monkeypatch):
    """A file of one's own, relative to the working directory or absolute, starts from a packaged config."""
    from posenc.config import cli

    text = ("from posenc.configs import default\n\ndef get_config(arg=None):\n"
            "    c = default.get_config(arg)\n    c.train.steps = 7\n    return c\n")
    (tmp_path / "mine.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    for spec in ("mine.py:tiny", str(tmp_path / "mine.py") + ":tiny"):
        c = cli.load(spec)
        assert c.train.steps == 7 and c.model.num_layers == 1, spec
