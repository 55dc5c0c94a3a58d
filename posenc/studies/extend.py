"""The extend study: every RoPE context-extension method, zero-shot and after each fine-tuning budget.

For each seed a base RoPE model is trained at length L (point ``base_s<seed>``;
or ``base_run``, a finished run, is read). For each factor s: LongRoPE
factors searched on the base model (``longrope_x<s>_s<seed>``,
:mod:`posenc.training.longrope`), one zero-shot evaluation of the base
parameters at L and s L with every method as an evaluation variant
(``zero_shot_x<s>_s<seed>``), and per method a fine-tune at s L from the base
checkpoint for each budget (``finetune_<method>_x<s>_s<seed>``,
:mod:`posenc.training.finetune`; with a constant learning rate a budget
continues the next shorter one, which equals training it from the base).
The training-free remappings (Self-Extend, ReRoPE, DCA, STRING, StreamingLLM,
LM-Infinite: ``model.position.rope.remap``) are methods too, evaluation
variants of the same base; those without fine-tuning in their paper
(``Method.finetune`` False: all but DCA) have no fine-tune points. The
retrieval tasks (``retrieval_tasks``: passkey, RULER's) are scored at target
lengths >= ``passkey_min_length`` that they fit.

Rows: one per method, factor, budget, task and eval length (fields in
:data:`Extend.row_fields`). Report: ``table.md`` and the plots of
:mod:`~posenc.studies.extend_report`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NamedTuple

from absl import logging

from posenc import checks
from posenc.config import overrides
from posenc.config.schema import ConfigError, Field, Section, Sub
from posenc.studies import engine, extend_report, tables
from posenc.training.schema import Run
from posenc.workdir import records


class Method(NamedTuple):
    """One extension method: its posenc.rope scaling, fixed fields and training-free remapping."""

    scaling: str | None  # the posenc.rope scaling kind (None: the base's own, for a remapping)
    extra: dict = {}  # further model.position.rope fields
    # (factor s, training length L) -> the model.position.rope remap fields (posenc.model.encodings.rope.REMAPS)
    remap: Callable[[float, int], dict] | None = None
    finetune: bool = True  # False: training-free only (no fine-tuning points)
    # (s, L) -> further run fields of its fine-tunes (a method that trains: PoSE's positions, DroPE's NoPE);
    # such a method has no zero-shot evaluation and fine-tunes at L, not at s L
    trains: Callable[[float, int], dict] | None = None


def _group(s: float) -> int:
    return max(1, int(round(2 * s)))


# method -> Method. The remappings' settings are the papers' rules at (s, L): Self-Extend's neighbor window
# W = L / 2 and group G = 2 s keep every grouped distance below L (W + (s L - W) / G < L; Jin et al. §3.3);
# ReRoPE's window w = L / 4 (bojone/rerope uses 512 of 2048 / 4096), Leaky ReRoPE's k = 2 s keeps w + (s L -
# w) / k < L; DCA's chunk 3/4 L and local window L / 8 (ChunkLlama's defaults); STRING's shift S = L / 3 and
# local window L / 8 (An et al. 2025: S in 0.25-0.4 L); StreamingLLM's 4 sinks and L - 5 recent keys (the
# query's slot stays below L); LM-Infinite's global branch 10 and local branch = limit = L (Han et al. §4).
METHODS = {
    "default": Method("default"),
    "linear": Method("linear"),
    "ntk": Method("ntk"),
    "dynamic": Method("dynamic"),  # factor 1: s = n / L at the current length n (emozilla)
    "yarn": Method("yarn"),  # temperature "paper": sqrt(1/t) = 0.1 ln s + 1
    "yarn_quadratic": Method("yarn", {"temperature": "quadratic"}),  # t = 1 + 0.1 ln s + 0.07 ln^2 s
    "dynamic_yarn": Method("dynamic_yarn"),
    "longrope": Method("longrope"),  # factors searched on the base model
    "llama3": Method("llama3"),
    "self_extend": Method(None, remap=lambda s, n: dict(remap="self_extend", group=_group(s),
                                                              window=max(1, n // 2)), finetune=False),
    "rerope": Method(None, remap=lambda s, n: dict(remap="rerope", window=max(1, n // 4)),
                     finetune=False),
    "leaky_rerope": Method(None, remap=lambda s, n: dict(remap="rerope", window=max(1, n // 4),
                                                               leaky=float(_group(s))), finetune=False),
    # DCA is also fine-tuned in its paper (ChunkLlama2 on long conversations)
    "dual_chunk": Method(None, remap=lambda s, n: dict(remap="dual_chunk", chunk=3 * n // 4,
                                                             local_window=n // 8)),
    "string": Method(None, remap=lambda s, n: dict(remap="string", shift=max(1, n // 3),
                                                         local_window=n // 8), finetune=False),
    "streaming_llm": Method(None, remap=lambda s, n: dict(remap="streaming_llm", sinks=4,
                                                                window=max(0, n - 5)), finetune=False),
    "lm_infinite": Method(None, remap=lambda s, n: dict(remap="lm_infinite", global_branch=10,
                                                              local_branch=n, limit=n), finetune=False),
    # PoSE (Zhu et al. 2024): fine-tune at L with positions skipping over s L (posenc.pose; the base's RoPE)
    "pose": Method(None, trains=lambda s, n: {"train.pose_length": int(round(s * n))}),
    # DroPE (Gelberg et al. 2025, SakanaAI/DroPE): the base with RoPE removed (NoPE, the same weights),
    # recalibrated by fine-tuning at L, then evaluated at s L
    "drope": Method(None, trains=lambda s, n: {"model.position.kind": "nope"}),
}
_ADAPTIVE = ("dynamic",)  # the scale follows the current length: no fixed factor
PASSKEY_EVAL = dict(batch_size=8, num_batches=4)  # 32 keys per target length


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


def method_fields(method: str, factor: float, original_length: int, longrope=None) -> dict:
    """The ``model.position.rope.*`` fields of ``method`` at factor s (``longrope``: a factor file).

    ``default`` changes nothing (the base's own RoPE: no scaling for a trained base, the
    checkpoint's own for ``base_hf``); a remapping (``Method.scaling`` None) sets its remap fields
    on the base's own RoPE (its scaling kept); every other method sets its scaling (and a remapping
    when it has one) and resets the options of other scalings and remappings to their defaults,
    whatever the base had.
    """
    from posenc.encodings.rope import rope_scaling
    from posenc.training import longrope as longrope_lib

    if method == "default":
        return {}
    m = METHODS[method]
    if m.trains is not None:
        fields = m.trains(float(factor), int(original_length))
        if "model.position.kind" in fields:  # the RoPE section goes with RoPE
            return fields
        return {**fields, **{f"model.position.rope.{k}": v for k, v in _resets(m).items()}}
    remapped = m.remap(float(factor), int(original_length)) if m.remap is not None else {}
    fields = {f"model.position.rope.{k}": v for k, v in remapped.items()}
    resets = _resets(m)
    if method == "longrope":
        if longrope is None:
            raise ValueError("method 'longrope' needs searched factors")
        fields.update(longrope_lib.rope_fields(longrope))
    if m.scaling is not None and method != "longrope":
        used = rope_scaling.KEYWORDS[m.scaling]
        fields["model.position.rope.scaling"] = m.scaling
        if "factor" in used and method not in _ADAPTIVE:
            fields["model.position.rope.factor"] = float(factor)
        if "original_length" in used:
            fields["model.position.rope.original_length"] = int(original_length)
        fields.update({f"model.position.rope.{k}": v for k, v in m.extra.items()})
    for name, default in resets.items():
        fields.setdefault(f"model.position.rope.{name}", default)
    return fields


def _resets(m: Method) -> dict:
    """The RoPE options ``m`` resets to their defaults: every remapping's, and every scaling's if it sets one."""
    from posenc.model.encodings import rope as rope_unit

    resets = dict(rope_unit.remap_defaults())
    if m.scaling is not None:
        resets.update(rope_unit.scaling_defaults())
    return resets


def _placeholder_longrope(config, factor) -> dict:
    """The YaRN factors the search starts from: a stand-in for validating a LongRoPE fine-tune."""
    from posenc.encodings.rope import rope, rope_search
    from posenc.model import spec as spec_lib

    m = config.model
    rotary = rope.rotary_dim(spec_lib.unit_head_dim(m), m.position.rope.rotary_fraction)  # MLA: its rotary part
    start = rope_search.seed_factors(rotary, factor=float(factor), original_length=int(config.task.train_length))
    return {"short_factor": [1.0] * len(start["yarn"]), "long_factor": [float(v) for v in start["yarn"]],
            "factor": float(factor), "original_length": int(config.task.train_length)}


def _base_config(config):
    """``copy`` of a run config without evaluation variants."""
    from posenc.training import prepare

    c = prepare.plain_copy(config)
    c.eval.variants = overrides.fields({})
    return c


def zero_shot_config(base_config, fields: dict, target: int):
    """The base config evaluated at (L, target) with every method as an evaluation variant."""
    c = _base_config(base_config)
    c.eval.lengths = (int(c.task.train_length), int(target))
    c.eval.variants = overrides.fields({m: f for m, f in fields.items() if m != "default" and zero_shot(m)})
    return c


def zero_shot(method: str) -> bool:
    """Whether ``method`` has a zero-shot evaluation (a method that trains has not)."""
    return METHODS[method].trains is None


def finetune_config(config, base_config, fields: dict, target: int, steps: int, *, at_target: bool = True):
    """The fine-tune of the base at length ``target`` with ``fields``, for ``steps`` steps.

    ``at_target`` False: at the base's length L instead (a method that trains for s L at L).
    """
    c = _base_config(base_config)
    length = int(c.task.train_length)
    overrides.apply(c, fields, schema=Run, where="method")
    ft = config.finetune
    trained = int(target) if at_target else length
    batch = int(ft.batch_size) or max(1, int(c.train.batch_size) * length // trained)
    c.task.train_length = trained
    c.train.update(steps=int(steps), batch_size=batch, learning_rate=float(ft.learning_rate),
                   warmup_steps=min(int(ft.warmup_steps), int(steps)),
                   min_lr_ratio=float(ft.min_lr_ratio), weight_decay=float(ft.weight_decay),
                   log_every=min(int(ft.log_every), int(steps)),
                   checkpoint_every=int(ft.checkpoint_every), fit_accuracy=0.0, progress=False)
    c.eval.lengths = (length, int(target))
    return c


_KEEP = ("eval_length", "loss", "accuracy", "exact_match", "perplexity", "loss_last_L", "sweep",
         "finetune_steps", "finetune_tokens", "diverged_at_step", "not_applicable", "train_seconds")


def study_row(row: dict, *, method: str, factor: float, seed: int, length: int, target: int,
              task: str, run: str) -> dict:
    """A results row of the study: the run's metrics with the study's identity."""
    out = {k: row.get(k) for k in _KEEP}
    out.update(method=method, factor=float(factor), seed=int(seed), train_length=int(length),
               target_length=int(target), task=task, run=run)
    out["finetune_steps"] = int(row.get("finetune_steps") or 0)
    out["finetune_tokens"] = int(row.get("finetune_tokens") or 0)
    return out


def hf_base(config):
    """The run of a Hugging Face base (``base_hf``): ``base`` with the checkpoint's model section."""
    from posenc.hf import hf
    from posenc.training import prepare

    c = prepare.plain_copy(config.base)
    model = hf.config(config.base_hf)
    c.model = prepare.plain_copy(model)
    if c.task.name == "text" and c.task.options.get("vocab_size") is None:
        c.task.options["vocab_size"] = int(model.vocab_size)  # the checkpoint's vocabulary, all of it
    return _resolve(c, f"base_hf {config.base_hf}")


