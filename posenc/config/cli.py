"""Configs from the command line: ``--config FILE[:ARG]`` and ``--config.<a.b>=<value>``.

``--config configs/compare.py:quick`` imports the file and calls its
``get_config("quick")``; every ``--config.<field>=<value>`` (or
``--config.<field> <value>``) is then set, in order, through the one
override applier (:func:`posenc.config.overrides.apply`), which parses the
text into the field's declared type. Every failure (no such file, an
unknown ``:ARG`` word, an unknown field, a bad value) is a
:class:`~posenc.config.schema.ConfigError` whose message names it in one
line; entry points print it and exit with status 2.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from posenc.config import overrides as overrides_lib
from posenc.config.schema import ConfigError

PREFIX = "--config."


def split_overrides(argv) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(field, text)], rest)``: the ``--config.<field>`` arguments of ``argv``, and the others."""
    found, rest, i = [], [], 0
    argv = list(argv)
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(PREFIX):
            name, eq, value = arg[len(PREFIX):].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{arg}: no value (use {arg}=VALUE)")
                value, i = argv[i + 1], i + 1
            found.append((name, value))
        else:
            rest.append(arg)
        i += 1
    return found, rest


def _split_spec(spec: str) -> tuple[str, str | None]:
    path, sep, arg = spec.rpartition(":")
    if sep and path.endswith(".py"):
        return path, arg
    return spec, None


def load_file(spec: str):
    """The config of ``FILE[:ARG]``: the file's ``get_config(ARG)``; ConfigError in one line on failure."""
    path, arg = _split_spec(spec)
    if not os.path.isfile(path):
        raise ConfigError(f"--config={spec}: no config file {path!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")  # the working directory, as `python -m` gives scripts (configs import configs)
    name = "posenc_config_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # a config file that does not import: its own error, in one line
        raise ConfigError(f"--config={spec}: {path} does not load: {type(e).__name__}: "
                          f"{' '.join(str(e).split())}") from e
    if not hasattr(module, "get_config"):
        raise ConfigError(f"--config={spec}: {path} has no get_config(arg=None) function")
    try:
        return module.get_config(arg) if arg is not None else module.get_config()
    except ConfigError as e:
        raise ConfigError(f"--config={spec}: {e}") from None
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"--config={spec}: {' '.join(str(e.args[0] if e.args else e).split())}") from None


def load(spec: str, field_overrides=(), *, schema=None):
    """``FILE[:ARG]`` loaded, then each ``(field, text)`` of ``field_overrides`` set (command-line text)."""
    config = load_file(spec)
    for name, text in field_overrides:
        overrides_lib.apply(config, {name: text}, schema=schema, where=f"{PREFIX}{name}", text=True)
    return config
