"""Per-call train-step times beside the host counters that explain a slow call (Linux).

    python -m benchmarks.bench_threads --case=T --calls=60 --steps=40
    python -m benchmarks.bench_threads --case=T --calls=100 --steps=40 --pin   # workers pinned

One JSON line per call of ``steps`` train steps (rope, the case's model of
benchmarks/cases.py): ``ms_per_step``, the host's steal ticks over the call
(/proc/stat), the process's user and system CPU seconds, involuntary and
voluntary context switches and minor faults (getrusage), and the busiest
threads as ``[CPU ticks, the CPU it last ran on, name]`` (/proc/self/task).
A last line gives the median, min and max. A call in which XLA:CPU's two
workers shared one CPU shows as about twice the time at the same CPU
seconds, with thousands of involuntary switches (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import time

from absl import app, flags

_CASE = flags.DEFINE_string("case", "T", "benchmark case of benchmarks/cases.py (a training case)")
_CALLS = flags.DEFINE_integer("calls", 60, "timed calls")
_STEPS = flags.DEFINE_integer("steps", 40, "train steps per call")
_PIN = flags.DEFINE_bool("pin", False, "pin XLA:CPU's workers to one CPU each first (benchmarks.pinning)")


def _host_ticks() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal


def main(argv):
    del argv
    import jax

    from benchmarks import cases, pinning, workload

    c = workload.config_for(cases.get_config(_CASE.value), "rope")
    _, graphdef, state = workload.fresh_state(c)
    k = int(_STEPS.value)
    chunks = workload.Chunks(c, k)
    state, metrics = chunks(graphdef, state, k)  # compiles; the worker pool starts
    jax.block_until_ready(metrics)
    if _PIN.value:
        pinned = pinning.pin_compute_threads()
        print(json.dumps({"pinned": {str(t): sorted(os.sched_getaffinity(t)) for t in pinned}}))
    times = []
    for _ in range(int(_CALLS.value)):
        h0, t0, r0 = _host_ticks(), pinning.thread_stats(), resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        state, metrics = chunks(graphdef, state, k)
        jax.block_until_ready(metrics)
        ms = (time.perf_counter() - t) / k * 1e3
        h1, t1, r1 = _host_ticks(), pinning.thread_stats(), resource.getrusage(resource.RUSAGE_SELF)
        busy = sorted(((t1[i][1] - t0[i][1], t1[i][2], t1[i][0]) for i in t1 if i in t0
                       and t1[i][1] > t0[i][1]), reverse=True)
        times.append(ms)
        print(json.dumps(dict(ms_per_step=round(ms, 2), host_steal_ticks=h1[7] - h0[7],
                              user_s=round(r1.ru_utime - r0.ru_utime, 3), system_s=round(r1.ru_stime - r0.ru_stime, 3),
                              involuntary_switches=r1.ru_nivcsw - r0.ru_nivcsw,
                              voluntary_switches=r1.ru_nvcsw - r0.ru_nvcsw, minor_faults=r1.ru_minflt - r0.ru_minflt,
                              threads=[list(b) for b in busy[:4]])), flush=True)
    print(json.dumps(dict(median_ms=round(statistics.median(times), 2), min_ms=round(min(times), 2),
                          max_ms=round(max(times), 2), calls=len(times), steps_per_call=k, pinned=bool(_PIN.value))))


if __name__ == "__main__":
    app.run(main)
