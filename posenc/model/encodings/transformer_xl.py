"""Transformer-XL relative attention: sinusoidal relative terms with learned u, v biases."""

import jax
from flax import nnx

from posenc.checks import one_of
from posenc.encodings import transformer_xl
from posenc.encodings.rope import rope
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("transformer_xl")
class TransformerXL(Encoding):
    """Relative terms u.k_j + (q_i + v).(W_r R_{i-j}) on top of q.k."""

    relative = True
    paper = "Dai et al. 2019"
    pure = "posenc.encodings.transformer_xl"
    angles = Option("exact", one_of(*rope.ANGLES), "sinusoid phases: exact (error independent of "
                    "the absolute position) | canonical (float32 products)")

    def setup(self, rngs, first):
        ku, kv, kw = jax.random.split(rngs.params(), 3)
        hd = (self.num_heads, self.head_dim)
        self.u = nnx.Param(0.02 * jax.random.normal(ku, hd))
        self.v = nnx.Param(0.02 * jax.random.normal(kv, hd))
        self.w_r = nnx.Param(self.d_model ** -0.5 * jax.random.normal(kw, (self.d_model,) + hd))

    def content_logits(self, q, k, q_positions, k_positions, *, scale, q_offset):
        # The paper scales the whole score (a)+(b)+(c)+(d) by 1/sqrt(d).
        terms = transformer_xl.logits(q, k, q_positions, k_positions, u=self.u[...],
                                      v=self.v[...], w_r=self.w_r[...], angles=self.angles)
        return terms * scale
