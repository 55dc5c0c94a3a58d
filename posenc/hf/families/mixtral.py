"""Mixture-of-experts families with a softmax router over Llama-like layers: Mixtral, Qwen3-MoE, OLMoE.

Every token's router probabilities ``softmax(x @ gate)`` choose its top-k
experts (``model.moe.router`` "softmax_top_k"); Mixtral renormalises the k
weights always, Qwen3-MoE and OLMoE when ``norm_topk_prob`` says so (and
round them to the logits' dtype). Qwen3-MoE keeps dense MLPs
(``intermediate_size``) on its ``mlp_only_layers`` and off its
``decoder_sparse_step``. The attention is the family's dense one: Mistral's
(window on every layer with a ``sliding_window``), Qwen 3's per-head
QK-norm, OLMoE's RMSNorm of the whole q / k projections.
"""

from __future__ import annotations

import functools

from posenc.hf import fields, hf_params, moe_fields, moe_params
from posenc.hf.registry import Family, register


def _spans(hf, out, window):
    n = out["model.num_layers"]
    fields.set_spans(out, {**hf, "sliding_window": window}, ["window" if window else "full"] * n)


def mixtral_fields(hf):
    """Mixtral: Mistral's layers, num_local_experts experts of width intermediate_size, top-k renormalised."""
    out = fields.llama_core(hf, "mixtral")
    _spans(hf, out, hf.get("sliding_window"))
    moe_fields.moe(hf, out, width_key="intermediate_size")
    return out


def qwen3_moe_fields(hf):
    """Qwen3-MoE: Qwen 3's layers (a window on every layer with use_sliding_window), its experts."""
    out = fields.llama_core(hf, "qwen3_moe")
    _spans(hf, out, hf.get("sliding_window") if hf.get("use_sliding_window") else None)
    moe_fields.moe({"norm_topk_prob": False, **hf}, out, options=("norm_topk_prob",))  # HF's default
    return out


def olmoe_fields(hf):
    """OLMoE: pre-norm layers with the whole q / k projections RMS-normalised, its experts."""
    fields.refuse(hf, {"clip_qkv": ((None,), "posenc does not clamp q / k / v")})
    out = fields.llama_core(hf, "olmoe")
    _spans(hf, out, None)
    moe_fields.moe(hf, out, width_key="intermediate_size", options=("norm_topk_prob",))
    return out


register("mixtral", Family("mixtral", mixtral_fields, functools.partial(
    hf_params.llama_params, moe=moe_params.softmax_moe(moe_params.MIXTRAL_NAMES, "block_sparse_moe"))))
register("qwen3_moe", Family("qwen3_moe", qwen3_moe_fields, functools.partial(
    hf_params.llama_params, moe=moe_params.softmax_moe())))
register("olmoe", Family("olmoe", olmoe_fields, functools.partial(
    hf_params.llama_params, moe=moe_params.softmax_moe())))
