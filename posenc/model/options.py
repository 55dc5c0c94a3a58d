"""Options of a model unit: declared once on its class, they become its config fields and checks.

A unit (an encoding) declares each hyper-parameter as a class attribute::

    class T5(Encoding):
        num_buckets = Option(32, positive_int, "number of relative-position buckets")

Then ``model.position.t5.num_buckets`` exists in every config with default
32, a bad value fails validation with the field's full name, and the unit
instance reads ``self.num_buckets``. Options are inherited (xPos and iRoPE
take every RoPE option).
"""

from __future__ import annotations

import weakref

import ml_collections

from posenc.config import schema
from posenc.config.schema import Field

# One declaration per field, for units and config sections alike (posenc.config.schema).
Option = Field


_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # class -> its options (read once)


def options_of(cls) -> dict[str, Option]:
    """Every Option of ``cls`` and its bases, by name (subclasses override bases).

    Options are declared when the class is made, so each class's are read once (config resolution
    asks for them many thousands of times); the caller gets its own dict.
    """
    found = _FOUND.get(cls)
    if found is None:
        found = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, Option):
                    found[name] = value
        _FOUND[cls] = found
    return dict(found)


def section(cls) -> ml_collections.ConfigDict:
    """A ConfigDict of the defaults of ``cls``'s options."""
    return ml_collections.ConfigDict({n: o.config_value() for n, o in options_of(cls).items()})


def read(cls, values, *, prefix: str) -> dict:
    """Validated options of ``cls`` from a mapping (missing ones take their defaults).

    ``prefix`` is the section's dotted name, used in error messages
    (e.g. ``model.position.t5``). Unknown keys are an error.
    """
    opts = options_of(cls)
    values = dict(values or {})
    for key in sorted(set(values) - set(opts)):
        raise schema.unknown(f"{prefix}.{key}", key, opts)
    return {n: o.validate(f"{prefix}.{n}", values.get(n, o.default)) for n, o in opts.items()}


def changed(cls, values) -> list[str]:
    """Names of the options in ``values`` that differ from their defaults."""
    opts = options_of(cls)
    return sorted(n for n, v in dict(values or {}).items()
                  if n in opts and _plain(v) != _plain(opts[n].default))


def _plain(v):
    # JSON round trips turn tuples into lists; both mean the same field value.
    return tuple(_plain(x) for x in v) if isinstance(v, (list, tuple)) else v
