"""OLMo 2 and OLMo 3: reordered norms (x + N(F(x))), whole-projection qk-norm; OLMo 3 windows 3 layers of 4.

OLMo 3's global layers have their own RoPE (YaRN in the long-context
checkpoints): a RoPE per layer type (:func:`posenc.hf.fields.rope_by_type`).
"""

from __future__ import annotations

import functools

from posenc.hf import fields, hf_params
from posenc.hf.registry import Family, register


def olmo2_fields(hf):
    """OLMo 2's fields: every layer global."""
    out = fields.llama_core(hf, "olmo2")
    fields.set_spans(out, hf, ["full"] * out["model.num_layers"])
    return out


def olmo3_fields(hf):
    """OLMo 3's fields: 3 window layers to 1 global, a RoPE per layer type."""
    out = fields.llama_core(hf, "olmo3")
    spans = fields.layer_spans(hf, out["model.num_layers"],
                               fields.every(out["model.num_layers"], 4, "sliding_attention", "full_attention"))
    fields.set_spans(out, hf, spans)
    fields.rope_by_type(hf, out, spans)
    return out


_reordered = functools.partial(hf_params.llama_params, norms=hf_params.REORDERED_NORMS)
register("olmo2", Family("olmo2", olmo2_fields, _reordered))
register("olmo3", Family("olmo3", olmo3_fields, _reordered))
