"""The results of a run: evaluate the trained model, build its rows, merge them into results.jsonl.

One row per (evaluation variant, eval length), with the run's identity
(task, position kind and options, norm, placement, seed, lengths), its
training (steps, fit, timings) and the metrics; see
:data:`posenc.workdir.results.REQUIRED_FIELDS`. A diverged run gets rows
too (metrics null, ``diverged_at_step``), so grids count it as a result.
"""

from __future__ import annotations

import os
import time

import jax
from absl import logging

import posenc
from posenc.training import dataset
from posenc.training import evaluate as evaluate_lib
from posenc.workdir import files, records, results

_main = lambda: jax.process_index() == 0  # noqa: E731  (only process 0 writes files)


def _identity(resolved, name: str | None, workdir: str) -> dict:
    config, spec = resolved.config, resolved.spec
    pos, norm = config.model.position, config.model.norm
    return dict(
        name=name or os.path.basename(os.path.abspath(workdir)), task=config.task.name,
        position=pos.kind, position_options={k: dict(v) for k, v in spec.position.options.items()},
        layer_kinds=list(spec.position.layer_kinds), randomized=bool(pos.randomized),
        norm=norm.kind, placement=norm.placement, qk_norm=norm.qk_norm,
        seed=int(config.train.seed), train_length=int(config.task.train_length),
        steps=int(config.train.steps), config_hash=resolved.hash,
        jax_version=jax.__version__, posenc_version=posenc.__version__,
        task_metadata=resolved.task.metadata())


def _fmt(v):
    return "n/a" if v is None else f"{v:.4f}"


def describe(row: dict) -> str:
    """An evaluation row in the words of the tables: the decoded answer first where the task has
    answers (the headline), then teacher-forced, then the loss; a text row: its loss and
    perplexity (no answers, no exact match)."""
    if row.get("perplexity") is not None:
        return (f"loss={_fmt(row['loss'])} perplexity={row['perplexity']:.3f} "
                f"next-token accuracy={_fmt(row['accuracy'])}")
    parts = []
    if row.get("decoded_accuracy") is not None:
        sampled = row.get("decoded_rows") is not None and row["decoded_rows"] < row["failing_rows"]
        parts.append(f"decoded accuracy={_fmt(row['decoded_accuracy'])} "
                     + (f"(estimated: {row['decoded_rows']} of {row['failing_rows']} failing rows decoded, "
                        f"standard error {_fmt(row['decoded_accuracy_se'])}) " if sampled else "")
                     + f"exact match={_fmt(row.get('decoded_exact_match'))}")
    parts.append(f"teacher-forced accuracy={_fmt(row['accuracy'])} exact match={_fmt(row['exact_match'])}")
    return "; ".join(parts + [f"loss={_fmt(row['loss'])}"])


def write_rows(workdir: str, rows: list[dict]) -> None:
    """Merge ``rows`` into ``workdir/results.jsonl`` (atomically; process 0 only), one row per key.

    Key: :func:`results.row_key` (with the row's ``sweep`` point); new rows win.
    """
    path = os.path.join(workdir, "results.jsonl")
    if _main():
        merged = {results.row_key(r): r for r in files.read_jsonl(path)}
        merged.update((results.row_key(r), r) for r in rows)
        files.write_jsonl(path, list(merged.values()))


def finish(model, resolved, workdir: str, *, name: str | None, record: records.CheckpointRecord,
           steps_trained: int, mesh=None, evals=None, eval_seconds=None, **extra) -> list[dict]:
    """Evaluate the trained ``model`` at every eval length (and variant) and write its rows.

    ``record``: the run's last checkpoint record (train metrics, seconds, fit
    state); ``extra`` fields are added to every row. ``evals`` (with
    ``eval_seconds``): the model's rows of ``evaluate.evaluate``, already
    computed (seeds evaluated together).
    """
    config = resolved.config
    if evals is None:
        t1 = time.time()
        evals = evaluate_lib.evaluate(model, resolved, mesh=mesh)
        eval_seconds = time.time() - t1
    fit = record.fit
    fitting = float(config.train.fit_accuracy) > 0
    if int(config.train.get("dataset_size", 0)):  # a fixed training set: its size and the examples trained on
        extra = {"dataset_size": int(config.train.dataset_size),
                 "train_examples": dataset.examples_seen(steps_trained, int(config.train.batch_size),
                                                         int(config.train.dataset_size)), **extra}
    train_seconds = record.train_seconds
    rows, writer = [], records.tensorboard_writer(config, workdir) if _main() else None
    for ev in evals:
        rows.append(results.make_row(
            **_identity(resolved, name, workdir), steps_trained=int(steps_trained),
            fitted=bool(fit.fitted) if fitting else None,
            steps_to_fit=fit.steps_to_fit if fitting else None,
            fit_accuracy=fit.accuracy if fitting else None,
            fit_examples="validation" if fitting else None,  # the fit check's stream: not these rows' examples
            train_loss=record.metrics.get("loss"), train_accuracy=record.metrics.get("accuracy"),
            train_seconds=train_seconds, eval_seconds=eval_seconds,
            wall_time=train_seconds + eval_seconds, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **extra, **ev))
        if writer is not None and ev.get("eval_variant") is None and ev.get("sweep") is None:
            for k in results.METRICS:
                if ev[k] is not None:
                    writer.add_scalar(f"eval/{k}", ev[k], ev["eval_length"])
    if writer is not None:
        writer.close()
    write_rows(workdir, rows)
    for r in rows if _main() else ():
        where = ", ".join([r["eval_variant"]] * bool(r["eval_variant"])
                          + [f"{k}={v}" for k, v in (r.get("sweep") or {}).items()])
        logging.info("eval length %d%s: %s", r["eval_length"], f" ({where})" if where else "", describe(r))
    return rows


def record_divergence(resolved, workdir: str, error: records.NonFiniteError, *,
                      name: str | None = None) -> list[dict]:
    """Write (and return) rows marking the run as diverged: metrics null, ``diverged_at_step``.

    For grids where divergence is a result (e.g. norm placements at high
    learning rates): the run then counts as complete and is not retrained.
    """
    rows = [results.make_row(
        **_identity(resolved, name, workdir), eval_variant=v, eval_length=int(n),
        loss=None, accuracy=None, exact_match=None, diverged_at_step=int(error.step),
        not_applicable=f"training diverged: {error}")
        for v in (None, *resolved.eval_variants) for n in resolved.config.eval.lengths]
    write_rows(workdir, rows)
    return rows
