"""Mixture-of-experts routers of the open checkpoints, as in transformers 5.x.

Each router takes the router logits ``[..., E]`` (from :func:`router_logits`)
and returns a :class:`Routing`: the chosen experts ``indices`` int32
``[..., k]``, their combine ``weights`` float32 ``[..., k]`` and the
``logits`` as given (what the losses of ``posenc.router_losses`` read).

============================  =================================================  ====================
router                        formula                                            checkpoints
============================  =================================================  ====================
:func:`softmax_top_k`         ``p = softmax(l); w, i = topk(p)``, ``w/sum(w)``   Mixtral, Qwen3-MoE,
                              with ``normalize``                                 OLMoE, Qwen3-Next
:func:`top_k_softmax`         ``v, i = topk(l); w = softmax(v)``                 gpt-oss
:func:`sigmoid_top_k`         ``s = sigmoid(l)``; top-k of ``s + bias`` within   DeepSeek-V3,
                              the best groups; ``w = s[i]``, normalised, scaled  GLM-4.5, Kimi K2
:func:`top_k_sigmoid`         ``v, i = topk(l); w = sigmoid(v)`` (scales the     Llama 4
                              expert *input*)
============================  =================================================  ====================

The math is float32 (the routers of transformers compute the softmax in
float32, DeepSeek-V3's its logits too). Where transformers rounds the weights
to the logits dtype (``.to(router_logits.dtype)``: Qwen3-MoE, OLMoE,
Qwen3-Next with ``round_weights=True``; gpt-oss and Llama 4 always) the
weights are rounded so, and returned as float32 holding those values: one
combine then reproduces both the float32 weights of Mixtral and the rounded
ones of the others.

Ties: :func:`top_k` is ``jax.lax.top_k``, which is stable: of equal values
the one with the lower index comes first, and is the one chosen at the k-th
place. ``torch.topk`` leaves the order of ties unspecified (on CPU it depends
on the length of the row: for 8 equal values and k = 2 it returns experts 6
and 5), so with tied scores (a router initialised to zeros) the experts
chosen may differ from transformers'; the weights of tied experts are equal,
so only which experts see the token differs. Without ties at the k-th place
the chosen sets agree; the order within the k slots does not matter to the
combine. transformers' DeepSeek-V3 router calls ``topk(sorted=False)``; here
the slots are always in descending order of the selection score.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from posenc import checks

_F32 = jnp.float32


class Routing(NamedTuple):
    """The output of a router: ``indices, weights, logits = router(logits, ...)``.

    indices: int32 ``[..., k]``, the chosen experts of each token;
    weights: float32 ``[..., k]``, their combine weights;
    logits: ``[..., E]``, the router logits as given (for the losses).
    """

    indices: jax.Array
    weights: jax.Array
    logits: jax.Array


def router_logits(x, weight, bias=None, *, dtype=None) -> jax.Array:
    """Router logits ``x @ weight (+ bias)`` in ``dtype`` (default: x's dtype).

    transformers computes them in the input dtype (``F.linear(hidden_states,
    self.weight)``: Mixtral, Qwen3-MoE, OLMoE, Qwen3-Next, Llama 4; gpt-oss with
    its ``bias``) or in float32 (DeepSeek-V3 and GLM-4.5 cast both operands:
    ``F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))``);
    pass ``dtype=jnp.float32`` for those. float32 logits use full float32
    matmul precision (no TF32 or bf16 passes on accelerators), as the choice of
    experts depends on them.

    Shapes: x ``[..., H]``, weight ``[H, E]`` (the transpose of transformers'
    ``gate.weight [E, H]``), bias ``[E]`` -> ``[..., E]``.
    """
    x = jnp.asarray(x)
    dt = x.dtype if dtype is None else jnp.dtype(dtype)
    weight = jnp.asarray(weight)
    if weight.ndim != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape [H, E] with H = {x.shape[-1]}; got {weight.shape}")
    precision = jax.lax.Precision.HIGHEST if dt == _F32 else None
    out = jnp.matmul(x.astype(dt), weight.astype(dt), precision=precision)
    if bias is not None:
        out = out + jnp.asarray(bias).astype(dt)
    return out


def top_k(x, k: int) -> tuple[jax.Array, jax.Array]:
    """The ``k`` largest values along the last axis and their indices, ties to the lower index.

    ``jax.lax.top_k`` (stable: equal values keep their order, so the lower
    index comes first and wins the k-th place). See the module docstring for
    how ``torch.topk`` differs on ties.

    Shapes: x ``[..., n]`` -> values ``[..., k]`` (descending), indices int32 ``[..., k]``.
    """
    x = jnp.asarray(x)
    k = checks.integer("k", k, minimum=1, maximum=x.shape[-1])
    return jax.lax.top_k(x, k)


def softmax_top_k(logits, *, k: int, normalize: bool = False, round_weights: bool = False) -> Routing:
    """Softmax over the experts, then the top k (Mixtral, Qwen3-MoE, OLMoE, Qwen3-Next).

    transformers ``MixtralTopKRouter`` / ``Qwen3MoeTopKRouter`` /
    ``OlmoeTopKRouter`` / ``Qwen3NextTopKRouter``::

        p = softmax(float32(logits));  w, i = topk(p, k)
        w = w / sum(w)            if normalize (Mixtral always; the others: norm_topk_prob)
        w = w.to(logits.dtype)    if round_weights (Qwen3-MoE, OLMoE, Qwen3-Next; not Mixtral)

    Shapes: logits ``[..., E]`` -> :class:`Routing` with ``[..., k]``.
    """
    logits = jnp.asarray(logits)
    probs = jax.nn.softmax(logits.astype(_F32), axis=-1)
    weights, indices = top_k(probs, k)
    if checks.boolean("normalize", normalize):
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    if checks.boolean("round_weights", round_weights):
        weights = weights.astype(logits.dtype).astype(_F32)
    return Routing(indices, weights, logits)


def top_k_softmax(logits, *, k: int) -> Routing:
    """The top k logits, then a softmax over those k (gpt-oss).

    transformers ``GptOssTopKRouter`` (logits with the router bias)::

        v, i = topk(logits, k);  w = softmax(v, dtype=logits.dtype)

    The softmax is float32, rounded to the logits dtype.

    Shapes: logits ``[..., E]`` -> :class:`Routing` with ``[..., k]``.
    """
    logits = jnp.asarray(logits)
    values, indices = top_k(logits, k)
    weights = jax.nn.softmax(values.astype(_F32), axis=-1)
    return Routing(indices, weights.astype(logits.dtype).astype(_F32), logits)


def top_k_sigmoid(logits, *, k: int = 1) -> Routing:
    """The top k logits, each through a sigmoid (Llama 4, k = 1).

    transformers ``Llama4Router``: ``v, i = topk(logits, k)``; the scores are
    ``sigmoid(float32(v)).to(logits.dtype)`` (the other experts get
    ``sigmoid(-inf) = 0``). ``Llama4TextMoe`` multiplies the expert *input* by
    the score (``scale="input"`` in ``posenc.experts``), and adds a shared expert.

    Shapes: logits ``[..., E]`` -> :class:`Routing` with ``[..., k]``.
    """
    logits = jnp.asarray(logits)
    values, indices = top_k(logits, k)
    weights = jax.nn.sigmoid(values.astype(_F32))
    return Routing(indices, weights.astype(logits.dtype).astype(_F32), logits)


def sigmoid_top_k(logits, *, k: int, bias=None, n_group: int = 1, topk_group: int = 1,
                  normalize: bool = False, scaling: float = 1.0) -> Routing:
    """Sigmoid scores, top k by bias-corrected score within the best groups (DeepSeek-V3, GLM-4.5, Kimi K2).

    DeepSeek-V3 (arXiv 2412.19437, eqs. 12-16 and §2.1.2); transformers
    ``DeepseekV3TopkRouter.forward`` (``Glm4MoeTopkRouter`` is the same)::

        s = sigmoid(float32(logits))                 # [..., E]
        c = s + bias                                 # e_score_correction_bias: selection only
        group score = sum of the top 2 of c in each of n_group groups of E / n_group experts
        keep the topk_group best groups; c = -inf outside them
        i = topk(c, k);  w = s[i]                    # the weights use s, never the bias
        w = w / (sum(w) + 1e-20)   if normalize      # norm_topk_prob
        w = w * scaling                              # routed_scaling_factor

    DeepSeek-V3 / Kimi K2: E = 256 / 384, k = 8, n_group = 8 / 1,
    topk_group = 4 / 1, normalize, scaling 2.5 / 2.827.

    Shapes: logits ``[..., E]``, bias ``[E]`` -> :class:`Routing` with ``[..., k]``.
    """
    logits = jnp.asarray(logits)
    num_experts = logits.shape[-1]
    n_group = checks.integer("n_group", n_group, minimum=1, maximum=num_experts)
    if num_experts % n_group:
        raise ValueError(f"n_group must divide the number of experts {num_experts}; got {n_group}")
    group_size = num_experts // n_group
    if n_group > 1 and group_size < 2:
        raise ValueError(f"each group needs at least 2 experts (its score is the sum of its top 2); "
                         f"got n_group={n_group} for {num_experts} experts")
    topk_group = checks.integer("topk_group", topk_group, minimum=1, maximum=n_group)
    checks.integer("k", k, minimum=1, maximum=topk_group * group_size)
    scaling = checks.number("scaling", scaling, positive=True)

    scores = jax.nn.sigmoid(logits.astype(_F32))
    choice = scores if bias is None else scores + jnp.asarray(bias).astype(_F32)
    if topk_group < n_group:  # with every group kept the mask is all True
        grouped = choice.reshape(*choice.shape[:-1], n_group, group_size)
        group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [..., n_group]
        _, best = jax.lax.top_k(group_scores, topk_group)
        keep = jnp.any(best[..., :, None] == jnp.arange(n_group), axis=-2)  # [..., n_group]
        keep = jnp.repeat(keep, group_size, axis=-1)
        choice = jnp.where(keep, choice, -jnp.inf)
    _, indices = jax.lax.top_k(choice, k)
    weights = jnp.take_along_axis(scores, indices, axis=-1)
    if checks.boolean("normalize", normalize):
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return Routing(indices, weights * scaling, logits)


ROUTERS: dict[str, Callable[..., Routing]] = {
    "softmax_top_k": softmax_top_k,
    "top_k_softmax": top_k_softmax,
    "sigmoid_top_k": sigmoid_top_k,
    "top_k_sigmoid": top_k_sigmoid,
}
