"""Llama-like families: Llama 2 / 3.x (SmolLM), Mistral, Qwen 2, Qwen 3 (dense) and Phi-3.

Pre-RMSNorm layers with a SwiGLU MLP and the checkpoint's RoPE; Qwen 2 and
Qwen 3 place their sliding-window layers from ``max_window_layers`` (HF's
``layer_types`` when the config has none), the others window every layer
when the config has a ``sliding_window``.
"""

from __future__ import annotations

from posenc.hf import fields, hf_params
from posenc.hf.registry import Family, register


def llama_like(preset: str, tie_default=False):
    """``fields(hf)`` of a Llama-like family with posenc preset ``preset``."""
    def read(hf):
        out = fields.llama_core(hf, preset, tie_default=tie_default)
        n = out["model.num_layers"]
        window = hf.get("sliding_window")
        if hf.get("model_type") in ("qwen2", "qwen3"):
            use = hf.get("use_sliding_window", False)
            default = ["sliding_attention" if use and window and i >= hf.get("max_window_layers", 28)
                       else "full_attention" for i in range(n)]
            spans = fields.layer_spans(hf, n, default)
        else:
            spans = ["window" if window else "full"] * n
        fields.set_spans(out, hf, spans)
        return out
    return read


register("llama", Family("llama3", llama_like("llama3"), hf_params.llama_params))
register("mistral", Family("mistral", llama_like("mistral"), hf_params.llama_params))
register("qwen2", Family("qwen2", llama_like("qwen2"), hf_params.llama_params))
register("qwen3", Family("qwen3", llama_like("qwen3"), hf_params.llama_params))
register("phi3", Family("phi3", llama_like("phi3"), hf_params.llama_params))
