"""Hard-ALiBi: each head attends to the last m_h tokens only (a hard window per head); some heads see all.

Jelassi, Brandfonbrener, Kakade and Malach 2024, "Repeat After Me:
Transformers are Better than State Space Models at Copying" (ICML 2024,
arXiv 2402.01032). The bias of head h is 0 on the last ``m_h`` keys and
-inf before them::

    bias[h, i, j] = 0     if i - j < m_h        (j > i - m_h)
                    -inf  if i - j >= m_h       (j <= i - m_h)

and heads with ``m_h = inf`` (here ``windows[h] = 0``) get no bias: plain
attention without positional encoding (NoPE). A head with window m sees its
query and the m - 1 keys before it.

Official code (sjelassi/transformers_ssm_copy @ 1188c47,
``synthetic_exps/models/hard_alibi_model.py`` ``GPTHardAlibiAttention._attn``):
head ``i < num_masked_heads`` keeps the keys at distances 0 .. i, a window of
``i + 1``; the other heads are NoPE. Its defaults (``synthetic_exps/main.py``)
are 16 heads of which 8 are windowed: windows 1, 2, ..., 8 and eight NoPE
heads, which :func:`windows` gives for any head count (half windowed).

Shapes: q_positions int [..., Lq], k_positions int [..., Lk], windows int [H]
-> float32 [..., H, Lq, Lk].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.encodings.absolute import relative_distances


def windows(num_heads: int, *, num_windowed: int | None = None) -> jax.Array:
    """The official per-head windows: head h < num_windowed gets ``h + 1``, the others 0 (no window).

    ``num_windowed`` defaults to ``num_heads // 2`` (the official 8 of 16).

    Shapes: -> int32 [num_heads].
    """
    num_heads = checks.integer("num_heads", num_heads, minimum=1)
    if num_windowed is None:
        num_windowed = num_heads // 2
    num_windowed = checks.integer("num_windowed", num_windowed, minimum=0, maximum=num_heads)
    h = np.arange(num_heads)
    return jnp.asarray(np.where(h < num_windowed, h + 1, 0), jnp.int32)


def _windows(windows) -> jax.Array:
    w = jnp.asarray(windows)
    if w.ndim != 1 or not jnp.issubdtype(w.dtype, jnp.integer):
        raise ValueError(f"windows must be an integer array of shape [H]; got {w.dtype} {w.shape}")
    # numpy on a concrete array: jnp ops on an array closed over by a jit would be traced
    if not isinstance(w, jax.core.Tracer) and bool((np.asarray(w) < 0).any()):
        raise ValueError(f"windows must be >= 0 (0: no window); got {np.asarray(w).tolist()}")
    return w.astype(jnp.int32)


def visible(q_positions, k_positions, windows, *, causal: bool = True) -> jax.Array:
    """Whether head h's window holds key j of query i: ``i - j < m_h`` (``|i - j| < m_h`` if not causal).

    Heads with window 0 see every key. Causal: keys after the query are inside
    the window here (they are the causal mask's to drop, as in
    ``posenc.alibi.bias``).

    Shapes: q_positions [..., Lq], k_positions [..., Lk], windows [H] -> bool [..., H, Lq, Lk].
    """
    causal = checks.boolean("causal", causal)
    w = _windows(windows)[:, None, None]
    d = relative_distances(q_positions, k_positions)[..., None, :, :]
    if not causal:
        d = jnp.abs(d)
    return (w == 0) | (d < w)


def bias(q_positions, k_positions, windows, *, causal: bool = True) -> jax.Array:
    """Hard-ALiBi bias: 0 inside head h's window, -inf outside (no bias for window 0).

    causal:    ``-inf`` where ``i - j >= m_h``; keys after the query get 0
               (left to the causal mask, as in ``posenc.alibi.bias``).
    symmetric: ``-inf`` where ``|i - j| >= m_h`` (bidirectional use).

    Every query keeps its own key (m_h >= 1), so a causal row is never fully
    masked. Depends on i - j only.

    Shapes: q_positions int [..., Lq], k_positions int [..., Lk], windows int [H]
    -> float32 [..., H, Lq, Lk].
    """
    return jnp.where(visible(q_positions, k_positions, windows, causal=causal), 0.0, -jnp.inf).astype(jnp.float32)
