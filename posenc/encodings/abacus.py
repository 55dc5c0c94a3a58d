"""Abacus embeddings: each digit indexed by its place within its own number.

McLeish et al. 2024, "Transformers Can Do Arithmetic with the Right
Embeddings" (official code: mcleish7/arithmetic, ``abacus.py`` and
``cramming/architectures/embeddings.py``, class ``Abacus``). A learned table
is indexed by

    index_t = 1 + (t - s_t) + k    if token t is a digit (s_t: the first token of its run of digits)
    index_t = 0                    otherwise

so the first stored digit of every number gets 1 + k, the next 2 + k, ...
With numbers written least significant digit first, digits of equal
significance share an index. ``k`` is a random offset, drawn at training
(the official ``random.randint(0, max_k)``: one draw per batch) and 0 at
evaluation; it lets the rows past the training lengths be trained.

The index of token t depends only on tokens <= t, so it is causal and can be
continued across decoding calls: ``carry`` is the length of the run of digits
that ends just before the first token (0 when the previous token is not a
digit), and :func:`indices` returns the carry after the last token as well.

Shapes: tokens int [..., L]; digits: the token ids that count as digits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks

OFFSET_PER = ("batch", "example")


def _digits(digits) -> np.ndarray:
    ids = np.asarray(digits)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"digits must be a non-empty 1-d sequence of token ids; got {digits!r}")
    return ids


def run_lengths(tokens, digits, *, carry=None):
    """Place (1-based) of each token in its run of consecutive digits, 0 on non-digits.

    ``carry`` int [...] (default 0): the length of the run of digits ending
    just before ``tokens[..., 0]``. Returns (places int32 [..., L], carry
    after the last token int32 [...]).
    """
    tokens = jnp.asarray(tokens)
    if tokens.ndim < 1 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be an integer array of shape [..., L]; got {tokens.dtype} "
                         f"{tokens.shape}")
    is_digit = jnp.isin(tokens, jnp.asarray(_digits(digits)))
    L = tokens.shape[-1]
    index = jnp.arange(L, dtype=jnp.int32)
    # The last non-digit at or before t (-1 if none in this chunk): a run starts right after it.
    last = jax.lax.cummax(jnp.where(is_digit, -1, index), axis=tokens.ndim - 1)
    carry = jnp.zeros(tokens.shape[:-1], jnp.int32) if carry is None else jnp.asarray(carry, jnp.int32)
    places = jnp.where(last >= 0, index - last, index + 1 + carry[..., None])
    places = jnp.where(is_digit, places, 0).astype(jnp.int32)
    return places, places[..., -1]


def indices(tokens, digits, *, offset=0, carry=None):
    """Abacus index of every token: ``place + offset`` on digits, 0 elsewhere (module docstring).

    ``offset`` int, scalar or [...] (one per example): the training offset k.
    Returns (indices int32 [..., L], carry after the last token int32 [...]).
    """
    places, new_carry = run_lengths(tokens, digits, carry=carry)
    offset = jnp.asarray(offset, jnp.int32)
    if offset.ndim:
        offset = offset[..., None]
    return jnp.where(places > 0, places + offset, 0), new_carry


def offsets(key, batch_shape=(), *, max_k: int, per: str = "batch"):
    """Training offsets k ~ U{0, ..., max_k}: one for the batch (official) or one per example.

    Returns int32 [] (``per="batch"``) or int32 ``batch_shape`` (``"example"``).
    """
    max_k = checks.integer("max_k", max_k, minimum=0)
    per = checks.choice("per", per, OFFSET_PER)
    shape = () if per == "batch" else tuple(batch_shape)
    return jax.random.randint(key, shape, 0, max_k + 1, dtype=jnp.int32)


__all__ = ["OFFSET_PER", "indices", "offsets", "run_lengths"]
