"""KV cache: a plain pytree of arrays (no nnx.Variable), one k/v buffer per layer.

Keys whose transform depends on their own position only (RoPE with a static
scaling: ``Encoding.static_key``) are cached rotated, once, when written: a
decoding step rotates its own tokens, not the whole cache (which cost about
two thirds of a step). Other keys are cached after the projection and
QK-norm but before the encoding's query/key transform (xPos scaling, a
remapped RoPE, QK-norm after RoPE), and every decoding step transforms the
whole valid cache with the frequencies of the current length. For the
dynamic RoPE kinds ("dynamic", "dynamic_yarn") this means the logits of step
t equal a full forward pass over the prefix of length t + 1. Hugging Face instead keeps
keys rotated under the base in force when they were written ("stale" keys);
that behaviour is not reproduced here (a documented difference).

A remapped RoPE (``model.position.rope.remap``: Self-Extend, ReRoPE, DCA,
STRING, StreamingLLM, LM-Infinite) needs nothing more: the keys are cached
unrotated with their positions and every step rotates them per region of the
method (``posenc.remap``). StreamingLLM's evicted keys stay in their slots,
masked, and its cache-slot positions are computed from the token positions
(``posenc.sinks``): the logits are those of the official rolling cache of
sinks + window keys, but the memory is that of every token.

Encodings with data-dependent terms (``posenc.model.encoding``) keep two more
things per layer: the features their keys need, one per slot like k and v
(FoX's cumulative log forget gate), and their decoding state after the last
written token (FoX's running sum, FoX (Pro)'s previous key and value, PaTH's
convolution inputs). PaTH's keys are stored moved through every later token
(its ``update_cache``), as its official cache does.

A recurrent layer (``model.layer_types``, ``posenc.model.mixers``) caches no
keys or values (its ``k``, ``v`` are [B, S, 0, 0]): its ``state`` is the conv
window (the last W - 1 inputs of its short convolution, time-major) and the
float32 state of its scan, each mixer's layout in its module; Falcon-H1's
``parallel_mamba2`` layer keeps its attention's keys and values and the
state ``{"attention": ..., "mamba": ...}``.

Layout::

    {"k": (layer 0 [B, S, K, Dk], ...), "v": (layer 0 [B, S, K, Dh], ...),  # Dk: key_dims
     # (multi-head latent attention, model.mla: k [B, S, 1, C + R] the normalised latent and
     #  the rotary key, v [B, S, 1, 0]; posenc.model.latent_attention)
     "features": (layer 0 {name: [B, S, ...]}, ...),   # {} for most encodings
     "state": (layer 0 {name: array}, ...),            # {} for most encodings
     "input_state": {name: array},  # the input unit's state ({} for most; Abacus: its digit run)
     "positions": int32 [B, S],   # position given for each written slot ([B, S, A]: A axes)
     "length": int32 []}          # number of written slots
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def init(num_layers, batch_size, max_length, num_kv_heads, head_dim, dtype, *, features=None,
         states=None, input_state=None, key_dims=None, value_dims=None, kv_heads=None, position_axes=1):
    """An empty cache for ``max_length`` tokens.

    ``key_dims``: per layer, the width of its cached keys (None: ``head_dim``
    everywhere; keys cached after a transform that widens them, PoPE's, are
    wider than the values); ``value_dims`` and ``kv_heads``: per layer, the width of its
    cached values and its number of key heads (None: ``head_dim``, ``num_kv_heads``; a
    multi-head latent attention layer caches one key head [latent | rotary key] and no
    values, width 0). ``features``: per layer, name -> shape of one token's feature
    (``jax.ShapeDtypeStruct`` [B, 1, ...]); ``states``: per layer, the unit's
    initial decoding state (a dict of arrays); ``input_state``: the input
    unit's (``Encoding.token_embed``); ``position_axes``: A > 1 keeps positions
    [B, S, A] (``Encoding.position_axes``).
    """
    key_dims = key_dims or [head_dim] * num_layers
    value_dims = value_dims or [head_dim] * num_layers
    kv_heads = kv_heads or [num_kv_heads] * num_layers
    features = features or [{}] * num_layers
    return {
        "k": tuple(jnp.zeros((batch_size, max_length, h, d), dtype) for h, d in zip(kv_heads, key_dims)),
        "v": tuple(jnp.zeros((batch_size, max_length, h, d), dtype) for h, d in zip(kv_heads, value_dims)),
        "features": tuple({n: jnp.zeros((f.shape[0], max_length) + tuple(f.shape[2:]), f.dtype)
                           for n, f in layer.items()} for layer in features),
        "state": tuple(states or [{}] * num_layers),
        "input_state": dict(input_state or {}),
        "positions": jnp.zeros((batch_size, max_length) + ((position_axes,) if position_axes > 1 else ()),
                               jnp.int32),
        "length": jnp.zeros((), jnp.int32),
    }


def layer(cache, i):
    """Layer ``i``'s entry: {"k", "v", "features", "state"}."""
    return {"k": cache["k"][i], "v": cache["v"][i],
            "features": cache.get("features", ({},) * len(cache["k"]))[i],
            "state": cache.get("state", ({},) * len(cache["k"]))[i]}


def assemble(entries, *, positions, length, input_state=None):
    """The cache from every layer's entry (as :func:`layer` gives them) and the shared fields."""
    return {"k": tuple(e["k"] for e in entries), "v": tuple(e["v"] for e in entries),
            "features": tuple(e["features"] for e in entries),
            "state": tuple(e["state"] for e in entries),
            "input_state": dict(input_state or {}),
            "positions": positions, "length": length}


def next_positions(cache, num_tokens):
    """Default positions of the next ``num_tokens``: continue after the last given one.

    Several axes ([B, S, A]): continue after the largest id written on any axis, the
    same id on every axis (Qwen2-VL's text after an image: ``posenc.mrope.position_ids``).
    """
    length = cache["length"]
    positions = cache["positions"]
    if positions.ndim == 3:
        written = (jnp.arange(positions.shape[1]) < length)[None, :, None]
        start = jnp.where(length > 0, jnp.max(jnp.where(written, positions, -1), axis=(1, 2)) + 1, 0)
        ids = start[:, None] + jnp.arange(num_tokens, dtype=jnp.int32)[None, :]
        return jnp.broadcast_to(ids[..., None], ids.shape + (positions.shape[2],))
    last = jax.lax.dynamic_index_in_dim(cache["positions"], jnp.maximum(length - 1, 0), axis=1,
                                        keepdims=False)
    start = jnp.where(length > 0, last + 1, 0)
    return start[:, None] + jnp.arange(num_tokens, dtype=jnp.int32)[None, :]


def write(buffer, values, start):
    """Write ``values`` [B, T, ...] into ``buffer`` [B, S, ...] at slot ``start``."""
    index = (0, start) + (0,) * (buffer.ndim - 2)
    return jax.lax.dynamic_update_slice(buffer, values.astype(buffer.dtype), index)
