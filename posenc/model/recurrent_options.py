"""The options of each recurrent mixer kind, declared once: ``model.recurrent.<kind>.<option>``.

``model.layer_types`` names the token mixer of every layer (:data:`KINDS`):
``attention`` (the default: every layer as before) or a recurrent kind whose
options live here, one class per kind (``Option`` attributes, as the
encodings' options). The sizes are small CPU defaults; the presets and the
checkpoint loaders set the published ones. The mixers themselves are
``posenc.model.mixers``; the rules between these options and the rest of the
model are ``posenc.model.recurrent_spec``'s.

This module imports no model code (``posenc.model.config`` reads it to
declare the ``model.recurrent`` section).
"""

from __future__ import annotations

from posenc import checks
from posenc.model.options import Option, options_of

ATTENTION = "attention"
# mixer kinds of model.layer_types: attention, then the recurrent ones (posenc.model.mixers)
KINDS = (ATTENTION, "mamba2", "gated_deltanet", "kda", "short_conv", "parallel_mamba2")
MAMBA2_NORMS = ("full", "grouped", "none")
GDN_PROJECTIONS = ("qkvz", "split")


def _limit(name, value) -> tuple[float, float]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name} must be (low, high); got {value!r}")
    low, high = (checks.number(f"{name}[{i}]", v, minimum=0.0) for i, v in enumerate(value))
    if high and high < low:
        raise ValueError(f"{name} must have low <= high (high 0: no upper limit); got {value!r}")
    return float(low), float(high)


def _five(name, value) -> tuple[float, ...]:
    out = checks.positive_floats(name, value)
    if len(out) != 5:
        raise ValueError(f"{name} must hold 5 multipliers (z, x, B, C, dt); got {value!r}")
    return out


class MixerOptions:
    """Base of a kind's options: ``check`` relates them to the model, ``unused_options`` names those the
    configuration ignores (setting one is an error)."""

    kind = ""

    @classmethod
    def check(cls, values: dict, *, prefix: str, d_model: int) -> None:
        """Cross-option checks (ValueError naming ``prefix.<option>``)."""

    @classmethod
    def unused_options(cls, values: dict) -> tuple[str, ...]:
        return ()


class Segmented(MixerOptions):
    """Options of the kinds whose full pass can run segment by segment."""

    segment = Option(8192, checks.positive_int, "a full pass over more tokens runs in segments of this many, "
                     "the state carried (memory of the segment, not the sequence; the result equals one call)")


class Mamba2(Segmented):
    """model.recurrent.mamba2: the Mamba-2 mixer (transformers' Mamba2Mixer; Bamba, Granite 4.0-H,
    Nemotron-H, Falcon-H1's SSM branch)."""

    kind = "mamba2"
    state_size = Option(16, checks.positive_int, "N: the state per head and group (state_size / mamba_d_state)")
    head_dim = Option(16, checks.positive_int, "P: channels per head (head_dim / mamba_d_head)")
    num_heads = Option(0, checks.nonnegative_int, "H (num_heads / mamba_n_heads); 0: expand * d_model // head_dim")
    expand = Option(2, checks.positive_int, "the inner width expand * d_model when num_heads is 0")
    n_groups = Option(1, checks.positive_int, "G: groups of heads sharing B and C (n_groups / mamba_n_groups)")
    conv_width = Option(4, checks.positive_int, "W of the causal depthwise conv over xBC (conv_kernel / mamba_d_conv)")
    chunk_size = Option(256, checks.positive_int, "tokens per chunk of the SSD scan (training, prefill)")
    segment = Option(2048, checks.positive_int, "a full pass over more tokens runs in segments of this many, "
                     "the state carried (the SSD's chunk terms are chunk^2 per chunk: shorter than the others')")
    conv_bias = Option(True, checks.boolean, "the conv has a bias (use_conv_bias / mamba_conv_bias)")
    bias = Option(False, checks.boolean, "in_proj and out_proj have biases (use_bias / mamba_proj_bias)")
    dt_limit = Option((0.0, 0.0), _limit, "(low, high) clamp of softplus(dt + dt_bias) (time_step_limit); "
                                          "high 0: none", type=tuple)
    norm = Option("full", checks.one_of(*MAMBA2_NORMS),
                  "the gated RMS norm: full (over H P: Mamba-2, Bamba, Granite 4.0-H) | grouped (per group of "
                  "H P / G: Nemotron-H, Falcon-H1) | none (y * silu(z): Falcon-H1 mamba_rms_norm False)")
    norm_before_gate = Option(False, checks.boolean, "w * norm(y) * silu(z) instead of w * norm(y * silu(z)) "
                                                     "(Falcon-H1 mamba_norm_before_gate)")

    @classmethod
    def unused_options(cls, values):
        out = ("expand",) if values["num_heads"] else ()
        return out + (("norm_before_gate",) if values["norm"] == "none" else ())

    @classmethod
    def check(cls, values, *, prefix, d_model):
        heads = values["num_heads"] or values["expand"] * d_model // values["head_dim"]
        if not values["num_heads"] and (values["expand"] * d_model) % values["head_dim"]:
            raise ValueError(f"{prefix}.head_dim={values['head_dim']} must divide the inner width expand * d_model "
                             f"= {values['expand'] * d_model} (or set {prefix}.num_heads)")
        if heads % values["n_groups"]:
            raise ValueError(f"{prefix}.n_groups={values['n_groups']} must divide the {heads} heads")


