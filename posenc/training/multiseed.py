"""Train the seeds of one config together: one jitted step, ``jax.vmap``-ed over the seeds.

``run_seeds(configs, workdirs)`` does what ``loop.run(config, workdir)``
does for each config, for configs that differ only in ``train.seed``: the S
``(model, optimizer)`` states (same graph) are stacked on a leading axis and
trained by one ``jax.vmap`` of the train step (``step.seeds_train_step_fn``).
Seed ``i`` starts from ``nnx.Rngs(seed_i)`` and trains on the data keys of its
own run, so its metrics, checkpoints and results equal those of
``loop.run`` up to float32 rounding (batched matmuls may sum in another
order). Every run keeps its own workdir: config.json, train_log.jsonl,
event files, checkpoints (a killed group resumes, as a group or run by run)
and results.jsonl, each row with ``seeds_trained_together`` = S and
``train_seconds`` the wall time of the joint training.

Divergence: a seed whose loss or gradient norm goes NaN / Inf at a check
(log and checkpoint steps, as in ``loop.run``) gets no checkpoint after its
last good one and is returned as its :class:`~posenc.training.loop.NonFiniteError`;
it is dropped from the stack and the others go on (the step recompiles once
for the smaller stack).

Seeds that resume from different steps (e.g. one was run alone and killed)
train in groups of equal start step; a group of one runs ``loop.run``. One
device only: several devices train with ``loop.run``'s data parallelism.

Speed (docs/performance.md), on 2 CPU cores: the quick grid's model
(batch 32, length 16, d_model 64) steps about 14% faster vmapped (3
seeds) and a grid cell finishes 4-8% sooner; larger models (length 32
and up, or d_model 256) step 5-45% slower. It costs one compile per stack
size. Over long runs the seeds agree with their separate runs only as
closely as float32 training trajectories do: the batched matmuls round
differently, and the differences grow with the steps.
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from posenc.model import Decoder
from posenc.training import loop, optim, results
from posenc.training import sharding as sharding_lib
from posenc.training import step as step_lib


def _without_seed(config) -> str:
    d = json.loads(results.canonical_json(config.to_dict()))
    d["train"].pop("seed", None)
    return results.canonical_json(d)


def _check(configs) -> None:
    if not configs:
        raise ValueError("run_seeds needs at least one config")
    seeds = [int(c.train.seed) for c in configs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"run_seeds needs distinct train.seed values, got {seeds}")
    first = _without_seed(configs[0])
    for c in configs[1:]:
        if _without_seed(c) != first:
            raise ValueError(f"run_seeds trains configs that differ only in train.seed; the config of "
                             f"seed {int(c.train.seed)} differs from that of seed {seeds[0]} elsewhere")
    if sharding_lib.mesh_or_none(configs[0]) is not None:
        raise ValueError("run_seeds runs on one device; with several devices (mesh.data != 1) use loop.run")


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _take(tree, index):
    return jax.tree.map(lambda x: x[index], tree)


def run_seeds(configs, workdirs, *, names=None, max_steps_this_run: int | None = None) -> list:
    """``loop.run`` of each ``configs[i]`` in ``workdirs[i]``, the seeds trained together.

    The configs must differ only in ``train.seed`` (ValueError otherwise).
    Returns, per config, its results rows, None if stopped by
    ``max_steps_this_run`` before the end, or the :class:`loop.NonFiniteError`
    of a diverged seed (``loop.record_divergence`` turns it into rows).
    """
    if len(configs) != len(workdirs):
        raise ValueError(f"got {len(configs)} configs and {len(workdirs)} workdirs")
    _check(configs)  # before any workdir is claimed
    names = list(names) if names is not None else [None] * len(configs)
    out, runs, main = [], [], loop.is_main_process()
    for i, (c, w, n) in enumerate(zip(configs, workdirs, names)):
        c, task, h, w, done = loop.start_run(c, w, name=n)
        out.append(done)  # complete runs: their rows
        if done is None:
            runs.append(dict(index=i, config=c, hash=h, workdir=w))
    by_start = {}
    for r in runs:
        c = r["config"]
        r["model"] = Decoder(c.model, rngs=nnx.Rngs(int(c.train.seed)))
        r["optimizer"] = nnx.Optimizer(r["model"], optim.make_optimizer(c.train), wrt=nnx.Param)
        graphdef, state = nnx.split((r["model"], r["optimizer"]))
        r["book"] = loop.RunLog(c, r["workdir"], main=main)
        r["state"] = r["book"].restore(state)
        by_start.setdefault(r["book"].start, []).append(r)
    for start, group in sorted(by_start.items()):
        if len(group) == 1:  # nothing to share: the plain loop
            r, i = group[0], group[0]["index"]
            r["book"].close()
            try:
                out[i] = loop.run(configs[i], workdirs[i], name=names[i], max_steps_this_run=max_steps_this_run)
            except loop.NonFiniteError as e:
                out[i] = e
            continue
        _train_group(group, graphdef, task, start, max_steps_this_run, main, out)
        for r in group:
            if out[r["index"]] is not None or "train_seconds" not in r:  # diverged, or stopped early
                continue
            nnx.update((r["model"], r["optimizer"]), r["state"])
            out[r["index"]] = loop.finish(
                r["model"], task, r["config"], r["workdir"], h=r["hash"], name=names[r["index"]],
                train_metrics=r["book"].last_metrics, train_seconds=r["train_seconds"],
                seeds_trained_together=len(group))
    return out


def _train_group(group, graphdef, task, start, max_steps_this_run, main, out) -> None:
    """Train the runs of ``group`` (equal start step) together; sets each run's final state."""
    config = group[0]["config"]
    steps = int(config.train.steps)
    end = steps if max_steps_this_run is None else min(steps, start + int(max_steps_this_run))
    log_every, ckpt_every = int(config.train.log_every), int(config.train.checkpoint_every)
    active = list(group)
    state = _stack([r.pop("state") for r in active])
    roots = jnp.stack([loop.data_root(r["config"]) for r in active])
    train_step = step_lib.seeds_train_step_fn(task, config)
    bar = loop._progress(steps, start, main and bool(config.train.progress) and end > start)
    unchecked, t0 = [], time.time()
    logging.info("training seeds %s together (steps %d to %d)",
                 [int(r["config"].train.seed) for r in active], start, end)
    try:
        for t in range(start, end):
            state, metrics = train_step(graphdef, state, roots, jnp.int32(t))
            s = t + 1
            unchecked.append((s, metrics))
            is_log, is_ckpt = loop.boundaries(s, steps=steps, end=end, log_every=log_every,
                                              ckpt_every=ckpt_every)
            if not (is_log or is_ckpt):
                continue
            fetched = jax.device_get(unchecked)
            if bar is not None:
                bar.update(len(unchecked))
            unchecked, keep = [], []
            for j, r in enumerate(active):
                try:
                    r["book"].add([(k, {n: float(v[j]) for n, v in m.items()}) for k, m in fetched])
                    keep.append(j)
                except loop.NonFiniteError as e:
                    logging.warning("seed %d diverged: %s", int(r["config"].train.seed), e)
                    out[r["index"]] = e
            if len(keep) < len(active):
                if not keep:
                    return
                active = [active[j] for j in keep]
                keep = jnp.asarray(keep)
                state, roots = _take(state, keep), roots[keep]
            for j, r in enumerate(active):
                if is_log:
                    last = r["book"].log(s)
                    if bar is not None and j == 0:
                        bar.set_postfix_str(f"loss={last['loss']:.4f} acc={last['accuracy']:.3f}")
                if is_ckpt:
                    r["book"].save(s, _take(state, j), r["book"].seconds + time.time() - t0)
    finally:
        if bar is not None:
            bar.close()
        for r in group:
            r["book"].close()
    if end < steps:
        logging.info("stopped after step %d of %d; rerun with the same workdirs to resume", end, steps)
        return
    for j, r in enumerate(active):
        r["state"] = _take(state, j)
        r["train_seconds"] = r["book"].seconds + time.time() - t0
