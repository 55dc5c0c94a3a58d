"""KERPLE: kernelized relative bias, logarithmic and power kernels."""

import jax
from flax import nnx

from posenc.encodings import kerple
from posenc.kernels import terms as kernel_lib
from posenc.model.encoding import Encoding
from posenc.model.registry import register_encoding


class _Kerple(Encoding):
    """KERPLE bias with per-head a, p, init U(0.01, 1) and U(0.01, 2), kept >= 0.01 after each update."""

    relative = True
    paper = "Chi et al. 2022"
    pure = "posenc.encodings.kerple"
    kernel = "log"

    def setup(self, rngs, first):
        ka, kp = jax.random.split(rngs.params())
        self.a = nnx.Param(jax.random.uniform(ka, (self.num_heads,), minval=0.01, maxval=1.0))
        self.p = nnx.Param(jax.random.uniform(kp, (self.num_heads,), minval=0.01, maxval=2.0))

    def bias(self, q_positions, k_positions):
        return kerple.bias(q_positions, k_positions, self.a[...], self.p[...], kind=self.kernel)

    def kernel_terms(self, q_positions, k_positions):
        return (kernel_lib.kerple(self.a[...], self.p[...], kind=self.kernel),)

    def constrain(self):
        # The reference clamps the stored parameters (in place, before each forward pass).
        a, p = kerple.constrain(self.a[...], self.p[...], kind=self.kernel)
        self.a[...], self.p[...] = a, p


@register_encoding("kerple_log")
class KerpleLog(_Kerple):
    """Logarithmic kernel bias -p log(1 + a |i - j|)."""

    kernel = "log"


@register_encoding("kerple_power")
class KerplePower(_Kerple):
    """Power kernel bias -a |i - j|^p, p in (0, 2]."""

    kernel = "power"
