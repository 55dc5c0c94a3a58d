"""Per-layer attention layout: each layer's span, whether it has QK-norm, its logit scaling.

``layout(cfg, position=..., train_length=...)`` validates the model fields
that vary by layer and resolves them into one :class:`Layout` (part of
:class:`~posenc.model.spec.ModelSpec`):

- spans (``model.attention_span``, ``attention_window``, ``attention_chunk``,
  ``global_every``, or explicit ``model.layer_spans``): "full", "window"
  (key j visible to query i when ``i - W < j <= i``) or "chunk" (keys in the
  query's chunk of C, Llama 4). ``global_every=k`` keeps layers ``k - 1,
  2k - 1, ...`` full: Gemma 3 (5 window : 1 full), SWAN-GPT and Llama 4
  (their global layers are the NoPE layers of iRoPE with the same k);
- ``model.norm.qk_norm_layers`` and ``model.logit_scale.layers``: "all",
  "positional" (layers whose encoding adds a position term) or "nope";
  Llama 4 has QK-norm on its RoPE layers and the temperature on its NoPE
  layers;
- ``model.logit_scale``: the query multiplier of ``posenc.logit_scale``
  (see :data:`posenc.model.config.LOGIT_SCALES`).

Every bad value raises ValueError naming the field; a field that no layer
uses is an error when set.
"""

from __future__ import annotations

import dataclasses

from posenc import checks
from posenc.model import config as config_lib
from posenc.model import encoding, registry

SPANS = encoding.SPANS


@dataclasses.dataclass(frozen=True)
class LogitScale:
    kind: str  # none | ssmax | logn | temperature
    layers: str  # all | positional | nope
    train_length: int  # logn (resolved: the task's training length for 0)
    floor_scale: float
    attn_scale: float
    ssmax_init: float
    ssmax_bias: bool


@dataclasses.dataclass(frozen=True)
class Layout:
    spans: tuple[str, ...]  # per layer: full | window | chunk
    window: int  # W of the window layers (0: none)
    chunk: int  # C of the chunk layers (0: none)
    qk_norm: tuple[bool, ...]  # per layer: model.norm.qk_norm applies
    logit_scale: LogitScale
    scaled: tuple[bool, ...]  # per layer: the logit scale applies

    def span(self, layer_index: int) -> dict:
        """``{"window": W, "chunk": C}`` of one layer (0 where the span is not that)."""
        s = self.spans[layer_index]
        return {"window": self.window if s == "window" else 0,
                "chunk": self.chunk if s == "chunk" else 0}

    @classmethod
    def default(cls, num_layers: int) -> Layout:
        """Every layer full, QK-norm everywhere, no logit scaling (the config defaults)."""
        d = config_lib.logit_scale_config()
        return cls(spans=("full",) * num_layers, window=0, chunk=0, qk_norm=(True,) * num_layers,
                   logit_scale=LogitScale(kind="none", layers="all", train_length=0,
                                          floor_scale=d.floor_scale, attn_scale=d.attn_scale,
                                          ssmax_init=d.ssmax_init, ssmax_bias=d.ssmax_bias),
                   scaled=(False,) * num_layers)


def _get(cfg, name, default):
    # Configs written before these fields existed (config.json of older runs) lack them.
    return cfg.get(name, default) if hasattr(cfg, "get") else default


def _nope_layers(position, num_layers) -> tuple[bool, ...]:
    per_layer = position.layer_options or tuple(position.options[k] for k in position.layer_kinds)
    return tuple(registry.get(k).layer_is_nope(per_layer[i], layer_index=i, num_layers=num_layers)
                 for i, k in enumerate(position.layer_kinds))


def _select(rule: str, nope: tuple[bool, ...]) -> tuple[bool, ...]:
    if rule == "all":
        return (True,) * len(nope)
    return tuple(n == (rule == "nope") for n in nope)


