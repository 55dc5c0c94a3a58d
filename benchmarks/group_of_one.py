"""Step time of one run's train program against a seed group of one, interleaved in one process.

    python -m benchmarks.group_of_one --case T --rounds 30
    python -m benchmarks.group_of_one --case R --rounds 6

A single run trains with ``step.train_chunk_fn``; seeds trained together use
``step.seeds_train_chunk_fn``, the same step under ``jax.vmap`` over a leading
seed axis. A group of one is that vmapped program over an axis of size 1. Both
run calls of ``--steps`` steps on the case's model (benchmarks/cases.py, rope),
alternately, and the paired ratio (group / single) of each round is reported
with its median: the measurement behind keeping two train paths
(posenc/training/step.py's docstring).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="T", choices=("T", "R"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed call")
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    from benchmarks import cases, workload
    from posenc.training import multiseed
    from posenc.training import step as step_lib

    c = workload.config_for(cases.get_config(args.case), "rope")
    spec, k = workload.train_spec(c), args.steps
    single, group = step_lib.train_chunk_fn(spec, k), step_lib.seeds_train_chunk_fn(spec, k)
    _, g1, s1 = workload.fresh_state(c)
    _, g2, s2 = workload.fresh_state(c)
    s2 = multiseed._stack([s2])
    root, roots = jax.random.key(0), jax.random.split(jax.random.key(0), 1)

    def timed(fn, graphdef, state, data, t):
        start = time.perf_counter()
        state, metrics = fn(graphdef, state, data, np.int32(t), np.int32(k))
        jax.block_until_ready(metrics)
        return state, (time.perf_counter() - start) / k

    s1, _ = timed(single, g1, s1, root, 0)  # compile
    s2, _ = timed(group, g2, s2, roots, 0)
    a, b = [], []
    for r in range(args.rounds):
        s1, t1 = timed(single, g1, s1, root, (r + 1) * k)
        s2, t2 = timed(group, g2, s2, roots, (r + 1) * k)
        a.append(t1)
        b.append(t2)
    ratios = [y / x for x, y in zip(a, b)]
    print(f"case {args.case}: single {statistics.median(a) * 1e3:.2f} ms/step, group of one "
          f"{statistics.median(b) * 1e3:.2f} ms/step; paired ratio median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}), {args.rounds} rounds of {k} steps")


if __name__ == "__main__":
    main()
