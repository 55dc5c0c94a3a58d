import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import alibi


def reference_get_slopes(n):
    """NumPy transcription of get_slopes from ofirpress/attention_with_linear_biases."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + reference_get_slopes(2 * closest_power_of_2)[0::2][
        : n - closest_power_of_2
    ]


def test_slopes_golden_vectors():
    np.testing.assert_allclose(alibi.slopes(8), [2.0**-k for k in range(1, 9)], rtol=1e-6)
    np.testing.assert_allclose(alibi.slopes(6), [0.25, 0.0625, 0.015625, 0.0039063, 0.5, 0.125], rtol=1e-4)
    want12 = [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.0039063, 0.70711, 0.35355, 0.17678, 0.088388]
    np.testing.assert_allclose(alibi.slopes(12), want12, rtol=1e-4)


def test_slopes_match_official_for_1_to_64():
    for n in range(1, 65):
        got = alibi.slopes(n)
        assert got.shape == (n,) and got.dtype == jnp.float32
        np.testing.assert_allclose(got, reference_get_slopes(n), rtol=1e-6, err_msg=f"n={n}")


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "8"])
def test_slopes_bad_num_heads(bad):
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1; got"):
        alibi.slopes(bad)


def test_bias_values_causal_and_symmetric():
    s = jnp.array([0.5, 0.25])
    q, k = jnp.array([2, 3]), jnp.array([0, 1, 2, 3])
    causal = alibi.bias(q, k, s)
    assert causal.shape == (2, 2, 4) and causal.dtype == jnp.float32
    d = np.array([[2, 1, 0, -1], [3, 2, 1, 0]], np.float32)
    np.testing.assert_allclose(causal, -np.array([0.5, 0.25])[:, None, None] * d)
    sym = alibi.bias(q, k, s, causal=False)
    np.testing.assert_allclose(sym, -np.array([0.5, 0.25])[:, None, None] * np.abs(d))


@settings(max_examples=25, deadline=None)
@given(shift=st.integers(-1000, 1000), causal=st.booleans())
def test_bias_depends_only_on_distance(shift, causal):
    s = alibi.slopes(4)
    q, k = jnp.array([3, 7, 9]), jnp.array([0, 2, 5, 9, 11])
    np.testing.assert_allclose(
        alibi.bias(q + shift, k + shift, s, causal=causal), alibi.bias(q, k, s, causal=causal), atol=1e-6
    )


def test_bias_batch_jit_vmap_grad():
    s = alibi.slopes(3)
    q = jnp.array([[4, 5], [10, 11]])
    k = jnp.array([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    out = jax.jit(alibi.bias)(q, k, s)
    assert out.shape == (2, 3, 2, 6)
    np.testing.assert_allclose(out[0], out[1])  # same distances in both rows
    np.testing.assert_allclose(jax.vmap(alibi.bias, in_axes=(0, 0, None))(q, k, s), out)
    g = jax.grad(lambda sl: alibi.bias(q, k, sl).sum())(s)
    np.testing.assert_allclose(g, [-2 * sum(4 + 5 - 2 * j for j in range(6))] * 3)


def test_bias_errors():
    with pytest.raises(ValueError, match=r"slopes must have shape \[H\]"):
        alibi.bias(jnp.arange(2), jnp.arange(2), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="q_positions must be an integer array"):
        alibi.bias(jnp.arange(2.0), jnp.arange(2), jnp.ones(2))