def _spans(cfg, position, num_layers):
    span = checks.choice("model.attention_span", _get(cfg, "attention_span", "full"), SPANS)
    window = checks.integer("model.attention_window", _get(cfg, "attention_window", 0), minimum=0)
    chunk = checks.integer("model.attention_chunk", _get(cfg, "attention_chunk", 0), minimum=0)
    every = checks.integer("model.global_every", _get(cfg, "global_every", 0), minimum=0)
    explicit = tuple(_get(cfg, "layer_spans", ()))
    if explicit:
        if len(explicit) != num_layers:
            raise ValueError(f"model.layer_spans has {len(explicit)} entries {explicit!r}; need one "
                             f"per layer (model.num_layers={num_layers})")
        if span != "full" or every:
            raise ValueError("model.layer_spans is set: leave model.attention_span ('full') and "
                             "model.global_every (0) at their defaults, they describe the same thing")
        spans = tuple(checks.choice(f"model.layer_spans[{i}]", s, SPANS) for i, s in enumerate(explicit))
    else:
        if every and span == "full":
            raise ValueError(f"model.global_every={every} is set, but model.attention_span is 'full' "
                             "(every layer is global already); set attention_span to window or chunk")
        spans = tuple("full" if every and (i + 1) % every == 0 else span for i in range(num_layers))
    for name, value, kind in (("attention_window", window, "window"), ("attention_chunk", chunk, "chunk")):
        if kind in spans and value < 1:
            raise ValueError(f"model.{name} must be >= 1 for the {kind} layers; got {value}")
        if kind not in spans and value:
            raise ValueError(f"model.{name}={value} is set, but no layer has span {kind!r} "
                             f"(layer spans {spans!r})")
    for i, (s, kind) in enumerate(zip(spans, position.layer_kinds)):
        registry.get(kind).check_span(s, where=f"layer {i} has span {s!r}",
                                      fields="model.layer_spans / model.attention_span")
    return spans, window, chunk


def _logit_scale(ls, train_length) -> LogitScale:
    defaults = config_lib.logit_scale_config()
    ls = defaults if ls is None else ls
    kind = checks.choice("model.logit_scale.kind", ls.kind, config_lib.LOGIT_SCALES)
    owners = {"train_length": "logn", "floor_scale": "temperature", "attn_scale": "temperature",
              "ssmax_init": "ssmax", "ssmax_bias": "ssmax"}
    for field in sorted(set(ls.keys()) - set(defaults.keys())):
        raise ValueError(f"unknown field model.logit_scale.{field}; the fields are: "
                         f"{', '.join(sorted(defaults.keys()))}")
    for field, owner in owners.items():
        if kind != owner and ls[field] != defaults[field]:
            raise ValueError(f"model.logit_scale.{field}={ls[field]!r} is set, but only kind "
                             f"{owner!r} uses it (model.logit_scale.kind={kind!r})")
    if kind == "none" and ls.layers != defaults.layers:
        raise ValueError(f"model.logit_scale.layers={ls.layers!r} is set, but model.logit_scale.kind "
                         "is 'none'")
    n = checks.integer("model.logit_scale.train_length", ls.train_length, minimum=0)
    if kind == "logn" and n == 0 and train_length is not None:
        n = checks.integer("task.train_length", train_length, minimum=1)
    if kind == "logn" and n < 2:
        raise ValueError("model.logit_scale.train_length must be >= 2 for kind 'logn' (0 means the "
                         f"task's training length, which only a training run fills in); got {n}")
    return LogitScale(
        kind=kind, layers=checks.choice("model.logit_scale.layers", ls.layers, config_lib.LAYER_RULES),
        train_length=n,
        floor_scale=checks.number("model.logit_scale.floor_scale", ls.floor_scale, positive=True),
        attn_scale=checks.number("model.logit_scale.attn_scale", ls.attn_scale),
        ssmax_init=checks.number("model.logit_scale.ssmax_init", ls.ssmax_init),
        ssmax_bias=checks.boolean("model.logit_scale.ssmax_bias", ls.ssmax_bias))


def layout(cfg, *, position, num_layers: int, qk_norm: str, train_length: int | None) -> Layout:
    """The :class:`Layout` of ``config.model`` (``position``: its resolved PositionSpec)."""
    spans, window, chunk = _spans(cfg, position, num_layers)
    nope = _nope_layers(position, num_layers)
    rule = checks.choice("model.norm.qk_norm_layers", _get(cfg.norm, "qk_norm_layers", "all"),
                         config_lib.LAYER_RULES)
    if qk_norm == "none" and rule != "all":
        raise ValueError(f"model.norm.qk_norm_layers={rule!r} is set, but model.norm.qk_norm is 'none'")
    scale = _logit_scale(_get(cfg, "logit_scale", None), train_length)
    return Layout(spans=spans, window=window, chunk=chunk, qk_norm=_select(rule, nope),
                  logit_scale=scale,
                  scaled=(_select(scale.layers, nope) if scale.kind != "none" else (False,) * num_layers))
