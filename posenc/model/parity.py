"""Parity drivers: a model's cached decoding run token by token or in pieces, and perturbed parameters.

Cached decoding must give the logits of the full forward pass (for every
encoding, norm and placement): :func:`decode_stepwise` and
:func:`decode_in_pieces` drive ``Decoder.decode`` the two ways a caller
does, to compare with ``Decoder.__call__``; :func:`perturb_params` moves
every parameter off its initial value so that zero-initialised ones (CoPE's
embeddings, ReZero gates) take part. ``posenc.model.check_encoding`` and the
tests build on them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def perturb_params(model, key, scale):
    """Add N(0, scale^2) noise to every parameter of ``model`` in place (one key per leaf)."""
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(key, len(leaves))
    noisy = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    nnx.update(model, jax.tree.unflatten(tree, noisy))


def decode_stepwise(model, tokens, first, max_length, positions=None):
    """Cached decoding of tokens[:, :first] (at positions[:first] when given), then one token per
    call (a ``lax.scan``), positions continuing from the cache -> (logits [B, L, V], cache).
    Call inside a jit."""
    cache = model.init_cache(tokens.shape[0], max_length)
    head, cache = model.decode(tokens[:, :first], cache,
                               *(() if positions is None else (_tokens(positions, 0, first),)))

    def step(cache, token):  # token [B]
        out, cache = model.decode(token[:, None], cache)
        return cache, out[:, 0]

    cache, tail = jax.lax.scan(step, cache, jnp.moveaxis(tokens[:, first:], 1, 0))
    return jnp.concatenate([head, jnp.moveaxis(tail, 0, 1).astype(head.dtype)], axis=1), cache


def decode_in_pieces(model, tokens, cuts, max_length, positions=None):
    """Cached decoding of tokens split at ``cuts`` (each piece one call; the first at
    positions[:cuts[0]] when given, later ones continuing) -> (logits [B, L, V], cache)."""
    cache = model.init_cache(tokens.shape[0], max_length)
    bounds = (0, *cuts, tokens.shape[1])
    outs = []
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        given = () if positions is None or i else (_tokens(positions, s, e),)
        out, cache = model.decode(tokens[:, s:e], cache, *given)
        outs.append(out)
    return jnp.concatenate(outs, axis=1), cache


def _tokens(positions, start, end):
    """Tokens ``start:end`` of positions [L], [B, L] or [B, L, A] (several axes: the axis last)."""
    return positions[:, start:end] if positions.ndim == 3 else positions[..., start:end]

