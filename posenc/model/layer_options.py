"""Per-layer encoding options: ``model.position.layers``, rules that change the kind or options of some layers.

A rule is a mapping with one selector and any number of changes::

    model.position.layers = (
        {"every": 6, "offset": 5, "rope.base": 1e6},        # Gemma 3: the global layers' RoPE base
        {"layers": (3, 7), "kind": "nope"},                 # explicit layer indices
    )

- selector: ``"every": k`` with ``"offset": o`` (default 0) selects the layers
  ``i`` with ``i % k == o``; ``"layers": (i, j, ...)`` selects those indices;
- ``"kind"``: the encoding of the selected layers (a per-layer kind, not an
  input embedding), e.g. NoPE layers in a RoPE model (Llama 4);
- ``"<kind>.<option>": value``: an option of the selected layers' encoding,
  e.g. ``"rope.base"``; every key names the kind the layer has after the
  rules, and every value passes the option's own check.

Rules apply in order (a later rule wins on the layers both select) on top of
``model.position.kind`` / ``layer_kinds``, and a layer takes the options of
its kind's section (``model.position.<kind>``) with its overrides on top.
Every bad rule is a ValueError naming ``model.position.layers[r]``, the bad
key or value and the allowed ones; a rule that selects no layer is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc import checks
from posenc.model import options as options_lib
from posenc.model import registry

SELECTORS = ("every", "layers")
KEYS = ("every", "offset", "layers", "kind")


def _rule_name(r: int) -> str:
    return f"model.position.layers[{r}]"


def _selected(rule: Mapping, r: int, num_layers: int) -> tuple[int, ...]:
    name = _rule_name(r)
    given = [s for s in SELECTORS if s in rule]
    if len(given) != 1:
        raise ValueError(f"{name} must select layers with exactly one of 'every' (with 'offset') or "
                         f"'layers'; got keys {sorted(rule)!r}")
    if given[0] == "every":
        every = checks.integer(f"{name}.every", rule["every"], minimum=1)
        offset = checks.integer(f"{name}.offset", rule.get("offset", 0), minimum=0)
        if offset >= every:
            raise ValueError(f"{name}.offset must be in [0, every={every}); got {offset}")
        chosen = tuple(i for i in range(num_layers) if i % every == offset)
    else:
        if "offset" in rule:
            raise ValueError(f"{name}.offset is set, but only 'every' uses it (this rule has 'layers')")
        layers = rule["layers"]
        if not isinstance(layers, (tuple, list)) or not layers:
            raise ValueError(f"{name}.layers must be a non-empty tuple of layer indices; got {layers!r}")
        chosen = tuple(checks.integer(f"{name}.layers[{j}]", i, minimum=0) for j, i in enumerate(layers))
        bad = [i for i in chosen if i >= num_layers]
        if bad:
            raise ValueError(f"{name}.layers has index {bad[0]}, past the last layer "
                             f"(model.num_layers={num_layers})")
    if not chosen:
        raise ValueError(f"{name} selects no layer ({dict(rule)!r} with model.num_layers={num_layers})")
    return chosen


def resolve(rules, layer_kinds: tuple[str, ...]):
    """Apply the rules to the per-layer kinds.

    Returns ``(kinds, overrides)``: the kind of every layer after the rules,
    and per layer ``{option: (value, field)}`` with ``field`` the dotted name
    of the rule entry that set it (for error messages). Option values are
    checked later against the layer's final kind (:func:`layer_options`).
    """
    if rules is None:
        rules = ()
    if not isinstance(rules, (tuple, list)):
        raise ValueError(f"model.position.layers must be a tuple of rules (mappings); got {rules!r}")
    kinds = list(layer_kinds)
    overrides: list[dict[str, tuple[Any, str]]] = [{} for _ in kinds]
    for r, rule in enumerate(rules):
        name = _rule_name(r)
        if hasattr(rule, "to_dict"):
            rule = rule.to_dict()
        if not isinstance(rule, Mapping):
            raise ValueError(f"{name} must be a mapping like {{'every': 6, 'offset': 5, "
                             f"'rope.base': 1e6}}; got {rule!r}")
        chosen = _selected(rule, r, len(kinds))
        kind = rule.get("kind")
        if kind is not None:
            try:
                cls = registry.get(kind)
            except ValueError as e:
                raise ValueError(f"{name}.kind: {e}") from None
            if cls.acts_at_input():
                raise ValueError(f"{name}.kind {kind!r} is an input embedding, not a per-layer "
                                 "encoding; set it as model.position.kind instead")
        for key in rule:
            if key in KEYS:
                continue
            head, dot, option = str(key).partition(".")
            if not dot or not option or "." in option:
                raise ValueError(f"unknown key {key!r} in {name}; the keys are: "
                                 f"{', '.join(KEYS)} and '<kind>.<option>' (e.g. 'rope.base')")
        for i in chosen:
            if kind is not None and kind != kinds[i]:
                kinds[i] = kind
                overrides[i] = {}  # options of the layer's former kind do not carry over
            for key, value in rule.items():
                if key not in KEYS:
                    overrides[i][key] = (value, f"{name}.{key}")
    for i, (k, over) in enumerate(zip(kinds, overrides)):
        for key, (_, field) in over.items():
            head, option = key.split(".", 1)
            if head != k:
                raise ValueError(f"{field} sets an option of {head!r}, but layer {i} has kind {k!r} "
                                 f"(name the layer's kind, e.g. '{k}.<option>')")
            opts = options_lib.options_of(registry.get(k))
            if option not in opts:
                raise ValueError(f"unknown field {field}: {k} has no option {option!r}; its options "
                                 f"are: {', '.join(sorted(opts)) or '(none)'}")
    return tuple(kinds), overrides


def layer_options(cls, base: Mapping, overrides: Mapping[str, tuple[Any, str]]) -> dict:
    """The options of one layer: its kind's validated ``base`` with the checked overrides on top.

    A layer without overrides gets ``base`` itself (the caller validated it).
    """
    if not overrides:
        return dict(base)
    opts = options_lib.options_of(cls)
    values = dict(base)
    for key, (value, field) in overrides.items():
        option = key.split(".", 1)[1]
        values[option] = opts[option].validate(field, value)
    unused = cls.unused_options(values)
    for key, (value, field) in overrides.items():
        option = key.split(".", 1)[1]
        if option in unused and options_lib.changed(cls, {option: value}):
            raise ValueError(f"{field}={value!r} is set, but {cls.name} does not use it with these "
                             f"options (unused here: {', '.join(unused)})")
    return values
