"""Mixture-of-experts router losses and load balancing, in float32.

- :func:`load_balancing_loss`: Switch Transformer's auxiliary loss (Fedus et
  al. 2021, arXiv 2101.03961, eqs. 4-6) in the top-k form of transformers'
  ``load_balancing_loss_func`` (``models/mixtral/modeling_mixtral.py``, used by
  Mixtral, Qwen3-MoE, OLMoE, Qwen3-Next, gpt-oss);
- :func:`router_z_loss`: ST-MoE's router z-loss (Zoph et al. 2022, arXiv
  2202.08906, eq. 5);
- :func:`expert_load` and :func:`bias_update`: DeepSeek-V3's
  auxiliary-loss-free balancing (arXiv 2412.19437, §2.1.2), which moves the
  selection bias ``e_score_correction_bias`` of ``posenc.routing.sigmoid_top_k``.

Router logits are ``[..., E]``: any leading shape of tokens (and layers); a
``mask`` broadcasts against that leading shape (an attention mask ``[B, S]``
against logits ``[L, B, S, E]``) and says which tokens count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks

_F32 = jnp.float32


def _stack(router_logits) -> jax.Array:
    # transformers passes one [tokens, E] tensor per layer as a tuple
    if isinstance(router_logits, (list, tuple)):
        return jnp.stack([jnp.asarray(layer) for layer in router_logits])
    return jnp.asarray(router_logits)


def _token_mask(mask, lead_shape) -> jax.Array:
    if mask is None:
        return jnp.ones(lead_shape, _F32)
    return jnp.broadcast_to(jnp.asarray(mask).astype(_F32), lead_shape)


def expert_load(indices, *, num_experts: int, mask=None) -> jax.Array:
    """Tokens routed to each expert: the count of (token, slot) pairs per expert.

    ``load_e = sum_t mask_t * #{j : indices[t, j] = e}`` (the ``c_i`` of
    DeepSeek-V3 §2.1.2; the ``bincount`` of transformers' balancing loss).

    Shapes: indices int ``[..., k]``, mask ``[...]`` -> float32 ``[E]``.
    """
    indices = jnp.asarray(indices)
    num_experts = checks.integer("num_experts", num_experts, minimum=1)
    m = _token_mask(mask, indices.shape[:-1])
    one_hot = jax.nn.one_hot(indices, num_experts, dtype=_F32)  # [..., k, E]
    return jnp.sum(one_hot * m[..., None, None], axis=tuple(range(indices.ndim)))


def load_balancing_loss(router_logits, *, top_k: int, mask=None) -> jax.Array:
    """Switch / Mixtral load-balancing loss ``E * sum_e f_e * P_e``.

    transformers ``load_balancing_loss_func(gate_logits, num_experts, top_k,
    attention_mask)``, over every token of every layer::

        p = softmax(logits);  chosen = topk(p, top_k)
        f_e = (tokens choosing e, over all k slots) / N    # sums to top_k
        P_e = sum_t p_te / N                               # mean router probability
        loss = E * sum_e f_e * P_e

    with N the number of (unmasked) tokens. At perfect balance
    (``f_e = top_k / E``, ``P_e = 1 / E``) the loss is ``top_k``. The softmax
    is float32 (transformers takes it in the logits dtype); ties in the top-k
    are broken as ``posenc.routing.top_k`` breaks them. Multiply by
    ``router_aux_loss_coef`` (Mixtral 0.02, Qwen3-MoE 0.001) for the training loss.

    Shapes: router_logits ``[..., E]`` (or a sequence of ``[T, E]``, one per
    layer, as transformers passes them), mask ``[...]`` (broadcast against the
    leading shape; True where the token counts) -> float32 scalar (0 with no
    token).
    """
    logits = _stack(router_logits)
    num_experts = logits.shape[-1]
    top_k = checks.integer("top_k", top_k, minimum=1, maximum=num_experts)
    probs = jax.nn.softmax(logits.astype(_F32), axis=-1)
    _, chosen = jax.lax.top_k(probs, top_k)
    m = _token_mask(mask, logits.shape[:-1])
    rows = jnp.maximum(jnp.sum(m), 1.0)
    tokens_per_expert = expert_load(chosen, num_experts=num_experts, mask=m) / rows
    prob_per_expert = jnp.sum(probs * m[..., None], axis=tuple(range(probs.ndim - 1))) / rows
    return num_experts * jnp.sum(tokens_per_expert * prob_per_expert)


def router_z_loss(router_logits, *, mask=None) -> jax.Array:
    """ST-MoE router z-loss ``mean_t (log sum_e exp(l_te))^2`` (Zoph et al. 2022, eq. 5).

    Keeps the router logits small (bf16 round-off in the router's exp);
    ST-MoE weights it by 0.001. float32 logsumexp; the mean is over the
    unmasked tokens (of every layer).

    Shapes: router_logits ``[..., E]`` (or a sequence of them), mask ``[...]`` -> float32 scalar (0 with no token).
    """
    logits = _stack(router_logits)
    sq = jnp.square(jax.nn.logsumexp(logits.astype(_F32), axis=-1))
    m = _token_mask(mask, sq.shape)
    return jnp.sum(sq * m) / jnp.maximum(jnp.sum(m), 1.0)


def bias_update(bias, load, *, rate: float = 1e-3) -> jax.Array:
    """DeepSeek-V3's auxiliary-loss-free update of the selection bias, once per step.

    arXiv 2412.19437 §2.1.2: "at the end of each step, we will decrease the
    bias term by gamma if its corresponding expert is overloaded, and increase
    it by gamma if its corresponding expert is underloaded"::

        bias_e += rate * sign(mean(load) - load_e)

    (gamma = ``rate`` = 0.001 for the first 14.3T tokens, then 0). ``load``
    is :func:`expert_load` of the step's routing (all tokens of the batch);
    an expert exactly at the mean keeps its bias. The bias only selects
    experts (``posenc.routing.sigmoid_top_k``); no gradient flows through it.

    Shapes: bias ``[E]``, load ``[E]`` -> float32 ``[E]``.
    """
    rate = checks.number("rate", rate, minimum=0.0)
    bias = jnp.asarray(bias)
    load = jnp.asarray(load, _F32)
    if load.shape != bias.shape or bias.ndim != 1:
        raise ValueError(f"bias and load must both have shape [E]; got {bias.shape} and {load.shape}")
    step = rate * jnp.sign(jnp.mean(load) - load)
    return bias.astype(_F32) + step
