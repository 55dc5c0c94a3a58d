"""Length-extrapolation comparison grids (tasks x encodings x placements x norms x seeds).

    python -m experiments.compare --config configs/compare.py:quick --workdir /tmp/compare

Each run is `base` (configs/default.py) with the grid point's fields set,
trained in WORKDIR/runs/<task>_<position>_<norm>-<placement>_s<seed>/;
complete runs are skipped, so an interrupted comparison resumes. Writes
WORKDIR/results.jsonl, WORKDIR/table.md and WORKDIR/plots/<task>_<metric>.png.

Args:
    quick     (default) nope, sinusoidal, learned, rope, alibi, t5 on copy,
              trained at length 16, evaluated at 16, 32, 64, 128 (8x), 2 seeds.
              The learned table has only 16 rows, so its longer lengths are n/a.
    full      every registered encoding, 3 seeds, copy and reverse, the default
              (longer) training.
    norms     RoPE with every norm placement, 2 seeds, a higher learning rate.
    scaling   RoPE context extension at factor 4: one RoPE model per seed, trained
              once and evaluated zero-shot with PI, NTK, dynamic NTK, YaRN and Llama 3
              scaling (evaluation variants), beside RoPE trained with YaRN and ALiBi.

Grid fields: `grid.tasks`, `grid.positions`, `grid.placements`, `grid.norms`,
`grid.seeds` (each entry is a value of task.name, model.position.kind,
model.norm.placement, model.norm.kind, train.seed, or the name of a
`variants` entry), `grid.vmap_seeds` (True: the seeds of a grid cell train
together in one `jax.vmap`-ed step on one device, posenc.training.multiseed;
default False: one after another, so results reproduce the separate runs'
float32 rounding exactly). `variants` maps a name to a dict of dotted fields,
the same form as `eval.variants` and `--config.x=y`:

    c.variants = default.fields({"rope_yarn": {"model.position.kind": "rope",
                                               "model.position.rope.scaling": "yarn",
                                               "model.position.rope.factor": 4.0}})

Override anything of the base from the command line, e.g.
`--config.base.train.steps=300`.
"""

from __future__ import annotations

import ml_collections

from configs import default  # the repository root is on sys.path (python -m experiments...)

ARGS = ("quick", "full", "norms", "scaling")


def _grid(**kw) -> ml_collections.ConfigDict:
    g = dict(tasks=("copy",), positions=("rope",), placements=("pre",), norms=("rms",), seeds=(0,),
             vmap_seeds=False)
    g.update(kw)
    return ml_collections.ConfigDict(g)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The comparison ``arg`` (one of ARGS)."""
    arg = arg or "quick"
    c = ml_collections.ConfigDict()
    c.name = arg
    c.base = default.get_config()
    c.variants = default.fields({})
    if arg == "quick":
        b = c.base
        b.task.train_length = 16
        b.model.update(d_model=64, num_layers=2, num_heads=4)
        b.train.update(steps=1500, batch_size=32, learning_rate=3e-3, warmup_steps=75,
                       log_every=250, checkpoint_every=500, progress=False)
        b.eval.update(lengths=(16, 32, 64, 128), batch_size=32, num_batches=2)
        c.grid = _grid(positions=("nope", "sinusoidal", "learned", "rope", "alibi", "t5"), seeds=(0, 1))
    elif arg == "full":
        from posenc.model import ENCODINGS

        c.base.train.progress = False
        c.grid = _grid(tasks=("copy", "reverse"), positions=tuple(sorted(ENCODINGS)), seeds=(0, 1, 2))
    elif arg == "norms":
        from posenc import registry

        c.base.train.update(learning_rate=3e-3, progress=False)
        c.grid = _grid(placements=tuple(registry.PLACEMENTS), seeds=(0, 1))
    elif arg == "scaling":
        c.base.train.progress = False
        # Zero-shot context extension: one trained RoPE model per seed, evaluated with each
        # frequency scaling at factor 4 (4x the training length).
        zero_shot = {name: {"model.position.rope.scaling": kind, "model.position.rope.factor": 4.0}
                     for name, kind in (("pi", "linear"), ("ntk", "ntk"), ("dynamic_ntk", "dynamic"),
                                        ("yarn", "yarn"), ("llama3", "llama3"))}
        c.variants = default.fields({
            "rope": {"model.position.kind": "rope", "eval.variants": zero_shot},
            "rope_yarn_trained": {"model.position.kind": "rope", "model.position.rope.scaling": "yarn",
                                  "model.position.rope.factor": 4.0},
        })
        c.grid = _grid(positions=("rope", "rope_yarn_trained", "alibi"), seeds=(0, 1))
    else:
        raise ValueError(f"unknown configs/compare.py argument {arg!r}; choose one of: {', '.join(ARGS)}")
    return c
