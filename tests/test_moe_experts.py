"""posenc.experts against NumPy transcriptions of the expert layers of transformers 5.x.

References (float64 NumPy, transcribed from transformers 5.18):
- ``MixtralExperts.forward`` (models/mixtral/modeling_mixtral.py; the experts
  of Qwen3-MoE, OLMoE, Qwen3-Next, DeepSeek-V3 and GLM-4.5 are the same code):
  a loop over the experts hit, ``index_add_`` of the weighted outputs;
- ``GptOssExperts.forward`` and ``_apply_gate`` (models/gpt_oss);
- ``Llama4TextMoe.forward`` with ``Llama4TextExperts`` (models/llama4): every
  expert on the input scaled by its score, plus the shared expert;
- ``Qwen3NextSparseMoeBlock.forward`` (models/qwen3_next): the sigmoid-gated
  shared expert.
Weights are given in transformers' layouts and converted as the module
docstring of ``posenc.experts`` says.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import experts, routing

RNG = np.random.default_rng(1)
T, H, I, E = 7, 8, 6, 4
# one compile per configuration instead of one per operation
routed = jax.jit(experts.routed, static_argnames=("glu", "scale"))
routed_dense = jax.jit(experts.routed_dense, static_argnames=("glu", "scale"))
moe = jax.jit(experts.moe, static_argnames=("router", "router_dtype", "glu", "scale", "dense"))
shared_expert = jax.jit(experts.shared_expert, static_argnames=("glu",))


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def f64(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


def mixtral_experts(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj):
    """MixtralExperts.forward: gate_up_proj [E, 2I, H], down_proj [E, H, I] (nn.Linear layout)."""
    hidden_states, top_k_weights, gate_up_proj, down_proj = f64(hidden_states, top_k_weights, gate_up_proj, down_proj)
    final_hidden_states = np.zeros_like(hidden_states)
    for expert_idx in np.unique(top_k_index):
        token_idx, top_k_pos = np.nonzero(top_k_index == expert_idx)
        current_state = hidden_states[token_idx]
        gate, up = np.split(current_state @ gate_up_proj[expert_idx].T, 2, axis=-1)
        current_hidden_states = (silu(gate) * up) @ down_proj[expert_idx].T
        current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
        np.add.at(final_hidden_states, token_idx, current_hidden_states)
    return final_hidden_states


def gpt_oss_apply_gate(gate_up, alpha=1.702, limit=7.0):
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = np.minimum(gate, limit)
    up = np.clip(up, -limit, limit)
    glu = gate * sigmoid(gate * alpha)
    return (up + 1) * glu


def gpt_oss_experts(hidden_states, router_indices, routing_weights, gate_up_proj, gate_up_proj_bias, down_proj,
                    down_proj_bias):
    """GptOssExperts.forward: gate_up_proj [E, H, 2I] (interleaved), down_proj [E, I, H], with biases."""
    hidden_states, routing_weights, gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias = f64(
        hidden_states, routing_weights, gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias)
    next_states = np.zeros_like(hidden_states)
    for expert_idx in np.unique(router_indices):
        token_idx, top_k_pos = np.nonzero(router_indices == expert_idx)
        current_state = hidden_states[token_idx]
        gate_up = current_state @ gate_up_proj[expert_idx] + gate_up_proj_bias[expert_idx]
        out = gpt_oss_apply_gate(gate_up) @ down_proj[expert_idx] + down_proj_bias[expert_idx]
        np.add.at(next_states, token_idx, out * routing_weights[token_idx, top_k_pos, None])
    return next_states


def llama4_text_moe(hidden_states, router_scores, gate_up_proj, down_proj, shared):
    """Llama4TextMoe.forward given the dense router scores [T, E]: every expert on x * score, summed, + shared."""
    hidden_states, router_scores, gate_up_proj, down_proj = f64(hidden_states, router_scores, gate_up_proj, down_proj)
    routed_in = np.repeat(hidden_states[None], router_scores.shape[1], 0) * router_scores.T[:, :, None]
    gate, up = np.split(routed_in @ gate_up_proj, 2, axis=-1)  # torch.bmm, chunk(2)
    routed_out = (up * silu(gate)) @ down_proj
    return shared_mlp(hidden_states, *shared) + routed_out.sum(0)


def shared_mlp(x, gate_proj, up_proj, down_proj):
    """Qwen3NextMLP / DeepseekV3MLP / Llama4TextMLP: down(silu(gate(x)) * up(x)), nn.Linear weights."""
    x, gate_proj, up_proj, down_proj = f64(x, gate_proj, up_proj, down_proj)
    return (silu(x @ gate_proj.T) * (x @ up_proj.T)) @ down_proj.T


def linear_layout(gate_proj, up_proj, down_proj):
    """nn.Linear weights of a gated MLP -> posenc's gate_up [H, 2I] (halves) and down [I, H]."""
    return np.concatenate([gate_proj.T, up_proj.T], -1), down_proj.T


