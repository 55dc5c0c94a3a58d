"""The model families of ``posenc.hf``: each HF ``config.json`` as posenc fields, each tensor's place.

A :class:`Family` maps a checkpoint's config to dotted ``model.*`` fields
(its preset of ``posenc.model.presets`` plus the checkpoint's values) and its
tensors (HF names, torch ``[out, in]`` layout) to posenc's flat parameter
paths (:mod:`posenc.hf.hf_params`). Every config field that would change the computation and that posenc
cannot express is refused by name (:func:`unsupported`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from posenc.attention import mla
from posenc.hf import hf_params
from posenc.model import encoding, presets
from posenc.model import options as options_lib

SPAN_OF = {"full_attention": "full", "sliding_attention": "window", "chunked_attention": "chunk"}


def unsupported(hf: dict, field: str, why: str):
    value = hf.get(field)
    return ValueError(f"unsupported field {field}={value!r} in config.json "
                      f"(model_type {hf.get('model_type')!r}): {why}")


@dataclasses.dataclass(frozen=True)
class Family:
    preset: str
    fields: Callable[[dict], dict]
    params: Callable  # (hf, tensors, spec) -> {path: array}


# -- config --------------------------------------------------------------------------------

def _rope_params(hf: dict, layer_type: str | None = None) -> dict:
    """The RoPE parameters in transformers 5's form: {rope_type, rope_theta, ...} (4.x read too)."""
    rp = hf.get("rope_parameters")
    if isinstance(rp, dict) and layer_type is not None and layer_type in rp:
        rp = rp[layer_type]
    if isinstance(rp, dict) and ("rope_type" in rp or "rope_theta" in rp):
        p = dict(rp)
    else:  # 4.x: rope_theta, rope_scaling, partial_rotary_factor at the top level
        # (Gemma 3's rope_scaling is its global layers'; its window layers rotate plainly)
        p = {} if layer_type == "sliding_attention" else dict(hf.get("rope_scaling") or {})
        if "type" in p and "rope_type" not in p:
            p["rope_type"] = p.pop("type")
        gemma3 = hf.get("model_type") == "gemma3_text"
        theta = "rope_local_base_freq" if gemma3 and layer_type == "sliding_attention" else "rope_theta"
        default = (1e6 if theta == "rope_theta" else 10000.0) if gemma3 else None
        p.setdefault("rope_theta", hf.get(theta, hf.get("rotary_emb_base", default or 10000.0)))
        for key in ("partial_rotary_factor", "original_max_position_embeddings"):
            if key in hf and key not in p:
                p[key] = hf[key]
        if "rotary_pct" in hf:
            p.setdefault("partial_rotary_factor", hf["rotary_pct"])
    p.setdefault("rope_type", "default")
    if "original_max_position_embeddings" in hf:
        p.setdefault("original_max_position_embeddings", hf["original_max_position_embeddings"])
    return p


def _rope_options(hf: dict, p: dict) -> dict:
    """posenc ``rope.*`` options of HF RoPE parameters ``p``."""
    kind = p["rope_type"]
    opts = {"base": float(p["rope_theta"]), "angles": "canonical"}
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        opts["rotary_fraction"] = float(p["partial_rotary_factor"])
    max_pos = hf.get("max_position_embeddings")
    original = p.get("original_max_position_embeddings")
    if kind == "default":
        return opts
    if kind not in ("linear", "dynamic", "yarn", "longrope", "llama3"):
        raise ValueError(f"unsupported field rope_type={kind!r} in config.json: posenc's RoPE "
                         "scalings are default, linear, dynamic, yarn, longrope, llama3")
    opts["scaling"] = kind
    if kind in ("linear", "llama3", "yarn", "dynamic"):
        opts["factor"] = float(p["factor"])
    if kind == "dynamic":  # HF: the config's max_position_embeddings is the original length
        opts["original_length"] = int(max_pos)
    if kind == "llama3":
        opts.update(original_length=int(original), low_freq_factor=float(p["low_freq_factor"]),
                    high_freq_factor=float(p["high_freq_factor"]))
    if kind == "yarn":
        opts["original_length"] = int(original or max_pos)
        for hf_key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
            if p.get(hf_key) is not None:
                opts[hf_key] = float(p[hf_key])
        if "truncate" in p:
            opts["truncate"] = bool(p["truncate"])
    if kind == "longrope":
        opts.update(original_length=int(original),
                    factor=float(p["factor"]) if p.get("factor") else max_pos / original,
                    short_factor=tuple(float(x) for x in p["short_factor"]),
                    long_factor=tuple(float(x) for x in p["long_factor"]))
        if p.get("attention_factor") is not None:
            opts["attention_factor"] = float(p["attention_factor"])
    return opts


