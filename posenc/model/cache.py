"""KV cache: a plain pytree of arrays (no nnx.Variable), one k/v buffer per layer.

Keys are cached after the projection and QK-norm but before the encoding's
query/key transform (rotation, xPos scaling). Every decoding step rotates
the whole valid cache with the frequencies of the current length. For the
static encodings this gives the same keys as rotating once; for the dynamic
RoPE kinds ("dynamic", "dynamic_yarn") it means the logits of step t equal a
full forward pass over the prefix of length t + 1. Hugging Face instead keeps
keys rotated under the base in force when they were written ("stale" keys);
that behaviour is not reproduced here (a documented difference).

Layout::

    {"k": (layer 0 [B, S, K, Dh], ...), "v": (...),
     "positions": int32 [B, S],   # position given for each written slot
     "length": int32 []}          # number of written slots
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def init(num_layers, batch_size, max_length, num_kv_heads, head_dim, dtype):
    """An empty cache for ``max_length`` tokens."""
    shape = (batch_size, max_length, num_kv_heads, head_dim)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
    return {
        "k": zeros,
        "v": tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
        "positions": jnp.zeros((batch_size, max_length), jnp.int32),
        "length": jnp.zeros((), jnp.int32),
    }


def next_positions(cache, num_tokens):
    """Default positions of the next ``num_tokens``: continue after the last given one."""
    length = cache["length"]
    last = jax.lax.dynamic_index_in_dim(cache["positions"], jnp.maximum(length - 1, 0), axis=1,
                                        keepdims=False)
    start = jnp.where(length > 0, last + 1, 0)
    return start[:, None] + jnp.arange(num_tokens, dtype=jnp.int32)[None, :]


def write(buffer, values, start):
    """Write ``values`` [B, T, ...] into ``buffer`` [B, S, ...] at slot ``start``."""
    index = (0, start) + (0,) * (buffer.ndim - 2)
    return jax.lax.dynamic_update_slice(buffer, values.astype(buffer.dtype), index)
