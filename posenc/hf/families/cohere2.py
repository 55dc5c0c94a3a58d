"""Cohere 2: parallel attention and MLP on one LayerNorm, window layers that rotate and
NoPE global layers, scaled output logits."""

from __future__ import annotations

import functools

from posenc.hf import fields, hf_params
from posenc.hf.registry import Family, register

# Cohere: one input norm feeds attention and the MLP in parallel; posenc's two norms get its gains
PARALLEL_NORMS = {"norm1": "input_layernorm", "norm2": "input_layernorm"}


def cohere2_fields(hf):
    """Cohere 2's fields: every ``sliding_window_pattern``-th layer global (and NoPE), ``logit_scale``."""
    out = fields.llama_core(hf, "cohere2", tie_default=True, eps_key="layer_norm_eps")
    out["model.position.rope.layout"] = "interleaved"  # Cohere interleaves the frequencies
    n = out["model.num_layers"]
    spans = fields.layer_spans(hf, n, fields.every(n, hf.get("sliding_window_pattern", 4), "sliding_attention",
                                                   "full_attention"))
    fields.set_spans(out, hf, spans)
    fields.nope(out, (i for i, s in enumerate(spans) if s != "window"))  # only the window layers rotate
    out["model.logits_multiplier"] = float(hf.get("logit_scale", 0.0625))
    return out


register("cohere2", Family("cohere2", cohere2_fields,
                           functools.partial(hf_params.llama_params, norms=PARALLEL_NORMS)))
