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
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import Any

import ml_collections

from posenc import checks
from posenc.model import config as config_lib
from posenc.model import encoding, fused
from posenc.model import layer_options as layer_options_lib
from posenc.model import layout as layout_lib
from posenc.model import options as options_lib
from posenc.norms import ngpt, norm_names, placements
from posenc.norms import norms as norms_lib


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
class NormSpec:
    kind: str
    placement: str
    eps: float
    mixln_fraction: float
    dyt_alpha: float
    derf_alpha: float
    v_norm: bool  # values RMS-normalised per head without a gain (Gemma 4)
    qk_norm: str
    qk_norm_after_rope: bool  # QK-norm on the rotated q, k (Llama 4), not on the projections
    attn_softcap: float
    final_softcap: float
    embed_scale: bool
    embed_norm: bool  # a norm right after the token embedding (BLOOM)

    @property
    def init_keywords(self) -> dict[str, float]:
        """The keywords of ``posenc.norms.init_params`` that ``kind`` takes (e.g. dyt_alpha)."""
        values = {"dyt_alpha": self.dyt_alpha, "derf_alpha": self.derf_alpha}
        return {k: values[k] for k in norms_lib.NORMS[self.kind].init_keywords}

    @property
    def qkv_norm(self) -> bool:
        """The placement normalises q, k and v per head inside attention (HybridNorm)."""
        return placements.PLACEMENTS[self.placement].qkv_norm

    @property
    def sphere(self) -> bool:
        """nGPT: hidden states and weight rows on the unit sphere (posenc.ngpt), no norm layers."""
        return placements.PLACEMENTS[self.placement].sphere


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
        return tuple(encoding.get(k).position_axes(o) if i or encoding.get(k).acts_at_input() else 1
                     for i, (k, o) in enumerate(self.units))

    @property
    def axes(self) -> int:
        """The position axes of the model: 1, or the A of its multi-axis units (ValueError when they differ)."""
        many = sorted({(a, k) for (k, _), a in zip(self.units, self.unit_axes) if a > 1})
        if len({a for a, _ in many}) > 1:
            raise ValueError("the position units of a model must read the same number of position axes; got "
                             + ", ".join(f"{k!r}: {a}" for a, k in many))
        return many[0][0] if many else 1


@dataclasses.dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (``model.mla``, posenc.mla): the widths, resolved."""

    kv_lora_rank: int  # C
    q_lora_rank: int  # Cq (0: one query projection)
    qk_nope_head_dim: int  # N
    qk_rope_head_dim: int  # R: the width every layer's encoding sees
    v_head_dim: int  # V
    absorb: bool  # decoding in the absorbed form

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


# What an MLA layer's unit may not do (the hook or fact, and why), in refusal order.
_MLA_REFUSED = (
    ("content_logits", "its logit term reads per-head keys"),
    ("values", "it adds to per-head values"),
    ("prepare", "it reads the layer input and changes q, k, v"),
    ("feature_bias", "it reads per-token features"),
    ("attention", "it computes its own attention weights"),
    ("output", "it changes the attention output"),
    ("update_cache", "it rewrites cached keys"),
)


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

    @property
    def unit_head_dim(self) -> int:
        """The width of the queries and keys every layer's encoding acts on (MLA: the rotary part)."""
        return self.head_dim if self.mla is None else self.mla.qk_rope_head_dim

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


def _fill(cls, values: dict, train_length: int) -> None:
    """Options declared ``train_length=True`` and left at 0 take the training length (in place)."""
    unused = cls.unused_options(values)
    for name, opt in options_lib.options_of(cls).items():
        if opt.train_length and values[name] == 0 and name not in unused:
            fill = opt.train_length
            values[name] = fill(train_length) if callable(fill) else train_length


