"""The command-line programs: ``python -m posenc <command> [flags]`` (or ``posenc <command>``).

    train      train one config, evaluate it at every eval length, write its report
    compare    a comparison grid (posenc.studies.compare)
    extend     the context-extension study (posenc.studies.extend)
    stability  the training-stability study (posenc.studies.stability)
    report     rebuild the report of any study or run from its rows
    findings   the findings of a finished comparison grid, and its figures
    analyze    where a trained run's attention looks, what its positions learned

Each is the module ``posenc.cli.<command>`` (``define_flags()``, ``main(argv)``;
``python -m posenc.cli.<command>`` runs it too); ``--config`` takes a packaged
config by name (``default:tiny``, ``compare:quick``: posenc/configs/) or a
file (``path/to/file.py[:ARG]``). ``python -m posenc --help`` lists them.

Every command (and the test suite, tests/conftest.py) keeps JAX's
persistent compilation cache in :func:`default_cache_dir`, so that each
(model, shape) compiles once per machine instead of once per process. Opt
out with ``--jax_cache_dir=`` or ``POSENC_JAX_CACHE_DIR=`` (empty, ``0`` or
``off``); point it elsewhere with either.
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
