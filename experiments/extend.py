"""Context extension study: every RoPE scaling, zero-shot and after each fine-tuning budget.

    python -m experiments.extend --config configs/extend.py:quick --workdir /tmp/extend
    python -m experiments.extend --config configs/extend.py:quick --workdir /tmp/ext2 \\
        --config.base_run=/tmp/run      # extend a finished run of experiments.train

For each seed: a base RoPE model trained at length L (WORKDIR/base/s<seed>/,
or ``base_run``). For each factor s: LongRoPE factors searched on the base
model (WORKDIR/longrope/x<s>_s<seed>.json, posenc.training.longrope); one
zero-shot evaluation of the base parameters at L and s L with every method
as an evaluation variant (WORKDIR/zero_shot/x<s>_s<seed>/); then per method
and budget a fine-tune at s L from the base checkpoint
(WORKDIR/finetune/<method>_x<s>_s<seed>_n<steps>/, posenc.training.finetune;
with a constant learning rate a budget continues the next shorter one, which
equals training it from the base). Passkey retrieval is scored at target
lengths >= ``passkey_min_length``. Every step is resumable: rerun the same
command to continue.

Writes WORKDIR/results.jsonl (one row per method, factor, budget, task and
eval length, with method, factor, finetune_steps, finetune_tokens,
eval_length, train_length = L, target_length = s L, loss, accuracy,
exact_match, perplexity, seed), WORKDIR/table.md and the plots
WORKDIR/plots/extend_loss_vs_length.png (loss at s L against s L per method,
zero-shot and after each budget), extend_loss_vs_tokens.png (loss at s L
against fine-tuning tokens per method, one panel per factor) and, with
passkey rows, extend_passkey.png.
"""

from __future__ import annotations

import os
import time

from absl import app, flags, logging

from experiments import runtime


def define_flags() -> None:
    """The command line's flags (defined when run as a program, so that importing
    the module, as the tests do, defines none and modules do not clash)."""
    runtime.define_config_and_workdir("Path to configs/extend.py[:ARG].",
                                      "Directory for the base run, fine-tunes, table and plots.")

# method -> (posenc.rope scaling kind, extra model.position.rope fields)
METHODS = {
    "default": ("default", {}),
    "linear": ("linear", {}),
    "ntk": ("ntk", {}),
    "dynamic": ("dynamic", {}),  # factor 1: s = n / L at the current length n (emozilla)
    "yarn": ("yarn", {}),  # temperature "paper": sqrt(1/t) = 0.1 ln s + 1
    "yarn_quadratic": ("yarn", {"temperature": "quadratic"}),  # t = 1 + 0.1 ln s + 0.07 ln^2 s
    "dynamic_yarn": ("dynamic_yarn", {}),
    "longrope": ("longrope", {}),  # factors searched on the base model
    "llama3": ("llama3", {}),
}
_ADAPTIVE = ("dynamic",)  # the scale follows the current length: no fixed factor
PASSKEY_EVAL = dict(batch_size=8, num_batches=4)  # 32 keys per target length


def method_fields(method: str, factor: float, original_length: int, longrope=None) -> dict:
    """The ``model.position.rope.*`` fields of ``method`` at factor s (``longrope``: a factor file)."""
    from posenc import rope_scaling
    from posenc.training import longrope as longrope_lib

    if method == "longrope":
        if longrope is None:
            raise ValueError("method 'longrope' needs searched factors")
        return longrope_lib.rope_fields(longrope)
    scaling, extra = METHODS[method]
    used = rope_scaling.KEYWORDS[scaling]
    fields = {"model.position.rope.scaling": scaling}
    if "factor" in used and method not in _ADAPTIVE:
        fields["model.position.rope.factor"] = float(factor)
    if "original_length" in used:
        fields["model.position.rope.original_length"] = int(original_length)
    fields.update({f"model.position.rope.{k}": v for k, v in extra.items()})
    return fields


def check(config) -> None:
    """ConfigError naming the first bad study field (the runs' own fields are checked by resolve)."""
    from posenc import checks
    from posenc.training import setup

    try:
        for m in config.methods:
            checks.choice("methods entry", m, METHODS)
        if not config.methods or not config.factors or not config.seeds:
            raise ValueError("methods, factors and seeds must be non-empty")
        for s in config.factors:
            checks.number("factors entry", s, minimum=1.0)
            if float(s) * int(config.base.task.train_length) % 1:
                raise ValueError(f"factors entry {s} times the training length is not an integer")
        for n in config.finetune_steps:
            checks.integer("finetune_steps entry", n, minimum=0)
        checks.integer("passkey_min_length", config.passkey_min_length, minimum=0)
        checks.integer("finetune.batch_size", config.finetune.batch_size, minimum=0)
        checks.integer("search.batch_size", config.search.batch_size, minimum=1)
    except ValueError as e:
        raise setup.ConfigError(str(e)) from None


