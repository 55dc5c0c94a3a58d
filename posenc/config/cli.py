"""Configs from the command line: ``--config NAME[:ARG]`` or ``--config FILE[:ARG]``, and
``--config.<a.b>=<value>``.

``--config compare:quick`` names a packaged config (``configs/compare.py`` at the
repository root, installed as ``posenc.configs.compare``) and calls its ``get_config("quick")``;
``--config path/to/mine.py:quick`` does the same with a file of your own. A
spec whose file part has no ``.py`` and no path separator is a packaged
config's name; any other is a file (relative to the working directory). Every
``--config.<field>=<value>`` (or ``--config.<field> <value>``) is then set, in
order, through the one override applier (:func:`posenc.config.overrides.apply`),
which parses the text into the field's declared type. Every failure (no such
file or packaged config, an unknown ``:ARG`` word, an unknown field, a bad
value) is a :class:`~posenc.config.schema.ConfigError` whose message names it
in one line; entry points print it and exit with status 2.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from posenc.config import overrides as overrides_lib
from posenc.config.schema import ConfigError, closest

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


PACKAGE = "posenc.configs"  # the packaged configs, by name (imported only when one is named)


def packaged_configs() -> list[str]:
    """The names of the packaged configs (the modules of posenc.configs: the root folder configs/), sorted."""
    import pkgutil

    folders = importlib.import_module(PACKAGE).__path__
    return sorted(m.name for m in pkgutil.iter_modules(folders) if not m.name.startswith("_") and not m.ispkg)


def _is_name(part: str) -> bool:
    return not part.endswith(".py") and "/" not in part and os.sep not in part and (
        not os.altsep or os.altsep not in part)


def _split_spec(spec: str) -> tuple[str, str | None]:
    """``(file or name, ARG or None)`` of ``FILE.py[:ARG]`` or ``NAME[:ARG]``."""
    path, sep, arg = spec.rpartition(":")
    if sep and path.endswith(".py"):
        return path, arg
    name, sep, arg = spec.partition(":")
    if sep and _is_name(name):
        return name, arg
    return spec, None


def _load_module(spec: str, path: str):
    """The module of a packaged config's name or of a config file; ConfigError in one line."""
    if _is_name(path):
        names = packaged_configs()
        if path not in names:
            hint = closest(path, names)
            raise ConfigError(f"--config={spec}: no packaged config {path!r}"
                              + (f" (did you mean {hint!r}?)" if hint else "")
                              + f"; choose one of: {', '.join(names)}, or a file: path/to/config.py[:ARG]")
        try:
            return importlib.import_module(f"{PACKAGE}.{path}"), f"{PACKAGE}.{path}"
        except Exception as e:  # a packaged config that does not import: its error, in one line
            raise ConfigError(f"--config={spec}: {PACKAGE}.{path} does not load: {type(e).__name__}: "
                              f"{' '.join(str(e).split())}") from e
    if not os.path.isfile(path):
        raise ConfigError(f"--config={spec}: no config file {path!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")  # the working directory, as `python -m` gives scripts (a config's own modules)
    name = "posenc_config_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # a config file that does not import: its own error, in one line
        raise ConfigError(f"--config={spec}: {path} does not load: {type(e).__name__}: "
                          f"{' '.join(str(e).split())}") from e
    return module, path


def load_file(spec: str):
    """The config of ``NAME[:ARG]`` (a packaged config) or ``FILE[:ARG]``: its ``get_config(ARG)``;
    ConfigError in one line on failure."""
    path, arg = _split_spec(spec)
    module, where = _load_module(spec, path)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"--config={spec}: {where} has no get_config(arg=None) function")
    try:
        return module.get_config(arg) if arg is not None else module.get_config()
    except ConfigError as e:
        raise ConfigError(f"--config={spec}: {e}") from None
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"--config={spec}: {' '.join(str(e.args[0] if e.args else e).split())}") from None


def load(spec: str, field_overrides=(), *, schema=None):
    """``NAME[:ARG]`` or ``FILE[:ARG]`` loaded, then each ``(field, text)`` of ``field_overrides`` set
    (command-line text)."""
    config = load_file(spec)
    for name, text in field_overrides:
        overrides_lib.apply(config, {name: text}, schema=schema, where=f"{PREFIX}{name}", text=True)
    return config
