"""PoPE: queries and keys as polar features (content in the magnitude, position in the phase)."""

import jax.numpy as jnp
from flax import nnx

from posenc import checks
from posenc.checks import one_of, positive
from posenc.encodings import pope
from posenc.encodings.rope import rope
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


def _fraction(name, value):
    value = checks.number(name, value, minimum=0.0, maximum=1.0)
    if value == 0.0:
        raise ValueError(f"{name} must be in (0, 1]; got {value!r}")
    return value


@register_encoding("pope")
class PoPE(Encoding):
    """``q.k = sum_c softplus(q_c) softplus(k_c) cos((s - t) theta_c + delta_c)`` over r components.

    Queries and keys become ``head_dim + r`` wide (``posenc.pope.query`` / ``key``: a
    (cos, sin) pair per encoded component, the other ``head_dim - r`` passed through);
    values and the logit scale ``1 / sqrt(head_dim)`` keep the head width, as lucidrains'
    attention. ``delta``: the learned phase bias per key head and frequency [K, r], zero
    at init, kept in [-2 pi, 0] by :meth:`constrain` (and clamped where used).
    Keys are cached transformed (``static_key``).
    """

    relative = True
    paper = "Gopalakrishnan et al. 2025"
    pure = "posenc.encodings.pope"
    fraction = Option(1.0, _fraction, "share of the head's components encoded, r = int(fraction * "
                      "head_dim) (1: the paper; < 1: lucidrains' partial PoPE)")
    base = Option(10000.0, positive, "frequencies theta_c = base^(-c / r)")
    angles = Option("exact", one_of(*rope.ANGLES), "exact: phases reduced mod 2 pi from integer "
                    "positions | canonical: float32 t * theta (lucidrains)")

    @classmethod
    def encoded_dim(cls, options, *, head_dim) -> int:
        """r: the number of components encoded."""
        return int(options["fraction"] * head_dim)

    @classmethod
    def check(cls, options, *, prefix, head_dim, **_):
        if cls.encoded_dim(options, head_dim=head_dim) < 1:
            raise ValueError(f"{prefix}.fraction={options['fraction']!r} encodes no component of "
                             f"head_dim {head_dim} (int(fraction * head_dim) = 0)")

    @classmethod
    def qk_head_dim(cls, options, *, head_dim):
        return head_dim + cls.encoded_dim(options, head_dim=head_dim)

    def setup(self, rngs, first):
        self.r = self.qk_dim - self.head_dim
        self.delta = nnx.Param(jnp.zeros((self.num_kv_heads, self.r), jnp.float32))

    def query(self, q, positions, *, seq_len):
        return pope.query(q, positions, pope.frequencies(self.r, base=self.base), angles=self.angles)

    def key(self, k, positions, *, seq_len):
        return pope.key(k, positions, pope.frequencies(self.r, base=self.base), bias=self.delta[...],
                        angles=self.angles)

    def static_key(self):
        return True

    def constrain(self):
        self.delta[...] = pope.clamp_bias(self.delta[...])
