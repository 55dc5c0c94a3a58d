"""The specs the compiled programs are cached by: every task, train and eval field changes its program,
or is declared as read on the host only (specs.HOST_FIELDS); equal configs share one program."""

import importlib

import pytest

from posenc.config import overrides
from posenc.training import evaluate, prepare, schema, specs
from posenc.training import step as step_lib

LENGTH = 16  # the evaluated length whose program is compared

# another valid value of every field of task, train and eval (a new field fails the coverage test
# below until it is given one here and classified by the program test)
CHANGES = {
    "task.name": "reverse",
    "task.train_length": 24,
    "task.min_size": 2,
    "task.seed": 1,
    "task.options": {"alphabet": 12},
    "train.steps": 300,
    "train.batch_size": 4,
    "train.learning_rate": 3e-3,
    "train.warmup_steps": 5,
    "train.min_lr_ratio": 0.5,
    "train.weight_decay": 0.01,
    "train.weight_decay_mode": "independent",
    "train.clip_norm": 0.5,
    "train.b1": 0.8,
    "train.b2": 0.95,
    "train.eps": 1e-8,
    "train.z_loss": 1e-4,
    "train.pose_length": 48,
    "train.qk_clip": 30.0,
    "train.seed": 1,
    "train.steps_per_call": 3,
    "train.fit_accuracy": 0.9,
    "train.fit_check_every": 7,
    "train.dataset_size": 100,
    "train.eval_every": 5,
    "train.select_length": LENGTH,
    "train.log_every": 7,
    "train.checkpoint_every": 7,
    "train.keep_checkpoints": 3,
    "train.tensorboard": True,
    "train.progress": False,
    "eval.lengths": (16, 48),
    "eval.batch_size": 4,
    "eval.num_batches": 3,
    "eval.seed": 7,
    "eval.position_buckets": 4,
    "eval.max_tokens_per_step": 32,
    "eval.sizes": "exact",
    "eval.decode": False,
    "eval.decode_rows": 2,
    "eval.variants": {"long": {"model.position.rope.base": 500.0}},
    # the text protocol's fields (checked on a text config)
    "eval.tokens": 64,
    "eval.text_protocol": "sliding",
    "eval.stride": 8,
}
TEXT_FIELDS = ("eval.tokens", "eval.text_protocol", "eval.stride")
TASK_ITSELF = ("task.name", "task.seed", "task.options")  # what the evaluation's batches come from


def _config(arg="tiny"):
    c = importlib.import_module("posenc.configs.default").get_config(arg)
    c.model.position.kind = "rope"
    c.eval.lengths = (LENGTH, 32)
    return c


def _fields():
    out = []
    for section in (schema.Task, schema.Train, schema.Eval):
        name = {schema.Task: "task", schema.Train: "train", schema.Eval: "eval"}[section]
        out += [f"{name}.{f}" for f in section.entries()]
    return out


def test_every_task_train_and_eval_field_has_a_change_to_try():
    assert sorted(_fields()) == sorted(CHANGES)
    assert set(specs.HOST_FIELDS) <= set(CHANGES)


def _programs(config):
    r = prepare.resolve(config)
    return (step_lib.train_chunk_fn(r.train, 4), step_lib.stats_fn(r.train),
            evaluate.length_fn(r.task, r.config, LENGTH).program)


@pytest.mark.parametrize("arg", ["tiny", "tiny,text"])
def test_each_field_changes_the_compiled_programs_or_is_read_on_the_host(arg):
    base = _config(arg)
    if arg == "tiny,text":
        base.eval.update(tokens=128, text_protocol="nonoverlapping", stride=0)
    before = _programs(base)
    assert _programs(_config(arg) if arg == "tiny" else base) == before  # equal configs: the same programs
    for field, value in CHANGES.items():
        if (field in TEXT_FIELDS) != (arg == "tiny,text") or (arg == "tiny,text" and field.startswith("task.")):
            continue
        if arg == "tiny,text" and field == "train.dataset_size":  # a fixed set of synthetic examples only
            continue
        c = prepare.plain_copy(base)
        fields = {field: value}
        if field == "train.select_length":  # chosen among the evaluations during training
            fields["train.eval_every"] = CHANGES["train.eval_every"]
        if field in ("eval.text_protocol", "eval.stride"):  # sliding windows need their stride
            fields.update({"eval.text_protocol": "sliding", "eval.stride": 8})
        overrides.apply(c, fields, schema=schema.Run)
        after = _programs(c)
        if field in specs.HOST_FIELDS:
            assert after == before, f"{field} is declared host-only, but a program changed"
        elif field.startswith("eval."):
            assert after[:2] == before[:2] and after[2] is not before[2], field
        else:  # task and train fields: the train programs; the evaluation's only where the task itself
            # changes (models trained differently on one task share the evaluation's programs)
            assert after[0] is not before[0] and after[1] is not before[1], field
            assert (after[2] is not before[2]) == (field in TASK_ITSELF), field


def test_the_task_spec_is_canonical_and_gives_one_task_object():
    a = specs.TaskSpec.from_config(_config())
    c = _config()
    c.task.options = {"alphabet": 16}  # the default, written out
    assert specs.TaskSpec.from_config(c) == a and hash(specs.TaskSpec.from_config(c)) == hash(a)
    assert a.make() is specs.TaskSpec.from_config(c).make()
    passkey = specs.TaskSpec("passkey", 0, (("depth", 0.5), ("length", None)))
    assert passkey.traced == {"depth": 0.5}
    assert passkey.untraced().options == (("depth", None), ("length", None))


def test_the_model_section_is_validated_once(monkeypatch):
    from posenc.model import config as model_config

    calls = []
    real = model_config.Model.validate.__func__

    def counted(cls, values, prefix):
        calls.append(prefix)
        return real(cls, values, prefix)

    monkeypatch.setattr(model_config.Model, "validate", classmethod(counted))
    c = _config()
    prepare.resolve(c)
    assert calls == ["model"]
    overrides.apply(c, {"eval.variants": {"long": {"model.position.rope.base": 500.0}}}, schema=schema.Run)
    # a variant's changed fields are checked too
    calls.clear()
    prepare.resolve(c)
    assert calls == ["model", "model"]
