"""Length-aware logit scaling: one multiplier per query, from its key count or its position.

Every method here multiplies a query's attention logits (equivalently its
query vector: logits are linear in q) by a function of how many keys it sees
or of where it sits:

- :func:`ssmax`: Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399),
  ``s * log(n)`` with ``s`` learned per head;
- :func:`logn`: Qwen-1's log-n attention, ``max(1, log(n) / log(L_train))``;
- :func:`temperature`: Llama 4's NoPE-layer temperature,
  ``log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1``.

``n`` is the number of keys the query attends to, not its position: with a
sliding window or chunked attention it stops growing. :func:`num_keys`
computes it from the query index, the causal offset, the key count and the
window / chunk size.

Shapes: ``num_keys`` int [..., Lq]; ``ssmax`` -> float32 [..., H, Lq] (per
head), ``logn`` and ``temperature`` -> float32 [..., Lq]. To apply one:
logits [..., H, Lq, Lk] times ``m[..., :, None]`` (per head) or
``m[..., None, :, None]``; or queries [..., Lq, H, Dh] times
``jnp.swapaxes(m, -1, -2)[..., None]`` (per head) or ``m[..., :, None, None]``.
The multipliers are float32; cast the product back to the activation dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.encodings.absolute import check_positions


def _check_int_array(name, value) -> jax.Array:
    value = jnp.asarray(value)
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array; got dtype {value.dtype}")
    return value


def _int_or_array(name, value, minimum):
    """A concrete integer (checked) or an integer array (dtype only: it may be traced)."""
    if value is None:
        return None
    if checks.is_int(value):
        return checks.integer(name, value, minimum=minimum)
    return _check_int_array(name, value)


def num_keys(query_index, *, kv_length=None, offset=0, window=None, chunk=None) -> jax.Array:
    """Number of keys each query attends to under a causal mask.

    Query ``i`` sits at key index ``p = query_index + offset`` (``offset``:
    the keys before the first query, e.g. the cache length when decoding;
    0 for a prefill from the start). It sees keys j with ``lo <= j <= hi``:
    ``hi = min(p, kv_length - 1)`` (no cap when ``kv_length`` is None) and
    ``lo = 0``, raised to ``p - window + 1`` with a sliding window (keys
    ``p - window < j <= p``, Gemma / Mistral) and to ``(p // chunk) * chunk``
    with chunked attention (keys in the query's chunk, Llama 4
    ``attention_chunk_size``). Returns ``max(hi - lo + 1, 0)``.

    Shapes: query_index int [..., Lq]; kv_length and offset int scalars or
    int arrays broadcastable against it (they may be traced) -> int32 [..., Lq].
    """
    idx = _check_int_array("query_index", query_index)
    offset = _int_or_array("offset", offset, 0)
    kv_length = _int_or_array("kv_length", kv_length, 0)
    # window and chunk set the mask's shape: static Python integers
    window = None if window is None else checks.integer("window", window, minimum=1)
    chunk = None if chunk is None else checks.integer("chunk", chunk, minimum=1)
    p = idx.astype(jnp.int32) + jnp.asarray(offset, jnp.int32)
    hi = p if kv_length is None else jnp.minimum(p, jnp.asarray(kv_length, jnp.int32) - 1)
    lo = jnp.zeros_like(p)
    if window is not None:
        lo = jnp.maximum(lo, p - window + 1)
    if chunk is not None:
        lo = jnp.maximum(lo, (p // chunk) * chunk)
    return jnp.maximum(hi - lo + 1, 0).astype(jnp.int32)


def _log_count(n) -> jax.Array:
    # A query that sees no key has no logits to scale; log 1 = 0 keeps it finite.
    n = _check_int_array("num_keys", n)
    return jnp.log(jnp.maximum(n, 1).astype(jnp.float32))


def ssmax(num_keys, s, *, bias=None) -> jax.Array:
    """Scalable-Softmax multiplier ``s * log(n)`` (+ ``bias``), per head and query.

    Nakanishi 2025, arXiv 2501.19399: softmax over ``n^(s z_j)`` instead of
    ``e^(z_j)``, i.e. the logits z of a query that sees n keys multiplied by
    ``s log n``, so the top weight no longer fades as n grows. ``s`` is
    learned per head (and layer); the paper's variant with a bias uses
    ``s log n + b``.

    Shapes: num_keys int [..., Lq]; s [H] and bias [H] or None -> float32
    [..., H, Lq]; a scalar s (and bias) -> float32 [..., Lq].
    """
    log_n = _log_count(num_keys)
    s = jnp.asarray(s, jnp.float32)
    if s.ndim > 1:
        raise ValueError(f"s must be a scalar or have shape [H]; got shape {s.shape}")
    if bias is not None:
        bias = jnp.asarray(bias, jnp.float32)
        if bias.shape != s.shape:
            raise ValueError(f"bias must have the shape of s {s.shape}; got shape {bias.shape}")
    if s.ndim == 0:
        return s * log_n if bias is None else s * log_n + bias
    out = s[:, None] * log_n[..., None, :]
    return out if bias is None else out + bias[:, None]


def logn(num_keys, *, train_length) -> jax.Array:
    """Qwen log-n scaling ``max(1, log(n) / log(train_length))``.

    Qwen-1 ``modeling_qwen.py``: ``logn_list[i - 1] = math.log(i, seq_length)
    if i > seq_length else 1``, and the query at key index t is multiplied by
    ``logn_list[t]``, so ``n = t + 1`` is the number of keys it sees under
    its (full) causal mask; with a window pass :func:`num_keys` of that
    window. Qwen uses it at inference only and stops at n = 32767 (its table
    length); here there is no cap.

    Shapes: num_keys int [..., Lq] -> float32 [..., Lq].
    """
    train_length = checks.integer("train_length", train_length, minimum=2)
    n = _check_int_array("num_keys", num_keys)
    ratio = _log_count(n) / jnp.float32(math.log(train_length))
    return jnp.where(n > train_length, ratio, jnp.float32(1.0))


def temperature(positions, *, floor_scale=8192.0, attn_scale=0.1) -> jax.Array:
    """Llama 4 NoPE-layer temperature ``log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1``.

    HF ``modeling_llama4.py`` (``attn_temperature_tuning``, computed as
    ``log1p``) and MaxText ``attentions.py`` (``temperature_tuning``):
    queries of the NoPE layers are multiplied by it. Equal to 1 for
    positions below ``floor_scale - 1``, then growing like the log of the
    position. It is a function of the absolute position (Llama 4's NoPE
    layers attend globally, where the key count is pos + 1).

    Shapes: positions int [..., L] -> float32 [..., L].
    """
    positions = check_positions(positions)
    floor_scale = checks.number("floor_scale", floor_scale, positive=True)
    attn_scale = checks.number("attn_scale", attn_scale)
    pos = positions.astype(jnp.float32)
    return jnp.log1p(jnp.floor((pos + 1.0) / floor_scale)) * attn_scale + 1.0
