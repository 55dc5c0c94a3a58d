"""T5 relative bias: a learned table of log-spaced relative-position buckets."""

import jax
from flax import nnx

from posenc.checks import boolean, positive_int
from posenc.encodings import t5
from posenc.kernels import terms as kernel_lib
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("t5")
class T5(Encoding):
    """Bucketed learned relative bias, table [num_buckets, H], shared by all layers by default."""

    relative = True
    paper = "Raffel et al. 2020"
    pure = "posenc.encodings.t5"
    num_buckets = Option(32, positive_int, "relative-position buckets")
    max_distance = Option(128, positive_int, "distance of the last bucket")
    shared = Option(True, boolean, "one table for every layer, owned by the first (T5, HF T5); "
                                   "False: a table per layer")

    @classmethod
    def check(cls, options, *, prefix, **_):
        try:
            t5.relative_position_bucket(0, bidirectional=False, num_buckets=options["num_buckets"],
                                        max_distance=options["max_distance"])
        except ValueError as e:
            raise ValueError(f"{prefix}: {e}") from None

    def setup(self, rngs, first):
        if self.shared and first is not None:
            self.table = first.table  # the same nnx.Param: one table, one gradient
            return
        # HF T5 init: N(0, d_model^-1/2).
        shape = (self.num_buckets, self.num_heads)
        self.table = nnx.Param(self.d_model ** -0.5 * jax.random.normal(rngs.params(), shape))

    def bias(self, q_positions, k_positions):
        return t5.bias(q_positions, k_positions, self.table[...], max_distance=self.max_distance)

    def kernel_terms(self, q_positions, k_positions):
        return (kernel_lib.t5(self.table[...], max_distance=self.max_distance),)