def _spec(values, train_length) -> ModelSpec:
    # Every field's own check ran once, from its declaration (posenc.model.config.Model);
    # what follows are the rules that relate several fields.
    cfg = ml_collections.ConfigDict(values.to_dict() if hasattr(values, "to_dict") else dict(values))
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
    mla = _mla(cfg, head_dim=head_dim, num_heads=num_heads, kv=kv)
    if mla is not None:
        kv = num_heads  # the explicit form's keys and values have every head
    position = _position(cfg.position, head_dim=head_dim if mla is None else mla.qk_rope_head_dim,
                         num_heads=num_heads, num_layers=num_layers, train_length=train_length)
    position.axes  # noqa: B018  (every multi-axis unit reads the same number of axes)
    norm = _norm(cfg.norm)
    if mla is not None:
        _check_mla(cfg, position, norm, rope_dim=mla.qk_rope_head_dim)
        attention_scale = attention_scale or mla.qk_head_dim ** -0.5
    _check_own_qk_norm(position, norm, head_dim=head_dim)
    _check_hidden_keys(position, norm)
    _check_sinks(cfg.attention_sinks, position)
    if norm.sphere:
        _check_sphere(cfg, position, kv=kv, head_dim=head_dim)
        attention_scale = ngpt.softmax_scale(head_dim)
    if cfg.attention_impl == "auto" and fused.on_accelerator():  # plugins told where it matters
        for kind in dict.fromkeys(position.layer_kinds):
            encoding.tell_no_kernel_form(encoding.get(kind))
    if cfg.attention_impl == "pallas":
        no_kernel = [k for k, opts in zip(position.layer_kinds, position.layer_options)
                     if not encoding.get(k).has_kernel_form() or encoding.get(k).rotates_in_attention(opts)]
        if no_kernel:
            raise ValueError(f"model.attention_impl='pallas' needs encodings with an in-kernel "
                             f"form; {', '.join(dict.fromkeys(no_kernel))} has none (use 'auto')")
    return ModelSpec(
        vocab_size=sizes["vocab_size"], d_model=d_model, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=kv, head_dim=head_dim, mlp=cfg.mlp, mlp_ratio=mlp_ratio,
        mlp_hidden=mlp_hidden or int(d_model * mlp_ratio), bias=bias, parallel_residual=parallel,
        attention_scale=attention_scale or 1.0 / math.sqrt(head_dim), dropout=dropout,
        tie_embeddings=bool(cfg.tie_embeddings), dtype=dtype,
        attention_block=sizes["attention_block"], attention_impl=cfg.attention_impl,
        attention_causal_block=int(cfg.attention_causal_block),
        attention_sinks=cfg.attention_sinks, attention_gate=cfg.attention_gate,
        position=position, norm=norm,
        embedding_multiplier=float(cfg.embedding_multiplier), residual_multiplier=float(cfg.residual_multiplier),
        logits_multiplier=float(cfg.logits_multiplier), residual_streams=streams, hyper_connections=hc_kind,
        mla=mla,
        layout=layout_lib.layout(cfg, position=position, num_layers=num_layers,
                                 qk_norm=norm.qk_norm, train_length=train_length),
    )


def unit_head_dim(model) -> int:
    """The width the layers' encodings act on, read off a ``config.model`` (not validated): MLA's
    rotary width (``model.mla.qk_rope_head_dim``, 0: head_dim // 2) or the head dim."""
    head = int(model.head_dim) or int(model.d_model) // int(model.num_heads)
    if not int(model.mla.kv_lora_rank):
        return head
    return int(model.mla.qk_rope_head_dim) or head // 2


def _mla(cfg, *, head_dim, num_heads, kv) -> MLASpec | None:
    """``model.mla`` resolved (None with kv_lora_rank 0, when no other field of it may be set)."""
    m = cfg.mla
    if not m.kv_lora_rank:
        defaults = config_lib.MLA.config()
        for field in defaults:
            if m[field] != defaults[field]:
                raise ValueError(f"model.mla.{field}={m[field]!r} is set, but MLA is off "
                                 "(model.mla.kv_lora_rank=0); set kv_lora_rank > 0 or leave the field")
        return None
    if kv != num_heads:
        raise ValueError(f"model.num_kv_heads={cfg.num_kv_heads!r} and model.mla: MLA shares one latent by "
                         "every head (no key-value groups); set model.num_kv_heads=0")
    rope = unit_head_dim(cfg)
    if rope % 2:
        raise ValueError(f"model.mla.qk_rope_head_dim must be even (rotary pairs); got {rope}"
                         + ("" if m.qk_rope_head_dim else f" (head_dim {head_dim} // 2)"))
    return MLASpec(kv_lora_rank=int(m.kv_lora_rank), q_lora_rank=int(m.q_lora_rank),
                   qk_nope_head_dim=int(m.qk_nope_head_dim) or head_dim, qk_rope_head_dim=rope,
                   v_head_dim=int(m.v_head_dim) or head_dim, absorb=bool(m.absorb))


# Fields MLA replaces with its own projections and norms (it has no q, k, v of one width to act on).
_MLA_FIELDS = {"bias": "none", "attention_gate": "none", "norm.qk_norm": "none",
               "norm.qk_norm_after_rope": False, "norm.v_norm": False}


