"""A plugin encoding defined outside the library, registered for the tests (conftest imports it).

Every test that runs over the registry runs over it too: it must build, train, decode and
extrapolate like a built-in, though it is not in the README (built-ins only).
"""

import jax.numpy as jnp
from flax import nnx

import posenc
from posenc.checks import positive
from posenc.model import Encoding, Option, register_encoding


@register_encoding("test_scaled_alibi")
class ScaledAlibi(Encoding):
    """ALiBi times a learned per-head scale: a plugin with an option and a parameter."""

    paper = "test plugin"
    init_scale = Option(0.5, positive, "initial per-head scale of the ALiBi bias")

    def setup(self, rngs, first):
        self.scale = nnx.Param(jnp.full((self.num_heads,), self.init_scale, jnp.float32))

    def bias(self, q_positions, k_positions):
        slopes = posenc.alibi.slopes(self.num_heads)
        return self.scale[...][:, None, None] * posenc.alibi.bias(q_positions, k_positions, slopes)
