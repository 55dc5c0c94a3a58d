"""A checkpoint's RoPE as posenc ``model.position.rope.*`` fields.

:func:`rope_params` reads the RoPE parameters of a ``config.json`` in
transformers 5's form (``rope_parameters``, per layer type where the config
has several) or 4.x's (``rope_theta``, ``rope_scaling`` and
``partial_rotary_factor`` at the top level); :func:`rope_options` turns them
into posenc ``rope.*`` options (scalings default, linear, dynamic, yarn,
longrope, llama3; any other is refused in one line).
"""

from __future__ import annotations

from posenc.model import ENCODINGS
from posenc.model import options as options_lib


def rope_params(hf: dict, layer_type: str | None = None) -> dict:
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


def rope_options(hf: dict, p: dict) -> dict:
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


def prefixed(opts: dict, prefix: str) -> dict:
    """``opts`` with every key behind ``prefix`` (``"model.position.rope."``)."""
    return {f"{prefix}{k}": v for k, v in opts.items()}


def set_rope(out: dict, opts: dict) -> None:
    """The checkpoint's RoPE options in place of the preset's."""
    for k in [k for k in out if k.startswith("model.position.rope.")]:
        del out[k]
    out.update(prefixed(opts, "model.position.rope."))


def default_of(option: str):
    """The default of posenc's RoPE ``option`` (what a per-layer rule resets it to)."""
    return options_lib.options_of(ENCODINGS["rope"])[option].default
