"""The run config, declared once: ``task``, ``model``, ``train``, ``eval`` and ``mesh``.

Each field is declared with its default, its check and a line of
documentation (:mod:`posenc.config.schema`); :func:`run_config` is the
ConfigDict of defaults every config file starts from, :func:`validate`
checks a config however it was built (command line, a config file that
unlocks and adds a field, code), and :func:`field_rows` feeds the field
table of the documentation. ``task.options`` holds the chosen task's own
options (the keyword parameters of its class, :func:`posenc.tasks.spec`);
``eval.variants`` maps a name to dotted ``model.*`` fields.
"""

from __future__ import annotations

import math

from posenc import checks
from posenc.config.schema import Field, Free, Section, Sub
from posenc.model.config import Model


def _rate(name, value) -> float:
    if not (checks.is_real(value) and math.isfinite(value) and value > 0):  # bool, None, inf: not a rate
        raise ValueError(f"{name} must be > 0 (a finite number), got {value!r}")
    return float(value)


def _unit(name, value) -> float:
    return checks.number(name, value, minimum=0.0, maximum=1.0)


def _beta(name, value) -> float:
    return checks.number(name, value, minimum=0.0, below=1.0)


def _lengths(name, value) -> tuple[int, ...]:
    lengths = tuple(value) if isinstance(value, (tuple, list)) else value
    if not isinstance(lengths, tuple) or not lengths or not all(checks.is_int(n) and n >= 1 for n in lengths):
        raise ValueError(f"{name} must be a non-empty tuple of positive integers, got {lengths!r}")
    return tuple(int(n) for n in lengths)


def _steps_per_call(name, value):
    from posenc.training import steploop

    return steploop.check_steps_per_call(value)  # its message names train.steps_per_call


def _task_name(name, value) -> str:
    from posenc import tasks

    if not isinstance(value, str) or value not in tasks.TASKS:
        raise ValueError(f"{name}: unknown task {value!r}; choose one of: {', '.join(tasks.TASKS)}")
    return value


def _eval_tokens(name, value):
    from posenc.tasks import text

    return text.check_eval_tokens(name, value)  # "auto" or an integer >= 1


def _decode_rows(name, value):
    from posenc.training import decode_sample

    return decode_sample.check_decode_rows(name, value)  # "all" or an integer >= 2


def _mesh_data(name, value) -> int:
    if not checks.is_int(value) or not (value == -1 or value >= 1):
        raise ValueError(f"{name} must be -1 (all devices) or a positive integer, got {value!r}")
    return int(value)


class Task(Section):
    """task: what the model learns and at which length."""

    name = Field("copy", _task_name, "any task of posenc.tasks.TASKS")
    train_length = Field(32, checks.positive_int, "training sequence length (tokens)")
    min_size = Field(0, checks.nonnegative_int, "smallest training problem size (0: the task's smallest)")
    seed = Field(0, checks.nonnegative_int, "folded into the data keys (another data stream, same init)")
    options = Free("the task's own options (keyword options of posenc.tasks.make, e.g. text: path, "
                   "tokens, max_bytes)")


