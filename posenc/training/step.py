"""Jitted functional train steps (one step, k steps per call, seeds vmapped) and diagnostics.

The model and optimizer are split once, ``graphdef, state =
nnx.split((model, optimizer))``; each step is a ``jax.jit`` function of
``(graphdef, state, key)`` that merges inside, generates its batch from
``key`` (so data needs no host round trip), and returns the new state: no
Python graph traversal per step. ``graphdef`` has no array leaves, so jit
treats it as static. Jitted functions are cached per (task, shapes, train
settings, mesh): runs in one process with equal shapes reuse the compiled step.

The train step collects no diagnostics, so attention takes its fused path
(``jax.nn.dot_product_attention``) wherever the encoding allows;
:func:`stats_fn` is a separate forward pass over the same batch that
returns them (max attention logit, attention entropy, output logit mean and
log Z), called on logging steps only. After the optimizer update every
encoding's :meth:`~posenc.model.Encoding.constrain` projects its parameters
back into their domain.

With a ``mesh`` (several devices, :mod:`posenc.training.sharding`) the
generated batch and positions are constrained to ``P("data")`` and the new
state to the shardings it came in with; without one the step is exactly
the single-device step. ``seeds_train_step_fn`` is the same step
``jax.vmap``-ed over the stacked states of several seeds (one device).

The step loop (:mod:`posenc.training.steploop`) calls :func:`train_chunk_fn`
(and :func:`seeds_train_chunk_fn`): up to k steps inside one compiled
``lax.fori_loop``, bit-identical to k calls of the single step. The
evaluation programs are in :mod:`posenc.training.eval_step` (same cache).

Losses (masked to answer tokens, ``m``):
  loss = sum(m * CE(logits, targets)) / sum(m)
  total = loss + z_loss_weight * mean_m(logsumexp(logits)^2)   (PaLM z-loss)
  accuracy = sum(m * [argmax == target]) / sum(m)
  exact_match = mean over examples with any answer token of [all answer tokens right]
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from posenc.encodings import absolute
from posenc.norms import z_loss
from posenc.training import optim
from posenc.training import sharding as sharding_lib

_CACHE: dict[tuple, object] = {}


def _token_terms(logits, targets, mask):
    """Per-token cross-entropy and correctness, and per-example answer flags."""
    logits = logits.astype(jnp.float32)
    mask = mask.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    has_answer = mask.sum(-1) > 0
    example_right = jnp.all((correct > 0) | (mask == 0), axis=-1) & has_answer
    return mask, ce, correct, has_answer, example_right


def masked_metrics(logits, targets, mask) -> dict:
    """Masked cross-entropy, token accuracy and exact match of ``logits`` [B, L, V]."""
    mask, ce, correct, has_answer, example_right = _token_terms(logits, targets, mask)
    denom = jnp.maximum(mask.sum(), 1.0)
    return {
        "loss": (ce * mask).sum() / denom,
        "accuracy": (correct * mask).sum() / denom,
        "exact_match": example_right.sum() / jnp.maximum(has_answer.sum(), 1),
    }


def positions_for(config, key, batch_size: int, length: int):
    """Positions fed to the model: None (0..L-1), or randomized (Ruoss et al. 2023).

    Randomized: ``length`` sorted distinct draws from
    ``[0, randomized_max_position)``, one draw for the whole batch
    (``randomized_per="batch"``, as the reference code) or one per example
    (``"example"``), at training and at evaluation alike (the model never
    sees the plain 0..L-1 layout).
    """
    pos = config.model.position
    if not pos.randomized:
        return None
    per_example = pos.get("randomized_per", "batch") == "example"
    return absolute.randomized_positions(
        key, length, max_position=int(pos.randomized_max_position),
        batch_shape=(batch_size,) if per_example else (),
    )


def _batch(task, config, key, batch_size, length, *, split, min_size=None):
    """The batch and positions of ``key`` (one split of the key: data, then positions).

    A task that emits ``position_ids`` (position coupling) gives the positions itself.
    """
    data_key, pos_key = jax.random.split(key)
    batch = task.batch(data_key, batch_size, length, min_size=min_size, split=split)
    if "position_ids" in batch:
        if config.model.position.randomized:
            raise ValueError("model.position.randomized=True, but the task gives its own positions "
                             "(position_ids: position coupling); use one or the other")
        return batch, batch["position_ids"]
    return batch, positions_for(config, pos_key, batch_size, length)


def _task_key(config, traced=()) -> str:
    """The task's config as a key; the options in ``traced`` (program arguments) left out."""
    task = config.task.to_dict()
    if traced:
        task["options"] = {k: v for k, v in task.get("options", {}).items() if k not in traced}
        task["traced"] = sorted(traced)
    return json.dumps(task, sort_keys=True, default=str)


def _min_size(config):
    return int(config.task.min_size) or None