def _prefixed(opts: dict, prefix: str) -> dict:
    return {f"{prefix}{k}": v for k, v in opts.items()}


def _spans(spans: list[str]) -> dict:
    """Span fields for per-layer spans: one span, a global_every pattern, or explicit layer_spans."""
    kinds = sorted(set(spans) - {"full"})
    if not kinds:
        return {"model.attention_span": "full", "model.global_every": 0, "model.layer_spans": ()}
    if len(kinds) == 1 and "full" not in spans:
        return {"model.attention_span": kinds[0], "model.global_every": 0, "model.layer_spans": ()}
    if len(kinds) == 1:
        k = spans.index("full") + 1
        if all(s == ("full" if (i + 1) % k == 0 else kinds[0]) for i, s in enumerate(spans)):
            return {"model.attention_span": kinds[0], "model.global_every": k,
                    "model.layer_spans": ()}
    return {"model.attention_span": "full", "model.global_every": 0,
            "model.layer_spans": tuple(spans)}


def _layer_spans(hf: dict, n: int, default: list[str]) -> list[str]:
    types = hf.get("layer_types") or default
    if len(types) != n:
        raise unsupported(hf, "layer_types", f"{len(types)} entries for {n} layers")
    for t in types:
        if t not in SPAN_OF:
            raise unsupported(hf, "layer_types", f"layer type {t!r}; posenc's are "
                              f"{', '.join(SPAN_OF)}")
    return [SPAN_OF[t] for t in types]


def _base(hf: dict, preset: str, *, eps_key="rms_norm_eps", tie_default=False) -> dict:
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


def _act(hf: dict, key: str, allowed: dict) -> str:
    act = hf.get(key, next(iter(allowed)))
    if act not in allowed:
        raise unsupported(hf, key, f"the activations posenc has here: {', '.join(allowed)}")
    return allowed[act]


def _refuse(hf: dict, fields: dict) -> None:
    """Refuse every field whose value is not one posenc computes (``{field: (ok values, why)}``)."""
    for field, (ok, why) in fields.items():
        if field in hf and hf[field] not in ok:
            raise unsupported(hf, field, why)


def _llama_core(hf: dict, preset: str, *, tie_default=False, o_bias=True,
                eps_key="rms_norm_eps") -> dict:
    """Sizes, the gated MLP, biases and the checkpoint's RoPE of a Llama-like layer."""
    _refuse(hf, {"pretraining_tp": ((None, 1), "tensor-parallel slicing changes the sums")})
    if hf.get("mlp_bias") and not hf.get("attention_bias"):
        raise unsupported(hf, "mlp_bias", "an MLP bias needs attention_bias too (model.bias 'all')")
    out = _base(hf, preset, eps_key=eps_key, tie_default=tie_default)
    out["model.mlp"] = _act(hf, "hidden_act", {"silu": "swiglu"})
    if hf.get("attention_bias"):
        out["model.bias"] = "all" if hf.get("mlp_bias") else ("attention" if o_bias else "qkv")
    elif hf.get("model_type") == "qwen2":
        out["model.bias"] = "qkv"
    _set_rope(out, _rope_options(hf, _rope_params(hf)))
    return out


def _set_rope(out: dict, opts: dict) -> None:
    """The checkpoint's RoPE options in place of the preset's."""
    for k in [k for k in out if k.startswith("model.position.rope.")]:
        del out[k]
    out.update(_prefixed(opts, "model.position.rope."))


def _set_spans(out: dict, hf: dict, spans: list[str]) -> None:
    """Span fields and the window of ``spans`` (a window layer needs the config's sliding_window)."""
    out.update(_spans(spans))
    window = hf.get("sliding_window")
    if "window" in spans and not window:
        raise unsupported(hf, "sliding_window", "layer_types has sliding_attention layers")
    out["model.attention_window"] = int(window) if "window" in spans else 0


