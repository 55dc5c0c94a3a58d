"""JAX's persistent compilation cache, as every command and the test suite keep it.

Each (model, shape) compiles once per machine instead of once per process.
Opt out with ``--jax_cache_dir=`` or ``POSENC_JAX_CACHE_DIR=`` (empty, ``0``
or ``off``); point it elsewhere with either.
"""

from __future__ import annotations

import os

CACHE_ENV = "POSENC_JAX_CACHE_DIR"
_OFF = ("", "0", "off", "false", "none")


def default_cache_dir() -> str:
    """``$POSENC_JAX_CACHE_DIR`` if set ("" when it says off), else ``$XDG_CACHE_HOME/posenc/jax``
    (``~/.cache/posenc/jax``)."""
    if CACHE_ENV in os.environ:
        value = os.environ[CACHE_ENV].strip()
        return "" if value.lower() in _OFF else os.path.expanduser(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "posenc", "jax")


def enable_compilation_cache(cache_dir: str | None) -> None:
    """Turn on JAX's persistent compilation cache in ``cache_dir`` ("" or None: off).

    Programs that take at least 0.2 s to compile are stored (the train and
    evaluation programs of every model; not the many tiny eager ops), keyed by
    their HLO, the XLA flags and the jax version, so a stale entry is never
    reused. A second run of a grid loads its programs instead of compiling
    them (docs/performance.md).
    """
    if not cache_dir:
        return
    import jax

    os.makedirs(cache_dir, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
