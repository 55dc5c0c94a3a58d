"""What grid studies share: a run config per grid point, and training a group of points.

:func:`run_config` is a point's run: the study's base config with the
point's override sets applied through the one applier, validated
(:func:`posenc.training.resolve`), a bad field named with the point.
:func:`train` trains a group of points (the seeds of one cell together in one
``jax.vmap``-ed step, :mod:`posenc.training.multiseed`, or one run) in their
directories and returns their rows; a run whose loss becomes NaN / Inf is a
result, rows with ``diverged_at_step``, not a crash.
"""

from __future__ import annotations

import json

from absl import logging

from posenc.config import overrides
from posenc.config.schema import ConfigError
from posenc.training import finish, loop, multiseed, prepare
from posenc.training import schema as run_schema
from posenc.workdir import records, results


def run_config(base, field_sets, *, name: str):
    """``base`` with each ``(where, {dotted field: value})`` of ``field_sets`` set, resolved."""
    run = prepare.plain_copy(base)
    for where, fields in field_sets:
        overrides.apply(run, overrides.as_dict(fields), schema=run_schema.Run, where=where)
    try:
        return prepare.resolve(run)
    except ConfigError as e:
        raise ConfigError(f"grid point {name}: {e}") from None


def cell_key(resolved, *, without=("train.seed",)) -> str:
    """The config of a run without the fields that vary inside its cell (its seed), as a hash."""
    d = json.loads(results.canonical_json(resolved.config.to_dict()))
    for dotted in without:
        *parents, last = dotted.split(".")
        node = d
        for p in parents:
            node = node[p]
        node.pop(last, None)
    return results.config_hash(d)


def vmappable(resolved) -> bool:
    """Whether seeds of this run can train together (one device: no multi-device mesh)."""
    from posenc.training import sharding

    return sharding.mesh_or_none(resolved.config) is None


def train(points, ctx) -> list[list[dict]]:
    """Train every point of the group (``point.run``) in its directory; the rows of each.

    Several points train together (their configs differ only in ``train.seed``);
    a diverged run's rows mark it (``finish.record_divergence``).
    """
    runs = [p.run for p in points]
    dirs = [ctx.run_dir(p) for p in points]
    if len(points) > 1:
        outs = multiseed.run_seeds(runs, dirs, names=[p.name for p in points])
    else:
        try:
            outs = [loop.run(runs[0], dirs[0], name=points[0].name)]
        except records.NonFiniteError as e:
            outs = [e]
    rows = []
    for p, d, out in zip(points, dirs, outs):
        if isinstance(out, records.NonFiniteError):  # divergence is a result, not a crash
            logging.warning("%s diverged: %s", p.name, out)
            out = finish.record_divergence(p.run, d, out, name=p.name)
        rows.append(list(out))
    return rows
