"""Abacus: a learned row per digit's place in its own number (McLeish et al. 2024)."""

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.checks import nonnegative_int, one_of, positive, positive_int
from posenc.encodings import abacus, absolute
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding

# The digits 0-9 of the arithmetic tasks (posenc.tasks: ids FIRST_SYMBOL + 0 .. 9), which is
# also the official tokenizer's ids '0': 4 ... '9': 13.
DIGITS = tuple(range(4, 14))


def _token_ids(name, value):
    if not isinstance(value, (tuple, list)) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ValueError(f"{name} must be a non-empty tuple of token ids >= 0; got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{name} has repeated token ids: {value!r}")
    return tuple(int(v) for v in value)


@register_encoding("abacus")
class Abacus(Encoding):
    """Learned table [table_size, D] indexed by ``posenc.abacus.indices`` of the token ids.

    As the official ``Abacus`` module (mcleish7/arithmetic): digit tokens
    get ``1 + place in their number + k``, other tokens row 0; ``k`` ~
    U{0..max_k} when the model is called with a training ``key`` (one draw
    per batch as the official code, or per example), 0 otherwise
    (evaluation, decoding). The layers run the per-layer kinds beside it
    (``model.position.layer_kinds``: NoPE by default, FIRE or RoPE as the
    paper's combinations). The KV cache keeps the current digit run, so
    cached decoding equals the full forward pass. Table init N(0,
    ``init_std``): the scale of the token embeddings (the official code
    initialises token and position tables alike).
    """

    relative = True  # reads no positions at all: shifting them changes nothing
    paper = "McLeish et al. 2024"
    pure = "posenc.encodings.abacus"
    max_k = Option(100, nonnegative_int, "largest training offset: k ~ U{0..max_k} (official "
                                         "max_abacus_len 100)")
    table_size = Option(1024, positive_int, "rows of the table (indices 0 .. table_size - 1)")
    offset_per = Option("batch", one_of(*abacus.OFFSET_PER), "one offset per batch (official) | "
                                                              "per example")
    digits = Option(DIGITS, _token_ids, "token ids of the digits (the arithmetic tasks' 4-13)")
    init_std = Option(0.02, positive, "std of the table's N(0, std) init")

    @classmethod
    def check(cls, options, *, prefix, **_):
        if options["table_size"] < options["max_k"] + 2:
            raise ValueError(f"{prefix}.table_size {options['table_size']} leaves no row for a digit at "
                             f"the largest offset {prefix}.max_k={options['max_k']}; need >= max_k + 2")

    def setup(self, rngs, first):
        self.table = nnx.Param(self.init_std * jax.random.normal(rngs.params(),
                                                                 (self.table_size, self.d_model)))

    def init_state(self, batch_size):
        return {"run": jnp.zeros((batch_size,), jnp.int32)}

    def token_embed(self, tokens, positions, dim, *, key=None, state=None):
        if tokens is None:  # called on embeddings: every token a non-digit (row 0)
            return jnp.broadcast_to(self.table[...][0], (*positions.shape, dim)), state
        offset = 0
        if key is not None:
            offset = abacus.offsets(key, tokens.shape[:1], max_k=self.max_k, per=self.offset_per)
        carry = None if not state else state["run"]
        ids, run = abacus.indices(tokens, self.digits, offset=offset, carry=carry)
        return absolute.learned(self.table[...], ids), {"run": run}
