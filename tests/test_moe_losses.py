"""posenc.router_losses against their formulas and transformers' load_balancing_loss_func.

References:
- ``load_balancing_loss_func`` of transformers 5.18 (models/mixtral/modeling_mixtral.py), transcribed
  in NumPy float64 below (with and without the attention mask);
- the ST-MoE router z-loss (Zoph et al. 2022, arXiv 2202.08906, eq. 5):
  ``L_z = 1/B sum_i (log sum_j exp(x_ij))^2``;
- DeepSeek-V3's auxiliary-loss-free balancing (arXiv 2412.19437, §2.1.2):
  ``b_i -= gamma`` for an overloaded expert, ``b_i += gamma`` for an underloaded one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import router_losses

RNG = np.random.default_rng(2)
# one compile per configuration instead of one per operation
load_balancing_loss = jax.jit(router_losses.load_balancing_loss, static_argnames=("top_k",))
router_z_loss = jax.jit(router_losses.router_z_loss)


def softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def load_balancing_loss_func(gate_logits, num_experts, top_k, attention_mask=None):
    """transformers: accumulate assignment counts and probability sums over the layers, then
    E * sum(tokens_per_expert * router_prob_per_expert)."""
    tokens_per_expert_sum = np.zeros(num_experts)
    router_prob_sum = np.zeros(num_experts)
    total_rows = 0.0
    if attention_mask is not None:
        flat_mask = np.asarray(attention_mask, np.float64).reshape(-1)
    for layer_gate in gate_logits:
        routing_weights = softmax(layer_gate)
        selected_experts = np.argsort(-routing_weights, -1, kind="stable")[:, :top_k]
        if attention_mask is None:
            tokens_per_expert_sum += np.bincount(selected_experts.reshape(-1), minlength=num_experts)
            router_prob_sum += routing_weights.sum(0)
            total_rows += routing_weights.shape[0]
        else:
            np.add.at(tokens_per_expert_sum, selected_experts.reshape(-1), np.repeat(flat_mask, top_k))
            router_prob_sum += (routing_weights * flat_mask[:, None]).sum(0)
            total_rows += flat_mask.sum()
    tokens_per_expert = tokens_per_expert_sum / total_rows
    router_prob_per_expert = router_prob_sum / total_rows
    return np.sum(tokens_per_expert * router_prob_per_expert) * num_experts


def test_load_balancing_loss_is_transformers():
    layers = [RNG.normal(size=(10, 8)).astype(np.float32) for _ in range(3)]  # 3 layers of [B * S, E]
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])  # [B, S]
    want = load_balancing_loss_func(layers, 8, 2)
    np.testing.assert_allclose(load_balancing_loss(layers, top_k=2), want, rtol=1e-6)
    np.testing.assert_allclose(load_balancing_loss(np.stack(layers), top_k=2), want, rtol=1e-6)
    masked = load_balancing_loss(np.stack(layers).reshape(3, 2, 5, 8), top_k=2, mask=mask)
    np.testing.assert_allclose(masked, load_balancing_loss_func(layers, 8, 2, mask), rtol=1e-6)
    assert masked.dtype == jnp.float32


def test_load_balancing_loss_at_balance_and_collapse():
    # balanced: 8 tokens, each sure of one expert, each expert chosen twice: f_e = P_e = 1/4, loss 1
    eye = np.log(np.eye(4) + 1e-9)[np.arange(8) % 4]
    assert float(load_balancing_loss(eye, top_k=1)) == pytest.approx(1.0, abs=1e-6)
    collapsed = np.tile([10.0, 0.0, 0.0, 0.0], (8, 1))  # every token to expert 0
    assert float(load_balancing_loss(collapsed, top_k=1)) == pytest.approx(4.0, rel=1e-3)


def test_router_z_loss_is_its_formula():
    logits = RNG.normal(scale=3.0, size=(2, 6, 8)).astype(np.float32)
    lse = np.log(np.exp(np.asarray(logits, np.float64)).sum(-1))
    np.testing.assert_allclose(router_z_loss(logits), np.mean(lse ** 2), rtol=1e-6)
    mask = RNG.integers(0, 2, size=(2, 6)).astype(bool)
    np.testing.assert_allclose(router_z_loss(logits, mask=mask), np.mean(lse[mask] ** 2), rtol=1e-6)
    assert float(router_z_loss(logits, mask=np.zeros((2, 6), bool))) == 0.0
    grad = jax.jit(jax.grad(router_losses.router_z_loss))(jnp.asarray(logits))
    assert grad.shape == logits.shape and bool(jnp.all(jnp.isfinite(grad)))


def test_expert_load_and_the_loss_free_bias_update():
    indices = np.array([[0, 1], [0, 2], [0, 1], [3, 0]])
    np.testing.assert_array_equal(router_losses.expert_load(indices, num_experts=5), [4, 2, 1, 1, 0])
    mask = np.array([1, 1, 0, 1])
    load = router_losses.expert_load(indices, num_experts=5, mask=mask)
    np.testing.assert_array_equal(load, [3, 1, 1, 1, 0])
    bias = np.array([0.1, 0.0, -0.2, 0.0, 0.0], np.float32)
    new = router_losses.bias_update(bias, load, rate=1e-3)  # mean load 1.2
    np.testing.assert_allclose(new, bias + 1e-3 * np.array([-1, 1, 1, 1, 1]), rtol=0, atol=1e-7)
    # an expert exactly at the mean keeps its bias
    kept = np.asarray(router_losses.bias_update(bias, np.array([2, 1, 0, 1, 1.0]), rate=0.5))
    np.testing.assert_array_equal(kept[[1, 3, 4]], bias[[1, 3, 4]])
    with pytest.raises(ValueError, match=r"bias and load must both have shape \[E\]"):
        router_losses.bias_update(bias, load[:4])
    with pytest.raises(ValueError, match="rate must be a finite number >= 0.0"):
        router_losses.bias_update(bias, load, rate=-1.0)
