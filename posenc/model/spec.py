"""ModelSpec: ``config.model`` validated once, as typed, frozen values.

``ModelSpec.from_config(config.model)`` is the one validation of a model
config: every bad field raises ValueError naming the field (full dotted
name), the bad value and the allowed values; a field of an encoding section
that the chosen encodings do not use is an error if it was set. A run's
config, whose fields ``posenc.training.schema.validate`` checked already,
goes through ``ModelSpec.from_values`` (the cross-field rules only). The
:class:`~posenc.model.Decoder` accepts a ModelSpec (trusted) or a ConfigDict
(validated through this). Everything derived from the config (head_dim,
per-layer kinds, each unit's options) is resolved here and nowhere else.

Each section has its spec and its own rules: ``posenc.model.position_spec``
(the kind and options of every layer), ``posenc.model.norm_spec``,
``posenc.model.mla_spec``, ``posenc.model.recurrent_spec`` (each layer's
mixer: attention or a recurrent kind) and the per-layer ``posenc.model.layout``;
the rules between the layers' units and the rest of the model live in
``posenc.model.unit_rules``. This module assembles them and keeps the rules
of the model-wide fields (sizes, residual forms, nGPT's model).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from posenc import checks
from posenc.config import schema
from posenc.model import config as config_lib
from posenc.model import fused, mla_spec, moe_spec, norm_spec, position_spec, recurrent_spec, unit_rules
from posenc.model import layout as layout_lib
from posenc.model.mla_spec import MLASpec
from posenc.model.moe_spec import MoESpec
from posenc.model.norm_spec import NormSpec
from posenc.model.position_spec import PositionSpec
from posenc.model.recurrent_spec import RecurrentSpec
from posenc.norms import ngpt, norm_names, placements


def resolve_dtype(name: str) -> str:
    """The compute dtype ``model.dtype`` names: "auto" is bfloat16 on GPU and TPU, float32 elsewhere.

    bfloat16 compute keeps float32 parameters, accumulation, softmax, norm
    statistics and rotary angles (the layers and pure functions do that).
    """
    name = checks.choice("model.dtype", name, config_lib.DTYPES)
    if name == "auto":
        return "bfloat16" if fused.on_accelerator() else "float32"
    return name


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # resolved (0 in the config: num_heads)
    head_dim: int  # resolved (0 in the config: d_model // num_heads)
    mlp: str
    mlp_ratio: float
    mlp_hidden: int  # resolved (0 in the config: int(mlp_ratio * d_model))
    bias: str  # none | qkv | attention | all: which projections have a bias
    parallel_residual: bool  # x + attn(N1 x) + mlp(N2 x) (GPT-NeoX, GPT-J)
    attention_scale: float  # resolved: the multiplier of q . k (0 in the config: 1 / sqrt(head_dim))
    dropout: float
    tie_embeddings: bool
    dtype: str  # resolved: "float32" | "bfloat16" ("auto" in the config: by platform)
    attention_block: int
    attention_impl: str
    attention_causal_block: int
    attention_sinks: str  # none | learned | zero (posenc.learned_sinks), every layer
    attention_gate: str  # none | elementwise | headwise (posenc.gated), every layer
    position: PositionSpec
    norm: NormSpec
    layout: layout_lib.Layout | None = None  # per-layer spans, QK-norm, logit scaling (resolved)
    # MiniCPM / Granite constants (posenc.multipliers); 1.0: off, nothing added to the program
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_multiplier: float = 1.0
    residual_streams: int = 1  # hyper-connections (posenc.hyper_connections); 1: off, nothing added
    hyper_connections: str = "dynamic"  # their kind (posenc.hyper_connections.KINDS), read when streams > 1
    mla: MLASpec | None = None  # multi-head latent attention (model.mla); None: the usual attention
    moe: MoESpec | None = None  # mixture-of-experts MLPs (model.moe); None: every MLP dense
    recurrent: RecurrentSpec | None = None  # each layer's mixer (model.layer_types); None: attention everywhere
    recurrences: int = 1  # passes through the layers with shared weights (a looped transformer); 1: one pass
    layers_without_mlp: tuple[int, ...] = ()  # layers whose token mixer has no MLP after it (model.layers_without_mlp)

    @property
    def unit_head_dim(self) -> int:
        """The width of the queries and keys every layer's encoding acts on (MLA: the rotary part)."""
        return self.head_dim if self.mla is None else self.mla.qk_rope_head_dim

    def has_mlp(self, layer_index: int) -> bool:
        """Whether a layer has its MLP sublayer (``model.layers_without_mlp``)."""
        return layer_index not in self.layers_without_mlp

    def layer_type(self, layer_index: int) -> str:
        """The mixer of a layer: "attention" or a recurrent kind (``model.layer_types``)."""
        return "attention" if self.recurrent is None else self.recurrent.layer_types[layer_index]

    @classmethod
    def from_config(cls, cfg, *, train_length: int | None = None) -> ModelSpec:
        """Validate ``config.model`` and resolve it (see the module docstring).

        ``train_length``: the task's training length, which options declared
        with ``train_length=True`` take when they are 0 (e.g. RoPE's
        ``original_length``, a learned table's ``max_length``). Without it
        such options stay 0, and a unit that needs them says so.
        """
        return _spec(config_lib.Model.validate(cfg, "model"), train_length)

    @classmethod
    def from_values(cls, values, *, train_length: int | None = None) -> ModelSpec:
        """Resolve ``config.model`` values already validated by their declarations (a run's
        config after ``posenc.training.schema.validate``): the cross-field rules only."""
        return _spec(values, train_length)


