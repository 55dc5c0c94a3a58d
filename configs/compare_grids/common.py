"""What the compare grids share: the grid section, tasks at problem sizes, the quick copy recipe."""

from __future__ import annotations

import ml_collections

from posenc.configs import default


def grid(**kw) -> ml_collections.ConfigDict:
    """The ``grid`` section: ``kw`` over one copy task, RoPE, pre-RMSNorm and seed 0."""
    g = dict(tasks=("copy",), positions=("rope",), placements=("pre",), norms=("rms",), seeds=(0,),
             vmap_seeds=False)
    g.update(kw)
    return ml_collections.ConfigDict(g)


def chomsky_tasks() -> tuple[str, ...]:
    """The 15 tasks of Delétang et al. 2023 (suite "chomsky" of the task registry, aliases left out)."""
    from posenc import tasks

    return tuple(n for n in tasks.TASKS if tasks.spec(n)["suite"] == "chomsky" and tasks.spec(n)["task"] == n)


def sized(name: str, train_size: int, eval_sizes, **options) -> dict:
    """Fields of a task trained on problem sizes up to ``train_size`` and evaluated at ``eval_sizes``
    (tokens from the size law of the task with ``options``)."""
    from posenc import tasks

    task = tasks.make(name, **options)  # length L holds a size-n problem when seq_len(n) <= L + 1
    return {"task.name": name, "task.train_length": task.seq_len(train_size) - 1,
            "eval.lengths": tuple(task.seq_len(n) - 1 for n in eval_sizes)}


def randomized(kinds, max_position: int) -> dict:
    """Randomized-position variants (Ruoss et al. 2023) of ``kinds``: ``<kind>_randomized``."""
    return {f"{k}_randomized": {"model.position.kind": k, "model.position.randomized": True,
                                "model.position.randomized_max_position": max_position} for k in kinds}


def reference_embedding(b) -> None:
    """Token embeddings times sqrt(d_model), as the transformer of Delétang et al. / Ruoss et al.

    Their code (google-deepmind/randomized_positional_encodings,
    models/transformer.py) draws embeddings with std 0.02 and multiplies
    them by sqrt(d_model) before adding the positional encoding. Without
    the factor, sinusoids at positions drawn from [0, 2048) (amplitude 1 in
    every dimension) swamp the tokens (norm 0.02 sqrt(d)): randomized
    sinusoidal positions stayed at chance accuracy on copy in 1500 steps
    (0.08-0.11 at the training length), and with it reached 0.61-0.65.
    """
    b.model.norm.embed_scale = True


def task_grid(c, per_task: dict, positions, *, quick: bool) -> None:
    """Task variants (one per task: its lengths) x ``positions``; fit, then extrapolate."""
    b = c.base
    if quick:
        b.model.update(d_model=64, num_layers=2, num_heads=4)
        b.train.update(steps=1500, batch_size=32, learning_rate=3e-3, warmup_steps=50)
    else:
        b.model.update(d_model=64, num_layers=5, num_heads=8)  # the model size of Ruoss et al. 2023
        b.train.update(steps=10000, batch_size=128, learning_rate=1e-3, warmup_steps=500)
    every = 250 if quick else 500
    # Fit, then extrapolate: stop once accuracy at the training length reaches the target (0.99;
    # 0.95 for the quick grids' short budget), at most train.steps.
    b.train.update(fit_accuracy=0.95 if quick else 0.99, fit_check_every=every, checkpoint_every=every,
                   log_every=every, progress=False)
    b.eval.update(batch_size=32, num_batches=2 if quick else 4)
    c.variants = default.fields({**per_task, **c.variants.to_dict()})
    c.grid = grid(tasks=tuple(per_task), positions=tuple(positions), seeds=(0, 1, 2), vmap_seeds=True)


COPY_SIZES = (7, 15, 31, 63)  # the quick grid: strings of up to 7 symbols, then 2x, 4x, 8x longer


def quick_copy(b) -> None:
    """The quick grid's task, model and budget (chosen by measurement; its outcome: README "Results").

    Copy trained on strings of up to 7 symbols (16 tokens), evaluated in
    Kazemnejad et al.'s size bins up to 8x (sizes 8-15, 16-31, 32-63); 3
    layers, so that NoPE fits too (with 2 it reached 0.85-0.975 in 4000
    steps); trained until 0.99 validation token accuracy at the training
    size (checked every 250 steps), at most 4000 steps.
    """
    b.update_from_flattened_dict(sized("copy", COPY_SIZES[0], COPY_SIZES))
    b.model.update(d_model=64, num_layers=3, num_heads=4)
    b.train.update(steps=4000, batch_size=32, learning_rate=3e-3, warmup_steps=75, fit_accuracy=0.99,
                   fit_check_every=250, log_every=250, checkpoint_every=1000, progress=False)
    b.eval.update(batch_size=32, num_batches=2)
