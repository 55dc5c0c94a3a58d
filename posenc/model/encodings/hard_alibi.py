"""Hard-ALiBi: each windowed head attends to its last m_h keys only, the other heads are NoPE."""

import jax.numpy as jnp

from posenc.checks import nonnegative_int, optional
from posenc.encodings import hard_alibi
from posenc.kernels import terms as kernel_lib
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("hard_alibi")
class HardALiBi(Encoding):
    """Bias 0 on head h's last h + 1 keys (h < num_windowed) and hidden before them; NoPE heads.

    ``posenc.hard_alibi.bias`` with its -inf made finite (``posenc.kernels.terms.HIDDEN``,
    as attention's own mask), so that no path computes ``0 * inf``.
    """

    relative = True
    paper = "Jelassi et al. 2024"
    pure = "posenc.encodings.hard_alibi"
    num_windowed = Option(None, optional(nonnegative_int), "heads with a hard window (head h < n sees "
                          "its last h + 1 keys; the rest NoPE); None: num_heads // 2 (official: 8 of 16)",
                          type=int)

    @classmethod
    def check(cls, options, *, prefix, num_heads, **_):
        n = options["num_windowed"]
        if n is not None and n > num_heads:
            raise ValueError(f"{prefix}.num_windowed={n} exceeds model.num_heads={num_heads}; choose "
                             f"0 .. {num_heads}")

    @classmethod
    def hides_keys(cls, options):
        return "" if options["num_windowed"] == 0 else "num_windowed"

    def windows(self):
        """int32 [H]: head h's window (0: no window)."""
        return hard_alibi.windows(self.num_heads, num_windowed=self.num_windowed)

    def bias(self, q_positions, k_positions):
        seen = hard_alibi.visible(q_positions, k_positions, self.windows())
        return jnp.where(seen, 0.0, kernel_lib.HIDDEN).astype(jnp.float32)

    def kernel_terms(self, q_positions, k_positions):
        return (kernel_lib.hard_alibi(self.windows()),)
