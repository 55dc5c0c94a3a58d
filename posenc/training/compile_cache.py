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
    if _has_filelock():
        # JAX writes an entry in place and, without a size limit, reads entries without a lock, so
        # that a process could read an entry another was still writing (a torn executable crashed
        # XLA's deserializer under two test workers). With a limit, one file lock orders every read
        # and write of the directory.
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)


MAX_BYTES = 8 * 2**30  # the cache's size limit (least recently used entries go first)


def _has_filelock() -> bool:
    try:
        import filelock  # noqa: F401
    except ImportError:
        return False
    return True