def _spec(values, train_length) -> ModelSpec:
    # Every field's own check ran once, from its declaration (posenc.model.config.Model);
    # what follows are the rules that relate several fields.
    cfg = schema.Values(values.to_dict() if hasattr(values, "to_dict") else values)
    sizes = {n: int(cfg[n]) for n in ("vocab_size", "d_model", "num_layers", "num_heads", "attention_block")}
    bias, parallel = cfg.bias, bool(cfg.parallel_residual)
    if parallel and cfg.norm.placement != "pre":
        raise ValueError(f"model.parallel_residual=True needs model.norm.placement 'pre' (both "
                         f"sublayers read the pre-normed input); got {cfg.norm.placement!r}")
    streams = int(cfg.residual_streams)
    if streams > 1 and (cfg.norm.placement != "pre" or parallel):
        raise ValueError(f"model.residual_streams={streams} (hyper-connections) wraps pre-norm sublayers: it needs "
                         f"model.norm.placement 'pre' and no parallel_residual; got {cfg.norm.placement!r}"
                         f"{' with parallel_residual' if parallel else ''}")
    hc_kind = str(cfg.hyper_connections)
    recurrences = int(cfg.get("recurrences", 1))
    sphere = placements.PLACEMENTS[norm_names.check_placement(cfg.norm.placement)].sphere
    if recurrences > 1 and (streams > 1 or sphere):
        raise ValueError(f"model.recurrences={recurrences} adds the input embeddings to the hidden state before "
                         "every pass: it needs one residual stream (model.residual_streams 1) and a placement "
                         f"other than 'ngpt' (the sphere); got residual_streams={streams}, placement "
                         f"{cfg.norm.placement!r}")
    if streams == 1 and hc_kind != "dynamic":  # a kind set without streams would silently do nothing
        raise ValueError(f"model.hyper_connections={hc_kind!r} joins residual streams: it needs "
                         "model.residual_streams > 1; got 1")
    mlp_hidden, attention_scale = int(cfg.mlp_hidden), float(cfg.attention_scale)
    dtype = resolve_dtype(cfg.dtype)
    dropout, mlp_ratio = float(cfg.dropout), float(cfg.mlp_ratio)
    d_model, num_heads, num_layers = sizes["d_model"], sizes["num_heads"], sizes["num_layers"]
    if cfg.head_dim == 0 and d_model % num_heads:
        raise ValueError(f"model.d_model {d_model} is not divisible by model.num_heads {num_heads} "
                         "(set model.head_dim explicitly or change num_heads)")
    head_dim = int(cfg.head_dim) or d_model // num_heads
    kv = int(cfg.num_kv_heads) or num_heads
    if num_heads % kv:
        raise ValueError(f"model.num_heads {num_heads} is not divisible by model.num_kv_heads {kv}")
    mla = mla_spec.resolve(cfg, head_dim=head_dim, num_heads=num_heads, kv=kv)
    if mla is not None:
        kv = num_heads  # the explicit form's keys and values have every head
    recurrent = recurrent_spec.resolve(cfg, num_layers=num_layers, d_model=d_model)
    position = position_spec.resolve(cfg.position, head_dim=head_dim if mla is None else mla.qk_rope_head_dim,
                                     num_heads=num_heads, num_layers=num_layers, train_length=train_length,
                                     attends=None if recurrent is None else recurrent.attends)
    position.axes  # noqa: B018  (every multi-axis unit reads the same number of axes)
    norm = norm_spec.resolve(cfg.norm)
    moe = moe_spec.resolve(cfg, num_layers=num_layers, mlp_hidden=mlp_hidden or int(d_model * mlp_ratio),
                           sphere=norm.sphere)
    if recurrent is not None:
        recurrent_spec.check(cfg, recurrent, norm=norm, mla=mla)
    if mla is not None:
        mla_spec.check(cfg, position, norm, rope_dim=mla.qk_rope_head_dim)
        attention_scale = attention_scale or mla.qk_head_dim ** -0.5
    unit_rules.check_qk_norm(position, norm, head_dim=head_dim)
    unit_rules.check_hidden_keys(position, norm)
    unit_rules.check_sinks(cfg.attention_sinks, position)
    if norm.sphere:
        _check_sphere(cfg, kv=kv, head_dim=head_dim)
        unit_rules.check_sphere(position, head_dim=head_dim)
        attention_scale = ngpt.softmax_scale(head_dim)
    unit_rules.check_kernel_form(cfg.attention_impl, position)
    without_mlp = _layers_without_mlp(cfg, num_layers=num_layers, streams=streams, moe=moe)
    return ModelSpec(
        vocab_size=sizes["vocab_size"], d_model=d_model, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=kv, head_dim=head_dim, mlp=cfg.mlp, mlp_ratio=mlp_ratio,
        mlp_hidden=mlp_hidden or int(d_model * mlp_ratio), bias=bias, parallel_residual=parallel,
        attention_scale=attention_scale or 1.0 / math.sqrt(head_dim), dropout=dropout,
        tie_embeddings=bool(cfg.tie_embeddings), dtype=dtype,
        attention_block=sizes["attention_block"], attention_impl=cfg.attention_impl,
        attention_causal_block=int(cfg.attention_causal_block),
        attention_sinks=cfg.attention_sinks, attention_gate=cfg.attention_gate,
        position=position, norm=norm, moe=moe,
        embedding_multiplier=float(cfg.embedding_multiplier), residual_multiplier=float(cfg.residual_multiplier),
        logits_multiplier=float(cfg.logits_multiplier), residual_streams=streams, hyper_connections=hc_kind,
        mla=mla, recurrences=recurrences, recurrent=recurrent, layers_without_mlp=without_mlp,
        layout=layout_lib.layout(cfg, position=position, num_layers=num_layers,
                                 qk_norm=norm.qk_norm, train_length=train_length),
    )


