"""Config fields declared once: default, check, type and a line of documentation per field.

A section is a class whose attributes declare its fields::

    class Train(Section):
        \"\"\"train: the optimizer, the schedule and the run's bookkeeping.\"\"\"
        steps = Field(5000, positive_int, "training steps")
        learning_rate = Field(1e-3, positive, "peak learning rate")

From that one declaration come

* the ``ml_collections.ConfigDict`` of defaults (:meth:`Section.config`),
* the validation of a config however it was built (:meth:`Section.validate`:
  an unknown field fails in one line naming it and the closest valid name,
  every field runs its check, missing fields take their defaults),
* the parsing of command-line text into the field's type (:meth:`Field.parse`),
* the field table of the documentation (:func:`rows`).

Kinds of entries: :class:`Field` (a value), :class:`Sub` (a nested section)
and :class:`Free` (a mapping whose keys another declaration decides: a
task's options, evaluation variants). A section may compute its entries
(:meth:`Section.entries`), e.g. one sub-section per registered encoding.
"""

from __future__ import annotations

import ast
import difflib
import json
import typing
from collections.abc import Callable
from typing import Any

import ml_collections
from ml_collections import config_dict

from posenc import checks

Check = Callable[[str, Any], Any]  # (full field name, value) -> clean value, or ValueError


class ConfigError(ValueError):
    """A config field is unknown or has a bad value (the message names it and what is allowed)."""


