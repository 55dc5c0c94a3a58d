"""The mixture-of-experts MLP of a decoder layer (``model.moe``): a router, routed experts, shared experts.

``MoEMLP(spec.moe, d_model, rngs=...)`` takes the place of a layer's dense
``MLP`` where ``spec.moe.layers`` says so (:func:`is_moe`). Per token ``x``
(``[..., H]``)::

    logits = x @ router (+ router_bias)                         posenc.routing.router_logits
    indices, weights = router(logits, e_score_correction_bias)  posenc.routing.ROUTERS[model.moe.router]
    y = sum_j weights_j expert_{indices_j}(x)                    (scale "input": expert(weights_j x))
      + shared_expert(x) (* sigmoid(x . shared_expert_gate))     posenc.experts.shared_expert

dropless: every token reaches its k experts. The routed experts run as
``posenc.expert_blocks.routed`` (``model.moe.impl`` "blocked": a batched
matmul over blocks of rows sorted by expert), ``posenc.experts.routed``
("ragged": ``jax.lax.ragged_dot``) or ``posenc.experts.routed_dense``
("dense": every expert on every token). Blocked and ragged do the work of
the k chosen experts per token, at training and evaluation alike; the MLP is
per token, so cached decoding gives the full forward's outputs.

Parameters (float32; transformers 5.x names and layouts on the right, so a
checkpoint maps one tensor to one parameter)::

    router                   [H, E]      gate.weight [E, H] (Mixtral, Qwen3-MoE, OLMoE, Qwen3-Next,
                                         DeepSeek-V3, GLM-4.5) / router.weight [E, H] (gpt-oss, Llama 4), transposed
    router_bias              [E]         router.bias (gpt-oss)
    e_score_correction_bias  [E]         gate.e_score_correction_bias (DeepSeek-V3, GLM-4.5): a CorrectionBias
                                         variable, not a Param (the optimizer leaves it; training moves it
                                         by DeepSeek-V3's rule, posenc.training.moe_terms)
    gate_up                  [E, H, 2I]  experts.gate_up_proj [E, 2I, H], last two axes swapped (gpt-oss and
                                         Llama 4 store [E, H, 2I] already; gpt-oss's gate / up interleaved)
    down                     [E, I, H]   experts.down_proj [E, H, I], swapped (gpt-oss, Llama 4: as stored)
    gate_up_bias, down_bias  [E, 2I], [E, H]   experts.gate_up_proj_bias, down_proj_bias (gpt-oss)
    shared_gate_up           [H, 2S]     [gate_proj.weight.T | up_proj.weight.T] of shared_experts (DeepSeek,
                                         GLM) / shared_expert (Llama 4, Qwen3-Next)
    shared_down              [S, H]      the shared MLP's down_proj.weight.T
    shared_expert_gate       [H]         shared_expert_gate.weight [1, H] (Qwen3-Next)

Initialisation: LeCun normal for the router and the experts (DeepNorm:
xavier normal with its gain on the experts, as the dense MLP), zero biases
and correction bias.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from flax import nnx

from posenc.model.layers import lecun_normal, xavier_normal
from posenc.model.moe_spec import MoESpec
from posenc.moe import expert_blocks, experts, routing

_ROUTED = {"blocked": expert_blocks.routed, "ragged": experts.routed, "dense": experts.routed_dense}


class CorrectionBias(nnx.Variable):
    """DeepSeek-V3's ``e_score_correction_bias`` [E]: state that selects experts, moved after each optimizer
    step (posenc.router_losses.bias_update), never by gradients (not an ``nnx.Param``)."""


def is_moe(spec, layer_index: int) -> bool:
    """Whether layer ``layer_index`` of a :class:`~posenc.model.ModelSpec` has the MoE MLP."""
    return spec.moe is not None and spec.moe.layers[layer_index]


class MoEMLP(nnx.Module):
    """Router, E routed experts and optional shared experts (module docstring); ``__call__`` -> (y, Routing)."""

    def __init__(self, moe: MoESpec, d_model: int, *, rngs: nnx.Rngs, gain: float | None = None):
        self.spec = moe
        E, H, I, S = moe.num_experts, d_model, moe.intermediate, moe.shared_intermediate

        def weight(shape, fan_in, fan_out, *, use_gain=True):
            if gain is None or not use_gain:
                return nnx.Param(lecun_normal(rngs.params(), shape, fan_in))
            return nnx.Param(xavier_normal(rngs.params(), shape, fan_in, fan_out, gain))

        def zeros(*shape):
            return nnx.Param(jnp.zeros(shape, jnp.float32))

        self.router = weight((H, E), H, E, use_gain=False)
        self.router_bias = zeros(E) if moe.router_bias else None
        self.e_score_correction_bias = (CorrectionBias(jnp.zeros((E,), jnp.float32))
                                        if moe.score_correction_bias else None)
        self.gate_up = weight((E, H, 2 * I), H, 2 * I)
        self.down = weight((E, I, H), I, H)
        self.gate_up_bias = zeros(E, 2 * I) if moe.expert_bias else None
        self.down_bias = zeros(E, H) if moe.expert_bias else None
        self.shared_gate_up = weight((H, 2 * S), H, 2 * S) if S else None
        self.shared_down = weight((S, H), S, H) if S else None
        self.shared_expert_gate = weight((H,), H, 1, use_gain=False) if moe.shared_expert_gate else None

    def route(self, x) -> routing.Routing:
        """The router on x [..., H] -> Routing (indices, weights [..., k]; logits [..., E])."""
        s = self.spec
        dtype = jnp.float32 if s.router_dtype == "float32" else x.dtype
        logits = routing.router_logits(x, self.router[...], _value(self.router_bias), dtype=dtype)
        kw = s.router_keywords()
        if s.router == "sigmoid_top_k":
            kw["bias"] = _value(self.e_score_correction_bias)
        return routing.ROUTERS[s.router](logits, **kw)

    def __call__(self, x):
        """x [..., H] -> (y like x, its Routing)."""
        s = self.spec
        r = self.route(x)
        glu = (functools.partial(experts.clamped_swiglu, alpha=s.swiglu_alpha, limit=s.swiglu_limit)
               if s.glu == "clamped_swiglu" else s.glu)
        y = _ROUTED[s.impl](x, r.indices, r.weights, self.gate_up[...], self.down[...],
                            gate_up_bias=_value(self.gate_up_bias), down_bias=_value(self.down_bias), glu=glu,
                            scale=s.scale)
        if self.shared_gate_up is not None:
            y = y + experts.shared_expert(x, self.shared_gate_up[...], self.shared_down[...],
                                          gate=_value(self.shared_expert_gate))
        return y, r


def _value(variable):
    return None if variable is None else variable[...]
