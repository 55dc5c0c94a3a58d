"""Names of every positional encoding, norm, placement and QK-norm.

Configs and error messages use these names; the model maps each name to an
implementation (``posenc.model.encodings``) and tests check that every name
here builds a model. Each entry: name -> (attach points, description).
Attach points are where the encoding touches attention: ``embed`` (adds a
vector per position), ``qk`` (rotates or scales queries and keys),
``logits`` (adds a bias to attention logits), ``values`` (adds a relative
term to the attention output).
"""

from __future__ import annotations

POSITION_KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "nope": ((), "no positional encoding (causal mask only)"),
    "sinusoidal": (("embed",), "fixed sinusoidal absolute embedding (Vaswani et al. 2017)"),
    "learned": (("embed",), "learned absolute table, GPT-2 init N(0, 0.02)"),
    "rope": (("qk",), "rotary embedding (Su et al. 2021), any frequency scaling in posenc.rope.KINDS"),
    "irope": (("qk",), "RoPE with NoPE every k-th layer and NoPE temperature (Llama 4)"),
    "xpos": (("qk",), "RoPE with exponential decay scaling (Sun et al. 2022)"),
    "alibi": (("logits",), "linear distance bias (Press et al. 2021)"),
    "t5": (("logits",), "bucketed learned relative bias (Raffel et al. 2020)"),
    "shaw": (("logits", "values"), "clipped relative key and value embeddings (Shaw et al. 2018)"),
    "transformer_xl": (("logits",), "sinusoidal relative terms with u, v biases (Dai et al. 2019)"),
    "kerple_log": (("logits",), "logarithmic kernelized bias (Chi et al. 2022)"),
    "kerple_power": (("logits",), "power kernelized bias (Chi et al. 2022)"),
    "fire": (("logits",), "functional interpolation bias with a learned MLP (Li et al. 2023)"),
    "cope": (("logits",), "contextual positions from gates (Golovneva et al. 2024)"),
}

NORM_KINDS: dict[str, str] = {
    "layer": "LayerNorm with bias",
    "layer_nobias": "LayerNorm without bias",
    "rms": "RMSNorm with gain g",
    "rms_offset": "RMSNorm with gain (1 + w), w init 0 (Gemma)",
    "scale": "ScaleNorm, one scalar gain init sqrt(D) (Nguyen & Salazar 2019)",
    "dyt": "Dynamic Tanh (Zhu et al. 2025)",
    "none": "identity",
}

PLACEMENTS: dict[str, str] = {
    "pre": "x + F(N(x)), final norm (GPT-2, Llama)",
    "post": "N(x + F(x)), no final norm (Vaswani, BERT)",
    "sandwich": "x + N_out(F(N_in(x))), final norm (Gemma 2/3, Peri-LN)",
    "reordered": "x + N(F(x)), final norm (OLMo 2, Swin v2)",
    "deepnorm": "N(alpha x + F(x)) with beta init scaling (Wang et al. 2022)",
    "mixln": "post-norm in the first fraction of layers, pre-norm after (Li et al. 2024)",
    "rezero": "x + a F(x), a init 0, no norm (Bachlechner et al. 2020)",
}

QK_NORMS: dict[str, str] = {
    "none": "no QK normalisation",
    "layer": "LayerNorm without bias over head_dim",
    "rms": "RMSNorm per head over head_dim (Gemma 3, Qwen 3)",
    "rms_full": "RMSNorm over the full q / k projection (OLMo 2)",
    "l2": "L2 normalisation with a learned temperature (cosine attention)",
}


def _check(kind: str, value, allowed) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"unknown {kind} {value!r}; choose one of: {', '.join(sorted(allowed))}")
    return value


def check_position_kind(name: str) -> str:
    """Return ``name`` if it is a registered position kind, else raise ValueError."""
    return _check("position kind", name, POSITION_KINDS)


def check_norm_kind(name: str) -> str:
    """Return ``name`` if it is a registered norm kind, else raise ValueError."""
    return _check("norm kind", name, NORM_KINDS)


def check_placement(name: str) -> str:
    """Return ``name`` if it is a registered residual placement, else raise ValueError."""
    return _check("norm placement", name, PLACEMENTS)


def check_qk_norm(name: str) -> str:
    """Return ``name`` if it is a registered QK-norm, else raise ValueError."""
    return _check("qk_norm", name, QK_NORMS)


def attach_points(name: str) -> tuple[str, ...]:
    """Where position kind ``name`` touches attention (see module docstring)."""
    return POSITION_KINDS[check_position_kind(name)][0]
