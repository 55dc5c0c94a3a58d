"""Decoded evaluation against teacher-forced evaluation, side by side in one process.

    python benchmarks/decode_speed.py --lengths 2048 4096 8192 16384 --runs 3
    python benchmarks/decode_speed.py --lengths 2048 --impl old --old-chunks 1   # the decoder before

For every length: the teacher-forced evaluation (``evaluate.evaluate_length``
with ``decoded=False``: one compiled call over every batch) and the decoded
evaluation (``decoded=True``: the same call, which also gives each row's first
teacher-forced error, then ``decode.eval_correctness`` over the same
examples), each run once to compile and then ``--runs`` times; one JSON line
per length with the median seconds of each and their ratio (what evaluating
with decoding costs against without). The model is the default config's
(the default config, ``--config-arg`` for its variant words), fresh
(``--seed``) or trained ``--train-steps`` steps on its task; a fresh model is
wrong from the first answer token of almost every example, so every row is
decoded (the worst case of the exact-match shortcut).

``--group-rows`` sets how many rows decode together (``decode.GROUP_ROWS``).
``--num-batches`` overrides ``eval.num_batches`` (fewer batches at the
longest lengths). ``--impl old`` times the decoder of the last commit
(``git show HEAD:posenc/training/decode.py``) instead, on its first
``--old-chunks`` row chunks only (each chunk decodes one after the other, so
the full time is the chunks' time times the number of chunks, printed as
``decoded_s_projected``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _config(arg):
    module = importlib.import_module("posenc.configs.default")
    return module.get_config(arg)


def _old_decode():
    source = subprocess.run(["git", "show", "HEAD:posenc/training/decode.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "old_decode.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("old_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        batch, _ = step_lib._batch(r.task, r.config, jax.random.key(i), int(r.config.train.batch_size),
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
    p.add_argument("--group-rows", type=int, default=None, help="rows decoded together (decode.GROUP_ROWS)")
    p.add_argument("--impl", choices=("new", "old"), default="new")
    p.add_argument("--old-chunks", type=int, default=1)
    p.add_argument("--old-steps", type=int, default=0,
                   help="instead of whole chunks: time the old decoder's loop over the last K and 2K answer "
                        "tokens of the first chunk; project its time per step over every chunk's span")
    p.add_argument("--old-cold", action="store_true",
                   help="time the old decoder's chunks without a compile run first (its compile is seconds, "
                        "a chunk minutes)")
    args = p.parse_args(argv)

    import jax
    from flax import nnx

    from posenc.model import Decoder
    from posenc.training import decode, evaluate, prepare

    if args.group_rows:
        decode.GROUP_ROWS = args.group_rows
    c = _config(args.config_arg)
    c.train.progress = False
    c.eval.lengths = tuple(args.lengths)
    if args.num_batches:
        c.eval.num_batches = args.num_batches
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(args.seed))
    if args.train_steps:
        model = _train(model, r, args.train_steps)
    old = _old_decode() if args.impl == "old" else None
    for length in args.lengths:
        plan = evaluate.plan_length(r.task, r.config, length)
        root = evaluate._root(r.config, length)
        forced = _timed(lambda: evaluate.evaluate_length(model, r.task, r.config, r.spec, length, decoded=False),
                        args.runs)
        row = {"length": length, "impl": args.impl, "num_batches": int(r.config.eval.num_batches),
               "batch_size": int(r.config.eval.batch_size),
               "max_tokens_per_step": int(r.config.eval.max_tokens_per_step),
               "teacher_forced_s": statistics.median(forced), "teacher_forced_runs": forced}
        if old is None:
            stats, answers = {}, {}
            plain = decode.eval_correctness

            def spy(*a, **k):  # the evaluation's decoding, its statistics kept
                return plain(*a, **dict(k, stats=stats))

            def decoded():
                answers.update(evaluate.evaluate_length(model, r.task, r.config, r.spec, length, decoded=True))

            evaluate.decode_lib.eval_correctness = spy
            try:
                times = _timed(decoded, args.runs)
            finally:
                evaluate.decode_lib.eval_correctness = plain
            row.update(decoded_s=statistics.median(times), decoded_runs=times,
                       ratio=statistics.median(times) / statistics.median(forced),
                       decoded_rows=stats["decoded_rows"], rows=stats["rows"], steps=stats["steps"],
                       groups=len(stats["groups"]), segments=stats["segments"],
                       prefill_pieces=stats["prefill_pieces"], seconds=stats["seconds"],
                       forced_pass=stats["forced_pass"], cache_sizes=sorted(stats["cache_sizes"]),
                       decoded_accuracy=answers["decoded_accuracy"],
                       decoded_exact_match=answers["decoded_exact_match"])
        else:
            parts, span = old._eval_set(r.task, r.config, length, root, plan.min_size)
            chunks = parts[:args.old_chunks]
            if args.old_steps:
                k = args.old_steps
                part, pos = parts[0]
                spans = {n: (span[1] - n, span[1]) for n in (k, 2 * k)}
                took = {n: statistics.median(_timed(
                    lambda n=n: old.answer_correctness(model, part, positions=pos, span=spans[n]), args.runs))
                    for n in spans}
                per_step = (took[2 * k] - took[k]) / k
                steps = span[1] - span[0]
                row.update(old_step_s=per_step, chunks=len(parts), rows_per_chunk=len(part["inputs"]),
                           steps_per_chunk=steps, decoded_s_projected=per_step * steps * len(parts),
                           ratio_projected=per_step * steps * len(parts) / statistics.median(forced))
                row["machine"] = f"{platform.machine()} {os.cpu_count()} cpus, jax {jax.__version__}"
                row["load_average"] = os.getloadavg()
                print(json.dumps(row), flush=True)
                continue

            def decoded():
                for part, pos in chunks:
                    old.answer_correctness(model, part, positions=pos, span=span)

            times = _timed(decoded, args.runs, warm=not args.old_cold)
            row.update(decoded_s_chunks=statistics.median(times), chunks_timed=len(chunks),
                       chunks=len(parts), rows_per_chunk=len(chunks[0][0]["inputs"]),
                       decoded_s_projected=statistics.median(times) * len(parts) / len(chunks),
                       ratio_projected=statistics.median(times) * len(parts) / len(chunks)
                       / statistics.median(forced), decoded_runs=times)
        row["machine"] = f"{platform.machine()} {os.cpu_count()} cpus, jax {jax.__version__} {jax.default_backend()}"
        row["load_average"] = os.getloadavg()
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
