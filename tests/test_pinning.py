"""benchmarks.pinning: XLA:CPU's worker threads pinned to one CPU each, and given their affinity back."""

import os
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import pinning

linux = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"),
                           reason="needs Linux thread affinity")


@linux
def test_workers_are_pinned_round_robin_and_unpinned():
    jax.block_until_ready(jax.jit(lambda x: x @ x + 1)(jnp.ones((256, 256))))  # the pool starts
    workers = pinning.compute_threads()
    assert workers, "XLA:CPU started no tf_XLAEigen thread"
    cpus = sorted(os.sched_getaffinity(0))
    before = pinning.pin_compute_threads()
    try:
        assert sorted(before) == workers
        for i, tid in enumerate(workers):
            assert os.sched_getaffinity(tid) == {cpus[i % len(cpus)]}
        assert os.sched_getaffinity(0) == set(cpus)  # the calling thread is left alone
        x = jnp.arange(12.0).reshape(3, 4)
        assert float(jax.jit(lambda a: (a @ a.T).sum())(x)) == float((x @ x.T).sum())
    finally:
        pinning.unpin(before)
    for tid, previous in before.items():
        assert os.sched_getaffinity(tid) == previous


def test_no_threads_of_another_name():
    assert pinning.compute_threads(prefix="no-such-thread-") == []
    assert pinning.pin_compute_threads(prefix="no-such-thread-") == {}


@linux
def test_thread_stats_name_this_thread_and_its_cpu():
    import threading

    stats = pinning.thread_stats()
    name, ticks, cpu = stats[threading.get_native_id()]
    assert name and ticks >= 0 and cpu in range(os.cpu_count())
