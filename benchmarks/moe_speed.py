"""Mixture-of-experts throughput against the dense model of the same active parameters, in one process.

    python -m benchmarks.moe_speed --rounds 3

Case R's model (benchmarks/cases.py: d_model 256, 4 layers, 4 heads, batch 16 x 256 tokens, vocab 256,
rope) with SwiGLU MLPs, trained on random tokens:

    dense    mlp_hidden 1024
    moe8     8 experts of width 512, top-2 (2 x 512 = 1024: the dense MLP's active parameters, plus the
             router's 256 x 8), model.moe.impl blocked (posenc.expert_blocks)
    moe32    32 experts of width 512, top-2: the active parameters of moe8, 4x its expert parameters

Training: tokens/s of the train chunk program (``--steps`` steps per call, as the loop runs them), dense
and moe8 alternating each round (paired ratio moe8 / dense). Evaluation: tokens/s of the jitted forward
on one batch, dense, moe8 and moe32 alternating each round, and moe32 with ``model.moe.impl`` dense (every
expert on every token) as the contrast: blocked evaluation follows the active parameters, dense the total.
One JSON row per measurement, then a summary line of medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

MODELS = {
    "dense": {"model.mlp_hidden": 1024},
    "moe8": {"model.moe.num_experts": 8, "model.moe.num_experts_per_tok": 2, "model.moe.moe_intermediate_size": 512,
             "model.moe.norm_topk_prob": True},
    "moe32": {"model.moe.num_experts": 32, "model.moe.num_experts_per_tok": 2,
              "model.moe.moe_intermediate_size": 512, "model.moe.norm_topk_prob": True},
    "moe32_dense": {"model.moe.num_experts": 32, "model.moe.num_experts_per_tok": 2,
                    "model.moe.moe_intermediate_size": 512, "model.moe.norm_topk_prob": True,
                    "model.moe.impl": "dense"},
}


def config(name: str):
    from benchmarks import cases, workload
    from posenc.config import overrides
    from posenc.training import schema

    c = workload.config_for(cases.get_config("R"), "rope")
    with c.unlocked():
        overrides.apply(c, {"model.mlp": "swiglu", **MODELS[name]}, schema=schema.Run)
    return c


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="train steps per timed call")
    parser.add_argument("--eval_calls", type=int, default=3, help="forward calls per timed evaluation round")
    args = parser.parse_args(argv)

    import jax
    import numpy as np
    from flax import nnx

    from benchmarks import workload
    from posenc.training import step as step_lib

    k = args.steps
    tokens_per_step = None

    def trainer(name):
        c = config(name)
        fn = step_lib.train_chunk_fn(workload.train_spec(c), k)
        _, graphdef, state = workload.fresh_state(c)
        box = {"state": state, "t": 0}

        def call():
            start = time.perf_counter()
            box["state"], metrics = fn(graphdef, box["state"], jax.random.key(0), np.int32(box["t"]), np.int32(k))
            jax.block_until_ready(metrics)
            box["t"] += k
            return time.perf_counter() - start

        call()  # compile
        return call, int(c.train.batch_size) * int(c.task.train_length)

    def evaluator(name):
        c = config(name)
        model = workload.build(c)
        graphdef, state = nnx.split(model)
        tokens = jax.random.randint(jax.random.key(1), (int(c.train.batch_size), int(c.task.train_length)), 0,
                                    int(c.model.vocab_size))
        fn = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
        jax.block_until_ready(fn(state, tokens))  # compile

        def call():
            start = time.perf_counter()
            for _ in range(args.eval_calls):
                jax.block_until_ready(fn(state, tokens))
            return (time.perf_counter() - start) / args.eval_calls

        n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        return call, tokens.size, n

    train = {name: trainer(name) for name in ("dense", "moe8")}
    tokens_per_step = train["dense"][1]
    seen: dict[str, list[float]] = {name: [] for name in train}
    for r in range(args.rounds):
        for name, (call, tokens) in train.items():
            seconds = call() / k
            seen[name].append(tokens / seconds)
            print(json.dumps({"kind": "train", "model": name, "round": r, "tokens_per_s": round(tokens / seconds),
                              "ms_per_step": round(seconds * 1e3, 2), "steps_per_call": k}), flush=True)
    ratios = [m / d for m, d in zip(seen["moe8"], seen["dense"])]
    del train
    evals = {name: evaluator(name) for name in MODELS}
    eval_seen: dict[str, list[float]] = {name: [] for name in evals}
    for r in range(args.rounds):
        for name, (call, tokens, params) in evals.items():
            seconds = call()
            eval_seen[name].append(tokens / seconds)
            print(json.dumps({"kind": "eval", "model": name, "round": r, "tokens_per_s": round(tokens / seconds),
                              "params": params}), flush=True)
    med = {n: statistics.median(v) for n, v in eval_seen.items()}
    print(f"train tokens/s median: dense {statistics.median(seen['dense']):,.0f}, moe8 "
          f"{statistics.median(seen['moe8']):,.0f}; paired ratio moe8 / dense {statistics.median(ratios):.3f} "
          f"({', '.join(f'{x:.3f}' for x in ratios)}), {tokens_per_step} tokens a step. eval tokens/s median: "
          + ", ".join(f"{n} {v:,.0f}" for n, v in med.items())
          + f"; moe32 / moe8 {med['moe32'] / med['moe8']:.3f}, moe32_dense / moe8 "
          f"{med['moe32_dense'] / med['moe8']:.3f}")


if __name__ == "__main__":
    main()
