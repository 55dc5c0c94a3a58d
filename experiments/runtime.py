"""Flags and start-up shared by the commands: plugins, compile cache, multi-host, one-line config errors."""

from __future__ import annotations

import importlib
import sys

from absl import app, flags

from posenc.training.compile_cache import CACHE_ENV, default_cache_dir, enable_compilation_cache

_CACHE = flags.DEFINE_string("jax_cache_dir", default_cache_dir(),
                             "JAX persistent compilation cache directory ('' = off; default "
                             f"${CACHE_ENV} or the user cache directory).")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Multi-process run: call jax.distributed.initialize() first (docs/multidevice.md).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 (default $JAX_COORDINATOR_ADDRESS or auto-detected).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "Number of processes (default $JAX_NUM_PROCESSES or auto-detected).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "This process's id in [0, num_processes) "
                                   "(default $JAX_PROCESS_ID or auto-detected).")
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
    """The required ``--config NAME[:ARG]`` / ``--config FILE[:ARG]`` and ``--workdir`` flags.

    Called from an entry point's ``define_flags`` (when run as a program), before its own flags.
    ``--config.<field>=<value>`` arguments are not absl flags: :func:`main` takes them out of
    the command line and :func:`config` sets them through the one override applier.
    """
    flags.DEFINE_string("config", None, config_help)
    flags.DEFINE_string("workdir", None, workdir_help)
    flags.mark_flags_as_required(["config", "workdir"])


_OVERRIDES: list[tuple[str, str]] = []  # the --config.<field>=<value> arguments, in order


def config(schema):
    """The config of ``--config`` with every ``--config.<field>`` set (ConfigError names a bad one)."""
    from posenc.config import cli

    return cli.load(flags.FLAGS.config, _OVERRIDES, schema=schema)


def main(fn) -> None:
    """``app.run(fn)`` for an entry point: plugins load before the config file is parsed
    (so their encodings have config sections and names), and a bad config value or
    field, a workdir that holds another kind of thing or config, or one another process
    holds, prints one line naming it and exits 2 instead of a traceback."""
    from posenc.config import cli
    from posenc.config.schema import ConfigError
    from posenc.training import backends, loop
    from posenc.workdir import lock

    backends.cpu_only_without_accelerators()  # no libtpu start-up errors on a CPU host
    loop.quiet_libraries()
    refusals = (ConfigError, lock.WorkdirHoldsOther, lock.WorkdirInUse)
    load_plugins(plugin_names(sys.argv))
    for flag in flags.FLAGS.get_flags_for_module(__name__):  # --config, --workdir, --plugins, ... in --help
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    try:
        found, argv = cli.split_overrides(sys.argv)
    except ConfigError as e:
        _fail(e)
    _OVERRIDES[:] = found

    def guarded(argv):
        try:
            return fn(argv)
        except refusals as e:  # a bad config, a workdir that holds something else or is in use
            _fail(e)
        except KeyboardInterrupt as e:  # Ctrl-C: training checkpointed first (steploop.Interrupted)
            from posenc.training import steploop

            where = f" after checkpointing step {e.step}" if isinstance(e, steploop.Interrupted) else ""
            print(f"interrupted{where}; rerun the same command to resume (finished runs and checkpoints "
                  "are kept)", file=sys.stderr)
            raise SystemExit(130) from None

    app.run(guarded, argv=argv, flags_parser=_parse_flags)


def _fail(error) -> None:
    print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
    raise SystemExit(2) from None


def _parse_flags(argv):
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        _fail(e)


def run_study(name: str, **options) -> list[dict]:
    """Start up (distributed, compile cache), then run the study ``name`` on ``--config`` / ``--workdir``."""
    start()
    from posenc import studies
    from posenc.training import loop

    loop.quiet_libraries()
    return studies.run(name, config(studies.study(name).schema), flags.FLAGS.workdir, **options)


def start() -> None:
    """Join the multi-process run if ``--distributed`` (before any JAX computation), then enable the compile cache."""
    if _DISTRIBUTED.value:
        from posenc.training import sharding

        sharding.initialize_distributed(coordinator_address=_COORDINATOR.value,
                                        num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
    enable_compilation_cache(_CACHE.value)
