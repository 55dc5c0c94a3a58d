"""Mixture-of-experts experts: gated MLPs, the routed experts as a grouped matmul, shared experts.

The routed experts run as ``jax.lax.ragged_dot`` (a grouped matmul): the
``T * k`` (token, slot) pairs are sorted by expert, the tokens gathered in
that order, and each expert multiplies only its contiguous group of rows
(``group_sizes [E]``), so the work is ``T * k`` rows, not ``T * E``. The
outputs are weighted and scatter-added back to their tokens in float32
(:func:`routed`). :func:`routed_dense` computes every expert on every token
and masks, the reference the grouped path equals (and a choice for a few
experts on hardware without a grouped matmul).

Weight layout (input dimension first, as ``x @ w``)::

    gate_up [E, H, 2I]   down [E, I, H]   gate_up_bias [E, 2I]   down_bias [E, H]

transformers 5.x stores ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``
(the ``nn.Linear`` layout) for Mixtral, Qwen3-MoE, OLMoE, Qwen3-Next,
DeepSeek-V3 and GLM-4.5: swap their last two axes. gpt-oss
(``GptOssExperts``) and Llama 4 (``Llama4TextExperts``) store this layout
already. The last axis of ``gate_up`` holds gate and up either as halves
(``chunk(2, dim=-1)``: :func:`swiglu`, every model but gpt-oss) or
interleaved (``[..., ::2]`` / ``[..., 1::2]``: gpt-oss, :func:`clamped_swiglu`).

Matmuls run in the dtype of ``x`` (weights are cast to it), the activation in
float32, the combine in float32; the output has the dtype of ``x``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.moe import routing

_F32 = jnp.float32


def swiglu(gate_up, *, activation: Callable = jax.nn.silu) -> jax.Array:
    """SwiGLU ``act(gate) * up`` with gate and up the two halves of the last axis.

    transformers ``MixtralExperts`` and the others: ``gate, up =
    linear(x, gate_up_proj).chunk(2, dim=-1); act_fn(gate) * up`` with
    ``hidden_act = "silu"`` (Shazeer 2020, "GLU Variants Improve Transformer").
    float32 inside.

    Shapes: gate_up ``[..., 2I]`` -> ``[..., I]``, the dtype of gate_up.
    """
    gate_up = jnp.asarray(gate_up)
    gate, up = jnp.split(gate_up.astype(_F32), 2, axis=-1)
    return (activation(gate) * up).astype(gate_up.dtype)


def clamped_swiglu(gate_up, *, alpha: float = 1.702, limit: float = 7.0) -> jax.Array:
    """gpt-oss's clamped SwiGLU, gate and up interleaved on the last axis.

    transformers ``GptOssExperts._apply_gate``::

        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = min(gate, limit);  up = clip(up, -limit, limit)
        out = (up + 1) * gate * sigmoid(alpha * gate)

    (alpha 1.702, limit = ``swiglu_limit`` 7.0.) float32 inside.

    Shapes: gate_up ``[..., 2I]`` -> ``[..., I]``, the dtype of gate_up.
    """
    gate_up = jnp.asarray(gate_up)
    alpha = checks.number("alpha", alpha)
    limit = checks.number("limit", limit, positive=True)
    h = gate_up.astype(_F32)
    gate = jnp.minimum(h[..., ::2], limit)
    up = jnp.clip(h[..., 1::2], -limit, limit)
    glu = gate * jax.nn.sigmoid(gate * alpha)
    return ((up + 1.0) * glu).astype(gate_up.dtype)


GLUS: dict[str, Callable] = {"swiglu": swiglu, "clamped_swiglu": clamped_swiglu}


def _glu(glu) -> Callable:
    if callable(glu):
        return glu
    return GLUS[checks.choice("glu", glu, GLUS)]


def _add_bias(h, bias, rows=None):
    if bias is None:
        return h
    bias = jnp.asarray(bias).astype(h.dtype)
    return h + (bias if rows is None else bias[rows])


def mlp(x, gate_up, down, *, gate_up_bias=None, down_bias=None, glu="swiglu") -> jax.Array:
    """One gated MLP ``down(glu(x @ gate_up + b1)) + b2`` (a dense layer or a shared expert).

    ``glu``: "swiglu" (halves), "clamped_swiglu" (gpt-oss, interleaved) or a
    callable ``[..., 2I] -> [..., I]``.

    Shapes: x ``[..., H]``, gate_up ``[H, 2I]``, down ``[I, H]``,
    gate_up_bias ``[2I]``, down_bias ``[H]`` -> like x.
    """
    x = jnp.asarray(x)
    h = _add_bias(jnp.matmul(x, jnp.asarray(gate_up).astype(x.dtype)), gate_up_bias)
    a = _glu(glu)(h).astype(x.dtype)
    return _add_bias(jnp.matmul(a, jnp.asarray(down).astype(x.dtype)), down_bias)


def shared_expert(x, gate_up, down, *, gate=None, glu="swiglu") -> jax.Array:
    """A shared expert (every token), optionally times a sigmoid gate per token.

    DeepSeek-V3 / GLM-4.5: ``shared_experts(x)``, one MLP of intermediate size
    ``n_shared_experts * moe_intermediate_size`` (``gate_up`` is
    ``concat([gate_proj.weight.T, up_proj.weight.T], -1)``, ``down`` is
    ``down_proj.weight.T``); Llama 4: ``shared_expert(x)``. Qwen3-Next
    (``Qwen3NextSparseMoeBlock``)::

        sigmoid(x @ shared_expert_gate) * shared_expert(x)

    with ``gate`` = ``shared_expert_gate.weight [1, H]`` as ``[H]`` (or
    ``[H, 1]``); the gate is float32 inside.

    Shapes: x ``[..., H]``, gate_up ``[H, 2I]``, down ``[I, H]``, gate ``[H]`` -> like x.
    """
    x = jnp.asarray(x)
    y = mlp(x, gate_up, down, glu=glu)
    if gate is None:
        return y
    gate = jnp.asarray(gate).reshape(-1)
    if gate.shape != x.shape[-1:]:
        raise ValueError(f"gate must have shape [H] or [H, 1] with H = {x.shape[-1]}; got {gate.shape}")
    g = jax.nn.sigmoid(jnp.matmul(x.astype(_F32), gate.astype(_F32))[..., None])
    return (g * y.astype(_F32)).astype(x.dtype)


def sort_by_expert(indices, *, num_experts: int) -> tuple[jax.Array, jax.Array]:
    """The order that sorts the ``T * k`` (token, slot) pairs by expert, and each expert's count.

    ``order`` is a stable argsort of ``indices.reshape(-1)`` (pair ``p`` is
    token ``p // k``, slot ``p % k``); ``group_sizes[e]`` is how many pairs go
    to expert ``e`` (``jax.lax.ragged_dot``'s ``group_sizes``). Indices must
    lie in ``[0, num_experts)``.

    Shapes: indices int ``[T, k]`` -> order int32 ``[T * k]``, group_sizes int32 ``[E]``.
    """
    flat = jnp.asarray(indices).reshape(-1)
    num_experts = checks.integer("num_experts", num_experts, minimum=1)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return order, group_sizes


def _prepare(x, indices, weights, gate_up, down, scale):
    x = jnp.asarray(x)
    gate_up, down = jnp.asarray(gate_up), jnp.asarray(down)
    hidden = x.shape[-1]
    if gate_up.ndim != 3 or gate_up.shape[1] != hidden or down.ndim != 3 or down.shape[2] != hidden \
            or down.shape[0] != gate_up.shape[0]:
        raise ValueError(f"gate_up must have shape [E, H, 2I] and down [E, I, H] with H = {hidden}; "
                         f"got {gate_up.shape} and {down.shape}")
    indices = jnp.asarray(indices)
    k = indices.shape[-1]
    if indices.shape[:-1] != x.shape[:-1] or jnp.shape(weights) != indices.shape:
        raise ValueError(f"indices and weights must have shape [..., k] with [...] = {x.shape[:-1]}; "
                         f"got {indices.shape} and {jnp.shape(weights)}")
    checks.choice("scale", scale, ("output", "input"))
    x2 = x.reshape(-1, hidden)
    return (x2, indices.reshape(-1, k).astype(jnp.int32), jnp.asarray(weights, _F32).reshape(-1, k),
            gate_up.astype(x.dtype), down.astype(x.dtype))


def routed(x, indices, weights, gate_up, down, *, gate_up_bias=None, down_bias=None, glu="swiglu",
           scale="output") -> jax.Array:
    """The routed experts as a grouped matmul over tokens sorted by expert.

    For each token ``t`` and slot ``j`` with expert ``e = indices[t, j]`` and
    weight ``w = weights[t, j]``::

        y_t = sum_j w * expert_e(x_t)        scale="output" (Mixtral, Qwen3-MoE, DeepSeek-V3, gpt-oss, ...)
        y_t = sum_j expert_e(w * x_t)        scale="input"  (Llama 4, Llama4TextMoe)

    with ``expert_e(x) = glu(x @ gate_up[e] + gate_up_bias[e]) @ down[e] +
    down_bias[e]``. transformers loops over the experts hit and
    ``index_add_``s (``MixtralExperts.forward``, ``GptOssExperts.forward``);
    here the pairs are sorted by expert (:func:`sort_by_expert`), both
    matmuls are ``jax.lax.ragged_dot`` over the sorted rows, and the rows are
    weighted and scatter-added back in float32. Equal to :func:`routed_dense`.

    Shapes: x ``[..., H]``, indices int ``[..., k]`` in ``[0, E)``, weights
    ``[..., k]``, gate_up ``[E, H, 2I]``, down ``[E, I, H]``, gate_up_bias
    ``[E, 2I]``, down_bias ``[E, H]`` -> like x.
    """
    x = jnp.asarray(x)
    x2, idx, w, gate_up, down = _prepare(x, indices, weights, gate_up, down, scale)
    k = idx.shape[1]
    order, group_sizes = sort_by_expert(idx, num_experts=gate_up.shape[0])
    token = order // k
    expert = idx.reshape(-1)[order]
    w_sorted = w.reshape(-1)[order][:, None]
    rows = x2[token]
    if scale == "input":
        rows = (rows.astype(_F32) * w_sorted).astype(x.dtype)
    h = _add_bias(jax.lax.ragged_dot(rows, gate_up, group_sizes), gate_up_bias, expert)
    a = _glu(glu)(h).astype(x.dtype)
    out = _add_bias(jax.lax.ragged_dot(a, down, group_sizes), down_bias, expert).astype(_F32)
    if scale == "output":
        out = out * w_sorted
    y = jnp.zeros(x2.shape, _F32).at[token].add(out)
    return y.astype(x.dtype).reshape(x.shape)


def routed_dense(x, indices, weights, gate_up, down, *, gate_up_bias=None, down_bias=None, glu="swiglu",
                 scale="output") -> jax.Array:
    """:func:`routed` computed densely: every expert on every token, then masked by the routing.

    ``T * E`` rows of work instead of ``T * k``: the reference for
    :func:`routed`, and a choice for few experts. Same arguments and shapes.
    """
    x = jnp.asarray(x)
    x2, idx, w, gate_up, down = _prepare(x, indices, weights, gate_up, down, scale)
    num_experts = gate_up.shape[0]
    one_hot = jax.nn.one_hot(idx, num_experts, dtype=_F32)  # [T, k, E]
    dense_w = jnp.einsum("tk,tke->et", w, one_hot)  # [E, T]: the weight of expert e for token t, 0 if not chosen
    chosen = jnp.sum(one_hot, axis=1).T  # [E, T]
    rows = jnp.broadcast_to(x2, (num_experts, *x2.shape))
    if scale == "input":
        rows = (rows.astype(_F32) * dense_w[..., None]).astype(x.dtype)
    h = jnp.einsum("eth,ehn->etn", rows, gate_up)
    if gate_up_bias is not None:
        h = h + jnp.asarray(gate_up_bias).astype(h.dtype)[:, None]
    a = _glu(glu)(h).astype(x.dtype)
    out = jnp.einsum("eti,eih->eth", a, down)
    if down_bias is not None:
        out = out + jnp.asarray(down_bias).astype(out.dtype)[:, None]
    mix = dense_w if scale == "output" else chosen
    y = jnp.einsum("et,eth->th", mix, out.astype(_F32))
    return y.astype(x.dtype).reshape(x.shape)


def moe(x, router_weight, gate_up, down, *, router: Callable[..., routing.Routing], router_bias=None,
        router_dtype=None, gate_up_bias=None, down_bias=None, glu="swiglu", scale="output",
        dense: bool = False) -> tuple[jax.Array, routing.Routing]:
    """A mixture-of-experts layer: router logits, a router, the routed experts.

    ``router`` maps logits ``[..., E]`` to a :class:`posenc.routing.Routing`,
    e.g. ``functools.partial(posenc.routing.softmax_top_k, k=2, normalize=True)``
    (Mixtral). The logits are ``posenc.routing.router_logits(x, router_weight,
    router_bias, dtype=router_dtype)`` (``router_dtype=jnp.float32`` for
    DeepSeek-V3 / GLM-4.5). The experts are :func:`routed` (``dense=True``:
    :func:`routed_dense`). Shared experts add :func:`shared_expert` to the
    output.

    Shapes: x ``[..., H]``, router_weight ``[H, E]``, gate_up ``[E, H, 2I]``,
    down ``[E, I, H]`` -> (like x, the :class:`~posenc.routing.Routing`).
    """
    logits = routing.router_logits(x, router_weight, router_bias, dtype=router_dtype)
    r = router(logits)
    experts = routed_dense if checks.boolean("dense", dense) else routed
    y = experts(x, r.indices, r.weights, gate_up, down, gate_up_bias=gate_up_bias, down_bias=down_bias,
                glu=glu, scale=scale)
    return y, r
