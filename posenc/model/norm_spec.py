"""NormSpec: ``config.model.norm`` resolved (the norm, its placement, QK-norm, soft-caps, embedding scale).

:func:`resolve` applies the rules inside the norm section (a field that
only another kind or placement reads is an error when set; a placement that
normalises q, k and v itself takes no QK-norm or value norm). Rules that
relate the norm to the position units are ``posenc.model.unit_rules``'s,
those of the rest of the model ``posenc.model.spec``'s.
"""

from __future__ import annotations

import dataclasses

from posenc.model import config as config_lib
from posenc.norms import norms as norms_lib
from posenc.norms import placements


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


def resolve(n) -> NormSpec:
    """``config.model.norm`` (its fields checked by their declarations) -> :class:`NormSpec`."""
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
