"""``python -m posenc <command> [flags]``: run the command module ``posenc.experiments.<command>``.

    python -m posenc train --config default:tiny --workdir /tmp/run
    python -m posenc compare --config compare:quick --workdir /tmp/compare
    python -m posenc train --help        # a command's flags
    python -m posenc --help              # the commands

The installed console script ``posenc`` is the same (``posenc train ...``).
The commands are the modules of posenc.experiments (the repository's root
folder experiments/, installed into the package) that define ``define_flags``
and ``main``; each runs as ``python -m experiments.<command>`` would in a
checkout, as the program's main module (its docstring is its ``--help``). No command, or an
unknown one, prints one line naming the commands and exits with status 2.
"""

from __future__ import annotations

import importlib
import pkgutil
import runpy
import sys

PACKAGE = "posenc.experiments"
USAGE = "usage: python -m posenc <command> [flags] (or: posenc <command> [flags])"


def _command_module(name: str):
    """The module ``posenc.experiments.<name>`` if it is a command (defines ``define_flags`` and ``main``),
    else None."""
    if not name.isidentifier() or name.startswith("_"):
        return None
    try:
        module = importlib.import_module(f"{PACKAGE}.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"{PACKAGE}.{name}":
            return None
        raise
    return module if callable(getattr(module, "define_flags", None)) and callable(
        getattr(module, "main", None)) else None


def commands() -> dict[str, str]:
    """Every command's name -> the first line of its module docstring, found in posenc.experiments."""
    package = importlib.import_module(PACKAGE)
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = _command_module(info.name)
        if module is not None:
            found[info.name] = (module.__doc__ or "").strip().split("\n")[0]
    return dict(sorted(found.items()))


def _help() -> str:
    names = commands()
    width = max(map(len, names))
    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<{width}}  {doc}" for name, doc in names.items()]
    lines += ["", "`python -m posenc <command> --help` lists a command's flags; --config takes a packaged "
              "config by name (default:tiny, compare:quick) or a file (path/to/config.py[:ARG])."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run ``argv[1]`` (default ``sys.argv``) as ``python -m posenc.experiments.<command>`` with the other arguments."""
    argv = list(sys.argv if argv is None else argv)
    name = argv[1] if len(argv) > 1 else ""
    if name in ("-h", "--help", "-help", "help"):
        print(_help())
        return
    if not name or _command_module(name) is None:
        names = list(commands())
        if name:
            from posenc.config.schema import closest

            hint = closest(name, names)
            what = f"error: unknown command {name!r}" + (f" (did you mean {hint!r}?)" if hint else "")
        else:
            what = "error: no command"
        print(f"{what}; usage: python -m posenc <command> [flags], <command> one of: {', '.join(names)}",
              file=sys.stderr)
        raise SystemExit(2)
    # run afresh as the main module, as python -m does (run_module sets argv[0] to the command's file);
    # the copy imported to check it goes, so that runpy does not warn of it
    sys.modules.pop(f"{PACKAGE}.{name}", None)
    sys.argv = [argv[0], *argv[2:]]
    runpy.run_module(f"{PACKAGE}.{name}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
