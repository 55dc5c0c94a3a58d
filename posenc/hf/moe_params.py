"""A mixture-of-experts layer's tensors in their places among posenc's parameters (posenc.model.moe).

The router ``gate.weight [E, H]`` (or ``router.weight``) becomes ``router
[H, E]``; the experts are read either per expert, as ``save_pretrained``
writes most families (``experts.{e}.gate_proj / up_proj / down_proj``, or
Mixtral's ``w1 / w3 / w2``), or stacked (``experts.gate_up_proj [E, 2I, H]``
and ``experts.down_proj [E, H, I]``, transformers 5's own layout), and become
``gate_up [E, H, 2I]`` (gate and up as halves) and ``down [E, I, H]``.
"""

from __future__ import annotations

import numpy as np

# HF per-expert names (gate, up, down)
SWIGLU_NAMES = ("gate_proj", "up_proj", "down_proj")
MIXTRAL_NAMES = ("w1", "w3", "w2")


def experts(out, path, t, prefix, E, *, names=SWIGLU_NAMES) -> None:
    """The routed experts under ``prefix`` (e.g. ``model.layers.3.mlp.``) at ``path`` (the MoE MLP)."""
    stacked = prefix + "experts.gate_up_proj"
    if t.has(stacked):  # [E, 2I, H] and [E, H, I]
        out[path + ("gate_up",)] = np.swapaxes(t(stacked), 1, 2)
        out[path + ("down",)] = np.swapaxes(t(prefix + "experts.down_proj"), 1, 2)
        return
    gate, up, down = names
    e = prefix + "experts.{}."
    out[path + ("gate_up",)] = np.stack([np.concatenate([t(e.format(j) + gate + ".weight").T,
                                                          t(e.format(j) + up + ".weight").T], axis=1)
                                         for j in range(E)])
    out[path + ("down",)] = np.stack([t(e.format(j) + down + ".weight").T for j in range(E)])


def router(out, path, t, name) -> None:
    """The router's weight ``name`` ([E, H]) as ``router`` [H, E]."""
    out[path + ("router",)] = t(name).T


def softmax_moe(names=SWIGLU_NAMES, module="mlp"):
    """``moe(out, path, t, layer_prefix, spec)`` of a router ``{module}.gate`` and experts under ``module``
    (Mixtral: ``block_sparse_moe`` with :data:`MIXTRAL_NAMES`, or ``mlp`` as transformers 5 names it;
    Qwen3-MoE, OLMoE: ``mlp``)."""
    def place(out, path, t, layer_prefix, spec):
        prefix = layer_prefix + (module if t.has(layer_prefix + module + ".gate.weight") else "mlp") + "."
        router(out, path, t, prefix + "gate.weight")
        experts(out, path, t, prefix, spec.moe.num_experts, names=names)
    return place


def shared(out, path, t, prefix) -> None:
    """The shared expert's gated MLP under ``prefix`` (``gate_proj`` / ``up_proj`` / ``down_proj``) as
    ``shared_gate_up [H, 2S]`` and ``shared_down [S, H]``."""
    out[path + ("shared_gate_up",)] = np.concatenate([t(prefix + "gate_proj.weight").T,
                                                       t(prefix + "up_proj.weight").T], axis=1)
    out[path + ("shared_down",)] = t(prefix + "down_proj.weight").T


def sigmoid_moe(out, path, t, layer_prefix, spec) -> None:
    """DeepSeek-V3 / GLM-4.5: ``mlp.gate`` with its ``e_score_correction_bias`` (a non-trained variable
    of posenc's MoE), the routed experts and ``mlp.shared_experts``."""
    prefix = layer_prefix + "mlp."
    router(out, path, t, prefix + "gate.weight")
    out[path + ("e_score_correction_bias",)] = t(prefix + "gate.e_score_correction_bias")
    experts(out, path, t, prefix, spec.moe.num_experts)
    if spec.moe.shared_intermediate:
        shared(out, path, t, prefix + "shared_experts.")


def refuse_extra_layers(hf, tensors, num_layers) -> None:
    """Refuse, in one line, the weights of layers past ``num_hidden_layers``: DeepSeek-V3 / GLM-4.5's
    multi-token-prediction layers (``num_nextn_predict_layers``), which posenc's decoder does not have."""
    from posenc.hf.registry import unsupported

    extra = sorted({k.split(".")[2] for k in tensors if k.startswith("model.layers.")
                    and k.split(".")[2].isdigit() and int(k.split(".")[2]) >= num_layers}, key=int)
    if extra:
        raise unsupported(hf, "num_nextn_predict_layers", f"the checkpoint has the weights of its multi-token "
                          f"prediction layer(s) {', '.join(extra)}, which posenc's decoder does not have")
