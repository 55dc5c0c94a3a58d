"""MLASpec: ``config.model.mla`` (multi-head latent attention, posenc.mla) resolved, and what MLA refuses.

MLA's projections and cache replace the per-head q, k, v of one width:
:func:`check` refuses the fields and placements that act on those, and
:func:`check_unit` the position units that need them (MLA takes units that
rotate or scale the rotary part token by token, and position-only biases).
"""

from __future__ import annotations

import dataclasses

from posenc.model import config as config_lib
from posenc.model import encoding, registry


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
_REFUSED = (
    ("content_logits", "its logit term reads per-head keys"),
    ("values", "it adds to per-head values"),
    ("prepare", "it reads the layer input and changes q, k, v"),
    ("feature_bias", "it reads per-token features"),
    ("attention", "it computes its own attention weights"),
    ("output", "it changes the attention output"),
    ("update_cache", "it rewrites cached keys"),
)

# Fields MLA replaces with its own projections and norms (it has no q, k, v of one width to act on).
_FIELDS = {"bias": "none", "attention_gate": "none", "norm.qk_norm": "none",
           "norm.qk_norm_after_rope": False, "norm.v_norm": False}


def resolve(cfg, *, head_dim, num_heads, kv) -> MLASpec | None:
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
    rope = int(m.qk_rope_head_dim) or head_dim // 2
    if rope % 2:
        raise ValueError(f"model.mla.qk_rope_head_dim must be even (rotary pairs); got {rope}"
                         + ("" if m.qk_rope_head_dim else f" (head_dim {head_dim} // 2)"))
    return MLASpec(kv_lora_rank=int(m.kv_lora_rank), q_lora_rank=int(m.q_lora_rank),
                   qk_nope_head_dim=int(m.qk_nope_head_dim) or head_dim, qk_rope_head_dim=rope,
                   v_head_dim=int(m.v_head_dim) or head_dim, absorb=bool(m.absorb))


def check(cfg, position, norm, *, rope_dim) -> None:
    """MLA's projections and cache replace the per-head q, k, v: refuse what needs them."""
    for field, wanted in _FIELDS.items():
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
        check_unit(registry.get(k), dict(opts), rope_dim=rope_dim,
                   where=f"model.mla: layer {i}'s position kind {k!r}")


def check_unit(cls, options: dict, *, rope_dim: int, where: str) -> None:
    """MLA takes units that rotate or scale the rotary part token by token and position-only
    biases; ValueError for the others (``where`` names the layer)."""
    for hook, why in _REFUSED:
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
