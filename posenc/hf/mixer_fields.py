"""The ``config.json`` readers of the recurrent mixers: ``model.layer_types`` and ``model.recurrent.*``.

Each helper turns a hybrid checkpoint's mixer sizes into dotted
``model.recurrent.<kind>.*`` fields (or refuses, in one line naming the
field, what posenc's mixer cannot compute). The family modules of the hybrids
(:mod:`posenc.hf.families`) compose them with :mod:`posenc.hf.fields`.
"""

from __future__ import annotations

import math

from posenc.hf.registry import unsupported


def mixers(hf: dict, n: int, types, mixer_of: dict, *, field="layer_types") -> tuple[str, ...]:
    """posenc's mixer per layer of the HF layer types ``types`` (``mixer_of``: HF type -> posenc kind)."""
    if len(types) != n:
        raise unsupported(hf, field, f"{len(types)} entries for {n} layers")
    for t in types:
        if t not in mixer_of:
            raise unsupported(hf, field, f"layer type {t!r}; posenc's are {', '.join(mixer_of)}")
    return tuple(mixer_of[t] for t in types)


def _number(value) -> float:
    if isinstance(value, dict) and "__float__" in value:  # transformers' JSON of inf / nan
        value = value["__float__"]
    return float(value)


def dt_limit(hf: dict, key="time_step_limit") -> tuple[float, float]:
    """posenc's (low, high) clamp of the time step (high 0: none) of HF's ``time_step_limit``."""
    value = hf.get(key) or (0.0, math.inf)
    low, high = (_number(v) for v in value)
    return (low, 0.0 if math.isinf(high) else high)


def mamba2(hf: dict, *, prefix="mamba_", norm="full", chunk_default=256, keys=None) -> dict:
    """model.recurrent.mamba2 of the config's Mamba-2 sizes (``prefix``: mamba_d_state, mamba_n_heads, ...;
    ``keys`` names others in full, e.g. {"n_heads": "mamba_num_heads"})."""
    names = ("d_state", "d_head", "n_heads", "n_groups", "d_conv", "conv_bias", "proj_bias", "expand", "chunk_size")
    key = {**{k: prefix + k for k in names}, **(keys or {})}
    heads, head_dim = int(hf[key["n_heads"]]), int(hf[key["d_head"]])
    expand = hf.get(key["expand"])
    if expand is not None and int(expand * int(hf["hidden_size"])) != heads * head_dim:
        raise unsupported(hf, key["expand"], f"the inner width expand * hidden_size must be "
                          f"{key['n_heads']} * {key['d_head']} = {heads * head_dim}")
    p = "model.recurrent.mamba2."
    return {p + "state_size": int(hf[key["d_state"]]), p + "head_dim": head_dim, p + "num_heads": heads,
            p + "n_groups": int(hf.get(key["n_groups"], 1)), p + "conv_width": int(hf.get(key["d_conv"], 4)),
            p + "conv_bias": bool(hf.get(key["conv_bias"], True)), p + "bias": bool(hf.get(key["proj_bias"], False)),
            p + "chunk_size": int(hf.get(key["chunk_size"]) or chunk_default), p + "dt_limit": dt_limit(hf),
            p + "norm": norm}
