"""PositionSpec: ``config.model.position`` resolved (the kind of every layer and each unit's options).

:func:`resolve` reads the per-layer kinds (``layer_kinds``, the rules of
``model.position.layers``), validates each kind's options section through
the unit's declarations (an option the configuration does not use is an
error when set, and so is a section of a kind no layer uses) and fills the
options declared ``train_length=True`` with the task's training length.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

from posenc import checks
from posenc.model import layer_options as layer_options_lib
from posenc.model import options as options_lib
from posenc.model import registry


@dataclasses.dataclass(frozen=True)
class PositionSpec:
    kind: str
    layer_kinds: tuple[str, ...]  # per layer; "nope" where the kind acts at the input
    options: Mapping[str, Mapping[str, Any]]  # validated options of every kind in use
    randomized: bool
    randomized_max_position: int
    randomized_per: str
    # per layer: the options of its unit (its kind's options with model.position.layers on top)
    layer_options: tuple[Mapping[str, Any], ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind in use: the input kind and the per-layer kinds, in order."""
        return tuple(dict.fromkeys((self.kind, *self.layer_kinds)))

    @property
    def units(self) -> tuple[tuple[str, Mapping[str, Any]], ...]:
        """``(kind, options)`` of the input unit, then of each layer's."""
        layer_options = self.layer_options or tuple(self.options[k] for k in self.layer_kinds)
        return ((self.kind, self.options[self.kind]), *zip(self.layer_kinds, layer_options))

    @property
    def unit_axes(self) -> tuple[int, ...]:
        """The position axes each unit of :attr:`units` reads (``Encoding.position_axes``; 1 for an input
        kind that does not act at the input, which builds no input unit)."""
        return tuple(registry.get(k).position_axes(o) if i or registry.get(k).acts_at_input() else 1
                     for i, (k, o) in enumerate(self.units))

    @property
    def axes(self) -> int:
        """The position axes of the model: 1, or the A of its multi-axis units (ValueError when they differ)."""
        many = sorted({(a, k) for (k, _), a in zip(self.units, self.unit_axes) if a > 1})
        if len({a for a, _ in many}) > 1:
            raise ValueError("the position units of a model must read the same number of position axes; got "
                             + ", ".join(f"{k!r}: {a}" for a, k in many))
        return many[0][0] if many else 1


def _fill(cls, values: dict, train_length: int) -> None:
    """Options declared ``train_length=True`` and left at 0 take the training length (in place)."""
    unused = cls.unused_options(values)
    for name, opt in options_lib.options_of(cls).items():
        if opt.train_length and values[name] == 0 and name not in unused:
            fill = opt.train_length
            values[name] = fill(train_length) if callable(fill) else train_length


def _without_attention(before, layer_kinds, overrides, attends, explicit) -> tuple[str, ...]:
    """NoPE for the layers without attention; ValueError where ``layer_kinds`` or a rule of
    ``model.position.layers`` names a position term for one of them (``before``: the kinds before
    the rules)."""
    kinds = list(layer_kinds)
    for i, attending in enumerate(attends):
        if attending:
            continue
        if explicit and explicit[i] != "nope":
            raise ValueError(f"model.position.layer_kinds[{i}]={explicit[i]!r}: layer {i} has no attention (a "
                             "recurrent mixer, model.layer_types), so no position term; set it to 'nope'")
        if overrides[i]:
            field = next(iter(overrides[i].values()))[1]
            raise ValueError(f"{field} selects layer {i}, which has no attention (a recurrent mixer, "
                             "model.layer_types) and no position term; select attention layers only")
        if kinds[i] not in ("nope", before[i]):
            raise ValueError(f"a rule of model.position.layers gives layer {i} the position kind {kinds[i]!r}, but "
                             "it has no attention (a recurrent mixer, model.layer_types); select attention layers "
                             "only")
        kinds[i] = "nope"
    return tuple(kinds)


def resolve(p, *, head_dim, num_heads, num_layers, train_length, attends=None) -> PositionSpec:
    """``config.model.position`` -> :class:`PositionSpec`; ``head_dim``: the width the units act on.

    ``attends``: per layer, whether it has attention (``posenc.model.recurrent_spec``; None: every
    layer). A layer without it (a recurrent mixer) has no position term: its unit is NoPE, and a
    per-layer kind or rule option that gives it another is refused.
    """
    kind = p.kind
    explicit = tuple(p.layer_kinds)
    if explicit:
        if len(explicit) != num_layers:
            raise ValueError(
                f"model.position.layer_kinds has {len(explicit)} entries {explicit!r}; "
                f"need one per layer (model.num_layers={num_layers})")
        for k in explicit:
            if registry.get(k).acts_at_input():
                raise ValueError(
                    f"model.position.layer_kinds entry {k!r} is an input embedding, not a "
                    "per-layer encoding; set it as model.position.kind instead")
    per_layer = explicit or (kind,) * num_layers
    layer_kinds = tuple("nope" if registry.get(k).acts_at_input() else k for k in per_layer)
    before = layer_kinds
    layer_kinds, overrides = layer_options_lib.resolve(p.layers, layer_kinds)
    if attends is not None:
        layer_kinds = _without_attention(before, layer_kinds, overrides, attends, explicit)
    used = tuple(dict.fromkeys((kind, *layer_kinds)))
    opts = {}
    for k in used:
        cls, prefix = registry.get(k), f"model.position.{k}"
        section = p[k].to_dict() if k in p else {}
        values = options_lib.read(cls, section, prefix=prefix)
        for name in options_lib.changed(cls, section):
            if name in cls.unused_options(values):
                raise ValueError(f"{prefix}.{name}={section[name]!r} is set, but {k} does not use it "
                                 f"with these options (unused here: "
                                 f"{', '.join(cls.unused_options(values))})")
        if train_length is not None:
            _fill(cls, values, checks.integer("task.train_length", train_length, minimum=1))
        cls.check(values, prefix=prefix, head_dim=head_dim, num_heads=num_heads,
                  num_layers=num_layers)
        opts[k] = types.MappingProxyType(values)
    per_layer_opts = []
    for i, k in enumerate(layer_kinds):
        if not overrides[i]:
            per_layer_opts.append(opts[k])
            continue
        cls = registry.get(k)
        values = layer_options_lib.layer_options(cls, opts[k], overrides[i])
        if train_length is not None:
            _fill(cls, values, train_length)
        cls.check(values, prefix=f"model.position.{k} (layer {i} with model.position.layers)",
                  head_dim=head_dim, num_heads=num_heads, num_layers=num_layers)
        per_layer_opts.append(types.MappingProxyType(values))
    for k in sorted(set(registry.ENCODINGS) - set(used)):
        set_fields = options_lib.changed(registry.get(k), p[k].to_dict()) if k in p else []
        if set_fields:
            raise ValueError(
                f"model.position.{k}.{set_fields[0]}={p[k][set_fields[0]]!r} is set, but no layer "
                f"uses {k} (model.position.kind={kind!r}"
                + (f", layer_kinds={explicit!r}" if explicit else "") + ")")
    return PositionSpec(
        kind=kind, layer_kinds=layer_kinds, options=types.MappingProxyType(opts),
        randomized=bool(p.randomized), randomized_max_position=int(p.randomized_max_position),
        randomized_per=p.randomized_per, layer_options=tuple(per_layer_opts),
    )
