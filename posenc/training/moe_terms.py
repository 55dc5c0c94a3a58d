"""The mixture-of-experts terms of a train step (``model.moe``): router losses and the loss-free bias update.

A model with MoE layers (``posenc.model.moe``) trains with, besides the
cross-entropy and z-loss of :mod:`~posenc.training.step`::

    total += router_aux_loss_coef * load_balancing_loss(L)    Switch / Mixtral (posenc.router_losses)
           + router_z_loss_coef   * router_z_loss(L)          ST-MoE

where ``L`` [calls, B, T, E] stacks the router logits of every MoE layer the
forward ran (a looped model's every pass), over every token of the batch:
one ``f_e`` and ``P_e`` over all layers' tokens, as transformers'
``load_balancing_loss_func`` concatenates its layers (and without an
attention mask, as there is no padding to leave out). A term whose weight is
0 is not computed. After the optimizer step, each layer's
``e_score_correction_bias`` (``model.moe.score_correction_bias``) moves by
DeepSeek-V3's rule (arXiv 2412.19437, §2.1.2) on the step's expert loads
(``posenc.router_losses.expert_load`` of its routing, summed over passes)::

    bias += bias_update_rate * sign(mean(load) - load)

Metrics: ``router_aux_loss`` and ``router_z_loss`` (the weighted terms, as
``z_loss``), ``expert_load_violation`` (DeepSeek-V3's MaxVio, ``max(load) /
mean(load) - 1``, averaged over the MoE layers' calls: 0 at perfect balance).
A dense model has none of these, and its step is unchanged.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.model.moe import MoEMLP
from posenc.moe import router_losses

_LOAD = "expert_load"  # the metrics entry that carries the loads from the loss to the bias update (popped)


@dataclasses.dataclass(frozen=True)
class MoETerms:
    """What a train step adds for a model's MoE layers (read off the model's graph, so it is static)."""

    layers: tuple[int, ...]  # the blocks with a MoE MLP
    num_experts: int
    top_k: int
    aux_coef: float
    z_coef: float
    bias_rate: float  # 0 or no correction bias: no update

    @classmethod
    def of(cls, model) -> MoETerms | None:
        """The terms of ``model`` (a :class:`~posenc.model.Decoder`), or None without MoE layers."""
        layers = tuple(i for i, b in enumerate(model.blocks) if isinstance(b.mlp, MoEMLP))
        if not layers:
            return None
        s = model.blocks[layers[0]].mlp.spec  # every MoE layer of a model shares model.moe
        return cls(layers=layers, num_experts=s.num_experts, top_k=s.top_k, aux_coef=s.router_aux_loss_coef,
                   z_coef=s.router_z_loss_coef, bias_rate=s.bias_update_rate if s.score_correction_bias else 0.0)


def losses(terms: MoETerms, routing) -> tuple[jax.Array, dict]:
    """``(weighted router losses, metrics)`` of the forward's ``routing`` (the list the model filled).

    The metrics hold the weighted terms, the load violation and the loads [calls, E] for
    :func:`update_bias` (which pops them).
    """
    logits = jnp.stack([r.logits for r in routing])  # [calls, B, T, E]
    zero = jnp.zeros((), jnp.float32)
    aux = (terms.aux_coef * router_losses.load_balancing_loss(logits, top_k=terms.top_k)
           if terms.aux_coef > 0 else zero)
    z = terms.z_coef * router_losses.router_z_loss(logits) if terms.z_coef > 0 else zero
    load = jax.lax.stop_gradient(jnp.stack([router_losses.expert_load(r.indices, num_experts=terms.num_experts)
                                            for r in routing]))  # [calls, E]
    violation = jnp.mean(jnp.max(load, -1) / jnp.mean(load, -1) - 1.0)
    return aux + z, {"router_aux_loss": aux, "router_z_loss": z, "expert_load_violation": violation, _LOAD: load}


def update_bias(model, terms: MoETerms, metrics: dict) -> None:
    """After the optimizer step: each MoE layer's correction bias by DeepSeek-V3's rule on its load (summed
    over a looped model's passes); pops the loads from ``metrics``."""
    load = metrics.pop(_LOAD)
    if not terms.bias_rate:
        return
    per_layer = load.reshape(-1, len(terms.layers), terms.num_experts).sum(0)
    for i, layer_load in zip(terms.layers, per_layer):
        bias = model.blocks[i].mlp.e_score_correction_bias
        bias[...] = router_losses.bias_update(bias[...], layer_load, rate=terms.bias_rate)