def normal(*shape, scale=1.0):
    return (scale * RNG.normal(size=shape)).astype(np.float32)


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


def routing_of(logits, k):
    return routing.softmax_top_k(logits, k=k, normalize=True)


def test_routed_is_mixtral_experts():
    x = normal(T, H)
    gate_up_proj, down_proj = normal(E, 2 * I, H, scale=0.5), normal(E, H, I, scale=0.5)
    r = routing_of(normal(T, E), 2)
    want = mixtral_experts(x, np.asarray(r.indices), np.asarray(r.weights), gate_up_proj, down_proj)
    args = (x, r.indices, r.weights, gate_up_proj.swapaxes(1, 2), down_proj.swapaxes(1, 2))
    close(routed(*args), want)
    close(routed_dense(*args), want)


def test_routed_is_gpt_oss_experts_with_clamps_and_biases():
    x = normal(T, H, scale=3.0)  # large enough that the clamps at 7 bite
    gate_up_proj, gate_up_bias = normal(E, H, 2 * I), normal(E, 2 * I)
    down_proj, down_bias = normal(E, I, H, scale=0.1), normal(E, H)
    r = routing.top_k_softmax(normal(T, E), k=2)
    h = np.asarray(x, np.float64) @ gate_up_proj[0]
    assert (h[:, ::2] > 7).any() and (np.abs(h[:, 1::2]) > 7).any()
    want = gpt_oss_experts(x, np.asarray(r.indices), np.asarray(r.weights), gate_up_proj, gate_up_bias, down_proj,
                           down_bias)
    kw = dict(gate_up_bias=gate_up_bias, down_bias=down_bias, glu="clamped_swiglu")
    close(routed(x, r.indices, r.weights, gate_up_proj, down_proj, **kw), want, tol=1e-4)
    close(routed_dense(x, r.indices, r.weights, gate_up_proj, down_proj, **kw), want, tol=1e-4)
    close(experts.clamped_swiglu(h.astype(np.float32)), gpt_oss_apply_gate(h), tol=1e-4)


def test_moe_with_input_scaling_and_a_shared_expert_is_llama4():
    x = normal(T, H)
    router_weight = normal(E, H)
    gate_up_proj, down_proj = normal(E, H, 2 * I, scale=0.5), normal(E, I, H, scale=0.5)
    shared = (normal(I, H, scale=0.5), normal(I, H, scale=0.5), normal(H, I, scale=0.5))
    y, r = moe(x, router_weight.T, gate_up_proj, down_proj,
                       router=functools.partial(routing.top_k_sigmoid, k=1), scale="input")
    y = y + shared_expert(x, *linear_layout(*shared))
    scores = np.zeros((T, E))
    np.put_along_axis(scores, np.asarray(r.indices), np.asarray(r.weights, np.float64), axis=1)
    close(y, llama4_text_moe(x, scores, gate_up_proj, down_proj, shared))


def test_shared_expert_with_a_sigmoid_gate_is_qwen3_next():
    x = normal(2, 3, H)
    shared = (normal(I, H), normal(I, H), normal(H, I))
    gate = normal(1, H)  # shared_expert_gate.weight
    want = sigmoid(np.asarray(x, np.float64) @ gate.T.astype(np.float64)) * shared_mlp(x, *shared)
    close(shared_expert(x, *linear_layout(*shared), gate=gate), want)
    close(shared_expert(x, *linear_layout(*shared)), shared_mlp(x, *shared))