def _check_mla(cfg, position, norm, *, rope_dim) -> None:
    """MLA's projections and cache replace the per-head q, k, v: refuse what needs them."""
    for field, wanted in _MLA_FIELDS.items():
        value = cfg[field] if "." not in field else cfg.norm[field.split(".")[1]]
        if value != wanted:
            raise ValueError(f"model.mla (kv_lora_rank={cfg.mla.kv_lora_rank}) cannot be combined with "
                             f"model.{field}={value!r} (MLA has its own projections and norms); set "
                             f"model.{field}={wanted!r}")
    if norm.qkv_norm or norm.sphere:
        raise ValueError(f"model.mla cannot be combined with model.norm.placement={norm.placement!r} (it "
                         "normalises or scales per-head q, k, v, which MLA does not form); choose another "
                         "placement")
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        check_mla_unit(encoding.get(k), dict(opts), rope_dim=rope_dim,
                       where=f"model.mla: layer {i}'s position kind {k!r}")


def check_mla_unit(cls, options: dict, *, rope_dim: int, where: str) -> None:
    """MLA takes units that rotate or scale the rotary part token by token and position-only
    biases; ValueError for the others (``where`` names the layer)."""
    for hook, why in _MLA_REFUSED:
        if encoding.overrides(cls, hook):
            raise ValueError(f"{where} cannot run with MLA: {why} ({hook}); MLA takes units that act on "
                             "the rotary part of q and k or add position-only biases (e.g. rope, nope, "
                             "alibi, t5)")
    field = cls.rotates_in_attention(options) or cls.own_qk_norm(options)
    if field:
        raise ValueError(f"{where} cannot run with MLA with model.position.{cls.name}.{field}="
                         f"{options[field]!r}: MLA rotates the rotary key once per token")
    if cls.qk_head_dim(options, head_dim=rope_dim) != rope_dim:
        raise ValueError(f"{where} cannot run with MLA: it widens q and k, and MLA adds its rotary "
                         "part to the per-head part")


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


def _check_sphere(cfg, position, *, kv, head_dim) -> None:
    """nGPT (placement ngpt) scales unit-norm q and k of every head by its own s_qk [d] and the
    fused SwiGLU by s_uv; it takes no other norm, multiplier or head grouping."""
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
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        unit = encoding.get(k)
        field = unit.own_qk_norm(opts) or unit.rotates_in_attention(opts)
        if field or unit.qk_head_dim(opts, head_dim=head_dim) != head_dim:
            raise ValueError(f"model.norm.placement='ngpt' scales the rotated queries and keys, which position "
                             f"kind {k!r} (layer {i}) {'normalises or rotates inside attention' if field else 'widens'}"
                             f"{f' (model.position.{k}.{field})' if field else ''}; choose another kind")


def _check_sinks(sinks: str, position) -> None:
    """Sinks join a softmax: a layer whose unit computes its own weights (stick-breaking, PaTH) has none."""
    if sinks == "none":
        return
    for i, k in enumerate(position.layer_kinds):
        if encoding.get(k).own_attention():
            raise ValueError(f"model.attention_sinks={sinks!r} joins the softmax, but layer {i}'s position "
                             f"kind {k!r} computes its own attention weights; set model.attention_sinks='none'")


def _check_own_qk_norm(position, norm, *, head_dim) -> None:
    """A unit that normalises q and k itself (FoX (Pro)) and model.norm.qk_norm (or a placement that
    normalises q, k, v: HybridNorm) would do it twice; a unit that rotates inside attention (a
    remapped RoPE) leaves no rotated q, k to normalise, and one that widens them (PoPE) leaves q, k
    wider than the norm's head_dim scales."""
    if norm.qkv_norm:
        _check_twice(position, f"model.norm.placement={norm.placement!r}", "choose another placement")
    if norm.qk_norm == "none":
        return
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        width = encoding.get(k).qk_head_dim(opts, head_dim=head_dim)
        if width != head_dim and norm.qk_norm_after_rope:
            raise ValueError(f"model.norm.qk_norm_after_rope=True cannot follow position kind {k!r} "
                             f"(layer {i}): its queries and keys are {width} wide after the transform, "
                             f"the QK-norm's scales {head_dim}; set qk_norm_after_rope=False")
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        field = encoding.get(k).rotates_in_attention(opts)
        if field and norm.qk_norm_after_rope:
            raise ValueError(f"model.norm.qk_norm_after_rope=True and model.position.{k}.{field}="
                             f"{opts[field]!r} cannot be combined (layer {i} rotates q and k per "
                             "(query, key) pair inside attention); set qk_norm_after_rope=False")
    _check_twice(position, f"model.norm.qk_norm={norm.qk_norm!r}", "set model.norm.qk_norm='none'")


