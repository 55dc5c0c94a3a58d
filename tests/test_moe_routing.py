"""posenc.routing against NumPy transcriptions of the routers of transformers 5.x.

References (float64 NumPy, transcribed from transformers 5.18):
- ``MixtralTopKRouter.forward`` (models/mixtral/modeling_mixtral.py);
- ``Qwen3MoeTopKRouter.forward`` (models/qwen3_moe; ``OlmoeTopKRouter`` and
  ``Qwen3NextTopKRouter`` are the same code);
- ``DeepseekV3TopkRouter.forward`` (models/deepseek_v3; ``Glm4MoeTopkRouter``
  is the same code);
- ``Llama4Router.forward`` (models/llama4);
- ``GptOssTopKRouter.forward`` (models/gpt_oss).
``torch.topk`` is transcribed as a descending stable argsort: on the random
inputs here no two values tie.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import routing

RNG = np.random.default_rng(0)
# one compile per configuration instead of one per operation
softmax_top_k = jax.jit(routing.softmax_top_k, static_argnames=("k", "normalize", "round_weights"))
sigmoid_top_k = jax.jit(routing.sigmoid_top_k, static_argnames=("k", "n_group", "topk_group", "normalize", "scaling"))


def topk(x, k):
    """torch.topk(x, k, dim=-1) -> (values, indices), descending (ties to the lower index)."""
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, idx, -1), idx


def softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def mixtral_router(router_logits):
    """MixtralTopKRouter: softmax(float), topk, router_top_value /= sum (always)."""
    router_probs = softmax(router_logits)
    router_top_value, router_indices = topk(router_probs, 2)
    router_top_value = router_top_value / router_top_value.sum(-1, keepdims=True)
    return router_top_value, router_indices


def qwen3_moe_router(router_logits, top_k, norm_topk_prob):
    """Qwen3MoeTopKRouter: softmax(float), topk, optional renormalisation, .to(router_logits.dtype)."""
    router_probs = softmax(router_logits)
    router_top_value, router_indices = topk(router_probs, top_k)
    if norm_topk_prob:
        router_top_value = router_top_value / router_top_value.sum(-1, keepdims=True)
    return router_top_value, router_indices


def deepseek_v3_router(router_logits, bias, top_k, num_group, topk_group, norm_topk_prob, routed_scaling_factor):
    """DeepseekV3TopkRouter.forward after the float32 linear."""
    num_experts = router_logits.shape[-1]
    scores = sigmoid(router_logits)
    scores_for_choice = scores + bias
    group_scores = topk(scores_for_choice.reshape(-1, num_group, num_experts // num_group), 2)[0].sum(-1)
    group_idx = topk(group_scores, topk_group)[1]
    group_mask = np.zeros_like(group_scores)
    np.put_along_axis(group_mask, group_idx, 1, axis=1)
    score_mask = np.repeat(group_mask[:, :, None], num_experts // num_group, axis=2).reshape(-1, num_experts)
    scores_for_choice = np.where(score_mask.astype(bool), scores_for_choice, -np.inf)
    topk_indices = topk(scores_for_choice, top_k)[1]
    topk_weights = np.take_along_axis(scores, topk_indices, 1)
    if norm_topk_prob:
        topk_weights = topk_weights / (topk_weights.sum(-1, keepdims=True) + 1e-20)
    return topk_weights * routed_scaling_factor, topk_indices


def llama4_router(router_logits, top_k):
    """Llama4Router: topk of the logits, scatter into -inf, sigmoid -> dense scores [T, E]."""
    router_top_value, router_indices = topk(router_logits, top_k)
    router_scores = np.full_like(router_logits, -np.inf, dtype=np.float64)
    np.put_along_axis(router_scores, router_indices, router_top_value, axis=1)
    return sigmoid(router_scores)


def gpt_oss_router(hidden_states, weight, bias, top_k):
    """GptOssTopKRouter: F.linear with bias, topk, softmax over the top-k values."""
    router_logits = np.asarray(hidden_states, np.float64) @ np.asarray(weight, np.float64).T + bias
    router_top_value, router_indices = topk(router_logits, top_k)
    return router_logits, softmax(router_top_value), router_indices


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


def test_softmax_top_k_is_mixtral_and_qwen3_moe():
    logits = RNG.normal(size=(12, 8)).astype(np.float32)
    r = softmax_top_k(logits, k=2, normalize=True)
    w, i = mixtral_router(logits)
    assert r.indices.dtype == jnp.int32 and r.weights.dtype == jnp.float32
    np.testing.assert_array_equal(r.indices, i)
    close(r.weights, w)
    assert r.logits is not None and r.logits.shape == (12, 8)
    for norm in (True, False):
        r = softmax_top_k(logits, k=3, normalize=norm, round_weights=True)
        w, i = qwen3_moe_router(logits, 3, norm)
        np.testing.assert_array_equal(r.indices, i)
        close(r.weights, w)


def test_softmax_top_k_rounds_the_weights_to_the_logits_dtype_when_asked():
    logits = jnp.asarray(RNG.normal(size=(6, 8)), jnp.bfloat16)
    plain = softmax_top_k(logits, k=2)
    rounded = softmax_top_k(logits, k=2, round_weights=True)
    assert plain.weights.dtype == rounded.weights.dtype == jnp.float32
    np.testing.assert_array_equal(rounded.weights, plain.weights.astype(jnp.bfloat16).astype(jnp.float32))
    assert not np.array_equal(plain.weights, rounded.weights)


def test_sigmoid_top_k_is_deepseek_v3():
    logits = RNG.normal(size=(2, 7, 16)).astype(np.float32)  # any leading shape
    bias = RNG.normal(scale=0.3, size=16).astype(np.float32)
    for n_group, topk_group, k, norm, scaling in ((4, 2, 4, True, 2.5), (1, 1, 3, False, 1.0), (8, 3, 5, True, 1.0)):
        r = sigmoid_top_k(logits, k=k, bias=bias, n_group=n_group, topk_group=topk_group, normalize=norm,
                                  scaling=scaling)
        w, i = deepseek_v3_router(logits.reshape(-1, 16), bias, k, n_group, topk_group, norm, scaling)
        assert r.indices.shape == r.weights.shape == (2, 7, k)
        np.testing.assert_array_equal(np.asarray(r.indices).reshape(-1, k), i)
        close(np.asarray(r.weights).reshape(-1, k), w)


def test_sigmoid_top_k_groups_limit_the_choice_and_the_bias_only_selects():
    # group 0 holds the best single expert, group 1 the best pair: with one group kept, group 1 wins
    logits = np.array([[4.0, -4.0, 2.0, 2.0]], np.float32)
    assert set(np.asarray(sigmoid_top_k(logits, k=1).indices).ravel()) == {0}
    r = sigmoid_top_k(logits, k=2, n_group=2, topk_group=1)
    assert sorted(np.asarray(r.indices).ravel()) == [2, 3]
    # a bias moves the choice; the weights stay the unbiased sigmoid scores
    bias = np.array([0.0, 0.0, -0.9, 0.0], np.float32)
    r = sigmoid_top_k(logits, k=2, bias=bias)
    assert list(np.asarray(r.indices).ravel()) == [0, 3]
    close(r.weights[0], sigmoid([4.0, 2.0]))


def test_top_k_sigmoid_is_llama4():
    logits = RNG.normal(size=(10, 4)).astype(np.float32)
    for k in (1, 2):
        r = routing.top_k_sigmoid(logits, k=k)
        dense = np.zeros((10, 4))
        np.put_along_axis(dense, np.asarray(r.indices), np.asarray(r.weights, np.float64), axis=1)
        close(dense, llama4_router(logits, k))


def test_top_k_softmax_is_gpt_oss_with_the_router_bias():
    x = RNG.normal(size=(9, 6)).astype(np.float32)
    weight, bias = RNG.normal(size=(8, 6)).astype(np.float32), RNG.normal(size=8).astype(np.float32)
    r = routing.top_k_softmax(routing.router_logits(x, weight.T, bias), k=2)
    logits, w, i = gpt_oss_router(x, weight, bias, 2)
    close(r.logits, logits)
    np.testing.assert_array_equal(r.indices, i)
    close(r.weights, w)


def test_router_logits_dtype():
    x = jnp.asarray(RNG.normal(size=(3, 6)), jnp.bfloat16)
    w = RNG.normal(size=(6, 4)).astype(np.float32)
    assert routing.router_logits(x, w).dtype == jnp.bfloat16  # Mixtral, Qwen3-MoE: the input dtype
    f32 = routing.router_logits(x, w, dtype=jnp.float32)  # DeepSeek-V3: float32 operands
    close(f32, np.asarray(x, np.float64) @ w, tol=1e-6)
    with pytest.raises(ValueError, match=r"weight must have shape \[H, E\]"):
        routing.router_logits(x, w.T)


def test_ties_go_to_the_lower_index():
    # jax.lax.top_k is stable; torch.topk's order of ties is unspecified (module docstring)
    values, indices = routing.top_k(jnp.array([1.0, 3.0, 3.0, 0.0, 3.0, 2.0]), 2)
    np.testing.assert_array_equal(indices, [1, 2])
    r = softmax_top_k(jnp.zeros((2, 8)), k=2, normalize=True)  # a router initialised to zeros
    np.testing.assert_array_equal(r.indices, [[0, 1], [0, 1]])
    close(r.weights, np.full((2, 2), 0.5))
    r = sigmoid_top_k(jnp.zeros((1, 8)), k=2, n_group=4, topk_group=2)
    np.testing.assert_array_equal(r.indices, [[0, 1]])


def test_routers_run_under_jit_and_name_bad_arguments():
    logits = jnp.asarray(RNG.normal(size=(4, 16)), jnp.float32)
    f = jax.jit(functools.partial(routing.sigmoid_top_k, k=4, n_group=4, topk_group=2, normalize=True))
    np.testing.assert_array_equal(f(logits).indices, routing.sigmoid_top_k(
        logits, k=4, n_group=4, topk_group=2, normalize=True).indices)
    assert set(routing.ROUTERS) == {"softmax_top_k", "top_k_softmax", "sigmoid_top_k", "top_k_sigmoid"}
    with pytest.raises(ValueError, match="n_group must divide"):
        routing.sigmoid_top_k(logits, k=2, n_group=3)
    with pytest.raises(ValueError, match="at least 2 experts"):
        routing.sigmoid_top_k(logits, k=2, n_group=16)
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 8\]"):
        routing.sigmoid_top_k(logits, k=9, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 16\]"):
        routing.softmax_top_k(logits, k=0)
    with pytest.raises(ValueError, match="normalize must be True or False"):
        routing.softmax_top_k(logits, k=2, normalize="yes")