def _layers_without_mlp(cfg, *, num_layers, streams, moe) -> tuple[int, ...]:
    """``model.layers_without_mlp``, checked against the model: such a layer is its mixer's residual
    alone, which the placements that wrap a whole layer (or both sublayers together) do not have."""
    without = tuple(int(i) for i in (cfg.get("layers_without_mlp", ()) or ()))
    if not without:
        return ()
    field = f"model.layers_without_mlp={without!r}"
    if without[-1] >= num_layers:
        raise ValueError(f"{field} names layer {without[-1]}; the model has layers 0..{num_layers - 1}")
    placement = str(cfg.norm.placement)
    if placement not in _MLP_FREE_PLACEMENTS or cfg.parallel_residual or streams > 1:
        raise ValueError(f"{field} needs a placement that wraps each sublayer on its own "
                         f"({', '.join(_MLP_FREE_PLACEMENTS)}), one residual stream and no parallel_residual; got "
                         f"placement {placement!r}, residual_streams {streams}, parallel_residual "
                         f"{bool(cfg.parallel_residual)}")
    if moe is not None and any(moe.layers[i] for i in without):
        raise ValueError(f"{field}: layer {next(i for i in without if moe.layers[i])} is a mixture-of-experts "
                         "layer (model.moe), whose MLP it would drop")
    return without