def _check_base(base) -> None:
    from posenc.training import setup

    pos = base.resolved.spec.position
    if set(pos.layer_kinds) != {"rope"} or pos.options["rope"]["scaling"] != "default":
        raise setup.ConfigError(f"the base run {base.workdir} must be RoPE without scaling in every "
                                f"layer; it has layers {sorted(set(pos.layer_kinds))}")


def train_base(config, seed: int, workdir: str):
    """The base run of ``seed`` (trained in WORKDIR/base/s<seed>/ unless ``base_run``)."""
    from posenc.training import finetune, loop, setup

    if config.base_run:
        return finetune.load_run(config.base_run)
    c = setup.plain_copy(config.base)
    c.train.seed = int(seed)
    d = os.path.join(workdir, "base", f"s{seed}")
    loop.run(c, d, name=f"base_s{seed}")
    return finetune.load_run(d)


def _copy(base):
    from posenc.training import overrides, setup

    c = setup.plain_copy(base.resolved.config)
    c.eval.variants = overrides.fields({})
    return c


def zero_shot_config(base, fields: dict, target: int):
    """The base config evaluated at (L, target) with every method as an evaluation variant."""
    from posenc.training import overrides

    c = _copy(base)
    length = int(c.task.train_length)
    c.eval.lengths = (length, int(target))
    c.eval.variants = overrides.fields({m: f for m, f in fields.items() if m != "default"})
    return c


