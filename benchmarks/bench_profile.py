"""Per-op profile of a benchmark case's train step, one step per call against k steps per call.

    python -m benchmarks.benchmark --config benchmarks/cases.py:T --positions=rope \
        --config.bench.profile=True

A ``jax.profiler`` trace (Perfetto JSON) of ``bench.steps`` train steps,
each XLA op event mapped back to its instruction in the compiled HLO
(name, shape, ``op_name``) and put in a category: matmuls (YNNPACK
fusions, forward and backward), reductions, transposes and copies, the
attention softmax and mask passes ([.., L, L] shapes), the output softmax
/ cross-entropy ([B, L, V]), GELU ([B L, 4 D]), the rest of the
elementwise and norm passes, and the optimizer and metrics (ops outside
the gradient). Rows: ms per step of each category and of all ops, and the
wall time per step, in both modes; wall minus ops is time the ops did not
run (dispatch, host work, waiting for threads).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+?)(?:\{[^}]*\})? (\w[\w-]*)\(")


def _instructions(hlo: str) -> dict:
    """name -> (op_name, shape, opcode) of every instruction of the compiled module."""
    out = {}
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            op = re.search(r'op_name="([^"]*)"', line)
            out[m.group(1)] = (op.group(1) if op else "", m.group(2), m.group(3))
    return out


def category(name: str, op_name: str, shape: str, opcode: str, dims: dict) -> str:
    """The category of one compiled op (module docstring); ``dims``: B, L, V, D, F of the case."""
    prim = op_name.split("/")[-1]
    backward = "transpose(" in op_name
    side = " bwd" if backward else " fwd"
    if not ("jvp(" in op_name or backward):
        return "optimizer, metrics, batch (outside the gradient)"
    if name.startswith("ynn_fusion") or opcode in ("dot", "convolution"):
        return "reduction (attention softmax sums)" if "reduce" in prim else "matmul" + side
    if opcode in ("copy", "transpose") or "transpose" in prim or "copy" in name or "barrier" in prim:
        return "transpose / copy"
    if "concatenate" in prim or opcode == "concatenate":
        return "concatenate (rotary halves)"
    B, L, V, D, F = (dims[k] for k in "BLVDF")
    if "tanh" in prim or f"{B * L},{F}]" in shape or f"{B},{L},{F}]" in shape:
        return "GELU" + side
    if f"{L},{L}]" in shape:
        return "attention softmax / mask" + side
    if f"{B},{L},{V}]" in shape or prim in ("exp", "log"):
        return "output softmax / cross-entropy" + side
    if "gather" in prim or "scatter" in prim:
        return "embedding gather / scatter"
    return "other elementwise, norms" + side


def _trace(run) -> tuple[dict, float]:
    """(op name -> total microseconds, wall seconds) of ``run()`` under the profiler."""
    import jax

    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        with jax.profiler.trace(d, create_perfetto_trace=True):
            jax.block_until_ready(run())
        wall = time.perf_counter() - t
        (path,) = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    total = collections.defaultdict(float)
    for e in events:
        if e.get("ph") == "X":
            total[e["name"]] += e["dur"]
    return total, wall


def profile(config, position: str, build) -> list[dict]:
    """Rows of the per-category profile of ``position`` at ``config``'s case, both modes.

    ``build(c)``: ``(model, graphdef, state)`` of a fresh run (benchmarks.benchmark).
    """
    import jax
    import numpy as np

    from benchmarks import workload
    from benchmarks.workload import config_for
    from posenc.training import step as step_lib

    c = config_for(config, position)
    steps = int(c.bench.steps)
    m = c.model
    dims = dict(B=int(c.train.batch_size), L=int(c.task.train_length), V=int(m.vocab_size),
                D=int(m.d_model), F=int(m.d_model * m.mlp_ratio))
    root = jax.random.key(0)
    single = step_lib.train_step_fn(workload.train_spec(c))
    chunk = step_lib.train_chunk_fn(workload.train_spec(c), steps)
    modes = {}
    _, g, s = build(c)
    modes["one per call"] = (single, g, s, single.lower(g, s, root).compile().as_text())
    _, g, s = build(c)
    args = (g, s, root, np.int32(0), np.int32(steps))
    modes[f"{steps} per call"] = (chunk, g, s, chunk.lower(*args).compile().as_text())
    rows = []
    for mode, (fn, g, s, hlo) in modes.items():
        state = [s]

        def run(fn=fn, g=g):
            if fn is single:
                out = []
                for t in range(steps):
                    state[0], metrics = fn(g, state[0], jax.random.fold_in(root, t))
                    out.append(metrics)
                return out
            state[0], metrics = fn(g, state[0], root, np.int32(0), np.int32(steps))
            return metrics

        jax.block_until_ready(run())  # compile
        walls = []
        for _ in range(3):  # wall time without the profiler (its events cost time of their own)
            t = time.perf_counter()
            jax.block_until_ready(run())
            walls.append(time.perf_counter() - t)
        wall = sorted(walls)[1]
        times, _ = _trace(run)
        ops = _instructions(hlo)
        by = collections.defaultdict(float)
        count = collections.Counter()
        for name, us in times.items():
            if name in ops:
                k = category(name, *ops[name], dims)
                by[k] += us
                count[k] += 1
        op_total = sum(by.values())
        row = {"case": c.bench.case, "position": position, "profile": mode,
               "wall_ms_per_step": round(wall / steps * 1e3, 3),
               "op_ms_per_step": round(op_total / steps / 1e3, 3),
               "distinct_ops": sum(count.values()),
               "categories_ms_per_step": {k: round(v / steps / 1e3, 3)
                                          for k, v in sorted(by.items(), key=lambda x: -x[1])},
               "load_1min": round(os.getloadavg()[0], 2)}
        rows.append(row)
    return rows
