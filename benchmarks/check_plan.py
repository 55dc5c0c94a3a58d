"""``accelerator_check.py --plan``: each stage's estimated seconds on one H200, before a machine starts.

A stage's estimate is its fixed costs (process start, jax import, compiles:
the values below, from the stages' dry runs and the peers' start-up) plus its
model FLOPs over an assumed share of the H200's dense bf16 peak
(``MFU``: large matmuls for case G, small ones for the 1-layer addition
model). Beside it, ``this_host_s`` is what the same FLOPs take on this host at
the rate of a training step of the addition model measured here (at a tenth
of its batch), so the plan also says what the stage would cost without an
accelerator. The total is compared with the check's budget; stages past it
are marked as those the budget cuts.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200_BF16_PEAK = 989.4e12  # dense, no sparsity (the data sheet; benchmarks.benchmark.CHIP_BF16_PEAK)
MFU = {"train": 0.35, "addition": 0.15, "eval": 0.30}  # assumed shares of the peak
# Seconds that do not scale with FLOPs: process start + jax import + compiles (per process).
FIXED = {"install": 30.0, "environment": 20.0, "tests": 150.0, "train_process": 45.0, "peer_process": 35.0,
         "addition_process": 30.0, "addition_arm": 15.0, "eval_process": 35.0, "attention_op": 60.0}


def _config(spec: str, overrides=()):
    """A packaged config ``NAME[:ARG]`` or ``FILE[:ARG]`` (relative to the repository) with ``(field, text)``
    overrides."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)  # benchmarks/cases.py imports posenc from this checkout
    from posenc.config import cli

    return cli.load(os.path.join(ROOT, spec) if ".py" in spec else spec, overrides)


def _flops_per_token(config, length: int) -> float:
    """PaLM's accounting, 6 N + 12 l L d per trained token (N the non-embedding parameters);
    ``config`` a run's config, or a benchmark case's (its ``model`` section has the vocabulary)."""
    import jax
    from flax import nnx

    from posenc.model import Decoder, ModelSpec
    from posenc.training import prepare

    if "bench" in config:
        spec = ModelSpec.from_config(config.model, train_length=length)
    else:
        spec = prepare.resolve(config).spec
    model = nnx.eval_shape(lambda: Decoder(spec, rngs=nnx.Rngs(0)))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    n -= spec.vocab_size * spec.d_model * (1 if spec.tie_embeddings else 2)
    return 6.0 * n + 12.0 * spec.num_layers * spec.d_model * length


def _host_flops_per_s(config) -> float:
    """Model FLOP/s of one training step of ``config`` at a tenth of its batch, measured here."""
    import jax

    from posenc.training import loop, prepare
    from posenc.training import step as step_lib

    config = config.copy_and_resolve_references()
    config.train.batch_size = max(1, int(config.train.batch_size) // 10)
    r = prepare.resolve(config)
    _, _, graphdef, state = loop.init_state(r)
    fn = step_lib.train_step_fn(r.train)
    key = jax.random.key(0)
    state, m = fn(graphdef, state, key)  # compile
    jax.block_until_ready(m)
    times = []
    for t in range(3):
        start = time.perf_counter()
        state, m = fn(graphdef, state, jax.random.fold_in(key, t + 1))
        jax.block_until_ready(m)
        times.append(time.perf_counter() - start)
    length = int(r.config.task.train_length)
    tokens = int(r.config.train.batch_size) * length
    return tokens * _flops_per_token(r.config, length) / sorted(times)[1]


def stages(args) -> list[dict]:
    """The plan's rows: stage, what, flops, h200_s, this_host_s (None where nothing is computed)."""
    from check_stages import ADDITION, EVAL_LENGTHS, PEERS, TRAIN_FIRST

    g = _config("benchmarks/cases.py:G")
    g_len, g_batch = int(g.task.train_length), int(args.batch or g.train.batch_size)
    g_steps = int(g.bench.steps) + int(g.bench.warmup)
    from posenc import studies
    from posenc.studies import engine
    from posenc.training import backends

    # before expanding the grid (resolving a spec asks jax for its backend): only the CPU backend on a
    # host without an accelerator, as posenc's commands do, so no libtpu start-up errors
    backends.cpu_only_without_accelerators()

    add = _config(ADDITION)
    base = engine.expand(studies.study("compare"), add)[1][0].run.config  # its first arm's run
    add_len = int(base.task.train_length)  # the longest training example (tokens)
    seeds, arms = len(add.grid.seeds), len(add.grid.positions)
    host = _host_flops_per_s(base)
    rows = []

    def row(stage, what, flops, fixed, mfu=None):
        h200 = fixed + (flops / (H200_BF16_PEAK * mfu) if flops else 0.0)
        rows.append({"stage": stage, "what": what, "flops": flops or None, "assumed_mfu": mfu,
                     "fixed_s": fixed, "h200_s": round(h200, 1),
                     "this_host_s": round(flops / host, 1) if flops else None})

    row("install", "carried wheels, posenc --no-deps", 0, FIXED["install"])
    row("environment", "versions, devices, torch", 0, FIXED["environment"])
    row("tests", "pytest -m accelerator (compile-bound)", 0, FIXED["tests"])
    def train(stage, positions):
        for position in positions:
            cfg = _config("benchmarks/cases.py:G", [("model.position.kind", position)])
            flops = _flops_per_token(cfg, g_len) * g_len * g_batch * g_steps
            peers = len(PEERS.get(position, ()))
            row(stage, f"case G {position}: {g_steps} steps of {g_batch} x {g_len} + {peers} peer(s)",
                flops * (1 + peers), FIXED["train_process"] + peers * FIXED["peer_process"], MFU["train"])

    train("train", args.positions[:TRAIN_FIRST])
    tokens = int(base.train.batch_size) * seeds * add_len * args.addition_steps
    row("addition", f"{ADDITION}: {arms} arms x {seeds} seeds vmapped, {args.addition_steps} steps of "
        f"{base.train.batch_size} x {add_len} (Cho et al.: 50000)",
        arms * tokens * _flops_per_token(base, add_len), FIXED["addition_process"] + arms * FIXED["addition_arm"],
        MFU["addition"])
    train("train_more", args.positions[TRAIN_FIRST:])
    for length in EVAL_LENGTHS:
        for position in args.positions:
            cfg = _config("benchmarks/cases.py:G", [("model.position.kind", position)])
            # a forward is a third of a training step's FLOPs
            row("eval", f"case G {position} forward at {length} tokens",
                _flops_per_token(cfg, length) * length / 3, FIXED["eval_process"], MFU["eval"])
    row("attention_op", "kernel blocks vs cuDNN / XLA", 0, FIXED["attention_op"])
    total = 0.0
    for r in rows:
        total += r["h200_s"]
        r["cumulative_h200_s"] = round(total, 1)
        r["within_budget"] = total <= args.budget_s
    return rows


def main(args) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    rows = stages(args)
    for r in rows:
        print(json.dumps({"check": "plan", **r}))
    cut = [r["what"] for r in rows if not r["within_budget"]]
    total = rows[-1]["cumulative_h200_s"]
    print(f"plan: {total:.0f} s on one H200 against a budget of {args.budget_s:.0f} s; "
          + (f"the budget cuts {len(cut)} row(s), from: {cut[0]}" if cut else "every stage fits"),
          file=sys.stderr)
    return 0