def _train_key(config, mesh, fsdp):
    train, pos = config.train, config.model.position
    return (_task_key(config), int(train.batch_size), int(config.task.train_length),
            optim.settings_key(train), float(train.z_loss), bool(pos.randomized),
            int(pos.randomized_max_position), pos.get("randomized_per", "batch"), mesh,
            fsdp and mesh is not None)


def _train_batch(task, config, key, mesh):
    batch, positions = _batch(task, config, key, int(config.train.batch_size),
                              int(config.task.train_length), split="train", min_size=_min_size(config))
    if mesh is not None:
        batch, positions = sharding_lib.constrain_batch((batch, positions), mesh)
    return batch, positions


def _train_step(task, config, *, mesh=None, fsdp=False):
    """The un-jitted ``step(graphdef, state, key) -> (state, metrics)``."""
    train = config.train
    z_weight = float(train.z_loss)
    schedule = optim.learning_rate_schedule(train)

    def step(graphdef, state, key):
        model, optimizer = nnx.merge(graphdef, state)
        batch, positions = _train_batch(task, config, key, mesh)
        mgraph, params, rest = nnx.split(model, nnx.Param, ...)

        def loss_fn(params):
            m = nnx.merge(mgraph, params, rest)
            # the input unit's training randomness (Abacus's offset): a key apart from the data's
            logits = m(batch["inputs"], positions, deterministic=False, key=jax.random.fold_in(key, 1))
            metrics = masked_metrics(logits, batch["targets"], batch["mask"])
            zl = (z_loss.z_loss(logits, weight=z_weight, mask=batch["mask"])
                  if z_weight > 0 else jnp.zeros((), jnp.float32))
            total = metrics["loss"] + zl
            metrics.update(z_loss=zl, total_loss=total)
            return total, metrics

        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["lr"] = schedule(optimizer.step[...])
        optimizer.update(model, grads)
        model.constrain()
        new_state = nnx.state((model, optimizer))
        if mesh is not None:
            new_state = sharding_lib.constrain_state(new_state, mesh, fsdp=fsdp)
        return new_state, metrics

    return step


def _stats_step(task, config, *, mesh=None):
    """The un-jitted ``stats(graphdef, state, key) -> model stats`` on the train batch of ``key``."""

    def stats(graphdef, state, key):
        model, _ = nnx.merge(graphdef, state)
        batch, positions = _train_batch(task, config, key, mesh)
        # deterministic=False: the same dropout masks would need the step's RNG state;
        # statistics of the deterministic forward are what the diagnostics mean.
        _, model_stats = model(batch["inputs"], positions, deterministic=True, return_stats=True)
        return {k: jnp.asarray(v, jnp.float32) for k, v in model_stats.items()}

    return stats


def train_step_fn(task, config, *, mesh=None):
    """``step(graphdef, state, key) -> (state, metrics)``, jitted with ``state`` donated.

    ``state`` is the state of ``(model, optimizer)``; metrics (float32
    scalars): loss, z_loss, total_loss, accuracy, exact_match, grad_norm,
    lr. With ``mesh``, ``state`` and ``key`` must already be placed on it
    (``sharding.shard_state``, ``sharding.replicate``); ValueError if
    ``train.batch_size`` does not divide over its devices.
    """
    sharding_lib.check_batch_size(int(config.train.batch_size), mesh, name="train.batch_size")
    fsdp = sharding_lib.fsdp_enabled(config)
    cache_key = ("train", *_train_key(config, mesh, fsdp))
    if cache_key not in _CACHE:
        step = _train_step(task, config, mesh=mesh, fsdp=fsdp)
        _CACHE[cache_key] = jax.jit(step, donate_argnums=(1,))
    return _CACHE[cache_key]


def stats_fn(task, config, *, mesh=None):
    """``stats(graphdef, state, key) -> dict`` of the model's diagnostics on step ``key``'s batch.

    Same batch and parameters as ``train_step_fn(...)(graphdef, state, key)``
    sees (call it first: the step donates ``state``): max_attention_logit,
    attention_entropy, logit_mean, log_z (float32 scalars).
    """
    fsdp = sharding_lib.fsdp_enabled(config)
    cache_key = ("stats", *_train_key(config, mesh, fsdp))
    if cache_key not in _CACHE:
        _CACHE[cache_key] = jax.jit(_stats_step(task, config, mesh=mesh))
    return _CACHE[cache_key]


def _seed_keys(roots, t):
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(roots, t)


def seeds_train_step_fn(task, config):
    """``step(graphdef, states, roots, t) -> (states, metrics)``: the train step of S seeds at once.

    One device. ``states`` is S ``(model, optimizer)`` states of one graph
    stacked on a leading axis (donated), ``roots`` the S data keys [S] of
    :func:`posenc.training.loop.data_root`, ``t`` the 0-based step (int32
    scalar). Seed ``i`` trains on ``fold_in(roots[i], t)``, exactly the key
    of its own run; the step is :func:`train_step_fn`'s under ``jax.vmap``,
    so every metric gains a leading [S] axis.
    """
    cache_key = ("seeds", *_train_key(config, None, False))
    if cache_key not in _CACHE:
        step = jax.vmap(_train_step(task, config), in_axes=(None, 0, 0))
        _CACHE[cache_key] = jax.jit(lambda g, states, roots, t: step(g, states, _seed_keys(roots, t)),
                                    donate_argnums=(1,))
    return _CACHE[cache_key]


