"""Decoded evaluation against teacher-forced evaluation, side by side in one process.

    python benchmarks/decode_speed.py --lengths 2048 4096 8192 16384 --runs 3

For every length: the teacher-forced evaluation (``evaluate.evaluate_length``
with ``decoded=False``: one compiled call over every batch) and the decoded
evaluation (``decoded=True``: the same call, which also gives each row's first
teacher-forced error, then ``decode.eval_answers`` over the same
examples), each run once to compile and then ``--runs`` times; one JSON line
per length with the median seconds of each and their ratio (what evaluating
with decoding costs against without). The model is the default config's
(``--config-arg`` for its variant words), fresh
(``--seed``) or trained ``--train-steps`` steps on its task; a fresh model is
wrong from the first answer token of almost every example, so every row is
decoded (the worst case of the exact-match shortcut).

``--group-rows`` sets how many rows decode together (``decode.Schedule.group_rows``);
``--decode-rows`` how many failing rows a length decodes (``eval.decode_rows``: an integer,
or all).
``--num-batches`` overrides ``eval.num_batches`` (fewer batches at the
longest lengths).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _config(arg):
    module = importlib.import_module("posenc.configs.default")
    return module.get_config(arg)


def _train(model, r, steps: int):
    import jax
    import optax
    from flax import nnx

    from posenc.training import step as step_lib

    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def update(model, optimizer, batch):
        def loss(model):
            logits = model(batch["inputs"], deterministic=True)
            mask, ce, *_ = step_lib._token_terms(logits, batch["targets"], batch["mask"])
            return (ce * mask).sum() / mask.sum()

        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    for i in range(steps):
        batch, _ = step_lib._batch(r.task, r.train.positions, jax.random.key(i), int(r.config.train.batch_size),
                                   int(r.config.task.train_length), split="train")
        update(model, optimizer, batch)
    return model


def _timed(fn, runs: int, warm: bool = True) -> list[float]:
    if warm:
        fn()  # compile
    out = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        out.append(time.perf_counter() - began)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--config-arg", default=None)
    p.add_argument("--num-batches", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-steps", type=int, default=0)
    p.add_argument("--group-rows", type=int, default=None, help="rows decoded together (Schedule.group_rows)")
    p.add_argument("--decode-rows", default=None, help="failing rows decoded per length (eval.decode_rows)")
    args = p.parse_args(argv)

    import jax
    from flax import nnx

    from posenc.model import Decoder
    from posenc.training import decode, evaluate, prepare

    schedule = decode.Schedule(group_rows=args.group_rows) if args.group_rows else decode.Schedule()
    c = _config(args.config_arg)
    c.train.progress = False
    c.eval.lengths = tuple(args.lengths)
    if args.num_batches:
        c.eval.num_batches = args.num_batches
    if args.decode_rows:
        c.eval.decode_rows = args.decode_rows if args.decode_rows == "all" else int(args.decode_rows)
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(args.seed))
    if args.train_steps:
        model = _train(model, r, args.train_steps)
    for length in args.lengths:
        forced = _timed(lambda: evaluate.evaluate_length(model, r.task, r.config, r.spec, length, decoded=False),
                        args.runs)
        row = {"length": length, "num_batches": int(r.config.eval.num_batches),
               "batch_size": int(r.config.eval.batch_size),
               "max_tokens_per_step": int(r.config.eval.max_tokens_per_step),
               "teacher_forced_s": statistics.median(forced), "teacher_forced_runs": forced}
        stats, answers = {}, {}
        plain = decode.eval_answers

        def spy(*a, **k):  # the evaluation's decoding, its statistics kept, with the schedule
            return plain(*a, **dict(k, stats=stats, schedule=schedule))

        def decoded():
            answers.update(evaluate.evaluate_length(model, r.task, r.config, r.spec, length, decoded=True))

        evaluate.decode_lib.eval_answers = spy
        try:
            times = _timed(decoded, args.runs)
        finally:
            evaluate.decode_lib.eval_answers = plain
        row.update(decoded_s=statistics.median(times), decoded_runs=times,
                   ratio=statistics.median(times) / statistics.median(forced),
                   decoded_rows=stats["decoded_rows"], failing_rows=stats["failing_rows"], rows=stats["rows"],
                   steps=stats["steps"],
                   groups=len(stats["groups"]), segments=stats["segments"],
                   prefill_pieces=stats["prefill_pieces"], seconds=stats["seconds"],
                   forced_pass=stats["forced_pass"], cache_sizes=sorted(stats["cache_sizes"]),
                   decoded_accuracy=answers["decoded_accuracy"],
                   decoded_exact_match=answers["decoded_exact_match"],
                   decoded_accuracy_se=answers["decoded_accuracy_se"])
        row["machine"] = f"{platform.machine()} {os.cpu_count()} cpus, jax {jax.__version__} {jax.default_backend()}"
        row["load_average"] = os.getloadavg()
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