def _nope(out: dict, layers) -> None:
    """Layers without RoPE (iRoPE-style NoPE layers) as a model.position.layers rule."""
    nope = tuple(layers)
    out["model.position.layers"] = ({"layers": nope, "kind": "nope"},) if nope else ()


def _llama_like(preset: str, tie_default=False):
    def fields(hf):
        out = _llama_core(hf, preset, tie_default=tie_default)
        n = out["model.num_layers"]
        window = hf.get("sliding_window")
        if hf.get("model_type") in ("qwen2", "qwen3"):
            use = hf.get("use_sliding_window", False)
            default = ["sliding_attention" if use and window and i >= hf.get("max_window_layers", 28)
                       else "full_attention" for i in range(n)]
            spans = _layer_spans(hf, n, default)
        else:
            spans = ["window" if window else "full"] * n
        _set_spans(out, hf, spans)
        return out
    return fields


def _rope_by_type(hf: dict, out: dict, spans: list[str]) -> None:
    """One RoPE per layer type (Gemma 3, OLMo 3): the window layers' in the section, the others
    as model.position.layers rules."""
    types = [t for t, s in SPAN_OF.items() if s in spans]
    by_type = {t: _rope_options(hf, _rope_params(hf, t)) for t in types}
    first = "sliding_attention" if "sliding_attention" in by_type else types[0]
    _set_rope(out, by_type[first])
    rules = []
    for t, opts in by_type.items():
        changed = {f"rope.{k}": v for k, v in opts.items() if by_type[first].get(k) != v}
        changed.update({f"rope.{k}": _default_of(k) for k in by_type[first] if k not in opts})
        if changed:
            layers = tuple(i for i, s in enumerate(spans) if s == SPAN_OF[t])
            rules.append({"layers": layers, **changed})
    out["model.position.layers"] = tuple(rules)


def _gemma(preset: str):
    def fields(hf):
        _refuse(hf, {"attention_bias": ((False,), "posenc's Gemma layers have no biases"),
                     "use_bidirectional_attention": ((None, False), "posenc decodes causally")})
        out = _base(hf, preset, tie_default=True)
        out["model.mlp"] = _act(hf, "hidden_activation",
                                {"gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"})
        n = out["model.num_layers"]
        every = 2 if preset == "gemma2" else hf.get("sliding_window_pattern", 6)
        spans = _layer_spans(hf, n, ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                                     for i in range(n)])
        out.update(_spans(spans))
        out["model.attention_window"] = int(hf["sliding_window"]) if "window" in spans else 0
        out["model.attention_scale"] = float(hf.get("query_pre_attn_scalar", 256)) ** -0.5
        out["model.norm.attn_softcap"] = float(hf.get("attn_logit_softcapping") or 0.0)
        out["model.norm.final_softcap"] = float(hf.get("final_logit_softcapping") or 0.0)
        if preset == "gemma2":
            _set_rope(out, _rope_options(hf, _rope_params(hf)))
        else:
            _rope_by_type(hf, out, spans)
        return out
    return fields


def _every(n: int, k: int, first: str, other: str) -> list[str]:
    """Layer types of an HF pattern: every k-th layer (k - 1, 2k - 1, ...) ``other``."""
    return [other if (i + 1) % k == 0 else first for i in range(n)]


def _olmo2_fields(hf):
    out = _llama_core(hf, "olmo2")
    _set_spans(out, hf, ["full"] * out["model.num_layers"])
    return out


def _olmo3_fields(hf):
    out = _llama_core(hf, "olmo3")
    spans = _layer_spans(hf, out["model.num_layers"],
                         _every(out["model.num_layers"], 4, "sliding_attention", "full_attention"))
    _set_spans(out, hf, spans)
    _rope_by_type(hf, out, spans)
    return out


def _smollm3_fields(hf):
    out = _llama_core(hf, "smollm3", tie_default=True)
    n = out["model.num_layers"]
    interval = hf.get("no_rope_layer_interval", 4)
    rope_layers = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if len(rope_layers) != n:
        raise unsupported(hf, "no_rope_layers", f"{len(rope_layers)} entries for {n} layers")
    use = hf.get("use_sliding_window", False) and hf.get("sliding_window") is not None
    spans = _layer_spans(hf, n, ["sliding_attention" if use and not r else "full_attention"
                                 for r in rope_layers])
    if "window" in spans and not use:
        raise unsupported(hf, "use_sliding_window", "layer_types has sliding_attention layers")
    _set_spans(out, hf, spans)
    _nope(out, (i for i, r in enumerate(rope_layers) if not r))
    return out


