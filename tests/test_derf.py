"""posenc.norms.derf (Dynamic erf) against the official Dynamic_erf, and its properties."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import norms

D = 8
_erf = np.vectorize(math.erf)


# zlab-princeton/Derf at 8dd9ea3cc70370f423a80a80af6f72466bc621db, "DNA model/dynamic_erf.py" and
# "language model/model_derf.patch", Dynamic_erf.forward:
#     self.weight * torch.erf(self.alpha * x + self.shift) + self.bias
# with alpha = ones(1) * 0.5, shift = ones(1) * 0.0, weight = ones(D), bias = zeros(D) at init.
def _official_derf(x, alpha, shift, weight, bias):
    return weight * _erf(alpha * np.asarray(x, np.float64) + shift) + bias


def test_derf_matches_official():
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 3.0, (2, 5, D)).astype(np.float32)
    g, b = rng.uniform(0.5, 1.5, D).astype(np.float32), rng.normal(size=D).astype(np.float32)
    got = norms.derf(jnp.asarray(x), jnp.float32(0.7), jnp.float32(-0.3), g, b)
    np.testing.assert_allclose(got, _official_derf(x, 0.7, -0.3, g, b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norms.derf(x, 0.7, -0.3, g), _official_derf(x, 0.7, -0.3, g, 0.0),
                               rtol=1e-5, atol=1e-6)


def test_derf_at_init_is_bounded_odd_and_differs_from_dyt():
    x = jnp.linspace(-50.0, 50.0, 4 * D).reshape(4, D)
    ones, zeros = jnp.ones(D), jnp.zeros(D)
    y = norms.derf(x, 0.5, 0.0, ones, zeros)
    assert float(jnp.max(jnp.abs(y))) <= 1.0
    np.testing.assert_allclose(norms.derf(-x, 0.5, 0.0, ones), -norms.derf(x, 0.5, 0.0, ones), atol=1e-7)
    # erf(0.5) = 0.5205 against tanh(0.5) = 0.4621: the function is not DyT's
    one = jnp.ones((1, D))
    np.testing.assert_allclose(norms.derf(one, 0.5, 0.0, ones), math.erf(0.5), rtol=1e-6)
    assert abs(float(norms.dyt(one, 0.5, ones)[0, 0]) - math.erf(0.5)) > 0.05


def test_derf_bf16_jit_and_grad():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(3, D)), jnp.bfloat16)
    y = jax.jit(norms.derf)(x, 0.5, 0.1, jnp.ones(D), jnp.zeros(D))
    assert y.dtype == jnp.bfloat16
    g = jax.grad(lambda s: jnp.sum(norms.derf(x.astype(jnp.float32), 0.5, s, jnp.ones(D))))(0.0)
    ref = np.sum(2 / np.sqrt(np.pi) * np.exp(-(0.5 * np.asarray(x, np.float64)) ** 2))
    np.testing.assert_allclose(g, ref, rtol=1e-4)


@pytest.mark.parametrize("args,match", [
    ((jnp.ones(2), 0.0, jnp.ones(D)), "alpha"), ((0.5, jnp.ones(2), jnp.ones(D)), "shift"),
    ((0.5, 0.0, jnp.ones(D + 1)), "gamma")])
def test_derf_rejects_bad_parameter_shapes(args, match):
    with pytest.raises(ValueError, match=match):
        norms.derf(jnp.ones((2, D)), *args)
