"""Pin XLA:CPU's compute threads to one CPU each (Linux), for timings that do not depend on the scheduler.

XLA:CPU runs a program's ops on a pool of worker threads (named ``tf_XLAEigen``), one per
CPU. Left to the Linux scheduler, the two workers of a 2-CPU machine sometimes share one
CPU for a while: every op then waits for the other half of its split, the step takes
about twice as long with the same CPU time, and the process's involuntary context
switches jump from tens to thousands per call (docs/performance.md, "The slow mode on
an idle host"). With each worker pinned to its own CPU, the probe of that section saw
no slow call in 200.

Pin only on a machine you have to yourself: a pinned thread cannot move away from a
co-tenant. The pool exists once a program has run, so call it after the first call.
"""

from __future__ import annotations

import os

WORKER_PREFIX = "tf_XLAEigen"


def thread_stats() -> dict[int, tuple[str, int, int]]:
    """``{thread id: (name, CPU ticks so far (user + system), the CPU it last ran on)}`` of this process.

    From ``/proc/self/task/*/stat``; empty where there is no /proc.
    """
    if not os.path.isdir("/proc/self/task"):
        return {}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (name, int(fields[11]) + int(fields[12]), int(fields[36]))
    return out


def compute_threads(prefix: str = WORKER_PREFIX) -> list[int]:
    """Thread ids of this process whose name starts with ``prefix`` (XLA:CPU's workers), in id order."""
    return sorted(tid for tid, (name, _, _) in thread_stats().items() if name.startswith(prefix))


def pin_compute_threads(prefix: str = WORKER_PREFIX) -> dict[int, set[int]]:
    """Pin every compute thread to one CPU of the process's affinity set, round robin.

    Returns ``{thread id: its affinity before}`` (for :func:`unpin`); empty where the
    platform has no ``sched_setaffinity`` or no such threads have started yet.
    """
    if not hasattr(os, "sched_setaffinity"):
        return {}
    cpus = sorted(os.sched_getaffinity(0))
    before = {}
    for i, tid in enumerate(compute_threads(prefix)):
        try:
            previous = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {cpus[i % len(cpus)]})
        except OSError:  # the thread ended
            continue
        before[tid] = previous
    return before


def unpin(before: dict[int, set[int]]) -> None:
    """Give the threads of :func:`pin_compute_threads` their affinity back."""
    for tid, cpus in before.items():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            continue
