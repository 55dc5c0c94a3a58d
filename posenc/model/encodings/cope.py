"""CoPE: contextual positions counted by sigmoid gates, interpolated embeddings."""

import jax.numpy as jnp
from flax import nnx

from posenc.checks import nonnegative_int
from posenc.encodings import cope
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("cope")
class CoPE(Encoding):
    """Contextual position encoding, embeddings [npos, Dh] (zeros at init, as the reference)."""

    relative = True
    paper = "Golovneva et al. 2024"
    pure = "posenc.encodings.cope"
    full_rows = True
    npos = Option(0, nonnegative_int, "positions embedded (0: training length + 1, the "
                                      "reference's block_size + 1)", train_length=lambda n: n + 1)

    @classmethod
    def check(cls, options, *, prefix, **_):
        if options["npos"] < 1:
            raise ValueError(f"{prefix}.npos must be >= 1 (0 means the task's training length + 1, "
                             "which is only known to a training run); got 0")

    def setup(self, rngs, first):
        self.embeddings = nnx.Param(jnp.zeros((self.npos, self.head_dim), jnp.float32))

    def content_logits(self, q, k, q_positions, k_positions, *, scale, q_offset):
        # posenc.cope aligns the last query with the last key. Roll the keys so the
        # key of query 0 (index q_offset) sits at Lk - Lq, then roll the result back;
        # keys that wrap around are later than every query and are masked anyway.
        shift = k.shape[-3] - q.shape[-3] - q_offset
        k = jnp.roll(k, shift, axis=-3)
        terms = cope.logits(q, k, self.embeddings[...], causal=True)
        # The paper's code divides (q.k + this term) by sqrt(dh).
        return jnp.roll(terms, -shift, axis=-1) * scale
