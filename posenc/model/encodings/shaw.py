"""Shaw et al. relative key and value embeddings, clipped at max_distance."""

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.checks import positive_int
from posenc.encodings import shaw
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("shaw")
class Shaw(Encoding):
    """Clipped relative key and value tables [2k + 1, Dh], shared by heads."""

    relative = True
    paper = "Shaw et al. 2018"
    pure = "posenc.encodings.shaw"
    max_distance = Option(20, positive_int, "clipping distance k (tensor2tensor's default 20)")

    def setup(self, rngs, first):
        shape = (2 * self.max_distance + 1, self.head_dim)
        kk, kv = jax.random.split(rngs.params())
        std = self.head_dim ** -0.5
        self.table_k = nnx.Param(std * jax.random.normal(kk, shape))
        self.table_v = nnx.Param(std * jax.random.normal(kv, shape))

    def content_logits(self, q, k, q_positions, k_positions, *, scale, q_offset):
        # tensor2tensor scales q before both the content and the relative term.
        return shaw.logits(q * jnp.asarray(scale, q.dtype), self.table_k[...], q_positions,
                           k_positions, max_distance=self.max_distance)

    def values(self, weights, q_positions, k_positions):
        return shaw.values(weights, self.table_v[...], q_positions, k_positions,
                           max_distance=self.max_distance)
