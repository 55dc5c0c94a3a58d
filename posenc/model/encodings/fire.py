"""FIRE: a learned MLP of the log-scaled, progressively normalised distance."""

from flax import nnx

from posenc.checks import positive, positive_int
from posenc.encodings import fire
from posenc.kernels import terms as kernel_lib
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("fire")
class Fire(Encoding):
    """Functional interpolation bias f(psi(i - j) / psi(max(L, i))), L = init_L x a learned multiplier."""

    paper = "Li et al. 2023"
    pure = "posenc.encodings.fire"
    hidden = Option(32, positive_int, "hidden width of the MLP")
    c = Option(0.1, positive, "initial log scale c")
    init_L = Option(512.0, positive, "fixed threshold scale: L = init_L * L_multiplier (learned, init 1)")

    def setup(self, rngs, first):
        params = fire.init_params(rngs.params(), self.num_heads, hidden=self.hidden, c=self.c)
        self.params = nnx.Dict({n: nnx.Param(v) for n, v in params.items()})

    def bias(self, q_positions, k_positions):
        return fire.bias(q_positions, k_positions, {n: p[...] for n, p in self.params.items()},
                         init_L=self.init_L)

    def kernel_terms(self, q_positions, k_positions):
        return (kernel_lib.fire({n: p[...] for n, p in self.params.items()}, init_L=self.init_L),)
