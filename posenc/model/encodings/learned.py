"""Learned absolute position table added to the token embeddings."""

import jax
from flax import nnx

from posenc.checks import nonnegative_int
from posenc.encodings import absolute
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("learned")
class Learned(Encoding):
    """Learned absolute table [max_length, D], GPT-2 init N(0, 0.02); no row past the table."""

    paper = "Radford et al. 2019"
    pure = "posenc.encodings.absolute"
    max_length = Option(0, nonnegative_int, "rows of the table (0: the training length)",
                        train_length=True)

    @classmethod
    def check(cls, options, *, prefix, **_):
        if options["max_length"] < 1:
            raise ValueError(f"{prefix}.max_length must be >= 1 (0 means the task's training length, "
                             "which is only known to a training run); got 0")

    @classmethod
    def longest_sequence(cls, options):
        return options["max_length"]

    def setup(self, rngs, first):
        self.table = nnx.Param(0.02 * jax.random.normal(rngs.params(), (self.max_length, self.d_model)))

    def embed(self, positions, dim):
        return absolute.learned(self.table[...], positions)
