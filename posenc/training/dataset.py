"""A fixed training set: N examples drawn once, visited in epochs, each epoch in a fresh order.

``train.dataset_size = N`` > 0 trains on a fixed set of N examples, as the
official position-coupling code (Cho et al. 2024, HanseulJo/position-coupling
``run.py``) does: its ``AdditionDataset`` draws ``n_data`` examples once
(seeded by ``seed_data``) and a ``DataLoader(shuffle=True)`` visits them in
epochs, every epoch in a fresh random order, the last batch of an epoch holding
the ``N mod B`` examples left (``drop_last=False``). Here:

* example ``i`` of the set is the task's example of key ``fold_in(examples_root, i)``
  (:meth:`posenc.tasks.base.Task.examples`): the same whatever the step that
  visits it, its training-time offsets (the task's ``fresh_draws``: coupled
  start ids, index-hint offsets) drawn anew at each visit, as the official
  ``__getitem__`` draws them;
* an epoch is ``ceil(N / B)`` steps; step ``t`` is step ``t mod ceil(N / B)``
  of epoch ``t // ceil(N / B)`` and visits the positions ``p = (t mod
  ceil(N / B)) * B + j`` of the epoch's order; rows with ``p >= N`` (the last
  batch's rest) are masked out of the loss, so the step's loss is the mean over
  the ``N mod B`` examples, as the official smaller last batch;
* the epoch's order is a keyed pseudo-random permutation of ``[0, N)``
  (:func:`permute`: a 4-round Feistel network over the next power of 4, cycle-
  walked into ``[0, N)``), keyed by the epoch: computed per index inside the
  step, where the official sampler draws ``torch.randperm(N)`` each epoch.

The roots: the run's data root (``posenc.training.loop.data_root``: its
``train.seed`` and ``DATA_STREAM``) folded with :data:`EXAMPLES` and
:data:`ORDER`, values no step number reaches, so the set and its orders are
apart from every step's key; a seed group's seeds each have their own set (the
official code seeds the data apart from the model, ``seed_data``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

EXAMPLES = 2**32 - 1  # fold_in(data root, EXAMPLES): the root of the examples' keys
ORDER = 2**32 - 2  # fold_in(data root, ORDER): the root of the epochs' orders
ROUNDS = 4  # Feistel rounds of an epoch's permutation


def steps_per_epoch(size: int, batch_size: int) -> int:
    """Steps of one epoch over ``size`` examples in batches of ``batch_size`` (the last one partial)."""
    return -(-int(size) // int(batch_size))


def examples_seen(steps: int, batch_size: int, size: int) -> int:
    """Examples trained on in ``steps`` steps (the visits: the last batch of an epoch holds N mod B)."""
    per_epoch = steps_per_epoch(size, batch_size)
    epochs, rest = divmod(int(steps), per_epoch)
    return epochs * int(size) + min(rest * int(batch_size), int(size))


def _mix(x):
    """A 32-bit integer hash (the finalizer of MurmurHash3)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def permute(index, key, size: int):
    """The image of ``index`` (int [..], each in ``[0, size)``) under the permutation of key ``key``.

    A bijection of ``[0, size)``: a Feistel network of :data:`ROUNDS` rounds over
    ``[0, 4^h)`` (the smallest power of 4 >= size), applied again while the
    image lies outside ``[0, size)`` (cycle walking; fewer than 4 applications
    on average). Each key gives another permutation.
    """
    size = int(size)
    bits = max(2, math.ceil(math.log2(max(size, 2))))
    half = (bits + 1) // 2
    mask = jnp.uint32((1 << half) - 1)
    round_keys = jax.random.bits(key, (ROUNDS,), dtype=jnp.uint32)

    def once(x):
        left, right = x >> half, x & mask
        for r in range(ROUNDS):
            left, right = right, left ^ (_mix(right ^ round_keys[r]) & mask)
        return (left << half) | right

    def walk(x):
        return jax.lax.while_loop(lambda y: y >= size, once, once(x))

    flat = jnp.asarray(index).astype(jnp.uint32).reshape(-1)
    return jax.vmap(walk)(flat).astype(jnp.int32).reshape(jnp.shape(index))


def positions(t, batch_size: int, size: int):
    """``(epoch, positions int32 [B], valid bool [B])`` of step ``t`` (traced): the rows' places in
    their epoch's order, and which rows hold an example (the last batch of an epoch: N mod B)."""
    per_epoch = steps_per_epoch(size, batch_size)
    t = jnp.asarray(t, jnp.int32)
    epoch = t // per_epoch
    p = (t % per_epoch) * batch_size + jnp.arange(batch_size, dtype=jnp.int32)
    return epoch, jnp.minimum(p, size - 1), p < size


def indices(root, t, batch_size: int, size: int):
    """``(index int32 [B], valid bool [B])``: the examples step ``t`` visits (data root ``root``)."""
    epoch, p, valid = positions(t, batch_size, size)
    order = jax.random.fold_in(jax.random.fold_in(root, ORDER), epoch.astype(jnp.uint32))
    return permute(p, order, size), valid


def batch(task, fixed, key, batch_size: int, length: int, *, min_size=None) -> dict:
    """The training batch of step ``t`` over the fixed set: ``fixed = (root, t, size)``.

    ``key``: the step's data key (the examples' training-time offsets). Rows past
    the epoch's end have ``mask`` 0, so they add nothing to the loss.
    """
    root, t, size = fixed
    index, valid = indices(root, t, batch_size, size)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.fold_in(root, EXAMPLES),
                                                          index.astype(jnp.uint32))
    out = task.examples(keys, length, fresh_key=key, min_size=min_size, split="train")
    out["mask"] = out["mask"] * valid[:, None].astype(out["mask"].dtype)
    return out


def epoch_order(root, epoch: int, size: int) -> np.ndarray:
    """The indices of epoch ``epoch`` in visiting order (host; for inspection and tests)."""
    key = jax.random.fold_in(jax.random.fold_in(root, ORDER), np.uint32(epoch))
    return np.asarray(permute(jnp.arange(size), key, size))