class GatedDeltaNet(Segmented):
    """model.recurrent.gated_deltanet: Gated DeltaNet (transformers' Qwen3NextGatedDeltaNet, Qwen3.5)."""

    kind = "gated_deltanet"
    num_key_heads = Option(2, checks.positive_int, "Hk: query / key heads (linear_num_key_heads)")
    num_value_heads = Option(4, checks.positive_int, "Hv: value heads, a multiple of Hk (linear_num_value_heads)")
    key_head_dim = Option(16, checks.positive_int, "Dk (linear_key_head_dim)")
    value_head_dim = Option(16, checks.positive_int, "Dv (linear_value_head_dim)")
    conv_width = Option(4, checks.positive_int, "W of the causal conv over q, k, v (linear_conv_kernel_dim)")
    chunk_size = Option(64, checks.positive_int, "tokens per chunk of the delta rule (training, prefill)")
    projections = Option("qkvz", checks.one_of(*GDN_PROJECTIONS),
                         "qkvz: in_proj_qkvz and in_proj_ba grouped by key head (Qwen3-Next) | split: "
                         "in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (Qwen3.5)")

    @classmethod
    def check(cls, values, *, prefix, d_model):
        if values["num_value_heads"] % values["num_key_heads"]:
            raise ValueError(f"{prefix}.num_value_heads={values['num_value_heads']} must be a multiple of "
                             f"{prefix}.num_key_heads={values['num_key_heads']}")


class KDA(Segmented):
    """model.recurrent.kda: Kimi Delta Attention (transformers' KimiLinearDeltaAttention)."""

    kind = "kda"
    num_heads = Option(4, checks.positive_int, "H: heads of q, k and v (linear_attn_config num_heads)")
    head_dim = Option(16, checks.positive_int, "Dk = Dv per head (linear_attn_config head_dim)")
    conv_width = Option(4, checks.positive_int, "W of the causal convs over q, k, v (short_conv_kernel_size)")
    chunk_size = Option(64, checks.positive_int, "tokens per chunk of KDA (training, prefill)")
    lower_bound = Option(0.0, lambda n, v: checks.number(n, v, maximum=0.0),
                         "0: the gate -exp(A_log) softplus(f + dt_bias); c < 0: fla's bounded gate "
                         "c sigmoid(exp(A_log) (f + dt_bias)) (forget_gate_lower_bound)")


class ShortConv(Segmented):
    """model.recurrent.short_conv: LFM2's gated short convolution (transformers' Lfm2ShortConv)."""

    kind = "short_conv"
    conv_width = Option(3, checks.positive_int, "W of the causal depthwise conv (conv_L_cache)")
    bias = Option(False, checks.boolean, "in_proj, conv and out_proj have biases (conv_bias)")


class ParallelMamba2(MixerOptions):
    """model.recurrent.parallel_mamba2: Falcon-H1's layer, attention and Mamba-2 (its options:
    model.recurrent.mamba2) side by side on the same normed input, outputs added."""

    kind = "parallel_mamba2"
    attention_in_multiplier = Option(1.0, checks.positive, "the attention branch reads x times this "
                                                           "(attention_in_multiplier)")
    attention_out_multiplier = Option(1.0, checks.positive, "the attention branch's output times this "
                                                            "(attention_out_multiplier)")
    ssm_in_multiplier = Option(1.0, checks.positive, "the Mamba-2 branch reads x times this (ssm_in_multiplier)")
    ssm_out_multiplier = Option(1.0, checks.positive, "the Mamba-2 branch's output times this (ssm_out_multiplier)")
    ssm_multipliers = Option((1.0, 1.0, 1.0, 1.0, 1.0), _five,
                             "in_proj's [z | x | B | C | dt] parts times these (ssm_multipliers: the muP vector)",
                             type=tuple)


OPTIONS: dict[str, type[MixerOptions]] = {c.kind: c for c in (Mamba2, GatedDeltaNet, KDA, ShortConv, ParallelMamba2)}
# the option sections a mixer kind reads (parallel_mamba2's SSM branch is a Mamba-2 mixer)
SECTIONS = {"mamba2": ("mamba2",), "gated_deltanet": ("gated_deltanet",), "kda": ("kda",),
            "short_conv": ("short_conv",), "parallel_mamba2": ("parallel_mamba2", "mamba2")}
# kinds whose layer still has attention (and its position encoding, span, KV cache)
WITH_ATTENTION = (ATTENTION, "parallel_mamba2")


def options(kind: str) -> dict[str, Option]:
    """The ``Option``s of recurrent kind ``kind``."""
    return options_of(OPTIONS[kind])