def hf_run(config):
    """The Hugging Face base as a finished run (its parameters; no checkpoint record of posenc's)."""
    from flax import nnx

    from posenc.hf import hf
    from posenc.training import finetune
    from posenc.workdir import records

    resolved = hf_base(config)
    model = hf.load(config.base_hf)
    return finetune.FinishedRun(workdir=config.base_hf, resolved=resolved, params=nnx.state(model, nnx.Param),
                                record=records.CheckpointRecord())


def _resolve(config, where: str):
    from posenc.training import prepare

    try:
        return prepare.resolve(config)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


class Extend(engine.Study):
    name = "extend"
    schema = ExtendConfig
    row_fields = {"method": "the extension method (experiments METHODS)", "factor": "s: target = s L",
                  "target_length": "s L", "finetune_steps": "fine-tuning budget (0: zero-shot)",
                  "finetune_tokens": "tokens seen in fine-tuning", "run": "the point that produced the row"}

    def points(self, config):
        from posenc.training import finetune, prepare

        bases = []
        if config.base_hf:
            resolved = hf_base(config)
            bases.append((int(resolved.config.train.seed), resolved, None))
        elif config.base_run:
            base = finetune.load_run(config.base_run)
            bases.append((int(base.resolved.config.train.seed), base.resolved, None))
        else:
            for seed in config.seeds:
                c = prepare.plain_copy(config.base)
                c.train.seed = int(seed)
                bases.append((int(seed), _resolve(c, f"base of seed {seed}"), c))
        points = []
        for seed, resolved, base_cfg in bases:
            pos = resolved.spec.position
            if config.base_hf:  # the checkpoint's own RoPE (its scaling too) is the method "default"
                if "rope" not in pos.layer_kinds:
                    raise ConfigError(f"base_hf {config.base_hf} has no RoPE layer to extend")
            elif set(pos.layer_kinds) != {"rope"} or pos.options["rope"]["scaling"] != "default":
                raise ConfigError(f"the base run must be RoPE without scaling in every layer; it has "
                                  f"layers {sorted(set(pos.layer_kinds))}")
            base_name = f"base_s{seed}"
            points.append(engine.Point(base_name, {"seed": seed}, run=resolved if base_cfg is not None else None))
            length = int(resolved.config.task.train_length)
            for factor in config.factors:
                target = int(round(float(factor) * length))
                tag = f"x{factor:g}_s{seed}"
                deps = (base_name,)
                if "longrope" in config.methods:
                    points.append(engine.Point(f"longrope_{tag}", {"seed": seed, "factor": float(factor)},
                                               after=deps))
                    deps = (base_name, f"longrope_{tag}")
                stand_in = _placeholder_longrope(resolved.config, factor)
                fields = {m: method_fields(m, factor, length, stand_in) for m in config.methods}
                _resolve(zero_shot_config(resolved.config, fields, target), f"zero_shot_{tag}")
                common = dict(seed=seed, factor=float(factor), length=length, target=target)
                points.append(engine.Point(f"zero_shot_{tag}", common, after=deps))
                for method in (m for m in config.methods if METHODS[m].finetune):
                    for steps in sorted({int(n) for n in config.finetune_steps if int(n) > 0}):
                        _resolve(finetune_config(config, resolved.config, fields[method], target, steps,
                                                 at_target=zero_shot(method)), f"finetune_{method}_{tag}_n{steps}")
                    points.append(engine.Point(f"finetune_{method}_{tag}", dict(common, method=method),
                                               after=deps if method == "longrope" else (base_name,)))
        return points

    # ------------------------------------------------------------------ running
    def run(self, points, ctx):
        return [self._run_one(p, ctx) for p in points]

    def _base(self, ctx, seed: int):
        from posenc.training import finetune

        if ctx.config.base_hf:
            return hf_run(ctx.config)
        return finetune.load_run(ctx.config.base_run or ctx.run_dir(f"base_s{seed}"))

    def _run_one(self, point, ctx) -> list[dict]:
        from posenc.training import loop, step

        name = point.name
        if name.startswith("base_"):
            if point.run is not None:
                loop.run(point.run, ctx.run_dir(point), name=name)
            return []
        base = self._base(ctx, point.fields["seed"])
        if name.startswith("longrope_"):
            self._search(ctx, point, base)
            return []
        if name.startswith("zero_shot_"):
            return self._zero_shot(ctx, point, base)
        rows = self._finetunes(ctx, point, base)
        # every budget compiled its own train step: free them; the evaluation programs stay, shared by the
        # seeds' bases and fine-tunes (one graph per method)
        step.clear_cache(training_only=True)
        return rows

    def _fields(self, ctx, point, base) -> dict:
        from posenc.training import longrope

        f, length = point.fields["factor"], point.fields["length"]
        found = None
        if "longrope" in ctx.config.methods:
            found = longrope.read_factors(os.path.join(ctx.run_dir(f"longrope_x{f:g}_s{point.fields['seed']}"),
                                                        "factors.json"))
        return {m: method_fields(m, f, length, found) for m in ctx.config.methods}

    def _search(self, ctx, point, base) -> None:
        from posenc.training import finetune, longrope

        path = os.path.join(ctx.run_dir(point), "factors.json")
        if os.path.exists(path):
            return
        s = ctx.config.search.to_dict()
        t0, factor = time.time(), point.fields["factor"]
        target = int(round(factor * int(base.resolved.config.task.train_length)))
        model = finetune.model_with(base.params, base.resolved.spec)
        found = longrope.search(model, base.resolved, factor=float(factor), target_length=target,
                                short=bool(s.pop("short")), batch_size=int(s.pop("batch_size")),
                                seed=int(base.resolved.config.train.seed), path=path, **s)
        logging.info("LongRoPE x%g: perplexity %.3f (seeds %s) in %.0fs", factor,
                     found["search"]["long"]["fitness"], found["search"]["long"]["seeds"], time.time() - t0)

    def _passkey(self, params, resolved, spec, target: int, path: str, key: str, tasks) -> list[dict]:
        """Rows of every retrieval task that fits ``target`` (cached in ``path`` under ``key`` and the task: a
        point resumes without redoing them)."""
        from posenc.tasks import registry
        from posenc.training import finetune
        from posenc.workdir import files

        rows = []
        for task in (t for t in tasks if registry.make(t).min_length() <= target):  # the ones that fit
            k = key if task == "passkey" else f"{key}:{task}"
            cached = [r for r in files.read_jsonl(path) if r.get("cache_key") == k]
            if not cached:
                cached = [dict(r, cache_key=k) for r in finetune.evaluate_on(
                    params, resolved, task, [target], spec=spec, eval_fields=PASSKEY_EVAL)]
                files.write_jsonl(path, [r for r in files.read_jsonl(path) if r.get("cache_key") != k] + cached)
            rows += cached
        return rows

    def _wants_passkey(self, ctx, target: int) -> bool:
        return bool(ctx.config.passkey_min_length) and target >= int(ctx.config.passkey_min_length)

    def _zero_shot(self, ctx, point, base) -> list[dict]:
        from posenc.training import finetune, prepare

        p = point.fields
        fields = self._fields(ctx, point, base)
        zero = prepare.resolve(zero_shot_config(base.resolved.config, fields, p["target"]))
        ident = dict(factor=p["factor"], seed=p["seed"], length=p["length"], target=p["target"], run=point.name)
        d, rows = ctx.run_dir(point), []
        for r in finetune.evaluate_params(base, zero, d, name=point.name):
            method = r.get("eval_variant") or "default"
            if method in ctx.config.methods:
                rows.append(study_row(r, method=method, task=str(zero.config.task.name), **ident))
        for method in [m for m in ctx.config.methods if zero_shot(m)] if self._wants_passkey(ctx, p["target"]) else ():
            spec = zero.spec if method == "default" else zero.eval_variants[method][1]
            rows += [study_row(r, method=method, task=r["task"], **ident) for r in self._passkey(
                base.params, zero, spec, p["target"], os.path.join(d, "passkey.jsonl"), f"{zero.hash}:{method}",
                ctx.config.retrieval_tasks)]
        return rows

    def _finetunes(self, ctx, point, base) -> list[dict]:
        """Every budget of one method and factor: fine-tune, evaluate, passkey."""
        from posenc.training import finetune, finish, prepare

        p, method = point.fields, point.fields["method"]
        fields = self._fields(ctx, point, base)[method]
        rows, previous = [], None  # previous: (workdir, resolved) of the last finished budget
        ident = dict(method=method, factor=p["factor"], seed=p["seed"], length=p["length"], target=p["target"])
        for steps in sorted({int(n) for n in ctx.config.finetune_steps if int(n) > 0}):
            name = f"{point.name}_n{steps}"
            d = os.path.join(ctx.run_dir(point), f"n{steps}")
            resolved = prepare.resolve(finetune_config(ctx.config, base.resolved.config, fields, p["target"], steps,
                                                       at_target=zero_shot(method)))
            start = None
            if previous is not None:
                try:  # continue the shorter budget where that equals starting from the base
                    finetune.check_continuable(previous[1], resolved)
                    start = previous[0]
                except ValueError:
                    start = None
            try:
                run_rows = finetune.finetune(base, resolved, d, name=name, continue_from=start,
                                             row_fields=dict(method=method, factor=float(p["factor"])))
                previous = (d, resolved)
            except records.NonFiniteError as e:
                logging.warning("%s diverged: %s", name, e)
                run_rows = [dict(r, finetune_steps=steps, finetune_tokens=0)
                            for r in finish.record_divergence(resolved, d, e, name=name)]
                previous = None
            rows += [study_row(r, task=r["task"], run=name, **ident) for r in run_rows]
            if self._wants_passkey(ctx, p["target"]) and previous is not None:
                trained = finetune.load_run(d)
                rows += [study_row(dict(r, finetune_steps=steps, finetune_tokens=run_rows[0]["finetune_tokens"]),
                                   task=r["task"], run=name, **ident)
                         for r in self._passkey(trained.params, resolved, resolved.spec, p["target"],
                                                os.path.join(d, "passkey.jsonl"), resolved.hash,
                                                ctx.config.retrieval_tasks)]
        return rows

    def report(self, rows, ctx):
        path = os.path.join(ctx.workdir, "table.md")
        tables.write(path, "\n".join(tables.missing_note(ctx)) + extend_report.table_markdown(rows) + "\n"
                     + extend_report.paired_markdown(rows))
        return [path] + extend_report.write_plots(rows, os.path.join(ctx.workdir, "plots"))