def seeds_stats_fn(task, config):
    """``stats(graphdef, states, roots, t) -> dict`` of [S] diagnostics: :func:`stats_fn` vmapped."""
    cache_key = ("seeds_stats", *_train_key(config, None, False))
    if cache_key not in _CACHE:
        stats = jax.vmap(_stats_step(task, config), in_axes=(None, 0, 0))
        _CACHE[cache_key] = jax.jit(lambda g, states, roots, t: stats(g, states, _seed_keys(roots, t)))
    return _CACHE[cache_key]


def _chunked(step_t, buffer: int):
    """``chunk(graphdef, state, data, t0, n) -> (state, metrics)``: ``n`` <= ``buffer`` steps in one program.

    ``step_t(graphdef, state, data, t) -> (state, metrics)`` is one train step
    at (traced, 0-based) step ``t``. The steps run in a ``lax.fori_loop``
    whose trip count ``n`` is an argument, so every chunk length up to
    ``buffer`` shares one compiled program; metrics are stacked into a
    leading axis of ``buffer`` rows, rows ``n ..`` left zero. Each step is
    the same computation as one step per call (same key, schedule step and
    state), so the results are bit-identical.
    """

    def chunk(graphdef, state, data, t0, n):
        t0, n = jnp.asarray(t0, jnp.int32), jnp.asarray(n, jnp.int32)
        shapes = jax.eval_shape(lambda s: step_t(graphdef, s, data, t0)[1], state)
        rows = jax.tree.map(lambda x: jnp.zeros((buffer, *x.shape), x.dtype), shapes)

        def body(i, carry):
            state, rows = carry
            state, metrics = step_t(graphdef, state, data, t0 + i)
            rows = jax.tree.map(lambda r, x: jax.lax.dynamic_update_index_in_dim(r, x, i, 0),
                                rows, metrics)
            return state, rows

        return jax.lax.fori_loop(0, n, body, (state, rows))

    return chunk


def train_chunk_fn(task, config, buffer: int, *, mesh=None):
    """``chunk(graphdef, state, root, t0, n) -> (state, metrics)``: train steps ``t0 .. t0 + n - 1``.

    Step ``t`` is :func:`train_step_fn`'s step on key ``fold_in(root, t)``,
    run inside one jitted loop (``n`` <= ``buffer``, traced: one compile for
    every chunk length); ``state`` is donated; each metric is stacked to
    [buffer] (rows past ``n`` are zero). Bit-identical to ``n`` calls of
    :func:`train_step_fn`. With ``mesh``, ``state``, ``root``, ``t0`` and
    ``n`` must already be placed on it (``sharding.replicate``).
    """
    buffer = int(buffer)
    sharding_lib.check_batch_size(int(config.train.batch_size), mesh, name="train.batch_size")
    fsdp = sharding_lib.fsdp_enabled(config)
    cache_key = ("chunk", buffer, *_train_key(config, mesh, fsdp))
    if cache_key not in _CACHE:
        step = _train_step(task, config, mesh=mesh, fsdp=fsdp)
        chunk = _chunked(lambda g, s, root, t: step(g, s, jax.random.fold_in(root, t)), buffer)
        _CACHE[cache_key] = jax.jit(chunk, donate_argnums=(1,))
    return _CACHE[cache_key]


def seeds_train_chunk_fn(task, config, buffer: int):
    """``chunk(graphdef, states, roots, t0, n) -> (states, metrics)``: :func:`train_chunk_fn` of S seeds.

    The step is :func:`seeds_train_step_fn`'s (vmapped over the stacked
    ``states`` and the data keys ``roots`` [S]); metrics are [buffer, S].
    """
    buffer = int(buffer)
    cache_key = ("seeds_chunk", buffer, *_train_key(config, None, False))
    if cache_key not in _CACHE:
        step = jax.vmap(_train_step(task, config), in_axes=(None, 0, 0))
        chunk = _chunked(lambda g, s, roots, t: step(g, s, _seed_keys(roots, t)), buffer)
        _CACHE[cache_key] = jax.jit(chunk, donate_argnums=(1,))
    return _CACHE[cache_key]


_TRAINING_KINDS = ("train", "stats", "seeds", "seeds_stats", "chunk", "seeds_chunk")


def clear_cache(*, training_only: bool = False) -> None:
    """Forget cached jitted steps, train and eval (e.g. between unrelated experiments).

    ``training_only``: forget the training programs only (each learning-rate schedule
    compiles its own) and keep the evaluation programs, which models of one graph share.
    """
    for key in [k for k in _CACHE if not training_only or k[0] in _TRAINING_KINDS]:
        del _CACHE[key]
