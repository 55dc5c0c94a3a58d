"""Flags and start-up shared by the entry points: plugins, compile cache, multi-host, config errors."""

from __future__ import annotations

import importlib
import sys

from absl import app, flags

import experiments

_CACHE = flags.DEFINE_string("jax_cache_dir", experiments.default_cache_dir(),
                             "JAX persistent compilation cache directory ('' = off; default "
                             f"${experiments.CACHE_ENV} or the user cache directory).")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Multi-process run: call jax.distributed.initialize() first (docs/multidevice.md).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 (default $JAX_COORDINATOR_ADDRESS or auto-detected).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "Number of processes (default $JAX_NUM_PROCESSES or auto-detected).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "This process's id in [0, num_processes) (default $JAX_PROCESS_ID or auto-detected).")
_PLUGINS = flags.DEFINE_list(
    "plugins", [], "Comma-separated Python modules to import first (on PYTHONPATH or the working "
    "directory), e.g. your own encodings registered with posenc.model.register_encoding. "
    "They run as code: only name modules you trust.")


def plugin_names(argv) -> list[str]:
    """The modules named by ``--plugins=a,b`` / ``--plugins a,b`` in ``argv``."""
    names = []
    for i, arg in enumerate(argv):
        value = None
        if arg.startswith("--plugins="):
            value = arg.split("=", 1)[1]
        elif arg == "--plugins" and i + 1 < len(argv):
            value = argv[i + 1]
        if value:
            names += [n.strip() for n in value.split(",") if n.strip()]
    return names


def load_plugins(names) -> None:
    """Import each plugin module; a missing one is a one-line error (exit 2)."""
    if "" not in sys.path:
        sys.path.insert(0, "")  # the working directory, as `python -m` gives scripts
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            print(f"error: --plugins: cannot import {name!r}: {e}", file=sys.stderr)
            raise SystemExit(2) from None


def define_config_and_workdir(config_help: str, workdir_help: str) -> None:
    """The required ``--config`` (an ml_collections config file, locked) and ``--workdir`` flags.

    Called from an entry point's ``define_flags`` (when run as a program), before its own flags.
    """
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, config_help, lock_config=True)
    flags.DEFINE_string("workdir", None, workdir_help)
    flags.mark_flags_as_required(["config", "workdir"])


def main(fn) -> None:
    """``app.run(fn)`` for an entry point: plugins load before the config file is parsed
    (so their encodings have config sections and names), and a bad config value or
    field prints one line naming it and exits 2 instead of a traceback."""
    load_plugins(plugin_names(sys.argv))

    def guarded(argv):
        from posenc.training.setup import ConfigError

        try:
            return fn(argv)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None

    app.run(guarded, flags_parser=_parse_flags)


def _parse_flags(argv):
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError) as e:
        # e.g. --config.train.stepz=3: ml_collections reports an unknown field of the locked
        # config as an AttributeError (with a "Did you mean" hint) while parsing the flag.
        print(f"error: {_flag_error(e, argv)}", file=sys.stderr)
        raise SystemExit(2) from None


def _flag_error(e, argv) -> str:
    import re

    text = str(e.args[0] if e.args else e)
    if isinstance(e, flags.Error):
        return " ".join(text.split())
    name = re.search(r"'(\w+)\\*'", text)
    hint = re.search(r'Did you mean "(\w+)"', text)
    name = name.group(1) if name else text.strip()
    flag_names = [a.split("=", 1)[0] + "." for a in argv if a.startswith("--config.")]
    arg = next((f[:-1] for f in flag_names if f".{name}." in f), "--config")
    return (f"{arg}: unknown config field {name!r}"
            + (f"; did you mean {hint.group(1)!r}?" if hint else ""))


def start() -> None:
    """Join the multi-process run if ``--distributed`` (before any JAX computation), then enable the compile cache."""
    if _DISTRIBUTED.value:
        from posenc.training import sharding

        sharding.initialize_distributed(coordinator_address=_COORDINATOR.value,
                                        num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
    experiments.enable_compilation_cache(_CACHE.value)
