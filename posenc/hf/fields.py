"""The ``config.json`` readers the families share: sizes, activations, refusals, spans, a Llama-like layer.

Each helper turns part of an HF config into dotted ``model.*`` fields (or
refuses a value posenc cannot compute, in one line naming the field). A
family module (:mod:`posenc.hf.families`) composes them into its
``fields(hf)``.
"""

from __future__ import annotations

from posenc.hf import rope_fields
from posenc.hf.registry import unsupported
from posenc.model import presets

# HF layer_types -> posenc attention spans
SPAN_OF = {"full_attention": "full", "sliding_attention": "window", "chunked_attention": "chunk"}


def base(hf: dict, preset: str, *, eps_key="rms_norm_eps", tie_default=False) -> dict:
    """The preset's fields with the checkpoint's sizes, head layout, tying and norm epsilon."""
    heads = int(hf["num_attention_heads"])
    out = presets.get(preset)
    out.update({
        "model.vocab_size": int(hf["vocab_size"]),
        "model.d_model": int(hf["hidden_size"]),
        "model.num_layers": int(hf["num_hidden_layers"]),
        "model.num_heads": heads,
        "model.num_kv_heads": int(hf.get("num_key_value_heads") or heads),
        "model.head_dim": int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
        "model.tie_embeddings": bool(hf.get("tie_word_embeddings", tie_default)),
        "model.norm.eps": float(hf.get(eps_key, out.get("model.norm.eps", 1e-6))),
        "model.position.layers": (),
    })
    if "intermediate_size" in hf:
        out["model.mlp_hidden"] = int(hf["intermediate_size"])
    return out


def act(hf: dict, key: str, allowed: dict) -> str:
    """posenc's MLP of the checkpoint's activation ``hf[key]`` (``allowed``: HF name -> posenc MLP)."""
    value = hf.get(key, next(iter(allowed)))
    if value not in allowed:
        raise unsupported(hf, key, f"the activations posenc has here: {', '.join(allowed)}")
    return allowed[value]


def refuse(hf: dict, fields: dict) -> None:
    """Refuse every field whose value is not one posenc computes (``{field: (ok values, why)}``)."""
    for field, (ok, why) in fields.items():
        if field in hf and hf[field] not in ok:
            raise unsupported(hf, field, why)


def spans(layer_spans: list[str]) -> dict:
    """Span fields for per-layer spans: one span, a global_every pattern, or explicit layer_spans."""
    kinds = sorted(set(layer_spans) - {"full"})
    if not kinds:
        return {"model.attention_span": "full", "model.global_every": 0, "model.layer_spans": ()}
    if len(kinds) == 1 and "full" not in layer_spans:
        return {"model.attention_span": kinds[0], "model.global_every": 0, "model.layer_spans": ()}
    if len(kinds) == 1:
        k = layer_spans.index("full") + 1
        if all(s == ("full" if (i + 1) % k == 0 else kinds[0]) for i, s in enumerate(layer_spans)):
            return {"model.attention_span": kinds[0], "model.global_every": k,
                    "model.layer_spans": ()}
    return {"model.attention_span": "full", "model.global_every": 0,
            "model.layer_spans": tuple(layer_spans)}


def layer_spans(hf: dict, n: int, default: list[str]) -> list[str]:
    """posenc spans of the config's ``layer_types`` (``default``: HF's when the config has none)."""
    types = hf.get("layer_types") or default
    if len(types) != n:
        raise unsupported(hf, "layer_types", f"{len(types)} entries for {n} layers")
    for t in types:
        if t not in SPAN_OF:
            raise unsupported(hf, "layer_types", f"layer type {t!r}; posenc's are "
                              f"{', '.join(SPAN_OF)}")
    return [SPAN_OF[t] for t in types]


def set_spans(out: dict, hf: dict, layer_spans: list[str]) -> None:
    """Span fields and the window of ``layer_spans`` (a window layer needs the config's sliding_window)."""
    out.update(spans(layer_spans))
    window = hf.get("sliding_window")
    if "window" in layer_spans and not window:
        raise unsupported(hf, "sliding_window", "layer_types has sliding_attention layers")
    out["model.attention_window"] = int(window) if "window" in layer_spans else 0


def every(n: int, k: int, first: str, other: str) -> list[str]:
    """Layer types of an HF pattern: every k-th layer (k - 1, 2k - 1, ...) ``other``."""
    return [other if (i + 1) % k == 0 else first for i in range(n)]


def nope(out: dict, layers) -> None:
    """Layers without RoPE (iRoPE-style NoPE layers) as a model.position.layers rule."""
    nope_layers = tuple(layers)
    out["model.position.layers"] = ({"layers": nope_layers, "kind": "nope"},) if nope_layers else ()


def llama_core(hf: dict, preset: str, *, tie_default=False, o_bias=True,
               eps_key="rms_norm_eps") -> dict:
    """Sizes, the gated MLP, biases and the checkpoint's RoPE of a Llama-like layer."""
    refuse(hf, {"pretraining_tp": ((None, 1), "tensor-parallel slicing changes the sums")})
    if hf.get("mlp_bias") and not hf.get("attention_bias"):
        raise unsupported(hf, "mlp_bias", "an MLP bias needs attention_bias too (model.bias 'all')")
    out = base(hf, preset, eps_key=eps_key, tie_default=tie_default)
    out["model.mlp"] = act(hf, "hidden_act", {"silu": "swiglu"})
    if hf.get("attention_bias"):
        out["model.bias"] = "all" if hf.get("mlp_bias") else ("attention" if o_bias else "qkv")
    elif hf.get("model_type") == "qwen2":
        out["model.bias"] = "qkv"
    rope_fields.set_rope(out, rope_fields.rope_options(hf, rope_fields.rope_params(hf)))
    return out


def rope_by_type(hf: dict, out: dict, layer_spans: list[str]) -> None:
    """One RoPE per layer type (Gemma 3, OLMo 3): the window layers' in the section, the others
    as model.position.layers rules."""
    types = [t for t, s in SPAN_OF.items() if s in layer_spans]
    by_type = {t: rope_fields.rope_options(hf, rope_fields.rope_params(hf, t)) for t in types}
    first = "sliding_attention" if "sliding_attention" in by_type else types[0]
    rope_fields.set_rope(out, by_type[first])
    rules = []
    for t, opts in by_type.items():
        changed = {f"rope.{k}": v for k, v in opts.items() if by_type[first].get(k) != v}
        changed.update({f"rope.{k}": rope_fields.default_of(k) for k in by_type[first] if k not in opts})
        if changed:
            layers = tuple(i for i, s in enumerate(layer_spans) if s == SPAN_OF[t])
            rules.append({"layers": layers, **changed})
    out["model.position.layers"] = tuple(rules)
