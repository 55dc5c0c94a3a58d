"""Jitted functional train steps (one step, k steps per call, seeds vmapped) and diagnostics.

The model and optimizer are split once, ``graphdef, state =
nnx.split((model, optimizer))``; each step is a ``jax.jit`` function of
``(graphdef, state, key)`` that merges inside, generates its batch from
``key`` (so data needs no host round trip), and returns the new state: no
Python graph traversal per step. ``graphdef`` has no array leaves, so jit
treats it as static. The programs are ``functools.cache``-d functions of a
:class:`~posenc.training.specs.TrainSpec` (and the mesh): runs in one process
whose specs are equal reuse the compiled step.

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

Why a single run does not train as a seed group of one: one run keeps its
own program, the un-vmapped step, for two reasons. A group of one is slower
at the small benchmark case: 2.9-3.7% more step time at case T (the paired medians of
three runs of ``python -m benchmarks.group_of_one --case T``, 10, 30 and 30 rounds),
1.0% at case R (2026-12-05, this 2-core CPU VM); and only the single run
takes a ``mesh`` (data parallel, FSDP), which the vmapped seed axis does not.
Both programs are built from the one ``_train_step`` (and ``_stats_step``),
so a new metric or loss term is written once.

The step loop (:mod:`posenc.training.steploop`) calls :func:`train_chunk_fn`
(and :func:`seeds_train_chunk_fn`): up to k steps inside one compiled
``lax.fori_loop``, bit-identical to k calls of the single step. The
evaluation programs are in :mod:`posenc.training.eval_step` (same cache).

A fixed training set (``train.dataset_size`` > 0, :mod:`posenc.training.dataset`):
step ``t`` visits the examples of its place in the epochs, so the step reads
``(root, t)`` besides its key (``fixed``); the chunk programs pass it, and the
single-step programs take it as an argument. With the default (0) nothing of
it enters a program.

Losses (masked to answer tokens, ``m``):
  loss = sum(m * CE(logits, targets)) / sum(m)
  total = loss + z_loss_weight * mean_m(logsumexp(logits)^2)   (PaLM z-loss)
          + the router losses of a mixture-of-experts model (posenc.training.moe_terms)
  accuracy = sum(m * [argmax == target]) / sum(m)
  exact_match = mean over examples with any answer token of [all answer tokens right]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from posenc.encodings import absolute, pose
from posenc.norms import z_loss
from posenc.training import dataset, moe_terms, optim, specs
from posenc.training import sharding as sharding_lib


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


def positions_for(positions: specs.Positions, key, batch_size: int, length: int):
    """Positions fed to the model: None (0..L-1), randomized (Ruoss et al. 2023) or PoSE's.

    Randomized: ``length`` sorted distinct draws from ``[0, positions.max_position)``, one
    draw for the whole batch (``per="batch"``, as the reference code) or one per example
    (``"example"``), at training and at evaluation alike (the model never sees the plain
    0..L-1 layout). PoSE (``positions.pose_length``, training only): one skip per example
    (:func:`posenc.encodings.pose.positions`).
    """
    if positions.pose_length:
        return pose.positions(key, length, target_length=positions.pose_length, batch_shape=(batch_size,))
    if not positions.randomized:
        return None
    return absolute.randomized_positions(
        key, length, max_position=positions.max_position,
        batch_shape=(batch_size,) if positions.per == "example" else (),
    )


def _batch(task, positions: specs.Positions, key, batch_size, length, *, split, min_size=None, fixed=None):
    """The batch and positions of ``key`` (one split of the key: data, then positions).

    A task that emits ``position_ids`` (position coupling) gives the positions itself; one that
    emits multi-axis ``axis_positions`` [B, L, A] (the grid tasks) gives them to a model reading
    several axes (``positions.axes`` > 1), while one-axis models read their usual positions.
    ``fixed = (root, t, size)``: step ``t``'s examples of a fixed training set (:mod:`~posenc.training.dataset`).
    """
    data_key, pos_key = jax.random.split(key)
    if fixed is None:
        batch = task.batch(data_key, batch_size, length, min_size=min_size, split=split)
    else:
        batch = dataset.batch(task, fixed, data_key, batch_size, length, min_size=min_size)
    given = "position_ids" if "position_ids" in batch else None
    if positions.axes > 1 and "axis_positions" in batch:
        given = "axis_positions"
    if given:
        if positions.randomized or positions.pose_length:
            field = "model.position.randomized=True" if positions.randomized else "train.pose_length > 0"
            raise ValueError(f"{field}, but the task gives its own positions ({given}); use one or the other")
        return batch, batch[given]
    return batch, positions_for(positions, pos_key, batch_size, length)


def _train_batch(spec: specs.TrainSpec, key, mesh, at=None):
    fixed = None if at is None else (*at, spec.dataset_size)
    batch, positions = _batch(spec.task.make(), spec.positions, key, spec.batch_size, spec.train_length,
                              split="train", min_size=spec.min_size, fixed=fixed)
    if mesh is not None:
        batch, positions = sharding_lib.constrain_batch((batch, positions), mesh)
    return batch, positions


def _train_step(spec: specs.TrainSpec, mesh=None):
    """The un-jitted ``step(graphdef, state, key, at=None) -> (state, metrics)``; ``at = (root, t)``:
    the data root and step number, which a fixed training set needs (``spec.dataset_size``)."""
    z_weight = spec.z_loss
    fsdp = spec.fsdp and mesh is not None
    schedule = optim.learning_rate_schedule(spec.optimizer)

    def step(graphdef, state, key, at=None):
        model, optimizer = nnx.merge(graphdef, state)
        batch, positions = _train_batch(spec, key, mesh, _at(spec, at))
        mgraph, params, rest = nnx.split(model, nnx.Param, ...)
        moe = moe_terms.MoETerms.of(model)  # None for a dense model (model.moe)

        def loss_fn(params):
            m = nnx.merge(mgraph, params, rest)
            routing = [] if moe else None  # each MoE layer's Routing of this forward
            # the input unit's training randomness (Abacus's offset): a key apart from the data's
            out = m(batch["inputs"], positions, deterministic=False, key=jax.random.fold_in(key, 1),
                    return_stats=bool(spec.qk_clip), routing=routing)
            logits, stats = out if spec.qk_clip else (out, None)
            metrics = masked_metrics(logits, batch["targets"], batch["mask"])
            if spec.qk_clip:  # the step's own forward: its largest logit per layer and head
                metrics["max_logit_per_head"] = jax.lax.stop_gradient(stats["max_logit_per_head"])
            zl = (z_loss.z_loss(logits, weight=z_weight, mask=batch["mask"])
                  if z_weight > 0 else jnp.zeros((), jnp.float32))
            total = metrics["loss"] + zl
            metrics.update(z_loss=zl, total_loss=total)
            if moe:  # the router losses on the logits of this forward
                router, moe_metrics = moe_terms.losses(moe, routing)
                total = total + router
                metrics.update(moe_metrics, total_loss=total)
            return total, metrics

        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["lr"] = schedule(optimizer.step[...])
        optimizer.update(model, grads)
        model.constrain()
        if moe:  # DeepSeek-V3's loss-free balancing: the correction biases move by the step's loads
            moe_terms.update_bias(model, moe, metrics)
        if spec.qk_clip:
            metrics["qk_clipped_heads"] = _qk_clip(model, metrics.pop("max_logit_per_head"), spec.qk_clip)
        new_state = nnx.state((model, optimizer))
        if mesh is not None:
            new_state = sharding_lib.constrain_state(new_state, mesh, fsdp=fsdp)
        return new_state, metrics

    return step


def _qk_clip(model, max_logits, threshold: float):
    """QK-Clip (Kimi K2, MuonClip): rescale each head's query and key weights (and biases) after the step.

    ``max_logits`` [num_layers, H]: the largest pre-softmax logit of each layer's query heads in
    the step's forward. Each layer applies the rule of its form (``Attention.qk_clip``: per key
    head's group, ``gamma ** 0.5`` on its query and key weights, as Megatron-LM's ``qk_clip``;
    ``LatentAttention.qk_clip``: MLA's case, ``posenc.qk_clip.clip_mla``), so those logits shrink
    by gamma. Returns the number of query heads whose logit passed the threshold (float32).
    """
    for i, block in enumerate(model.blocks):
        block.attn.qk_clip(max_logits[i], threshold)
    return jnp.sum(max_logits > threshold).astype(jnp.float32)


def _at(spec: specs.TrainSpec, at):
    """``at`` where the spec trains on a fixed set (ValueError if it is missing), else None."""
    if not spec.dataset_size:
        return None
    if at is None:
        raise ValueError("train.dataset_size > 0: the step needs its data root and step number (at=(root, t)); "
                         "the chunk programs (train_chunk_fn) pass them")
    return at


def _stats_step(spec: specs.TrainSpec, mesh=None):
    """The un-jitted ``stats(graphdef, state, key, at=None) -> model stats`` on the train batch of ``key``."""

    def stats(graphdef, state, key, at=None):
        model, _ = nnx.merge(graphdef, state)
        batch, positions = _train_batch(spec, key, mesh, _at(spec, at))
        # deterministic=False: the same dropout masks would need the step's RNG state;
        # statistics of the deterministic forward are what the diagnostics mean.
        _, model_stats = model(batch["inputs"], positions, deterministic=True, return_stats=True)
        return {k: jnp.asarray(v, jnp.float32) for k, v in model_stats.items() if jnp.ndim(v) == 0}

    return stats


def train_step_fn(spec: specs.TrainSpec, *, mesh=None):
    """``step(graphdef, state, key, at=None) -> (state, metrics)``, jitted with ``state`` donated
    (``at = (root, t)`` with a fixed training set, ``spec.dataset_size``).

    ``state`` is the state of ``(model, optimizer)``; metrics (float32
    scalars): loss, z_loss, total_loss, accuracy, exact_match, grad_norm,
    lr. With ``mesh``, ``state`` and ``key`` must already be placed on it
    (``sharding.shard_state``, ``sharding.replicate``); ValueError if
    ``spec.batch_size`` does not divide over its devices. Equal specs share
    one program.
    """
    sharding_lib.check_batch_size(spec.batch_size, mesh, name="train.batch_size")
    return _train_step_program(spec, mesh)


@functools.cache
def _train_step_program(spec, mesh):
    return jax.jit(_train_step(spec, mesh), donate_argnums=(1,))


def stats_fn(spec: specs.TrainSpec, *, mesh=None):
    """``stats(graphdef, state, key, at=None) -> dict`` of the model's diagnostics on step ``key``'s batch.

    Same batch and parameters as ``train_step_fn(spec)(graphdef, state, key)``
    sees (call it first: the step donates ``state``): max_attention_logit,
    attention_entropy, logit_mean, log_z (float32 scalars).
    """
    return _stats_program(spec, mesh)


@functools.cache
def _stats_program(spec, mesh):
    return jax.jit(_stats_step(spec, mesh))


def _seed_keys(roots, t):
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(roots, t)


def _seeds(fn, spec: specs.TrainSpec):
    """``fn(graphdef, state, key[, at])`` vmapped over seeds as ``f(graphdef, states, roots, t)``: seed
    ``i`` on key ``fold_in(roots[i], t)`` (and ``at = (roots[i], t)`` with a fixed training set)."""
    if not spec.dataset_size:
        vmapped = jax.vmap(fn, in_axes=(None, 0, 0))
        return lambda g, states, roots, t: vmapped(g, states, _seed_keys(roots, t))
    vmapped = jax.vmap(fn, in_axes=(None, 0, 0, (0, None)))
    return lambda g, states, roots, t: vmapped(g, states, _seed_keys(roots, t), (roots, t))


def _keyed(fn, spec: specs.TrainSpec):
    """``fn(graphdef, state, key[, at])`` as ``f(graphdef, state, root, t)``: key ``fold_in(root, t)``."""
    if not spec.dataset_size:
        return lambda g, s, root, t: fn(g, s, jax.random.fold_in(root, t))
    return lambda g, s, root, t: fn(g, s, jax.random.fold_in(root, t), (root, t))


@functools.cache
def seeds_train_step_fn(spec: specs.TrainSpec):
    """``step(graphdef, states, roots, t) -> (states, metrics)``: the train step of S seeds at once.

    One device. ``states`` is S ``(model, optimizer)`` states of one graph
    stacked on a leading axis (donated), ``roots`` the S data keys [S] of
    :func:`posenc.training.loop.data_root`, ``t`` the 0-based step (int32
    scalar). Seed ``i`` trains on ``fold_in(roots[i], t)``, exactly the key
    of its own run; the step is :func:`train_step_fn`'s under ``jax.vmap``,
    so every metric gains a leading [S] axis.
    """
    return jax.jit(_seeds(_train_step(spec), spec), donate_argnums=(1,))


@functools.cache
def seeds_stats_fn(spec: specs.TrainSpec):
    """``stats(graphdef, states, roots, t) -> dict`` of [S] diagnostics: :func:`stats_fn` vmapped."""
    return jax.jit(_seeds(_stats_step(spec), spec))


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


def train_chunk_fn(spec: specs.TrainSpec, buffer: int, *, mesh=None):
    """``chunk(graphdef, state, root, t0, n) -> (state, metrics)``: train steps ``t0 .. t0 + n - 1``.

    Step ``t`` is :func:`train_step_fn`'s step on key ``fold_in(root, t)``,
    run inside one jitted loop (``n`` <= ``buffer``, traced: one compile for
    every chunk length); ``state`` is donated; each metric is stacked to
    [buffer] (rows past ``n`` are zero). Bit-identical to ``n`` calls of
    :func:`train_step_fn`. With ``mesh``, ``state``, ``root``, ``t0`` and
    ``n`` must already be placed on it (``sharding.replicate``).
    """
    sharding_lib.check_batch_size(spec.batch_size, mesh, name="train.batch_size")
    return _train_chunk_program(spec, int(buffer), mesh)


@functools.cache
def _train_chunk_program(spec, buffer, mesh):
    chunk = _chunked(_keyed(_train_step(spec, mesh), spec), buffer)
    return jax.jit(chunk, donate_argnums=(1,))


def seeds_train_chunk_fn(spec: specs.TrainSpec, buffer: int):
    """``chunk(graphdef, states, roots, t0, n) -> (states, metrics)``: :func:`train_chunk_fn` of S seeds.

    The step is :func:`seeds_train_step_fn`'s (vmapped over the stacked
    ``states`` and the data keys ``roots`` [S]); metrics are [buffer, S].
    """
    return _seeds_chunk_program(spec, int(buffer))


@functools.cache
def _seeds_chunk_program(spec, buffer):
    chunk = _chunked(_seeds(_train_step(spec), spec), buffer)
    return jax.jit(chunk, donate_argnums=(1,))


TRAINING_PROGRAMS = (_train_step_program, _stats_program, seeds_train_step_fn, seeds_stats_fn, _train_chunk_program,
                     _seeds_chunk_program)
EVAL_PROGRAMS: list = []  # posenc.training.eval_step adds its own


def clear_cache(*, training_only: bool = False) -> None:
    """Forget the compiled train and evaluation programs (e.g. between unrelated experiments).

    ``training_only``: forget the training programs only (each learning-rate schedule
    compiles its own) and keep the evaluation programs, which models of one graph share.
    """
    for program in (*TRAINING_PROGRAMS, *(() if training_only else EVAL_PROGRAMS)):
        program.cache_clear()
