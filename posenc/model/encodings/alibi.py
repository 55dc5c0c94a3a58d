"""ALiBi: a linear distance bias, no parameters."""

from posenc.encodings import alibi
from posenc.kernels import terms as kernel_lib
from posenc.model.encoding import Encoding
from posenc.model.registry import register_encoding


@register_encoding("alibi")
class ALiBi(Encoding):
    """Linear distance bias -slope_h (i - j), geometric slopes per head."""

    relative = True
    paper = "Press et al. 2021"
    pure = "posenc.encodings.alibi"

    def bias(self, q_positions, k_positions):
        return alibi.bias(q_positions, k_positions, alibi.slopes(self.num_heads))

    def kernel_terms(self, q_positions, k_positions):
        return (kernel_lib.alibi(alibi.slopes(self.num_heads)),)
