"""The registry of encodings: config names -> :class:`~posenc.model.encoding.Encoding` subclasses.

``@register_encoding("name")`` makes a unit the position kind ``name`` of
configs (``model.position.kind``, ``layer_kinds``; its options become
``model.position.<name>.<option>``). Built-ins register when
``posenc.model.encodings`` is imported (one module each); plugins register
the same way from anywhere (``--plugins=MODULE`` on the command line imports
them). :func:`get` is the one lookup, :func:`registered` registers a class
for one block only (``posenc.model.check_encoding`` of an unregistered unit).
"""

from __future__ import annotations

import contextlib
import re

from posenc.model import options as options_lib
from posenc.model.encoding import Encoding

ENCODINGS: dict[str, type[Encoding]] = {}

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def register_encoding(name: str):
    """Class decorator: make ``cls`` the encoding called ``name`` in configs.

    ``name`` must be lower_snake_case and new (a plugin cannot replace a
    built-in). Its options become ``model.position.<name>.<option>`` in
    configs built afterwards.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"encoding name must be lower_snake_case (a-z, 0-9, _); got {name!r}")

    def decorate(cls):
        if not (isinstance(cls, type) and issubclass(cls, Encoding)):
            raise TypeError(f"register_encoding({name!r}) decorates Encoding subclasses; got {cls!r}")
        old = ENCODINGS.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"encoding {name!r} is already registered by "
                             f"{old.__module__}.{old.__qualname__}")
        if "name" in vars(cls) and cls.name != name:  # one class, two names: subclass it
            raise ValueError(f"{cls.__qualname__} is already registered as {cls.name!r}")
        cls.name = name
        ENCODINGS[name] = cls
        return cls

    return decorate


def get(name) -> type[Encoding]:
    """The encoding class called ``name``; ValueError listing every registered name."""
    if not isinstance(name, str) or name not in ENCODINGS:
        raise ValueError(f"unknown position kind {name!r}; choose one of: {', '.join(sorted(ENCODINGS))} "
                         "(an encoding of your own registers when its module is imported: "
                         "--plugins=MODULE on the command line)")
    return ENCODINGS[name]


def read_options(name: str, values, *, prefix: str | None = None) -> dict:
    """Validated options of encoding ``name`` from its config section (or None: defaults)."""
    return options_lib.read(get(name), values, prefix=prefix or f"model.position.{name}")


@contextlib.contextmanager
def registered(name_or_class):
    """Context manager -> the config name of a registered name or an Encoding subclass; an
    unregistered class is in the registry (as ``unregistered_<class name>``) for the block only."""
    if isinstance(name_or_class, str):
        yield get(name_or_class).name
        return
    cls = name_or_class
    if not (isinstance(cls, type) and issubclass(cls, Encoding)):
        raise TypeError(f"check_encoding takes a registered name or an Encoding subclass; "
                        f"got {cls!r}")
    if cls.name and ENCODINGS.get(cls.name) is cls:
        yield cls.name
        return
    base = "unregistered_" + re.sub(r"[^a-z0-9]+", "_", cls.__name__.lower()).strip("_")
    name, n = base, 1
    while name in ENCODINGS:
        name, n = f"{base}_{n}", n + 1
    had_name = "name" in vars(cls)
    old = vars(cls).get("name")
    cls.name = name
    ENCODINGS[name] = cls
    try:
        yield name
    finally:
        del ENCODINGS[name]
        if had_name:
            cls.name = old
        else:
            del cls.name
