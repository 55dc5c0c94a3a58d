"""RecurrentSpec: ``model.layer_types`` and ``model.recurrent`` resolved, and what a recurrent layer refuses.

``model.layer_types`` names the token mixer of every layer (one entry per
layer, or a period the number of layers repeats: ``("gated_deltanet",) * 3 +
("attention",)`` is Qwen3-Next's pattern at any depth that 4 divides). The
default ``()`` is attention everywhere: the model of before, its compiled
programs unchanged (:func:`resolve` then returns None). Each recurrent kind
reads its section ``model.recurrent.<kind>`` (``posenc.model.recurrent_options``);
a field of a section no layer reads is an error when set, as is an option
the kind's configuration ignores.

Position in a hybrid: an attention layer keeps its position encoding
(``model.position``: a NoPE attention layer is one rule or per-layer kind);
a recurrent layer has no queries or keys, so no encoding acts there (its
position unit is NoPE, ``posenc.model.position_spec``), and a per-layer
position kind, rule option or span that names one is refused. Falcon-H1's
``parallel_mamba2`` layers have attention, and keep all of it.

:func:`check` holds the rules between recurrent layers and the rest of the
model (``posenc.model.spec`` runs it before anything compiles): placements
that normalise inside attention or put every matrix on the sphere, MLA in a
layer that also runs Mamba-2, and attention-only fields set in a model
without attention.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

from posenc.model import options as options_lib
from posenc.model import recurrent_options as ro

# Fields that only attention reads, with their off values: set in a model without attention, an error.
_ATTENTION_FIELDS = {"attention_impl": ("auto", "dense", "blocked"), "attention_sinks": ("none",),
                     "attention_gate": ("none",), "attention_span": ("full",), "global_every": (0,),
                     "layer_spans": ((),), "norm.qk_norm": ("none",), "norm.v_norm": (False,),
                     "norm.attn_softcap": (0.0,), "logit_scale.kind": ("none",), "mla.kv_lora_rank": (0,)}


@dataclasses.dataclass(frozen=True)
class RecurrentSpec:
    layer_types: tuple[str, ...]  # per layer: a kind of posenc.model.recurrent_options.KINDS
    options: Mapping[str, Mapping[str, Any]]  # validated options of every section in use

    @property
    def attends(self) -> tuple[bool, ...]:
        """Per layer: whether it has attention (and so a position encoding, a span and keys)."""
        return tuple(t in ro.WITH_ATTENTION for t in self.layer_types)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The recurrent kinds in use, in layer order."""
        return tuple(dict.fromkeys(t for t in self.layer_types if t != ro.ATTENTION))


def _get(cfg, name, default):
    # configs written before these fields existed (config.json of older runs) lack them
    return cfg.get(name, default) if hasattr(cfg, "get") else default


def layer_types(cfg, num_layers: int) -> tuple[str, ...]:
    """``model.layer_types`` per layer (a period repeated; () : attention everywhere)."""
    given = tuple(_get(cfg, "layer_types", ()) or ())
    if not given:
        return (ro.ATTENTION,) * num_layers
    for i, t in enumerate(given):
        if t not in ro.KINDS:
            raise ValueError(f"model.layer_types[{i}]={t!r} is not a mixer; choose one of: {', '.join(ro.KINDS)}")
    if num_layers % len(given):
        raise ValueError(f"model.layer_types has {len(given)} entries {given!r}; need one per layer or a period "
                         f"that model.num_layers={num_layers} is a multiple of")
    return given * (num_layers // len(given))


def resolve(cfg, *, num_layers: int, d_model: int) -> RecurrentSpec | None:
    """``model.layer_types`` and ``model.recurrent`` -> :class:`RecurrentSpec` (None: attention in every
    layer, when no ``model.recurrent`` field may be set)."""
    types_ = layer_types(cfg, num_layers)
    used = {s for t in types_ if t != ro.ATTENTION for s in ro.SECTIONS[t]}
    sections = _get(cfg, "recurrent", None)
    opts = {}
    for kind, cls in ro.OPTIONS.items():
        prefix = f"model.recurrent.{kind}"
        section = sections[kind].to_dict() if sections is not None and kind in sections else {}
        if kind not in used:
            changed = options_lib.changed(cls, section)
            if changed:
                raise ValueError(f"{prefix}.{changed[0]}={section[changed[0]]!r} is set, but no layer reads "
                                 f"model.recurrent.{kind} (model.layer_types={tuple(_get(cfg, 'layer_types', ()))!r})")
            continue
        values = options_lib.read(cls, section, prefix=prefix)
        unused = cls.unused_options(values)
        for name in options_lib.changed(cls, section):
            if name in unused:
                raise ValueError(f"{prefix}.{name}={section[name]!r} is set, but {kind} does not use it with "
                                 f"these options (unused here: {', '.join(unused)})")
        cls.check(values, prefix=prefix, d_model=d_model)
        opts[kind] = types.MappingProxyType(values)
    if not used:
        return None
    return RecurrentSpec(layer_types=types_, options=types.MappingProxyType(opts))


def _value(cfg, field):
    head, _, rest = field.partition(".")
    return cfg[head][rest] if rest else cfg[head]


def check(cfg, spec: RecurrentSpec, *, norm, mla) -> None:
    """The rules between recurrent layers and the rest of ``config.model`` (ValueError in one line)."""
    where = {t: i for i, t in reversed(list(enumerate(spec.layer_types))) if t != ro.ATTENTION}
    first = min(where.values())
    if norm.sphere or norm.qkv_norm:
        raise ValueError(f"model.norm.placement={norm.placement!r} "
                         + ("puts every matrix on the unit sphere" if norm.sphere else
                            "normalises q, k and v inside attention instead of the layer input")
                         + f", which layer {first}'s {spec.layer_types[first]} mixer does not follow; choose "
                         "another placement (e.g. 'pre')")
    if mla is not None and "parallel_mamba2" in where:
        raise ValueError(f"model.mla (kv_lora_rank={mla.kv_lora_rank}) cannot run in layer "
                         f"{where['parallel_mamba2']}, a parallel_mamba2 layer (Falcon-H1's attention and Mamba-2 "
                         "side by side); use MLA with attention or recurrent layers, or set kv_lora_rank=0")
    spans = tuple(_get(cfg, "layer_spans", ()) or ())
    for i, (s, attends) in enumerate(zip(spans, spec.attends)):
        if s != "full" and not attends:
            raise ValueError(f"model.layer_spans[{i}]={s!r}: layer {i} is a {spec.layer_types[i]} layer (no "
                             "attention, no span); set it to 'full'")
    if any(spec.attends):
        return
    for field, off in _ATTENTION_FIELDS.items():
        value = _value(cfg, field)
        value = tuple(value) if isinstance(value, list) else value
        if value not in off:
            raise ValueError(f"model.{field}={value!r} is set, but no layer has attention (model.layer_types="
                             f"{tuple(_get(cfg, 'layer_types', ()))!r}); leave it at {off[0]!r}")
