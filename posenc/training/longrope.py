"""LongRoPE factors for a trained model: :mod:`posenc.rope_search` with the model's perplexity as fitness.

Ding et al. 2024 search per-pair rescale factors lambda for a trained RoPE
model; a candidate's fitness is the model's perplexity at the target length
on training data (a small batch) with frequencies ``inv_i / lambda_i`` and
LongRoPE's attention factor ``sqrt(1 + ln s / ln L)``. Here the batch is
``batch_size`` windows of the task's training split at the target length,
drawn once from ``seed``, so every candidate is scored on the same tokens;
the frequencies are computed by ``posenc.rope.frequencies("longrope", ...)``
exactly as the model computes them, and passed to one compiled forward pass
as an argument, so a search of a hundred candidates compiles once.

:func:`search` returns the factor file of :mod:`posenc.rope_search` (JSON:
``short_factor``, ``long_factor``, the search summary) and
:func:`rope_fields` turns one into ``model.position.rope.*`` fields.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.encodings.rope import rope, rope_search
from posenc.model.encodings.rope import RoPE
from posenc.training import step as step_lib
from posenc.workdir import files


def _rope_units(model) -> list:
    units = [b.attn.encoding for b in model.blocks]
    if not units or not all(isinstance(u, RoPE) for u in units):
        raise ValueError("the LongRoPE search needs a model with RoPE in every layer "
                         "(model.position.kind = 'rope')")
    return units


@jax.jit
def _loss(graphdef, state, inv_freq, attention_factor, batch):
    """Mean next-token loss of the model with the given RoPE frequencies (compiled once per graph)."""
    model = nnx.merge(graphdef, state)
    for unit in _rope_units(model):
        # The candidate's frequencies replace the unit's own (static) ones in this trace only.
        object.__setattr__(unit, "frequencies", lambda seq_len: (inv_freq, attention_factor))
    logits = model(batch["inputs"], deterministic=True)
    return step_lib.masked_metrics(logits, batch["targets"], batch["mask"])["loss"]


def perplexity_fitness(model, task, length: int, *, factor: float, original_length: int,
                       batch_size: int = 4, seed: int = 0):
    """``fitness(lambda) -> perplexity`` of ``model`` at ``length`` with LongRoPE factors ``lambda``.

    ``factor`` s gives the attention factor sqrt(1 + ln s / ln L), L =
    ``original_length``; the windows are ``batch_size`` training examples of
    ``task`` at ``length`` from ``key(seed)``.
    """
    unit = _rope_units(model)[0]
    graphdef, state = nnx.split(model)
    batch = task.batch(jax.random.key(int(seed)), int(batch_size), int(length), split="train")

    def fitness(lam) -> float:
        lam = [float(v) for v in np.asarray(lam)]
        inv, scale = rope.frequencies("longrope", unit.rotary_dim, base=unit.base, factor=factor,
                                      original_length=original_length, seq_len=int(length),
                                      short_factor=lam, long_factor=lam)
        return math.exp(float(_loss(graphdef, state, jnp.asarray(inv), jnp.float32(scale), batch)))

    return fitness


def search(model, resolved, *, factor: float, target_length: int, short: bool = False,
           batch_size: int = 4, seed: int = 0, path: str | None = None, **options) -> dict:
    """Search LongRoPE factors for ``model`` (trained as ``resolved``) at ``target_length``.

    ``long_factor``: the search at the target length with scale ``factor``;
    ``short_factor``: a search at the training length with scale 1 if
    ``short``, else ones (the model as trained). ``options`` go to
    :func:`posenc.rope_search.search` (population_size, iterations, ...).
    Returns the factor-file object (written to ``path`` when given).
    """
    unit = _rope_units(model)[0]
    if unit.scaling != "default":
        raise ValueError(f"the LongRoPE search starts from unscaled RoPE; the model uses scaling "
                         f"{unit.scaling!r}")
    length = int(resolved.config.task.train_length)
    task = resolved.task
    long_fit = perplexity_fitness(model, task, target_length, factor=factor, original_length=length,
                                  batch_size=batch_size, seed=seed)
    kw = dict(base=unit.base, original_length=length, seed=seed, **options)
    long = rope_search.search(long_fit, unit.rotary_dim, factor=factor, **kw)
    if short:
        short_fit = perplexity_fitness(model, task, length, factor=factor, original_length=length,
                                       batch_size=batch_size, seed=seed)
        short_result = rope_search.search(short_fit, unit.rotary_dim, factor=1.0, **kw)
    else:
        short_result = np.ones(unit.rotary_dim // 2)
    config = rope_search.longrope_config(rotary_dim=unit.rotary_dim, base=unit.base, factor=factor,
                                         original_length=length, short=short_result, long=long)
    config["search"]["target_length"] = int(target_length)
    config["search"]["batch_size"] = int(batch_size)
    if path is not None:
        write_factors(path, config)
    return config


def rope_fields(factors: dict) -> dict:
    """``model.position.rope.*`` fields of a factor file: scaling longrope with its factors."""
    kw = rope_search.frequency_kwargs(factors)
    out = {"model.position.rope.scaling": "longrope"}
    for k in ("base", "factor", "original_length"):
        if k in kw:
            out[f"model.position.rope.{k}"] = kw[k]
    for k in ("short_factor", "long_factor"):
        out[f"model.position.rope.{k}"] = tuple(float(v) for v in kw[k])
    return out


def write_factors(path, config) -> None:
    """Write a factor file (:func:`posenc.rope_search.longrope_config`'s object) atomically."""
    rope_search.check_config(config)
    files.atomic_write(path, json.dumps(config, indent=1, allow_nan=False))


def read_factors(path) -> dict:
    """Read and check a factor file written by :func:`write_factors`."""
    with open(path) as f:
        config = json.load(f)
    rope_search.check_config(config)
    return config
