"""The one override path: dotted fields set on a config, from any source.

An override set is a mapping ``{"model.position.kind": "alibi", "train.steps": 300}``.
The command line (``--config.x=y``), ``:ARG`` words of a config file, model
presets, grid variants and evaluation variants are all override sets, and
:func:`apply` sets them all: one lookup (an unknown field is an error naming
it and the closest valid name), one coercion (command-line text is parsed
into the field's declared type; ints become floats for float fields, lists
tuples) and one error format (``ConfigError``).

With a ``schema`` (a :class:`~posenc.config.schema.Section`), fields are
looked up in the declaration, so a field missing from a hand-built config is
still settable; a :class:`~posenc.config.schema.Free` mapping accepts any key
(``task.options.path``, ``eval.variants.yarn4``), and a dotted tail below one
of its keys sets a field inside that entry
(``eval.variants.yarn4.model.position.rope.factor``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections

from posenc.config import schema as schema_lib
from posenc.config.schema import ConfigError, Field, Free, Sub


def fields(overrides: Mapping) -> ml_collections.ConfigDict:
    """A ConfigDict of override sets keyed by name: ``{name: {dotted field: value}}``.

    Use it for grid ``variants`` and ``eval.variants``: a plain dict assigned
    into a ConfigDict would not accept dotted keys (an ml_collections rule).
    """
    return ml_collections.ConfigDict(
        {k: (ml_collections.ConfigDict(dict(v), allow_dotted_keys=True) if isinstance(v, Mapping) else v)
         for k, v in dict(overrides).items()}, allow_dotted_keys=True)


def as_dict(overrides) -> dict:
    """A plain dict of an override set (a ConfigDict with dotted keys, a dict, or None)."""
    if overrides is None:
        return {}
    return dict(overrides.to_dict() if hasattr(overrides, "to_dict") else overrides)


def _mapping(value, dotted: bool):
    if isinstance(value, ml_collections.ConfigDict):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return ml_collections.ConfigDict(
            {k: _mapping(v, True) if isinstance(v, Mapping) else _tuples(v) for k, v in value.items()},
            allow_dotted_keys=dotted)
    return _tuples(value)


def _tuples(value):
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def coerce(current, value, entry=None):
    """``value`` as the field's type where that is lossless (int -> float, list -> tuple, dict -> ConfigDict)."""
    kind = entry.kind if isinstance(entry, Field) else schema_lib.builtin_type(current)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, list):
        return _tuples(value)
    if isinstance(value, Mapping) or isinstance(value, ml_collections.ConfigDict):
        return _mapping(value, isinstance(entry, Free) and entry.dotted or True)
    return value


def _set(node, key, value) -> None:
    with node.unlocked() if hasattr(node, "unlocked") and node.is_locked else _nullcontext():
        if key in node and isinstance(node[key], ml_collections.ConfigDict) and not isinstance(
                value, ml_collections.ConfigDict):
            raise TypeError(f"it is a section; give a mapping, not {value!r}")
        if key in node and value is not None and node[key] is not None and isinstance(
                node[key], (int, float, str, bool, tuple)) and type(node[key]) is not type(value):
            # ConfigDict refuses a type change of a field; the declared check decides instead.
            del node[key]
        node[key] = value


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _child(node, key, *, create: bool, dotted: bool = False):
    if key not in node or node[key] is None:
        if not create:
            return None
        _set(node, key, ml_collections.ConfigDict({}, allow_dotted_keys=dotted))
    return node[key]


def apply(config, overrides: Mapping[str, Any], *, schema=None, where: str = "override",
          text: bool = False) -> None:
    """Set every dotted field of ``overrides`` in ``config`` (in place); ConfigError on a bad one.

    ``schema``: the Section class ``config`` follows (None: the config's own
    fields). ``text``: the values are command-line text, parsed into each
    field's type (``"3"`` -> 3, ``"(32,64)"`` -> (32, 64), JSON for mappings).
    """
    for path, value in dict(overrides).items():
        if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
            raise ConfigError(f"{where}: field names are dotted strings like 'train.steps'; got {path!r}")
        try:
            _apply_one(config, path, value, schema=schema, text=text)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            text_e = " ".join(str(e.args[0] if e.args else e).split())
            raise ConfigError(f"{where}: cannot set {path}={value!r}: {text_e}") from None


def _apply_one(config, path: str, value, *, schema, text: bool) -> None:
    parts = path.split(".")
    node, section, prefix = config, schema, ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        full = f"{prefix}.{part}" if prefix else part
        if section is not None:
            entry = section.entry(part, prefix)
        else:
            entry = None
            if not hasattr(node, "keys") or part not in node:
                names = list(node.keys()) if hasattr(node, "keys") else []
                raise schema_lib.unknown(full, part, names)
        if isinstance(entry, Free):
            if last:  # the whole mapping
                mapping = schema_lib.parse_text(value, dict) if text else value
                _set(node, part, coerce(None, mapping if mapping is not None else {}, entry))
                return
            holder = _child(node, part, create=True, dotted=entry.dotted)
            key, rest = parts[i + 1], parts[i + 2:]
            if not rest:
                if text:
                    value = schema_lib.parse_text(value, dict if entry.dotted else entry.value_type)
                _set(holder, key, coerce(holder.get(key), value, None))
                return
            inner = _child(holder, key, create=True, dotted=True)
            if text:
                value = schema_lib.literal(value)
            _set(inner, ".".join(rest), coerce(inner.get(".".join(rest)), value, None))
            return
        if isinstance(entry, Field) and not last:
            raise ConfigError(f"{full} is a field, not a section: {path!r} goes past it")
        if last:
            if isinstance(entry, Sub):
                mapping = schema_lib.parse_text(value, dict) if text else value
                if not isinstance(mapping, Mapping) and not isinstance(mapping, ml_collections.ConfigDict):
                    raise ConfigError(f"{full} is a section; set its fields ({full}.<field>)")
                for k, v in as_dict(mapping).items():
                    _apply_one(config, f"{full}.{k}", v, schema=schema, text=False)
                return
            if text:
                value = entry.parse(value) if isinstance(entry, Field) else schema_lib.literal(value)
            _set(node, part, coerce(node.get(part), value, entry))
            return
        section = entry.section if isinstance(entry, Sub) else None
        node = _child(node, part, create=section is not None)
        prefix = full
