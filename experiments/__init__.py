"""Command-line entry points: ``python -m experiments.train`` and ``python -m experiments.compare``.

Each entry point also keeps freed memory in the process (:func:`keep_freed_memory`;
``--keep_freed_memory=false`` turns it off).

Every entry point (and the test suite, tests/conftest.py) keeps JAX's
persistent compilation cache in :func:`default_cache_dir`, so that each
(model, shape) compiles once per machine instead of once per process. Opt
out with ``--jax_cache_dir=`` or ``POSENC_JAX_CACHE_DIR=`` (empty, ``0`` or
``off``); point it elsewhere with either.
"""

from __future__ import annotations

import ctypes
import os
import sys

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


DEFAULT_CACHE_DIR = default_cache_dir()


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


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep large freed blocks in the process; True if it took effect.

    XLA:CPU allocates a program's temporary buffers at every call (39 MB for
    a case-T train step, hundreds of MB at case R) and frees them after it.
    Above glibc's mmap threshold each such block is mapped afresh and
    unmapped on free, so every call faults its pages in again: about 10,000
    page faults and 15 ms of kernel time per T step, 160,000 and 250 ms per
    R step, on top of the step's own compute (docs/performance.md). With the
    mmap and trim thresholds at 1 GiB (and no top padding) the blocks come
    from the heap and stay there, so later calls reuse pages that are
    already mapped. The process keeps up to that much freed memory instead
    of returning it to the system. A no-op off Linux / glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # glibc's malloc.h
    settings = ((m_mmap_threshold, 1 << 30), (m_trim_threshold, 1 << 30), (m_top_pad, 0))
    return all(mallopt(option, value) == 1 for option, value in settings)