# placements with a residual per sublayer (posenc.placements.residual), where a layer may skip its MLP's
_MLP_FREE_PLACEMENTS = ("pre", "post", "sandwich", "reordered", "deepnorm", "mixln", "rezero")


def unit_head_dim(model) -> int:
    """The width the layers' encodings act on, read off a ``config.model`` (not validated): MLA's
    rotary width (``model.mla.qk_rope_head_dim``, 0: head_dim // 2) or the head dim."""
    head = int(model.head_dim) or int(model.d_model) // int(model.num_heads)
    if not int(model.mla.kv_lora_rank):
        return head
    return int(model.mla.qk_rope_head_dim) or head // 2


# nGPT's model: what the other fields must be (the official code has none of these).
_SPHERE_FIELDS = {"mlp": "swiglu", "bias": "none", "parallel_residual": False, "attention_scale": 0.0,
                  "embedding_multiplier": 1.0, "residual_multiplier": 1.0, "logits_multiplier": 1.0,
                  "norm.qk_norm": "none", "norm.v_norm": False, "norm.embed_scale": False,
                  "norm.embed_norm": False}


def placement_fields(placement: str) -> dict[str, Any]:
    """The dotted fields that select ``placement`` with what it needs (nGPT: its SwiGLU MLP and a key
    head per query head)."""
    fields: dict[str, Any] = {"model.norm.placement": placement}
    if placements.PLACEMENTS[norm_names.check_placement(placement)].sphere:
        fields.update({"model.mlp": _SPHERE_FIELDS["mlp"], "model.num_kv_heads": 0})
    return fields


def _check_sphere(cfg, *, kv, head_dim) -> None:
    """nGPT (placement ngpt) scales unit-norm q and k of every head by its own s_qk [d] and the
    fused SwiGLU by s_uv; it takes no other norm, multiplier or head grouping (its units:
    ``posenc.model.unit_rules.check_sphere``)."""
    for field, wanted in _SPHERE_FIELDS.items():
        value = cfg[field] if "." not in field else cfg.norm[field.split(".")[1]]
        if value != wanted:
            raise ValueError(f"model.norm.placement='ngpt' cannot be combined with model.{field}={value!r} "
                             f"(nGPT has its own scales); set model.{field}={wanted!r}")
    if kv != cfg.num_heads:
        raise ValueError(f"model.norm.placement='ngpt' needs as many key heads as query heads (s_qk scales "
                         f"both per head); got model.num_kv_heads={kv}, model.num_heads={cfg.num_heads}")
    if cfg.num_heads * head_dim != cfg.d_model:
        raise ValueError(f"model.norm.placement='ngpt' needs num_heads * head_dim == d_model (s_qk has d "
                         f"entries); got {cfg.num_heads} * {head_dim} != {cfg.d_model}")