def _check_twice(position, what: str, fix: str) -> None:
    """``what`` normalises q and k: refuse a layer whose unit normalises them itself."""
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        field = encoding.get(k).own_qk_norm(opts)
        if field:
            raise ValueError(f"{what} and model.position.{k}.{field} both normalise the queries and keys "
                             f"of layer {i}; {fix} or turn the unit's own QK-norm off")


def _check_hidden_keys(position, norm) -> None:
    """Soft-capping maps a bias that hides keys (Hard-ALiBi's windows) to -cap: the keys come back."""
    if not norm.attn_softcap:
        return
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        field = encoding.get(k).hides_keys(opts)
        if field:
            raise ValueError(f"model.norm.attn_softcap={norm.attn_softcap!r} and model.position.{k}."
                             f"{field}={opts[field]!r} cannot be combined: layer {i}'s bias hides keys, "
                             "and the soft-cap would map it to -cap and let them through; set "
                             "model.norm.attn_softcap=0")


def _norm(n) -> NormSpec:
    defaults = config_lib.norm_config()
    # Fields that only one choice reads: setting them for another is a mistake.
    for field, owner, chosen in (("mixln_fraction", "placement 'mixln'", n.placement == "mixln"),
                                 ("dyt_alpha", "kind 'dyt'", n.kind == "dyt"),
                                 ("derf_alpha", "kind 'derf'", n.kind == "derf")):
        if not chosen and n[field] != defaults[field]:
            raise ValueError(f"model.norm.{field}={n[field]!r} is set, but only {owner} uses it "
                             f"(model.norm.kind={n.kind!r}, model.norm.placement={n.placement!r})")
    if placements.PLACEMENTS[n.placement].qkv_norm:
        for field, off in (("qk_norm", "none"), ("v_norm", False)):
            if n[field] != off:
                raise ValueError(f"model.norm.{field}={n[field]!r} and model.norm.placement={n.placement!r} "
                                 f"both normalise attention's projections (the placement normalises q, k "
                                 f"and v per head with a gain); set model.norm.{field}={off!r}")
    return NormSpec(
        kind=n.kind, placement=n.placement, eps=float(n.eps), mixln_fraction=float(n.mixln_fraction),
        dyt_alpha=float(n.dyt_alpha), derf_alpha=float(n.derf_alpha), v_norm=bool(n.v_norm),
        qk_norm=n.qk_norm, qk_norm_after_rope=bool(n.qk_norm_after_rope),
        attn_softcap=float(n.attn_softcap), final_softcap=float(n.final_softcap),
        embed_scale=bool(n.embed_scale), embed_norm=bool(n.embed_norm),
    )


def _position(p, *, head_dim, num_heads, num_layers, train_length) -> PositionSpec:
    kind = p.kind
    explicit = tuple(p.layer_kinds)
    if explicit:
        if len(explicit) != num_layers:
            raise ValueError(
                f"model.position.layer_kinds has {len(explicit)} entries {explicit!r}; "
                f"need one per layer (model.num_layers={num_layers})")
        for k in explicit:
            if encoding.get(k).acts_at_input():
                raise ValueError(
                    f"model.position.layer_kinds entry {k!r} is an input embedding, not a "
                    "per-layer encoding; set it as model.position.kind instead")
    per_layer = explicit or (kind,) * num_layers
    layer_kinds = tuple("nope" if encoding.get(k).acts_at_input() else k for k in per_layer)
    layer_kinds, overrides = layer_options_lib.resolve(p.layers, layer_kinds)
    used = tuple(dict.fromkeys((kind, *layer_kinds)))
    opts = {}
    for k in used:
        cls, prefix = encoding.get(k), f"model.position.{k}"
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
        cls = encoding.get(k)
        values = layer_options_lib.layer_options(cls, opts[k], overrides[i])
        if train_length is not None:
            _fill(cls, values, train_length)
        cls.check(values, prefix=f"model.position.{k} (layer {i} with model.position.layers)",
                  head_dim=head_dim, num_heads=num_heads, num_layers=num_layers)
        per_layer_opts.append(types.MappingProxyType(values))
    for k in sorted(set(encoding.ENCODINGS) - set(used)):
        set_fields = options_lib.changed(encoding.get(k), p[k].to_dict()) if k in p else []
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