class Train(Section):
    """train: AdamW with warmup + cosine, clipping, fit-then-extrapolate, bookkeeping."""

    steps = Field(5000, checks.positive_int, "training steps (the most, with fit_accuracy)")
    batch_size = Field(32, checks.positive_int, "examples per step")
    learning_rate = Field(1e-3, _rate, "peak learning rate")
    warmup_steps = Field(200, checks.nonnegative_int, "linear warmup steps, then cosine decay")
    min_lr_ratio = Field(0.1, _unit, "cosine decays to learning_rate * min_lr_ratio")
    weight_decay = Field(0.1, checks.nonnegative, "AdamW weight decay, on matrices only")
    weight_decay_mode = Field("coupled", checks.one_of("coupled", "independent"),
                              "coupled: decay lr_t * weight_decay per step (AdamW); independent: "
                              "weight_decay * lr_t / learning_rate (Wortsman et al. 2023)")
    clip_norm = Field(1.0, checks.nonnegative, "global-norm clipping (0 = off)")
    b1 = Field(0.9, _beta, "Adam beta1")
    b2 = Field(0.98, _beta, "Adam beta2")
    eps = Field(1e-9, checks.positive, "Adam epsilon")
    z_loss = Field(0.0, checks.nonnegative, "PaLM z-loss weight (1e-4 typical; 0 = off)")
    qk_clip = Field(0.0, checks.nonnegative, "QK-Clip (Kimi K2): after each step, scale the query and key weights "
                    "of every head whose largest logit passed this threshold back to it (100 in the report; "
                    "0 = off; MLA: the nope parts by sqrt(gamma), the rotary query by gamma)")
    pose_length = Field(0, checks.nonnegative_int, "PoSE (Zhu et al. 2024): train on task.train_length windows whose "
                        "positions skip so that distances up to this length occur (0 = off; >= task.train_length)")
    seed = Field(0, checks.nonnegative_int, "model init and data keys")
    steps_per_call = Field("auto", lambda n, v: _steps_per_call(n, v), "training steps per compiled call "
                           "(an integer >= 1, or auto: from a measured step time; the same results)",
                           type=object)
    fit_accuracy = Field(0.0, _unit, "> 0: stop once validation accuracy at the training length reaches it")
    fit_check_every = Field(250, checks.positive_int, "steps between fit checks (with fit_accuracy > 0)")
    dataset_size = Field(0, checks.nonnegative_int, "> 0: a fixed training set of this many examples, visited in "
                         "epochs in a fresh seeded order (Cho et al. 2024: 1000000, scripts/addition/"
                         "run_coupling.sh 100000); 0: a fresh batch every step")
    eval_every = Field(0, checks.nonnegative_int, "> 0: every this many steps, validation loss, accuracy and exact "
                       "match (teacher-forced) at every eval.lengths into WORKDIR/eval_log.jsonl (Cho et al.: "
                       "every epoch)")
    select_length = Field(0, checks.nonnegative_int, "> 0: an eval.lengths entry; the parameters of lowest "
                          "validation loss there (every eval_every steps) are evaluated beside the last, rows "
                          "checkpoint best_long_val / last (Cho et al.: lowest loss on 100-digit val_long)")
    log_every = Field(250, checks.positive_int, "steps between train_log.jsonl rows")
    checkpoint_every = Field(1000, checks.positive_int, "steps between checkpoints")
    keep_checkpoints = Field(2, checks.positive_int, "checkpoints kept")
    tensorboard = Field(False, checks.boolean, "event files in WORKDIR/tensorboard (needs tensorboardX)")
    progress = Field(True, checks.boolean, "progress bar on stderr")

    @classmethod
    def check(cls, values, prefix):
        from posenc.training import optim, specs

        optim.learning_rate_schedule(specs.OptimizerSpec.from_train(values))  # warmup_steps within steps
        if values["select_length"] and not values["eval_every"]:
            raise ValueError(f"{prefix}.select_length={values['select_length']} chooses among the evaluations "
                             f"during training: it needs {prefix}.eval_every > 0")


