"""Dotted-field overrides: one applier for ``--config.x=y``, grid variants and evaluation variants.

An override set is a mapping ``{"model.position.kind": "alibi", "train.steps": 300}``.
:func:`apply` sets each field through ``ml_collections``' own path setter
(the one ``--config.x=y`` uses), after checking that the field exists, so
a typo is a ValueError naming the field and the fields beside it.
"""

from __future__ import annotations

from typing import Any, Mapping

import ml_collections
from ml_collections.config_flags import config_path


def fields(overrides: Mapping) -> ml_collections.ConfigDict:
    """A ConfigDict of override sets keyed by name: ``{name: {dotted field: value}}``.

    Use it for grid ``variants`` and ``eval.variants``: a plain dict assigned
    into a ConfigDict would not accept dotted keys (an ml_collections rule).
    """
    return ml_collections.ConfigDict(dict(overrides), allow_dotted_keys=True)


def _holder(config, path: str):
    *parents, last = path.split(".")
    node = config
    for i, p in enumerate(parents):
        if not hasattr(node, "keys") or p not in node:
            where = ".".join(parents[:i]) or "the config"
            raise ValueError(f"unknown config field {path!r}: {where} has no field {p!r}; "
                             f"it has: {', '.join(sorted(node.keys())) if hasattr(node, 'keys') else '(none)'}")
        node = node[p]
    if not hasattr(node, "keys") or last not in node:
        parent = ".".join(parents) or "the config"
        raise ValueError(f"unknown config field {path!r}; the fields of {parent} are: "
                         f"{', '.join(sorted(node.keys())) if hasattr(node, 'keys') else '(none)'}")
    return node, last


def coerce(current, value):
    """``value`` as the type of the field's ``current`` value where that is lossless (int -> float, list -> tuple)."""
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(current, tuple) and isinstance(value, list):
        return tuple(value)
    if isinstance(current, ml_collections.ConfigDict) and isinstance(value, Mapping):
        return ml_collections.ConfigDict(dict(value), allow_dotted_keys=True)
    return value


def apply(config, overrides: Mapping[str, Any], *, where: str = "override") -> None:
    """Set every dotted field of ``overrides`` in ``config`` (in place); ValueError on a bad one."""
    for path, value in dict(overrides).items():
        if not isinstance(path, str) or not path:
            raise ValueError(f"{where}: field names are dotted strings like 'train.steps'; got {path!r}")
        holder, field = _holder(config, path)
        value = coerce(holder[field], value)
        try:
            config_path.set_value(path, config, value)
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"{where}: cannot set {path}={value!r}: {e}") from None


def as_dict(overrides) -> dict:
    """A plain dict of an override set (a ConfigDict with dotted keys, a dict, or None)."""
    if overrides is None:
        return {}
    return dict(overrides.to_dict() if hasattr(overrides, "to_dict") else overrides)
