"""EXAONE 4: reordered norms, local (window) and global layers by ``sliding_window_pattern``; with a
window only the local layers rotate (the global layers are NoPE)."""

from __future__ import annotations

import functools

from posenc.hf import fields, hf_params
from posenc.hf.registry import Family, register


def exaone4_fields(hf):
    """EXAONE 4's fields: the layer pattern (a string "LLLG" or an interval) and its NoPE layers."""
    out = fields.llama_core(hf, "exaone4")
    n = out["model.num_layers"]
    window = hf.get("sliding_window")
    pattern = hf.get("sliding_window_pattern") or 0
    if isinstance(pattern, str):  # "LLLG": L local (window), G global
        pattern = [pattern[i % len(pattern)] for i in range(n)]
        default = ["sliding_attention" if c == "L" else "full_attention" for c in pattern]
    else:
        default = (fields.every(n, int(pattern), "sliding_attention", "full_attention")
                   if window and pattern else ["full_attention"] * n)
    spans = fields.layer_spans(hf, n, default)
    fields.set_spans(out, hf, spans)
    # HF: with a window, only the window layers rotate (the global layers are NoPE)
    fields.nope(out, (i for i, s in enumerate(spans) if window and s != "window"))
    return out


register("exaone4", Family("exaone4", exaone4_fields,
                           functools.partial(hf_params.llama_params, norms=hf_params.REORDERED_NORMS)))
