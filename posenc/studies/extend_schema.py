"""The extend study's config declaration: a base RoPE run (or a finished run, or a Hugging Face checkpoint),
methods, factors, fine-tuning budgets, the retrieval tasks and the LongRoPE search."""

from __future__ import annotations

from posenc import checks
from posenc.config.schema import Field, Section, Sub
from posenc.studies.extend_methods import METHODS
from posenc.training.schema import Run


def _methods(name, value):
    if not isinstance(value, (tuple, list)) or not value:
        raise ValueError(f"{name} must be a non-empty tuple of methods ({', '.join(METHODS)})")
    return tuple(checks.choice(f"{name} entry", m, METHODS) for m in value)


def _nonempty(check):
    def wrapped(name, value):
        if not isinstance(value, (tuple, list)) or not value:
            raise ValueError(f"{name} must be a non-empty tuple; got {value!r}")
        return tuple(check(f"{name} entry", v) for v in value)

    return wrapped


def _task_name(name, value):
    from posenc.tasks import registry

    try:
        registry.task_class(value)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    return value


def _budgets(name, value):
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of step counts; got {value!r}")
    return tuple(checks.integer(f"{name} entry", n, minimum=0) for n in value)


class Finetune(Section):
    """finetune: train.* fields of the fine-tunes."""

    learning_rate = Field(3e-4, checks.positive, "fine-tuning learning rate")
    warmup_steps = Field(10, checks.nonnegative_int, "warmup steps")
    min_lr_ratio = Field(1.0, lambda n, v: checks.number(n, v, minimum=0.0, maximum=1.0),
                         "1: constant after warmup (a longer budget then continues a shorter one)")
    weight_decay = Field(0.0, checks.nonnegative, "weight decay")
    batch_size = Field(0, checks.nonnegative_int, "0: the base's tokens per step (base batch * L / (s L))")
    log_every = Field(10, checks.positive_int, "steps between log rows")
    checkpoint_every = Field(1000, checks.positive_int, "steps between checkpoints")


class Search(Section):
    """search: the LongRoPE search (posenc.rope_search.search options)."""

    batch_size = Field(4, checks.positive_int, "windows of training data at s L scoring each candidate")
    short = Field(False, checks.boolean, "also search short_factor at L")
    population_size = Field(16, checks.positive_int, "candidates per generation")
    parents_size = Field(8, checks.positive_int, "parents kept per generation")
    mutation_numbers = Field(4, checks.positive_int, "mutations per generation")
    crossover_size = Field(4, checks.positive_int, "crossovers per generation")
    iterations = Field(10, checks.positive_int, "generations")


class ExtendConfig(Section):
    """The extension study: a base RoPE run, methods, factors, budgets, passkey and the LongRoPE search."""

    name = Field("", doc="the study's name (the ARG of --config extend:ARG)")
    base = Sub(Run, "the base run's config (the default config's fields)")
    base_run = Field("", doc="a finished run's workdir to extend instead of training base (RoPE without "
                             "scaling; its own seed)")
    base_hf = Field("", doc="a Hugging Face checkpoint directory (posenc.hf) to extend instead: its model "
                            "with base.task (e.g. task.options.tokens of posenc.hf.tokenize) at L = "
                            "base.task.train_length")
    seeds = Field((0,), _nonempty(lambda n, v: checks.integer(n, v, minimum=0)), "train.seed of each base run",
                  type=tuple)
    methods = Field(tuple(METHODS), _methods, "methods of METHODS", type=tuple)
    factors = Field((2,), _nonempty(lambda n, v: checks.number(n, v, minimum=1.0)),
                    "s: each method extends L to s L", type=tuple)
    finetune_steps = Field((0,), _budgets, "fine-tuning budgets (0 = zero-shot only)", type=tuple)
    finetune = Sub(Finetune)
    passkey_min_length = Field(0, checks.nonnegative_int, "the retrieval tasks at target lengths >= this (0: never)")
    retrieval_tasks = Field(("passkey",), _nonempty(_task_name), "byte-level retrieval tasks scored beside the "
                            "text (passkey; RULER's niah_single, niah_multikey, ..., variable_tracking, "
                            "common_words, frequent_words)", type=tuple)
    search = Sub(Search)

    @classmethod
    def check(cls, values, prefix):
        if values["base_run"] and values["base_hf"]:
            raise ValueError("base_run and base_hf both name a base model; give one")
        length = int(values["base"]["task"]["train_length"])
        for s in values["factors"]:
            if float(s) * length % 1:
                raise ValueError(f"factors entry {s} times the training length {length} is not an integer")