def _exaone4_fields(hf):
    out = _llama_core(hf, "exaone4")
    n = out["model.num_layers"]
    window = hf.get("sliding_window")
    pattern = hf.get("sliding_window_pattern") or 0
    if isinstance(pattern, str):  # "LLLG": L local (window), G global
        pattern = [pattern[i % len(pattern)] for i in range(n)]
        default = ["sliding_attention" if c == "L" else "full_attention" for c in pattern]
    else:
        default = (_every(n, int(pattern), "sliding_attention", "full_attention")
                   if window and pattern else ["full_attention"] * n)
    spans = _layer_spans(hf, n, default)
    _set_spans(out, hf, spans)
    # HF: with a window, only the window layers rotate (the global layers are NoPE)
    _nope(out, (i for i, s in enumerate(spans) if window and s != "window"))
    return out


def _glm4_fields(hf):
    out = _llama_core(hf, "glm4", o_bias=False)  # GLM-4: q / k / v biases, none on o_proj
    p = _rope_params(hf)
    p.setdefault("partial_rotary_factor", 0.5)
    _set_rope(out, _rope_options(hf, p))
    out["model.position.rope.layout"] = "interleaved"  # GLM rotates pairs (2i, 2i + 1)
    _set_spans(out, hf, ["full"] * out["model.num_layers"])
    return out


def _cohere2_fields(hf):
    out = _llama_core(hf, "cohere2", tie_default=True, eps_key="layer_norm_eps")
    out["model.position.rope.layout"] = "interleaved"  # Cohere interleaves the frequencies
    n = out["model.num_layers"]
    spans = _layer_spans(hf, n, _every(n, hf.get("sliding_window_pattern", 4), "sliding_attention",
                                       "full_attention"))
    _set_spans(out, hf, spans)
    _nope(out, (i for i, s in enumerate(spans) if s != "window"))  # only the window layers rotate
    out["model.logits_multiplier"] = float(hf.get("logit_scale", 0.0625))
    return out


def _qwen3_next_fields(hf):
    """Qwen3-Next's full-attention layers: gated attention (each head's gate after its query in
    q_proj), (1 + w) RMSNorms, per-head qk-norm, partial RoPE and dense MLPs."""
    n = int(hf["num_hidden_layers"])
    every = hf.get("full_attention_interval", 4)  # HF's layer_types when the config has none
    types = hf.get("layer_types") or _every(n, every, "linear_attention", "full_attention")
    linear = [i for i, t in enumerate(types) if t == "linear_attention"]
    if linear:
        raise ValueError(f"unsupported linear-attention layers {linear} in config.json (model_type "
                         "'qwen3_next'): Gated DeltaNet is not in posenc (a checkpoint whose "
                         "layer_types are all full_attention loads)")
    experts, step = hf.get("num_experts", 512), hf.get("decoder_sparse_step", 1)
    dense = set(hf.get("mlp_only_layers") or ())
    moe = [i for i in range(n) if i not in dense and experts and step and (i + 1) % step == 0]
    if moe:
        raise ValueError(f"unsupported mixture-of-experts layers {moe} in config.json (model_type "
                         f"'qwen3_next', num_experts={experts}): posenc's MLPs are dense (a "
                         "checkpoint with num_experts=0 or every layer in mlp_only_layers loads)")
    out = _llama_core(hf, "qwen3")
    p = _rope_params(hf)
    p.setdefault("partial_rotary_factor", 0.25)  # HF's default for Qwen3-Next
    _set_rope(out, _rope_options(hf, p))
    _set_spans(out, hf, _layer_spans(hf, n, types))
    out["model.norm.kind"] = "rms_offset"  # (1 + w) gains, also on q_norm / k_norm
    out["model.attention_gate"] = "elementwise"
    return out