def closest(name: str, candidates) -> str | None:
    """The candidate most like ``name`` (a typo's intended field), or None."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def unknown(full: str, name: str, candidates, *, what: str = "config field") -> ConfigError:
    """The one-line error of an unknown ``name`` at dotted path ``full``."""
    hint = closest(name, candidates)
    parent = full.rsplit(".", 1)[0] if "." in full else ""
    where = parent or "the config"
    text = f"unknown {what} {full!r}"
    if hint is not None:
        text += f"; did you mean {(parent + '.' if parent else '') + hint!r}?"
    return ConfigError(text + f" (the fields of {where} are: {', '.join(sorted(candidates)) or '(none)'})")


# ----------------------------------------------------------------------- text values
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_NONE = ("none", "null")


def literal(text: str):
    """A value written on a command line: JSON or a Python literal, else the text itself."""
    s = text.strip()
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(s)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return text


def parse_text(text: str, kind) -> Any:
    """``text`` as a value of ``kind`` (a type, a ``typing`` form such as ``int | None``, or None: any)."""
    if not isinstance(text, str):
        return text
    s = text.strip()
    args = typing.get_args(kind)
    if args and type(None) in args:  # Optional[X]
        if s.lower() in _NONE:
            return None
        rest = [a for a in args if a is not type(None)]
        kind = rest[0] if len(rest) == 1 else None
    if kind is bool:
        if s.lower() in _TRUE:
            return True
        if s.lower() in _FALSE:
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if kind is int:
        try:
            return int(s)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if kind is float:
        try:
            return float(s)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    if kind is str:
        return text
    if kind in (tuple, list):
        value = literal(s)
        if isinstance(value, (list, tuple)):
            return tuple(value)
        if value == "" or s == "":
            return ()
        # a comma-separated list without brackets: 32,64,128
        return tuple(literal(part) for part in s.split(",") if part.strip())
    if kind is dict:
        value = literal(s)
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object, got {text!r}")
        return value
    return literal(s)


def _plain(value):
    """Lists as tuples, ConfigDicts as dicts (JSON round trips and ConfigDicts mean the same value)."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "to_dict"):
        return {k: _plain(v) for k, v in value.to_dict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class Values(dict):
    """Validated values read as a ConfigDict is (``v.model.d_model``, ``v["norm"]``, ``v.get``,
    ``v.to_dict()``), without building one: nested sections come back as Values. Read-only."""

    __slots__ = ()

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        return Values(value) if isinstance(value, dict) and not isinstance(value, Values) else value

    def get(self, key, default=None):
        return self[key] if key in self else default

    def items(self):
        return [(k, self[k]) for k in self]

    def values(self):
        return [self[k] for k in self]

    def to_dict(self) -> dict:
        return {k: v.to_dict() if isinstance(v, Values) else v for k, v in self.items()}

    def _read_only(self, *args, **kwargs):
        raise TypeError("validated values are read-only")

    __setitem__ = __delitem__ = __setattr__ = update = pop = setdefault = clear = _read_only  # type: ignore


# --------------------------------------------------------------------------- entries
class Field:
    """One config field: a default, a check and a line of documentation.

    Args:
      default: the value when the config does not set it (None needs ``type``).
      check: ``check(full_name, value) -> clean value``, raising ValueError with
        the full name; default: a check by the default's type.
      doc: one line for tables and ``--help``.
      type: the field's type when ``default`` does not tell it (None, or a tuple
        of numbers); a ``typing`` form such as ``int | None`` is accepted.
      train_length: 0 means "the task's training length" (filled in by the
        training layer before validation; e.g. RoPE's ``original_length``); a
        callable maps the training length to the value.
    """

    def __init__(self, default, check: Check | None = None, doc: str = "", *, type=None,
                 train_length=False):
        if default is None and type is None:
            raise ValueError("a Field with default None needs type= (the field's type)")
        self.default, self.check, self.doc = default, check, doc
        self.type, self.train_length = type, train_length
        self.name = ""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        # On the class: the Field itself. On an instance (a model unit) the validated value is
        # an instance attribute (set at construction) and shadows this descriptor.
        return self if obj is None else self.default

    @property
    def kind(self):
        """The value's type: ``type=`` if given, else the default's type."""
        if self.type is not None:
            return self.type
        return builtin_type(self.default)

    def config_value(self):
        """The field's initial value in a ConfigDict (a typed placeholder for None)."""
        if self.type is object:  # any value (e.g. an int or "auto"): a reference typed object
            return config_dict.FieldReference(self.default, field_type=object)
        if self.default is None:
            base = self.type
            args = [a for a in typing.get_args(base) if a is not type(None)]
            return config_dict.placeholder(args[0] if len(args) == 1 else object if args else base)
        return self.default

    def parse(self, text: str):
        """Command-line text as this field's value (``"3"`` -> 3 for an int field; None for a
        field whose default is None, from ``None`` / ``null``)."""
        if self.default is None and isinstance(text, str) and text.strip().lower() in _NONE:
            return None
        return parse_text(text, self.kind)

    def validate(self, full_name: str, value):
        """The clean value of this field, or ValueError naming ``full_name``."""
        if self.check is not None:
            return self.check(full_name, value)
        if value is None:
            return None
        return by_type(full_name, value, self.default)

    def __repr__(self):
        return f"Field({self.default!r}, doc={self.doc!r})"


def builtin_type(value):
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    if isinstance(value, float):
        return float
    if isinstance(value, str):
        return str
    if isinstance(value, (tuple, list)):
        return tuple
    if isinstance(value, dict):
        return dict
    return None


def by_type(name, value, default):
    """The default check of a field: ``value`` of the default's type (int accepted for a float)."""
    if isinstance(default, bool):
        return checks.boolean(name, value)
    if isinstance(default, int):
        return checks.integer(name, value)
    if isinstance(default, float):
        return checks.number(name, value)
    if isinstance(default, str) and not isinstance(value, str):
        raise ValueError(f"{name} must be a string; got {value!r}")
    if isinstance(default, tuple):
        if not isinstance(value, (tuple, list)):
            raise ValueError(f"{name} must be a tuple; got {value!r}")
        return tuple(value)
    return value


class Sub:
    """A nested section: ``model = Sub(Model)``."""

    def __init__(self, section: type[Section], doc: str = ""):
        self.section, self.doc = section, doc or section.doc()
        self.name = ""

    def __set_name__(self, owner, name):
        self.name = name


class Free:
    """A mapping whose keys another declaration decides (a task's options, evaluation variants).

    ``keys(config, section_values)`` may name the valid keys (for error
    messages and type parsing: a dict ``key -> type``); ``check(full_name,
    mapping) -> clean mapping`` validates it. Values are stored as a
    ConfigDict that accepts dotted keys (override sets such as ``{"model.x": 1}``).
    """

    def __init__(self, doc: str = "", *, check: Check | None = None, dotted: bool = False,
                 value_type=None):
        self.doc, self.check, self.dotted, self.value_type = doc, check, dotted, value_type
        self.name = ""

    def __set_name__(self, owner, name):
        self.name = name

    def config_value(self):
        return ml_collections.ConfigDict({}, allow_dotted_keys=True) if self.dotted else (
            ml_collections.ConfigDict())

    def validate(self, full_name: str, value):
        value = {} if value is None else _plain(value)
        if not isinstance(value, dict):
            raise ValueError(f"{full_name} must be a mapping; got {value!r}")
        return self.check(full_name, value) if self.check is not None else value


Entry = Field | Sub | Free


class Section:
    """A config section: its entries are the :class:`Field`, :class:`Sub` and :class:`Free` attributes."""

    @classmethod
    def doc(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def entries(cls) -> dict[str, Entry]:
        """Every entry by name, bases first (a subclass may override or add)."""
        found: dict[str, Entry] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, (Field, Sub, Free)):
                    found[name] = value
        return found

    @classmethod
    def config(cls) -> ml_collections.ConfigDict:
        """The section's ConfigDict of defaults."""
        out = {}
        for name, entry in cls.entries().items():
            out[name] = entry.section.config() if isinstance(entry, Sub) else entry.config_value()
        return ml_collections.ConfigDict(out)

    @classmethod
    def validate(cls, cfg, prefix: str) -> dict:
        """Clean values of ``cfg`` (a ConfigDict or mapping) by field; ConfigError on an unknown one.

        Missing fields take their defaults; then :meth:`check` sees the whole section.
        """
        given = _keys(cfg)
        entries = cls.entries()
        for key in given:
            if key not in entries:
                raise unknown(f"{prefix}.{key}" if prefix else key, key, entries)
        values = {}
        for name, entry in entries.items():
            full = f"{prefix}.{name}" if prefix else name
            raw = cfg[name] if name in given else None
            if isinstance(entry, Sub):
                values[name] = entry.section.validate(raw if raw is not None else {}, full)
            elif isinstance(entry, Free):
                values[name] = entry.validate(full, raw)
            else:
                value = raw if name in given else entry.default
                values[name] = entry.validate(full, _plain(value) if isinstance(value, list) else value)
        cls.check(values, prefix)
        return values

    @classmethod
    def check(cls, values: dict, prefix: str) -> None:
        """Cross-field checks of the validated ``values`` (ValueError naming ``prefix.<field>``)."""

    @classmethod
    def entry(cls, name: str, prefix: str) -> Entry:
        """The entry ``name``; ConfigError with the closest valid name if there is none."""
        entries = cls.entries()
        if name not in entries:
            raise unknown(f"{prefix}.{name}" if prefix else name, name, entries)
        return entries[name]


def _keys(cfg) -> list[str]:
    if cfg is None:
        return []
    if hasattr(cfg, "keys"):
        return list(cfg.keys())
    raise ValueError(f"expected a section (a mapping), got {cfg!r}")


def options_section(name: str, fields: dict[str, Field], doc: str = "") -> type[Section]:
    """A Section class holding ``fields`` (e.g. a unit's declared options)."""
    return type(name, (Section,), {"__doc__": doc, **fields})


# ------------------------------------------------------------------------- documents
def rows(section: type[Section], prefix: str, *, skip=()) -> list[tuple[str, str, str]]:
    """``(dotted field, default, doc)`` of every field below ``section`` (sub-sections recursed).

    ``skip``: dotted prefixes left out (e.g. the per-encoding sections, listed elsewhere).
    """
    out = []
    for name, entry in section.entries().items():
        full = f"{prefix}.{name}" if prefix else name
        if any(full == s or full.startswith(s + ".") for s in skip):
            continue
        if isinstance(entry, Sub):
            out += rows(entry.section, full, skip=skip)
        elif isinstance(entry, Free):
            out.append((full, "{}", entry.doc))
        else:
            out.append((full, repr(entry.default), entry.doc))
    return out


def markdown_table(table_rows) -> str:
    """A markdown table of :func:`rows`."""
    lines = ["| field | default | meaning |", "|---|---|---|"]
    for full, default, doc in table_rows:
        lines.append(f"| `{full}` | `{default}` | {doc.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


def unknown_argument(where: str, word: str, allowed) -> ConfigError:
    """The error of an unknown ``:ARG`` word of a config file, with the closest allowed one."""
    hint = closest(word, allowed)
    return ConfigError(f"unknown {where} argument {word!r}" + (f" (did you mean {hint!r}?)" if hint else "")
                       + f"; choose one of: {', '.join(allowed)}")
