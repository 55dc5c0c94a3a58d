"""Nemotron-H: Mamba-2 and NoPE attention blocks, each followed by a squared-ReLU MLP block.

Nemotron-H's blocks are one sublayer each (``layers_block_type``, or the
older ``hybrid_override_pattern``: M Mamba-2, * attention, - MLP, E experts),
each with its own pre-norm and residual. A mixer block is one posenc layer
(its ``norm1`` and mixer), with the MLP block right after it if there is
one (its ``norm2`` and MLP); a mixer block followed by another mixer block
is a layer of ``model.layers_without_mlp``. So the released patterns load
(``M-M-M-M*-...``: the attention block right after a Mamba-2 block). An MLP
block that follows no mixer block and mixture-of-experts blocks are refused
in one line. The Mamba-2 layers have the group-wise gated norm (``n_groups``
groups); the attention has no position encoding; the MLP is
``down(relu(up x)^2)`` (``model.mlp`` relu2).
"""

from __future__ import annotations

from posenc.hf import fields, hf_params, mixer_fields, mixer_params
from posenc.hf.registry import Family, register, unsupported

PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
MIXER_OF = {"linear_attention": "mamba2", "full_attention": "attention"}


def block_types(hf):
    """The config's block types (layers_block_type, or hybrid_override_pattern's letters)."""
    if hf.get("layers_block_type"):
        return "layers_block_type", list(hf["layers_block_type"])
    pattern = hf.get("hybrid_override_pattern")
    if pattern:
        if set(pattern) - set(PATTERN):
            raise unsupported(hf, "hybrid_override_pattern", f"letters other than {''.join(PATTERN)}")
        return "hybrid_override_pattern", [PATTERN[c] for c in pattern]
    return "layers_block_type", ["linear_attention", "moe", "full_attention", "mlp"]  # HF's default


def layers(hf) -> list[tuple[int, int | None]]:
    """posenc's layers as (mixer block, MLP block after it or None) indices of the pattern."""
    field, types = block_types(hf)
    moe = [i for i, t in enumerate(types) if t == "moe"]
    if moe:
        raise unsupported(hf, field, f"blocks {moe} are mixture-of-experts, which this loader does not place")
    out: list[tuple[int, int | None]] = []
    for i, t in enumerate(types):
        if t in MIXER_OF:
            out.append((i, None))
        elif not out or out[-1][1] is not None or out[-1][0] != i - 1:
            raise unsupported(hf, field, f"block {i} ('mlp') follows no mixer block: posenc's layers are a "
                              "mixer, with or without an MLP after it")
        else:
            out[-1] = (out[-1][0], i)
    return out


def nemotron_h_fields(hf):
    """Nemotron-H: (mixer, MLP) block pairs as posenc layers, Mamba-2 with the grouped gated norm, NoPE
    attention, squared-ReLU MLPs."""
    blocks = layers(hf)
    types = block_types(hf)[1]
    mixers = tuple(MIXER_OF[types[m]] for m, _ in blocks)
    fields.refuse(hf, {"mamba_hidden_act": (("silu",), "posenc's Mamba-2 conv is SiLU's")})
    hf = {**hf, "num_hidden_layers": len(mixers)}
    out = fields.base(hf, "nemotron_h", eps_key="layer_norm_epsilon")
    out["model.mlp"] = fields.act(hf, "mlp_hidden_act", {"relu2": "relu2"})
    if hf.get("attention_bias") != hf.get("mlp_bias"):
        raise unsupported(hf, "mlp_bias", "posenc's biases are on attention and the MLP together (model.bias all)")
    out["model.bias"] = "all" if hf.get("attention_bias") else "none"
    out["model.position.kind"] = "nope"
    fields.set_spans(out, hf, ["full"] * len(mixers))
    out["model.layer_types"] = mixers
    out["model.layers_without_mlp"] = tuple(i for i, (_, mlp) in enumerate(blocks) if mlp is None)
    if "mamba2" in mixers:
        out.update(mixer_fields.mamba2(hf, prefix="", norm="grouped", keys={
            "d_state": "ssm_state_size", "d_head": "mamba_head_dim", "n_heads": "mamba_num_heads",
            "d_conv": "conv_kernel", "conv_bias": "use_conv_bias", "proj_bias": "use_bias"}))
    return out


def nemotron_h_params(hf, tensors, spec):
    """Each mixer block of the pattern, with the MLP block after it if any, as one posenc layer."""
    t, out = hf_params.Tensors(tensors), {}
    hf_params.head(out, spec, t, "backbone.embeddings.weight", "lm_head.weight")
    hf_params.norm(out, ("final_norm",), t, "backbone.norm_f", "rms")
    for i, (m, mlp) in enumerate(layers(hf)):
        p, b = f"backbone.layers.{m}.", ("blocks", i)
        mixer_params.attention_or_mamba2(out, b, t, spec, i, attention_prefix=p + "mixer.", mamba_prefix=p + "mixer.")
        hf_params.norm(out, b + ("norm1",), t, p + "norm", "rms")
        if mlp is None:
            continue
        q = f"backbone.layers.{mlp}."
        mixer_params.mlp(out, b, t, q + "mixer.", gate=None)
        if spec.bias == "all":
            out[b + ("mlp", "b1")] = t(q + "mixer.up_proj.bias")
            out[b + ("mlp", "b2")] = t(q + "mixer.down_proj.bias")
        hf_params.norm(out, b + ("norm2",), t, q + "norm", "rms")
    t.done()
    return out


register("nemotron_h", Family("nemotron_h", nemotron_h_fields, nemotron_h_params))