def _deepseek_v3_fields(hf):
    """DeepSeek-V3's dense layers: multi-head latent attention (model.mla), RoPE on the rotary parts
    (interleaved pairs with rope_interleave), the softmax scale times YaRN's mscale_all_dim squared."""
    n = int(hf["num_hidden_layers"])
    dense = hf.get("first_k_dense_replace", 3)  # HF's default
    if dense is None or int(dense) < n:
        start = 0 if dense is None else int(dense)
        raise unsupported(hf, "first_k_dense_replace", f"layers {start}..{n - 1} are mixture-of-experts "
                          f"(n_routed_experts={hf.get('n_routed_experts')}), which posenc does not have; "
                          f"a checkpoint with first_k_dense_replace >= num_hidden_layers ({n}) loads")
    heads = int(hf["num_attention_heads"])
    _refuse(hf, {"attention_bias": ((False,), "posenc's MLA has no biases"),
                 "num_key_value_heads": ((None, heads), "MLA's keys have every head (HF repeats them)"),
                 "pretraining_tp": ((None, 1), "tensor-parallel slicing changes the sums")})
    out = _base(hf, "deepseek_v3")
    out["model.mlp"] = _act(hf, "hidden_act", {"silu": "swiglu"})
    nope, rope_dim = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"])
    out.update({"model.num_kv_heads": 0, "model.head_dim": nope + rope_dim,
                "model.mla.kv_lora_rank": int(hf["kv_lora_rank"]),
                "model.mla.q_lora_rank": int(hf.get("q_lora_rank") or 0),
                "model.mla.qk_nope_head_dim": nope, "model.mla.qk_rope_head_dim": rope_dim,
                "model.mla.v_head_dim": int(hf["v_head_dim"])})
    p = _rope_params(hf)
    _set_rope(out, _rope_options(hf, p))
    out["model.position.rope.layout"] = "interleaved" if hf.get("rope_interleave", True) else "half"
    # transformers' yarn_apply_mscale: any scaled RoPE with mscale_all_dim multiplies the softmax scale
    all_dim = p.get("mscale_all_dim") if p["rope_type"] != "default" else None
    out["model.attention_scale"] = mla.softmax_scale(nope + rope_dim, factor=float(p.get("factor") or 1.0),
                                                     mscale=float(all_dim or 0.0))
    _set_spans(out, hf, ["full"] * n)
    return out


def _default_of(option: str):
    return options_lib.options_of(encoding.get("rope"))[option].default


def _llama4_fields(hf):
    moe = hf.get("moe_layers")
    if moe is None:
        step = hf.get("interleave_moe_layer_step", 1)
        moe = list(range(step - 1, hf["num_hidden_layers"], step)) if step else []
    if moe:
        raise unsupported(hf, "moe_layers", f"layers {moe} are mixture-of-experts, which posenc does "
                          "not have (a text model with moe_layers=[] loads)")
    _refuse(hf, {"attention_bias": ((False,), "posenc's Llama 4 layers have no biases")})
    hf = {**hf, "intermediate_size": hf.get("intermediate_size_mlp", hf.get("intermediate_size"))}
    out = _base(hf, "llama4")
    out["model.mlp"] = _act(hf, "hidden_act", {"silu": "swiglu"})
    n = out["model.num_layers"]
    interval = hf.get("no_rope_layer_interval", 4)
    rope_layers = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    chunk = hf.get("attention_chunk_size")
    spans = _layer_spans(hf, n, ["chunked_attention" if r and chunk else "full_attention"
                                 for r in rope_layers])
    out.update(_spans(spans))
    out["model.attention_chunk"] = int(chunk) if "chunk" in spans else 0
    for k in [k for k in out if k.startswith("model.position.rope.")]:
        del out[k]
    out.update(_prefixed(_rope_options(hf, _rope_params(hf)), "model.position.rope."))
    out["model.position.rope.layout"] = "interleaved"  # Llama 4 rotates complex pairs (2i, 2i + 1)
    nope = tuple(i for i, r in enumerate(rope_layers) if not r)
    out["model.position.layers"] = ({"layers": nope, "kind": "nope"},) if nope else ()
    if not hf.get("use_qk_norm", True):
        out.update({"model.norm.qk_norm": "none", "model.norm.qk_norm_layers": "all",
                    "model.norm.qk_norm_after_rope": False})
    if hf.get("attn_temperature_tuning", True) and nope:
        out["model.logit_scale.floor_scale"] = float(hf.get("floor_scale", 8192))
        out["model.logit_scale.attn_scale"] = float(hf.get("attn_scale", 0.1))
    else:
        out.update({"model.logit_scale.kind": "none", "model.logit_scale.layers": "all",
                    "model.logit_scale.floor_scale": 8192.0, "model.logit_scale.attn_scale": 0.1})
    if not nope and out["model.norm.qk_norm"] != "none":
        out["model.norm.qk_norm_layers"] = "all"
    return out