class Eval(Section):
    """eval: the lengths, batches and evaluation variants of a run's evaluation."""

    @classmethod
    def check(cls, values, prefix):
        sliding = values["text_protocol"] == "sliding"
        if sliding and not values["stride"]:
            raise ValueError(f"{prefix}.text_protocol='sliding' needs {prefix}.stride >= 1")
        if not sliding and values["stride"]:
            raise ValueError(f"{prefix}.stride={values['stride']} is set, but only text_protocol 'sliding' "
                             "uses it")

    lengths = Field((32, 64, 128, 256), _lengths, "evaluation lengths (a tuple)", type=tuple)
    batch_size = Field(32, checks.positive_int, "examples (text: windows) per evaluation batch")
    num_batches = Field(4, checks.positive_int, "synthetic tasks: batches per length (text: from eval.tokens)")
    seed = Field(1234, checks.nonnegative_int, "evaluation data keys")
    position_buckets = Field(8, checks.positive_int, "text: loss over this many position ranges per length")
    max_tokens_per_step = Field(16384, checks.nonnegative_int,
                                "evaluation memory bound: rows per forward * length (0 = off)")
    sizes = Field("default", checks.one_of("default", "exact", "bin"),
                  "synthetic tasks: exact (every example at the largest size a length fits, Deletang et "
                  "al.) | bin (the sizes above the previous length's, Kazemnejad et al.) | default: the task's")
    decode = Field(True, checks.boolean, "also score the answers generated greedily through the KV cache "
                                   "(decoded_accuracy, decoded_exact_match)")
    decode_rows = Field(32, lambda n, v: _decode_rows(n, v), "failing rows decoded per length (all, or an integer "
                        ">= 2: a seeded sample); exact match and first errors stay exact, decoded_accuracy is "
                        "estimated without bias (decoded_accuracy_se)", type=object)
    tokens = Field("auto", lambda n, v: _eval_tokens(n, v), "text: every length scores the first eval.tokens "
                   "targets of the held-out split, a whole number of windows at every length (auto: the most "
                   "the split holds, up to 131072)", type=object)
    text_protocol = Field("nonoverlapping", checks.one_of("nonoverlapping", "sliding"),
                          "text: non-overlapping windows (Press et al. 2022's main tables) | sliding windows "
                          "every eval.stride tokens, each token scored once (their appendix)")
    stride = Field(0, checks.nonnegative_int, "text, sliding: the step between windows (each scores its last "
                                         "stride tokens, with up to L - stride of context)")
    variants = Free("name -> dotted model.* fields: the trained parameters also evaluated with those "
                    "fields changed (zero-shot context extension); JSON on the command line",
                    dotted=True)


class Mesh(Section):
    """mesh: the devices a run uses (not part of the config hash)."""

    data = Field(-1, _mesh_data, "data-parallel devices; -1: all; batch sizes must divide by it")
    fsdp = Field(False, checks.boolean, "shard each parameter and its Adam moments over the devices")


class Run(Section):
    """A run: task, model, train, eval, mesh."""

    name = Field("", doc="the run's name (logs only)")
    task = Sub(Task)
    model = Sub(Model)
    train = Sub(Train)
    eval = Sub(Eval)
    mesh = Sub(Mesh)

    @classmethod
    def check(cls, values, prefix):
        from posenc import tasks
        from posenc.tasks.base import Task as SyntheticTask

        train, lengths = values["train"], values["eval"]["lengths"]
        if train["select_length"] and train["select_length"] not in lengths:
            raise ValueError(f"train.select_length={train['select_length']} must be one of eval.lengths "
                             f"{lengths}: the checkpoint is chosen on the validation loss there")
        if train["dataset_size"] and not issubclass(tasks.task_class(values["task"]["name"]), SyntheticTask):
            raise ValueError(f"train.dataset_size={train['dataset_size']} draws a fixed set of synthetic examples; "
                             f"task {values['task']['name']!r} has none (0: its usual batches)")


def run_config():
    """The ConfigDict of a run with every default (configs/default.py starts from it)."""
    return Run.config()


def validate(config) -> dict:
    """Every field of the run ``config`` checked (ConfigError on an unknown one); the clean values."""
    return Run.validate(config, "")


def field_rows() -> list[tuple[str, str, str]]:
    """``(field, default, doc)`` of every run field; the per-encoding sections are one row each."""
    from posenc.config import schema

    return schema.rows(Run, "", skip=("name", *(f"model.position.{k}" for k in _encoding_sections())))


def _encoding_sections():
    from posenc.model import ENCODINGS
    from posenc.model import options as options_lib

    return [k for k, cls in ENCODINGS.items() if options_lib.options_of(cls)]
