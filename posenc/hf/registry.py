"""The registry of checkpoint families: ``config.json`` ``model_type`` -> :class:`Family`.

Each module of :mod:`posenc.hf.families` registers its families when it is
imported (``register("llama", Family(...))``); the package imports every one
of its modules, so a new family is one new module there and no list names it.
:func:`family` looks a checkpoint's family up and refuses, in one line, a
``model_type`` that no module registered, or one that a module declared
refused (:func:`refuse`: an architecture posenc knows and cannot express,
with the reason).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Family:
    """How posenc reads one checkpoint family.

    ``preset``: the family's preset of :mod:`posenc.model.presets`; ``fields(hf)``: the dotted
    ``model.*`` fields of a ``config.json`` (the preset's, then the checkpoint's values);
    ``params(hf, tensors, spec)``: ``{flat parameter path: float32 array}`` of the checkpoint's
    tensors (HF names, torch ``[out, in]`` layout) for a :class:`posenc.model.ModelSpec`.
    """

    preset: str
    fields: Callable[[dict], dict]
    params: Callable  # (hf, tensors, spec) -> {path: array}


# model_type -> Family, filled by the modules of posenc.hf.families as they are imported
FAMILIES: dict[str, Family] = {}
# model_type -> why posenc cannot load it (what in the architecture it cannot express)
REFUSED: dict[str, str] = {}


def register(model_type: str, family: Family) -> Family:
    """Register ``family`` for checkpoints whose ``config.json`` has ``model_type``; returns it."""
    if model_type in FAMILIES or model_type in REFUSED:
        raise ValueError(f"model_type {model_type!r} is registered twice (posenc.hf.families)")
    FAMILIES[model_type] = family
    return family


def refuse(model_type: str, why: str) -> None:
    """Refuse checkpoints whose ``config.json`` has ``model_type``, in one line saying ``why``."""
    if model_type in FAMILIES or model_type in REFUSED:
        raise ValueError(f"model_type {model_type!r} is registered twice (posenc.hf.families)")
    REFUSED[model_type] = why


def family(hf: dict) -> Family:
    """The family of a ``config.json``; ValueError naming an unsupported architecture."""
    kind = hf.get("model_type")
    if kind in REFUSED:
        raise ValueError(f"unsupported architecture model_type={kind!r}: {REFUSED[kind]}")
    if kind not in FAMILIES:
        arch = hf.get("architectures")
        raise ValueError(f"unsupported architecture model_type={kind!r} (architectures {arch}); "
                         f"posenc.hf loads: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[kind]


def unsupported(hf: dict, field: str, why: str) -> ValueError:
    """The one-line error refusing the value of ``field`` in ``hf`` (a ``config.json``), and why."""
    value = hf.get(field)
    return ValueError(f"unsupported field {field}={value!r} in config.json "
                      f"(model_type {hf.get('model_type')!r}): {why}")