def _neox_fields(hf):
    out = _base(hf, "gpt_neox", eps_key="layer_norm_eps")
    if not hf.get("attention_bias", True):
        raise unsupported(hf, "attention_bias", "GPT-NeoX's MLP keeps its biases; posenc's bias "
                          "choice 'all' needs the attention biases too")
    out["model.mlp"] = _act(hf, "hidden_act", {"gelu": "gelu_erf", "gelu_new": "gelu",
                                               "gelu_pytorch_tanh": "gelu"})
    out["model.parallel_residual"] = bool(hf.get("use_parallel_residual", True))
    for k in [k for k in out if k.startswith("model.position.rope.")]:
        del out[k]
    p = _rope_params(hf)
    p.setdefault("partial_rotary_factor", 0.25)
    out.update(_prefixed(_rope_options(hf, p), "model.position.rope."))
    return out


def _bloom_fields(hf):
    _refuse(hf, {"apply_residual_connection_post_layernorm": ((False,), "posenc's residual adds "
                                                              "the block input"),
                 "pretraining_tp": ((None, 1), "tensor-parallel slicing changes the sums")})
    hf = {**hf, "hidden_size": hf.get("hidden_size", hf.get("n_embed")),
          "num_hidden_layers": hf.get("n_layer"), "num_attention_heads": hf.get("n_head")}
    out = _base(hf, "bloom", eps_key="layer_norm_epsilon", tie_default=True)
    out["model.mlp_hidden"] = 4 * out["model.d_model"]
    return out


_P = hf_params
_reordered = functools.partial(_P.llama_params, norms=_P.REORDERED_NORMS)

FAMILIES: dict[str, Family] = {
    "llama": Family("llama3", _llama_like("llama3"), _P.llama_params),
    "mistral": Family("mistral", _llama_like("mistral"), _P.llama_params),
    "qwen2": Family("qwen2", _llama_like("qwen2"), _P.llama_params),
    "qwen3": Family("qwen3", _llama_like("qwen3"), _P.llama_params),
    "qwen3_next": Family("qwen3", _qwen3_next_fields, _P.llama_params),
    "phi3": Family("phi3", _llama_like("phi3"), _P.llama_params),
    "smollm3": Family("smollm3", _smollm3_fields, _P.llama_params),
    "gemma2": Family("gemma2", _gemma("gemma2"), _P.llama_params),
    "gemma3_text": Family("gemma3", _gemma("gemma3"), _P.llama_params),
    "llama4_text": Family("llama4", _llama4_fields,
                          functools.partial(_P.llama_params, mlp="feed_forward")),
    "olmo2": Family("olmo2", _olmo2_fields, _reordered),
    "olmo3": Family("olmo3", _olmo3_fields, _reordered),
    "exaone4": Family("exaone4", _exaone4_fields, _reordered),
    "glm4": Family("glm4", _glm4_fields, functools.partial(_P.llama_params, norms=_P.GLM4_NORMS)),
    "cohere2": Family("cohere2", _cohere2_fields,
                      functools.partial(_P.llama_params, norms=_P.PARALLEL_NORMS)),
    "gpt_neox": Family("gpt_neox", _neox_fields, _P.neox_params),
    "bloom": Family("bloom", _bloom_fields, _P.bloom_params),
    "deepseek_v3": Family("deepseek_v3", _deepseek_v3_fields, _P.deepseek_v3_params),
}


def family(hf: dict) -> Family:
    """The family of a ``config.json``; ValueError naming an unsupported architecture."""
    kind = hf.get("model_type")
    if kind not in FAMILIES:
        arch = hf.get("architectures")
        raise ValueError(f"unsupported architecture model_type={kind!r} (architectures {arch}); "
                         f"posenc.hf loads: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[kind]
