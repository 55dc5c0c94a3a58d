"""validate_config: every bad ``config.model`` value raises ValueError at construction."""

from __future__ import annotations

from posenc import registry, rope
from posenc.model import attention

MLPS = ("gelu", "swiglu")
DTYPES = ("float32", "bfloat16")
ROPE_LAYOUTS = ("half", "interleaved")
SINUSOIDAL_LAYOUTS = ("interleaved", "concat")
ROTARY_KINDS = ("rope", "irope", "xpos")
# RoPE scalings whose frequencies need the training length (posenc.rope).
NEEDS_ORIGINAL_LENGTH = ("dynamic", "yarn", "dynamic_yarn", "longrope", "llama3")
ROPE_SCALINGS = rope.KINDS


def _choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; choose one of: {', '.join(allowed)}")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"model.{name} must be an integer >= 1; got {value!r}")


def head_dim(cfg) -> int:
    """``model.head_dim``, or d_model // num_heads when it is 0."""
    return int(cfg.head_dim) or cfg.d_model // cfg.num_heads


def layer_kinds(cfg) -> tuple[str, ...]:
    """Per-layer position kind (embed kinds act at the input, so their layers are NoPE)."""
    pos = cfg.position
    if pos.layer_kinds:
        kinds = tuple(pos.layer_kinds)
    else:
        kinds = (pos.kind,) * cfg.num_layers
    return tuple("nope" if "embed" in registry.attach_points(k) else k for k in kinds)


def validate_config(cfg, *, max_length=None) -> None:
    """Raise ValueError naming the bad value (and the allowed ones) for any bad field.

    Args:
      cfg: ``config.model`` (see posenc/model/config.py).
      max_length: longest sequence the caller will run, if known (checked
        against the learned position table).
    """
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "attention_block"):
        _positive_int(name, cfg[name])
    for name in ("num_kv_heads", "head_dim", "attention_causal_block"):
        if isinstance(cfg[name], bool) or not isinstance(cfg[name], int) or cfg[name] < 0:
            raise ValueError(f"model.{name} must be an integer >= 0 (0 = "
                             f"{'off' if name == 'attention_causal_block' else 'default'}); got {cfg[name]!r}")
    _choice("mlp", cfg.mlp, MLPS)
    _choice("dtype", cfg.dtype, DTYPES)
    attention.check_impl(cfg.attention_impl)
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"model.dropout must be in [0, 1); got {cfg.dropout!r}")
    if not cfg.mlp_ratio > 0:
        raise ValueError(f"model.mlp_ratio must be > 0; got {cfg.mlp_ratio!r}")
    if cfg.head_dim == 0 and cfg.d_model % cfg.num_heads:
        raise ValueError(
            f"d_model {cfg.d_model} is not divisible by num_heads {cfg.num_heads} "
            "(set model.head_dim explicitly or change num_heads)")
    kv = cfg.num_kv_heads or cfg.num_heads
    if cfg.num_heads % kv:
        raise ValueError(f"num_heads {cfg.num_heads} is not divisible by num_kv_heads {kv}")

    n = cfg.norm
    registry.check_norm_kind(n.kind)
    registry.check_placement(n.placement)
    registry.check_qk_norm(n.qk_norm)
    if not n.eps > 0:
        raise ValueError(f"model.norm.eps must be > 0; got {n.eps!r}")
    for name in ("attn_softcap", "final_softcap"):
        if n[name] < 0:
            raise ValueError(f"model.norm.{name} must be >= 0 (0 = off); got {n[name]!r}")
    if not 0.0 <= n.mixln_fraction <= 1.0:
        raise ValueError(f"model.norm.mixln_fraction must be in [0, 1]; got {n.mixln_fraction!r}")

    p = cfg.position
    registry.check_position_kind(p.kind)
    if p.layer_kinds:
        if len(p.layer_kinds) != cfg.num_layers:
            raise ValueError(
                f"model.position.layer_kinds has {len(p.layer_kinds)} entries "
                f"{tuple(p.layer_kinds)!r}; need one per layer (num_layers={cfg.num_layers})")
        for k in p.layer_kinds:
            registry.check_position_kind(k)
            if "embed" in registry.attach_points(k):
                raise ValueError(
                    f"model.position.layer_kinds entry {k!r} is an input embedding, not a "
                    "per-layer encoding; set it as model.position.kind instead")
    _choice("position.sinusoidal_layout", p.sinusoidal_layout, SINUSOIDAL_LAYOUTS)
    _choice("position.rope_layout", p.rope_layout, ROPE_LAYOUTS)
    _choice("position.scaling", p.scaling, ROPE_SCALINGS)
    kinds = set(layer_kinds(cfg))
    if kinds & set(ROTARY_KINDS):
        dh = head_dim(cfg)
        rd = int(dh * p.rotary_fraction)
        if rd < 2 or rd % 2:
            raise ValueError(
                f"rotary dim head_dim * rotary_fraction = {dh} * {p.rotary_fraction} = {rd} "
                "must be even and >= 2")
        if p.scaling in NEEDS_ORIGINAL_LENGTH and not p.original_length:
            raise ValueError(
                f"model.position.scaling {p.scaling!r} needs model.position.original_length "
                "(the training length); it is 0 (unset)")
    if p.original_length < 0:
        raise ValueError(f"model.position.original_length must be >= 0; got {p.original_length!r}")
    if p.kind == "learned":
        _positive_int("position.max_length", p.max_length)
        if max_length is not None and max_length > p.max_length:
            raise ValueError(
                f"length {max_length} exceeds the learned position table "
                f"(model.position.max_length={p.max_length})")
    if "irope" in kinds:
        _positive_int("position.nope_every", p.nope_every)
    for name, key in (("t5", "t5_num_buckets"), ("t5", "t5_max_distance"),
                      ("shaw", "shaw_max_distance"), ("fire", "fire_hidden"), ("cope", "cope_npos")):
        if name in kinds:
            _positive_int(f"position.{key}", p[key])
