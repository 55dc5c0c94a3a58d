"""Command-line entry points: ``python -m experiments.train`` and ``python -m experiments.compare``."""

from __future__ import annotations

import os

DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "posenc", "jax")


def enable_compilation_cache(cache_dir: str | None) -> None:
    """Turn on JAX's persistent compilation cache in ``cache_dir`` ("" or None: off).

    Each (model, shape) compiles once per machine instead of once per process,
    which is most of the start-up time of a small run.
    """
    if not cache_dir:
        return
    import jax

    os.makedirs(cache_dir, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
