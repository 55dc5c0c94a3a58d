"""posenc.expert_blocks: the routed experts over blocks of rows sorted by expert equal posenc.experts'
dense reference in value and gradient, for every block size and routing (an idle expert, every token on
the same experts), with biases, gpt-oss's clamped SwiGLU and Llama 4's input scaling."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import expert_blocks, experts

RNG = np.random.default_rng(3)
T, H, I, E, K = 9, 8, 6, 4, 2


def normal(*shape, scale=1.0):
    return jnp.asarray(RNG.normal(size=shape) * scale, jnp.float32)


def test_block_size_and_the_bound_on_blocks():
    assert expert_blocks.block_size(8192, 8) == 128  # 8192 / 32 = 256, capped
    assert expert_blocks.block_size(8192, 32) == 64
    assert expert_blocks.block_size(2, 8) == 1  # decoding one token: one row per block
    assert expert_blocks.block_size(100, 4) == 4  # 100 / 16 = 6 -> 4
    assert expert_blocks.num_blocks(2, 8, 1) == 2
    rng = np.random.default_rng(0)
    for _ in range(200):  # the bound holds for every split of the pairs over the experts
        e, block = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        sizes = rng.multinomial(int(rng.integers(1, 40)), rng.dirichlet(np.full(e, 0.3)))
        assert sum(-(-n // block) for n in sizes) <= expert_blocks.num_blocks(int(sizes.sum()), e, block)


def test_layout_puts_each_expert_in_its_own_blocks():
    indices = jnp.asarray([[2, 0], [2, 1], [0, 2], [2, 3], [2, 0]], jnp.int32)  # expert 2: 5 pairs, 0: 3
    pair, row, block_expert = expert_blocks.layout(indices, num_experts=E, block=2)
    flat = np.asarray(indices).reshape(-1)
    np.testing.assert_array_equal(flat[np.asarray(pair)], [0, 0, 0, 1, 2, 2, 2, 2, 2, 3])
    # expert 0 in rows 0-2 (block 1 padded), expert 1 row 4, expert 2 rows 6-10, expert 3 row 12
    np.testing.assert_array_equal(np.asarray(row), [0, 1, 2, 4, 6, 7, 8, 9, 10, 12])
    np.testing.assert_array_equal(np.asarray(block_expert), [0, 0, 1, 2, 2, 2, 3])
    assert len(block_expert) == expert_blocks.num_blocks(10, E, 2) == 7


@pytest.mark.parametrize("case", ["mixtral", "gpt_oss", "llama4"])
def test_blocks_equal_the_dense_reference_in_value_and_gradient(case):
    x = normal(T, H, scale=3.0 if case == "gpt_oss" else 1.0)
    gate_up, down = normal(E, H, 2 * I, scale=0.5), normal(E, I, H, scale=0.5)
    kw = {"mixtral": {}, "llama4": {"scale": "input"}, "gpt_oss": {"glu": "clamped_swiglu"}}[case]
    biases = (normal(E, 2 * I), normal(E, H)) if case == "gpt_oss" else (None, None)
    indices = jnp.asarray(RNG.integers(0, E - 1, size=(T, K)), jnp.int32)  # expert E - 1 idle
    indices = indices.at[:, 1].set((indices[:, 0] + 1) % (E - 1))
    two_experts = jnp.tile(jnp.asarray([[1, 2]], jnp.int32), (T, 1))  # every token on experts 1 and 2
    weights = jnp.asarray(RNG.uniform(size=(T, K)), jnp.float32)

    def loss(fn, x, gate_up, down, weights, b1, b2, indices):
        return jnp.sum(jnp.sin(fn(x, indices, weights, gate_up, down, gate_up_bias=b1, down_bias=b2, **kw)))

    @jax.jit
    def grads(x, gate_up, down, weights, b1, b2):
        fns = [experts.routed_dense] + [functools.partial(expert_blocks.routed, block=b) for b in (1, 2, 3, 16)]
        return [[jax.value_and_grad(functools.partial(loss, fn), argnums=(0, 1, 2, 3))(
            x, gate_up, down, weights, b1, b2, idx) for fn in fns] for idx in (indices, two_experts)]

    for want, *got in grads(x, gate_up, down, weights, *biases):
        for value, g in got:
            np.testing.assert_allclose(value, want[0], rtol=1e-5, atol=1e-4)
            for a, b in zip(g, want[1], strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    x3 = x.reshape(3, 3, H)  # any leading shape, the automatic block
    y = expert_blocks.routed(x3, indices.reshape(3, 3, K), weights.reshape(3, 3, K), gate_up, down,
                             gate_up_bias=biases[0], down_bias=biases[1], **kw)
    want = experts.routed(x, indices, weights, gate_up, down, gate_up_bias=biases[0], down_bias=biases[1], **kw)
    np.testing.assert_allclose(y.reshape(T, H), want, rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_named():
    x = normal(T, H)
    gate_up, down = normal(E, H, 2 * I), normal(E, I, H)
    idx, w = jnp.zeros((T, K), jnp.int32), jnp.ones((T, K))
    with pytest.raises(ValueError, match=r"gate_up must have shape \[E, H, 2I\]"):
        expert_blocks.routed(x, idx, w, gate_up.swapaxes(1, 2), down)
    with pytest.raises(ValueError, match="block must be an integer >= 1; got 0"):
        expert_blocks.routed(x, idx, w, gate_up, down, block=0)
