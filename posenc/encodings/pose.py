"""PoSE: positional skip-wise training (Zhu et al., ICLR 2024, arXiv 2309.10400).

A model trained on windows of ``length`` tokens is shown the relative
positions of a longer ``target_length`` by giving each training window
position ids with a skip: the window is cut into two chunks, the first keeps
positions ``0 .. r - 1`` and the second continues at ``r + u`` instead of
``r``, with the skip ``u`` drawn uniformly from ``[0, target_length -
length]``. Every relative distance up to ``target_length - 1`` occurs in
training while the attention cost stays that of ``length`` tokens; the model
is then evaluated with plain positions ``0 .. N - 1`` at lengths up to
``target_length``.

The draws are those of the official ``train_preprocess_function_pose``
(``dwzhu-pku/PoSE`` ``src/train_pose.py``): the first chunk's length ``r``
is uniform on ``1 .. (length + 1) // 2``, its start stays 0 (the code's
revision ``lt = 0``, "more uniform coverage of large relative positions"),
and the skip ``u`` is uniform on ``0 .. target_length - length``, both
inclusive. That code also skips the second chunk's content forward in the
document; the content here is whatever the task gives (a text task's
window, a synthetic task's example), so only the positions are sampled.

Shapes: ``positions(key, length, ...)`` -> int32 [*batch_shape, length],
one draw per batch entry, strictly increasing, first 0, last below
``target_length``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks


def skip_positions(length: int, first: jax.Array, skip: jax.Array) -> jax.Array:
    """Positions of one window: ``0 .. first - 1``, then ``first + skip .. length - 1 + skip``.

    ``first`` (the first chunk's length) and ``skip`` are int scalars (or arrays broadcasting
    to a batch shape); -> int32 [..., length].
    """
    i = jnp.arange(length, dtype=jnp.int32)
    first, skip = jnp.asarray(first, jnp.int32)[..., None], jnp.asarray(skip, jnp.int32)[..., None]
    return jnp.where(i < first, i, i + skip)


def positions(key, length: int, *, target_length: int, batch_shape=()) -> jax.Array:
    """PoSE's position ids for training windows of ``length`` tokens aimed at ``target_length``.

    One independent draw of the first chunk's length and the skip per batch entry (the
    official sampler draws per example); int32 [*batch_shape, length].
    """
    checks.integer("length", length, minimum=1)
    checks.integer("target_length", target_length, minimum=1)
    if target_length < length:
        raise ValueError(f"PoSE target_length={target_length} must be >= the training length {length}")
    batch_shape = tuple(int(b) for b in batch_shape)
    k_first, k_skip = jax.random.split(key)
    # random.randint(1, (length + 1) // 2) and random.randint(0, target - length): both ends inclusive
    first = jax.random.randint(k_first, batch_shape, 1, (length + 1) // 2 + 1, jnp.int32)
    skip = jax.random.randint(k_skip, batch_shape, 0, target_length - length + 1, jnp.int32)
    return skip_positions(length, first, skip)


def coverage(length: int, target_length: int) -> np.ndarray:
    """How often each relative distance ``0 .. target_length - 1`` occurs in expectation per window.

    Exact over the sampler's uniform draws (a host-side numpy computation for reports and tests):
    the expected number of (query, key) pairs at each distance in one causal window.
    """
    counts = np.zeros(target_length, np.float64)
    firsts = np.arange(1, (length + 1) // 2 + 1)
    skips = np.arange(0, target_length - length + 1)
    i = np.arange(length)
    for r in firsts:
        for u in skips:
            p = np.where(i < r, i, i + u)
            d = (p[:, None] - p[None, :])[np.tril_indices(length)]
            counts += np.bincount(d, minlength=target_length)[:target_length]
    return counts / (len(firsts) * len(skips))
