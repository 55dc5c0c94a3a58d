"""Flags and start-up shared by the training entry points: compile cache and multi-host."""

from __future__ import annotations

from absl import flags

import experiments

_CACHE = flags.DEFINE_string("jax_cache_dir", experiments.DEFAULT_CACHE_DIR,
                             "JAX persistent compilation cache directory ('' = off).")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Multi-process run: call jax.distributed.initialize() first (docs/multidevice.md).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 (default $JAX_COORDINATOR_ADDRESS or auto-detected).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "Number of processes (default $JAX_NUM_PROCESSES or auto-detected).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "This process's id in [0, num_processes) (default $JAX_PROCESS_ID or auto-detected).")


def start() -> None:
    """Join the multi-process run if ``--distributed`` (before any JAX computation), then enable the compile cache."""
    if _DISTRIBUTED.value:
        from posenc.training import sharding

        sharding.initialize_distributed(coordinator_address=_COORDINATOR.value,
                                        num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
    experiments.enable_compilation_cache(_CACHE.value)