def test_moe_is_mixtral_sparse_moe_block_for_any_leading_shape():
    x = normal(2, 3, H)
    gate_weight = normal(E, H)
    gate_up_proj, down_proj = normal(E, 2 * I, H, scale=0.5), normal(E, H, I, scale=0.5)
    y, r = moe(x, gate_weight.T, gate_up_proj.swapaxes(1, 2), down_proj.swapaxes(1, 2),
                       router=functools.partial(routing.softmax_top_k, k=2, normalize=True))
    assert y.shape == x.shape and r.indices.shape == (2, 3, 2) and r.logits.shape == (2, 3, E)
    logits = np.asarray(x.reshape(-1, H), np.float64) @ gate_weight.T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    idx = np.argsort(-probs, -1)[:, :2]
    w = np.take_along_axis(probs, idx, -1)
    w /= w.sum(-1, keepdims=True)
    close(y.reshape(-1, H), mixtral_experts(x.reshape(-1, H), idx, w, gate_up_proj, down_proj))


def test_ragged_and_dense_agree_in_value_and_gradient_with_an_idle_expert():
    x = normal(T, H)
    gate_up, down = normal(E, H, 2 * I, scale=0.5), normal(E, I, H, scale=0.5)
    indices = jnp.asarray(RNG.integers(0, E - 1, size=(T, 2)), jnp.int32)  # expert E - 1 gets no token
    indices = indices.at[:, 1].set((indices[:, 0] + 1) % (E - 1))
    weights = jnp.asarray(RNG.uniform(size=(T, 2)), jnp.float32)
    order, sizes = experts.sort_by_expert(indices, num_experts=E)
    assert int(sizes[E - 1]) == 0 and int(sizes.sum()) == 2 * T
    assert (np.diff(np.asarray(indices).reshape(-1)[np.asarray(order)]) >= 0).all()

    def loss(fn, gate_up, down, weights):
        return jnp.sum(jnp.sin(fn(x, indices, weights, gate_up, down, scale="input")))

    @jax.jit
    def both(gate_up, down, weights):
        return [jax.value_and_grad(functools.partial(loss, fn), argnums=(0, 1, 2))(gate_up, down, weights)
                for fn in (experts.routed, experts.routed_dense)]

    ragged, dense = both(gate_up, down, weights)
    close(ragged[0], dense[0])
    for g_ragged, g_dense in zip(ragged[1], dense[1], strict=True):
        close(g_ragged, g_dense)
    assert float(jnp.abs(ragged[1][0][E - 1]).max()) == 0.0


def test_bfloat16_in_bfloat16_out():
    x = jnp.asarray(normal(T, H), jnp.bfloat16)
    gate_up, down = normal(E, H, 2 * I, scale=0.5), normal(E, I, H, scale=0.5)
    r = routing_of(routing.router_logits(x, normal(H, E)), 2)
    y = routed(x, r.indices, r.weights, gate_up, down)
    assert y.dtype == jnp.bfloat16
    want = routed(x.astype(jnp.float32), r.indices, r.weights, gate_up, down)
    close(y.astype(jnp.float32), np.asarray(want, np.float64), tol=0.1)


def test_bad_arguments_are_named():
    x = normal(T, H)
    gate_up, down = normal(E, H, 2 * I), normal(E, I, H)
    r = routing_of(normal(T, E), 2)
    with pytest.raises(ValueError, match=r"gate_up must have shape \[E, H, 2I\]"):
        experts.routed(x, r.indices, r.weights, gate_up.swapaxes(1, 2), down)
    with pytest.raises(ValueError, match="indices and weights must have shape"):
        experts.routed(x, r.indices[:3], r.weights[:3], gate_up, down)
    with pytest.raises(ValueError, match="unknown scale 'inputs'"):
        experts.routed(x, r.indices, r.weights, gate_up, down, scale="inputs")
    with pytest.raises(ValueError, match="unknown glu 'geglu'; choose one of: clamped_swiglu, swiglu"):
        experts.mlp(x, gate_up[0], down[0], glu="geglu")
    with pytest.raises(ValueError, match=r"gate must have shape \[H\]"):
        experts.shared_expert(x, gate_up[0], down[0], gate=normal(2, H))
