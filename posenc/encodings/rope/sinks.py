"""Attention sinks: StreamingLLM (Xiao et al. 2024) and LM-Infinite (Han et al. 2024).

Both keep the first few tokens ("sinks", the global branch) and a recent
window, and drop the keys in between: the Lambda-shaped mask. They differ in
the positions the kept keys see.

**StreamingLLM** (ICLR 2024; official code mit-han-lab/streaming-llm,
``streaming_llm/kv_cache.py`` and ``pos_shift/modify_llama.py``). The cache
(``StartRecentKVCache``) keeps the first ``sinks`` tokens and the last
``window`` tokens; each new token is appended, attends to the cache, and the
cache is trimmed back to sinks + window. RoPE positions are cache slots: keys
at 0 .. n_cache - 1, the query at n_cache (``pos_shift``). A query at i
(token index) thus attends to the sinks j < n and the recent keys 0 <= i - j
<= window (``window`` + 1 keys with itself), at distances

    recent keys:  i - j                              (slots are contiguous)
    sink keys:    min(i, sinks + window) - j         (the query's slot, capped)

:func:`relative_positions` / :func:`regions` give the token-by-token
streaming computation (the paper's perplexity evaluation) for every query
at once, so a full forward pass with these masks equals decoding one token
at a time with the official cache.

**LM-Infinite** (NAACL 2024; official code Glaciohound/LM-Infinite,
``models/lambda_attention.py`` and ``models/llama.py``, the
``use_lambda_attention`` path). Keys within the local branch, 0 <= d <
local_branch, keep their RoPE distances; the first ``global_branch`` keys
beyond it are attended at the capped distance ``limit`` (the official query
rotated at ``limit_distance``, keys unrotated), and the other keys are
dropped. ``limit=None`` is the official ``limit_distance=None``: the global
keys keep their true distances.

Differences from the official code, and why:

- Sinks / global keys are read off the positions (j < sinks), the window off
  d; the official code uses cache slots / indices, the same for positions
  0, 1, 2, ...
- LM-Infinite's cap is ``min(limit_distance, kv_len - 1)`` officially, which
  equals ``limit_distance`` on every visible global pair when limit <=
  local_branch (the published settings: limit = local_branch). A larger
  limit makes the official prefill and cached decoding disagree (the cap then
  depends on the sequence length), so posenc requires limit <= local_branch.
  Its optional ``triangle_offset`` and ``top_k_attention`` (off by default)
  are not implemented.

Shapes: q_positions int [..., Lq], k_positions int [..., Lk] -> float32
[..., Lq, Lk]; NaN where the query does not attend (j > i, and the keys
dropped between the sinks and the window; see ``posenc.remap``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.encodings.rope import remap

__all__ = ["lm_infinite_regions", "lm_infinite_relative_positions", "regions", "relative_positions"]


def _check_streaming(sinks, window):
    return checks.integer("sinks", sinks, minimum=0), checks.integer("window", window, minimum=0)


def regions(q_positions, k_positions, *, sinks: int, window: int) -> list[remap.Region]:
    """[recent, sinks] regions (``posenc.remap.Region``) of StreamingLLM.

    recent: positions (i, j), mask j >= sinks and 0 <= i - j <= window;
    sinks: positions (min(i, sinks + window), j), mask j < sinks and j <= i.
    """
    sinks, window = _check_streaming(sinks, window)
    q, k, d = remap.positions(q_positions, k_positions)
    is_sink = (k < sinks)[..., None, :]
    recent = remap.Region(q, k, ~is_sink & (d >= 0) & (d <= window))
    sink = remap.Region(jnp.minimum(q, sinks + window), k, is_sink & (d >= 0))
    return [recent, sink]


def relative_positions(q_positions, k_positions, *, sinks: int, window: int) -> jax.Array:
    """StreamingLLM relative positions (cache slots): i - j in the window, min(i, sinks + window) - j for sinks.

    sinks >= 0 (official ``start_size``, 4 in the paper); window >= 0
    (official ``recent_size``): a query sees the sinks and the keys with
    0 <= i - j <= window. NaN elsewhere.
    """
    sinks, window = _check_streaming(sinks, window)
    q, k, d = remap.positions(q_positions, k_positions)
    is_sink = (k < sinks)[..., None, :]
    capped = jnp.minimum(q, sinks + window)[..., :, None] - k[..., None, :]
    rel = jnp.where(is_sink, capped, d).astype(jnp.float32)
    return jnp.where((d >= 0) & (is_sink | (d <= window)), rel, jnp.nan)


def _check_lm_infinite(global_branch, local_branch, limit):
    global_branch = checks.integer("global_branch", global_branch, minimum=0)
    local_branch = checks.integer("local_branch", local_branch, minimum=1)
    if limit is not None:
        limit = checks.integer("limit", limit, minimum=0, maximum=local_branch)
    return global_branch, local_branch, limit


def lm_infinite_regions(q_positions, k_positions, *, global_branch: int, local_branch: int,
                        limit) -> list[remap.Region]:
    """[local, global] regions (``posenc.remap.Region``) of LM-Infinite's Lambda attention.

    local: positions (i, j), mask 0 <= d < local_branch; global: positions
    (limit, 0) (``limit=None``: (i, j)), mask j < global_branch and d >=
    local_branch.
    """
    global_branch, local_branch, limit = _check_lm_infinite(global_branch, local_branch, limit)
    q, k, d = remap.positions(q_positions, k_positions)
    local = remap.Region(q, k, (d >= 0) & (d < local_branch))
    mask = (k < global_branch)[..., None, :] & (d >= local_branch)
    if limit is None:
        return [local, remap.Region(q, k, mask)]
    return [local, remap.Region(jnp.full_like(q, limit), jnp.zeros_like(k), mask)]


def lm_infinite_relative_positions(q_positions, k_positions, *, global_branch: int, local_branch: int,
                                   limit) -> jax.Array:
    """LM-Infinite relative positions: d within the local branch, ``limit`` for the global keys beyond it.

    global_branch >= 0 (official ``global_branch``, 10-100); local_branch >= 1
    (keys with 0 <= d < local_branch; the pre-training length in the paper);
    limit: an integer in [0, local_branch] (official ``limit_distance``,
    = local_branch in the paper) or None (no cap). NaN elsewhere.
    """
    global_branch, local_branch, limit = _check_lm_infinite(global_branch, local_branch, limit)
    q, k, d = remap.positions(q_positions, k_positions)
    is_global = (k < global_branch)[..., None, :]
    far = d if limit is None else jnp.full_like(d, limit)
    rel = jnp.where(d < local_branch, d, far).astype(jnp.float32)
    return jnp.where((d >= 0) & ((d < local_branch) | is_global), rel, jnp.nan)
