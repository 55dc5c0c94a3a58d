"""Benchmarks and device checks, run from the repository root (not installed with the package).

    python -m benchmarks.benchmark --config benchmarks/cases.py:R     # throughput and memory, one JSON line each
    python -m benchmarks.bench_threads --case=T                       # XLA:CPU worker threads, pinned or not
    python benchmarks/decode_speed.py                                 # decoded against teacher-forced evaluation
    python benchmarks/accelerator_check.py --plan                     # the GPU / TPU device check

``cases`` holds the benchmark cases (``get_config(arg)``), ``workload`` the model, state and random
tokens they time; docs/performance.md records the measurements.
"""