def finetune_config(config, base, fields: dict, target: int, steps: int):
    """The fine-tune of ``base`` at length ``target`` with ``fields``, for ``steps`` steps."""
    from posenc.training import overrides

    c = _copy(base)
    length = int(c.task.train_length)
    overrides.apply(c, fields, where="method")
    ft = config.finetune
    batch = int(ft.batch_size) or max(1, int(c.train.batch_size) * length // int(target))
    c.task.train_length = int(target)
    c.train.update(steps=int(steps), batch_size=batch, learning_rate=float(ft.learning_rate),
                   warmup_steps=min(int(ft.warmup_steps), int(steps)),
                   min_lr_ratio=float(ft.min_lr_ratio), weight_decay=float(ft.weight_decay),
                   log_every=min(int(ft.log_every), int(steps)),
                   checkpoint_every=int(ft.checkpoint_every), fit_accuracy=0.0, progress=False)
    c.eval.lengths = (length, int(target))
    return c


def _longrope_factors(config, base, factor: float, target: int, workdir: str):
    from posenc import rope_search
    from posenc.training import finetune, longrope

    path = os.path.join(workdir, "longrope", f"x{factor:g}_s{base.resolved.config.train.seed}.json")
    if os.path.exists(path):
        return rope_search.read_json(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    s = config.search.to_dict()
    t0 = time.time()
    model = finetune.model_with(base.params, base.resolved.spec)
    found = longrope.search(model, base.resolved, factor=float(factor), target_length=int(target),
                            short=bool(s.pop("short")), batch_size=int(s.pop("batch_size")),
                            seed=int(base.resolved.config.train.seed), path=path, **s)
    logging.info("LongRoPE x%g: perplexity %.3f (seeds %s) in %.0fs", factor,
                 found["search"]["long"]["fitness"], found["search"]["long"]["seeds"], time.time() - t0)
    return found


def _passkey(params, resolved, spec, target: int, path: str, key: str) -> list[dict]:
    """Passkey rows at ``target`` (cached in ``path`` under ``key``)."""
    from posenc.training import finetune, results

    cached = [r for r in results.read_jsonl(path) if r.get("cache_key") == key]
    if cached:
        return cached
    rows = [dict(r, cache_key=key) for r in finetune.evaluate_on(
        params, resolved, "passkey", [target], spec=spec, eval_fields=PASSKEY_EVAL)]
    results.write_jsonl(path, [r for r in results.read_jsonl(path) if r.get("cache_key") != key] + rows)
    return rows


_KEEP = ("eval_length", "loss", "accuracy", "exact_match", "perplexity", "loss_last_L",
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


def _finetunes(config, base, method, fields, factor, target, workdir, passkey) -> list[dict]:
    """Every budget of one method and factor: fine-tune, evaluate, passkey."""
    from posenc.training import finetune, finish, loop, setup

    seed, length = int(base.resolved.config.train.seed), int(base.resolved.config.task.train_length)
    rows, previous = [], None  # previous: (workdir, resolved) of the last finished budget
    for steps in sorted({int(n) for n in config.finetune_steps if int(n) > 0}):
        name = f"{method}_x{factor:g}_s{seed}_n{steps}"
        d = os.path.join(workdir, "finetune", name)
        resolved = setup.resolve(finetune_config(config, base, fields, target, steps))
        start = None
        if previous is not None:
            try:  # continue the shorter budget where that equals starting from the base
                finetune.check_continuable(previous[1], resolved)
                start = previous[0]
            except ValueError:
                start = None
        try:
            run_rows = finetune.finetune(base, resolved, d, name=name, continue_from=start,
                                         row_fields=dict(method=method, factor=float(factor)))
            previous = (d, resolved)
        except loop.NonFiniteError as e:
            logging.warning("%s diverged: %s", name, e)
            run_rows = [dict(r, finetune_steps=steps, finetune_tokens=0)
                        for r in finish.record_divergence(resolved, d, e, name=name)]
            previous = None
        ident = dict(method=method, factor=factor, seed=seed, length=length, target=target, run=name)
        rows += [study_row(r, task=r["task"], **ident) for r in run_rows]
        if passkey and previous is not None:
            trained = finetune.load_run(d)
            rows += [study_row(dict(r, finetune_steps=steps, finetune_tokens=run_rows[0]["finetune_tokens"]),
                               task="passkey", **ident)
                     for r in _passkey(trained.params, resolved, resolved.spec, target,
                                       os.path.join(d, "passkey.jsonl"), resolved.hash)]
    return rows


def run_study(config, workdir: str) -> list[dict]:
    """The whole study (resumable); writes results.jsonl, table.md and plots; returns the rows."""
    from experiments import extend_report
    from posenc.training import finetune, loop, results, setup, step

    check(config)
    loop.quiet_libraries()
    t0, rows = time.time(), []
    seeds = config.seeds if not config.base_run else (None,)
    for seed in seeds:
        base = train_base(config, seed, workdir)
        _check_base(base)
        seed = int(base.resolved.config.train.seed)
        length = int(base.resolved.config.task.train_length)
        for factor in config.factors:
            target = int(round(float(factor) * length))
            passkey = bool(config.passkey_min_length) and target >= int(config.passkey_min_length)
            found = (_longrope_factors(config, base, factor, target, workdir)
                     if "longrope" in config.methods else None)
            fields = {m: method_fields(m, factor, length, found) for m in config.methods}
            name = f"x{factor:g}_s{seed}"
            d = os.path.join(workdir, "zero_shot", name)
            zero = setup.resolve(zero_shot_config(base, fields, target))
            ident = dict(factor=factor, seed=seed, length=length, target=target, run=f"zero_shot_{name}")
            for r in finetune.evaluate_params(base, zero, d, name=name):
                method = r.get("eval_variant") or "default"
                if method in config.methods:
                    rows.append(study_row(r, method=method, task="text", **ident))
            for method in config.methods if passkey else ():
                spec = zero.spec if method == "default" else zero.eval_variants[method][1]
                rows += [study_row(r, method=method, task="passkey", **ident) for r in _passkey(
                    base.params, zero, spec, target, os.path.join(d, "passkey.jsonl"),
                    f"{zero.hash}:{method}")]
            for method in config.methods:
                rows += _finetunes(config, base, method, fields[method], factor, target, workdir,
                                   passkey)
                step.clear_cache()  # every budget compiled its own step: free them
            logging.info("factor %g of seed %d done (%.0fs so far)", factor, seed, time.time() - t0)
    if not loop.is_main_process():
        return rows
    results.write_jsonl(os.path.join(workdir, "results.jsonl"), rows)
    extend_report.write_table(rows, os.path.join(workdir, "table.md"))
    plots = extend_report.write_plots(rows, os.path.join(workdir, "plots"))
    logging.info("extension study done in %.0fs: %d rows, %s, %d plots", time.time() - t0, len(rows),
                 os.path.join(workdir, "table.md"), len(plots))
    return rows


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    runtime.start()
    from experiments import extend_report
    from posenc.training import loop

    rows = run_study(flags.FLAGS.config, flags.FLAGS.workdir)
    if loop.is_main_process():
        print(extend_report.table_markdown(rows))


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
