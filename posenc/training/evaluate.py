"""Length evaluation: loss, accuracy and exact match at every ``config.eval.lengths``.

For each length, ``eval.num_batches`` batches of ``split="eval"`` data (every
example at the largest problem size that fits) drawn from keys
``fold_in(fold_in(key(eval.seed), length), i)``: the same evaluation set for
every run, independent of training. Each length is one static shape, so it
compiles once per process (the model switches to blocked attention for long
sequences by itself). Models with randomized positions are evaluated with
randomized positions as well (Ruoss et al. 2023), seeded the same way.

Not applicable (metrics ``None`` and a ``not_applicable`` reason): a learned
absolute table evaluated past its ``max_length`` rows, and randomized
positions at lengths above ``randomized_max_position``.

Zero-shot context extension: ``eval.position_overrides`` (e.g.
``"scaling=yarn,scaling_factor=4.0"``) evaluates the trained parameters in
a model whose ``model.position`` fields are overridden (RoPE frequency
scaling: PI, NTK, YaRN, Llama 3, ...); the position kind cannot change.

With a ``mesh`` (several devices) each eval batch is split over its
devices (``eval.batch_size`` must divide by their number); the sums are
the same as on one device up to float32 rounding.

For the ``text`` task a row also carries ``position_loss``: mean loss over
``eval.position_buckets`` equal position ranges ``[b L / n, (b + 1) L / n)``
(the loss-vs-position curve of Press et al. 2022).
"""

from __future__ import annotations

import ast

import jax
import numpy as np
from flax import nnx

from posenc.training import sharding as sharding_lib
from posenc.training import step as step_lib


def parse_overrides(text: str) -> dict:
    """``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}`` (values as Python literals where they parse)."""
    out = {}
    for item in filter(None, (t.strip() for t in str(text).split(","))):
        if "=" not in item:
            raise ValueError(f"eval.position_overrides item {item!r} is not of the form field=value")
        k, v = (t.strip() for t in item.split("=", 1))
        try:
            out[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k] = v
    return out


def eval_model(model, config):
    """``(model, config)`` to evaluate: with ``eval.position_overrides`` a copy of the model
    with the overridden position fields and the trained parameters."""
    overrides = parse_overrides(config.eval.get("position_overrides", ""))
    if not overrides:
        return model, config
    from posenc.model import Decoder, validate_config

    config = config.copy_and_resolve_references()
    pos = config.model.position
    for k, v in overrides.items():
        if k not in pos or k == "kind":
            allowed = ", ".join(sorted(f for f in pos if f != "kind"))
            raise ValueError(f"eval.position_overrides: cannot override {k!r}; choose from: {allowed}")
        pos[k] = float(v) if isinstance(pos[k], float) and isinstance(v, int) else v
    validate_config(config.model)
    extended = Decoder(config.model, rngs=nnx.Rngs(0))
    nnx.update(extended, nnx.state(model, nnx.Param))
    return extended, config


def not_applicable(config, length: int) -> str | None:
    """Why evaluation at ``length`` is impossible for this model, or None."""
    pos = config.model.position
    kinds = set(pos.layer_kinds) | {pos.kind}
    if "learned" in kinds and length > int(pos.max_length):
        return f"learned position table has {int(pos.max_length)} rows < eval length {length}"
    if pos.randomized and length > int(pos.randomized_max_position):
        return (f"randomized positions are drawn from [0, {int(pos.randomized_max_position)}), "
                f"fewer than eval length {length}")
    return None


def _buckets(position_loss, position_mask, num_buckets: int) -> list[dict]:
    length = len(position_loss)
    edges = np.linspace(0, length, num_buckets + 1).round().astype(int)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi <= lo:
            continue
        m = float(position_mask[lo:hi].sum())
        out.append({"start": int(lo), "end": int(hi),
                    "loss": float(position_loss[lo:hi].sum() / m) if m > 0 else None})
    return out


def evaluate_length(model, task, config, length: int, *, mesh=None) -> dict:
    """Metrics of ``model`` on ``task`` at ``length``: loss, accuracy, exact_match (+ position_loss)."""
    reason = not_applicable(config, length)
    if reason is not None:
        return {"eval_length": int(length), "loss": None, "accuracy": None, "exact_match": None,
                "not_applicable": reason}
    per_position = config.task.name == "text"
    batch_size = int(config.eval.batch_size)
    fn = step_lib.eval_step_fn(task, config, int(length), batch_size, per_position=per_position,
                               mesh=mesh)
    graphdef, state = nnx.split(model)
    if mesh is not None:  # a no-op for arrays already placed; places fresh ones (overridden models)
        state = sharding_lib.shard_state(state, mesh, fsdp=sharding_lib.fsdp_enabled(config))
    root = jax.random.fold_in(jax.random.key(int(config.eval.seed)), int(length))
    totals = None
    for i in range(int(config.eval.num_batches)):
        key = jax.random.fold_in(root, i)
        out = fn(graphdef, state, key if mesh is None else sharding_lib.replicate(key, mesh))
        totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
    totals = jax.device_get(totals)
    denom = max(float(totals["mask_sum"]), 1.0)
    row = {
        "eval_length": int(length),
        "loss": float(totals["loss_sum"]) / denom,
        "accuracy": float(totals["correct_sum"]) / denom,
        "exact_match": float(totals["exact_sum"]) / max(float(totals["examples"]), 1.0),
        "eval_tokens": int(totals["mask_sum"]),
        "problem_size": int(task.max_size(int(length))) if config.task.name != "text" else None,
    }
    if per_position:
        row["position_loss"] = _buckets(np.asarray(totals["position_loss"]),
                                        np.asarray(totals["position_mask"]),
                                        int(config.eval.position_buckets))
    return row


def evaluate(model, task, config, lengths=None, *, mesh=None) -> list[dict]:
    """:func:`evaluate_length` at each of ``lengths`` (default ``config.eval.lengths``), on ``mesh`` if given."""
    lengths = tuple(config.eval.lengths) if lengths is None else tuple(lengths)
    model, config = eval_model(model, config)
    return [evaluate_length(model, task, config, int(n), mesh=mesh) for n in lengths]
