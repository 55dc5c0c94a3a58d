"""SmolLM3: Llama-like layers with every ``no_rope_layer_interval``-th layer NoPE."""

from __future__ import annotations

from posenc.hf import fields, hf_params
from posenc.hf.registry import Family, register, unsupported


def smollm3_fields(hf):
    """SmolLM3's fields: the NoPE layers of ``no_rope_layers`` (or the interval) as a position rule."""
    out = fields.llama_core(hf, "smollm3", tie_default=True)
    n = out["model.num_layers"]
    interval = hf.get("no_rope_layer_interval", 4)
    rope_layers = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if len(rope_layers) != n:
        raise unsupported(hf, "no_rope_layers", f"{len(rope_layers)} entries for {n} layers")
    use = hf.get("use_sliding_window", False) and hf.get("sliding_window") is not None
    spans = fields.layer_spans(hf, n, ["sliding_attention" if use and not r else "full_attention"
                                       for r in rope_layers])
    if "window" in spans and not use:
        raise unsupported(hf, "use_sliding_window", "layer_types has sliding_attention layers")
    fields.set_spans(out, hf, spans)
    fields.nope(out, (i for i, r in enumerate(rope_layers) if not r))
    return out


register("smollm3", Family("smollm3", smollm3_fields, hf_params.llama_params))
