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
:mod:`~posenc.studies.extend_report`. The methods are in
:mod:`~posenc.studies.extend_methods`, the config in
:mod:`~posenc.studies.extend_schema`, the configs of each point's runs in
:mod:`~posenc.studies.extend_runs`.
"""

from __future__ import annotations

import os
import time

from absl import logging

from posenc.config.schema import ConfigError
from posenc.studies import engine, extend_report, tables
from posenc.studies.extend_methods import METHODS, method_fields, zero_shot
from posenc.studies.extend_runs import (
    finetune_config,
    hf_base,
    hf_run,
    placeholder_longrope,
    resolve,
    study_row,
    zero_shot_config,
)
from posenc.studies.extend_schema import ExtendConfig
from posenc.workdir import records

PASSKEY_EVAL = dict(batch_size=8, num_batches=4)  # 32 keys per target length


class Extend(engine.Study):
    """The extend study: its points (bases, LongRoPE searches, zero-shot evaluations, fine-tunes), how each
    runs, and its report."""

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
                bases.append((int(seed), resolve(c, f"base of seed {seed}"), c))
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
                stand_in = placeholder_longrope(resolved.config, factor)
                fields = {m: method_fields(m, factor, length, stand_in) for m in config.methods}
                resolve(zero_shot_config(resolved.config, fields, target), f"zero_shot_{tag}")
                common = dict(seed=seed, factor=float(factor), length=length, target=target)
                points.append(engine.Point(f"zero_shot_{tag}", common, after=deps))
                for method in (m for m in config.methods if METHODS[m].finetune):
                    for steps in sorted({int(n) for n in config.finetune_steps if int(n) > 0}):
                        resolve(finetune_config(config, resolved.config, fields[method], target, steps,
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
