"""Length-extrapolation comparison grids (encodings x placements x norms x seeds x tasks).

    python -m experiments.compare --config configs/compare.py:quick --workdir /tmp/compare

Each run is `base` (configs/default.py) with the grid's overrides, trained in
WORKDIR/runs/<task>_<position>_<norm>-<placement>_s<seed>/; completed runs
are skipped, so an interrupted comparison resumes. Writes
WORKDIR/results.jsonl, WORKDIR/table.md and WORKDIR/plots/<task>_<metric>.png.

Args:
    quick     (default) nope, sinusoidal, learned, rope, alibi, t5 on copy,
              trained at length 16, evaluated at 16, 32, 64, 128 (8x), 2 seeds;
              about five minutes on 2 CPU cores. The learned table has only
              16 rows, so its longer lengths are n/a.
    full      every position kind in posenc.registry.POSITION_KINDS, 3 seeds,
              copy and reverse, the default (longer) training.
    norms     RoPE with every norm placement, 2 seeds, a higher learning rate.
    scaling   RoPE context extension at factor 4: plain RoPE evaluated zero-shot
              with PI, NTK, dynamic NTK, YaRN and Llama 3 scaling
              (`eval.position_overrides`), RoPE trained with YaRN, and ALiBi.

Grid fields: `grid.tasks`, `grid.positions` (a position kind or a name in
`variants`), `grid.placements`, `grid.norms`, `grid.seeds`, `grid.vmap_seeds`
(True: the seeds of a grid cell train together in one `jax.vmap`-ed step on one
device, posenc.training.multiseed; on 2 CPU cores 4-8% faster for the quick grid,
slower for larger models, see docs/performance.md; default False: one after
another, so results reproduce the separate runs' float32 rounding exactly). `variants` maps a
name to `;`-separated `dotted.field=value` overrides of the base config,
e.g. `rope_yarn: "model.position.kind=rope;model.position.scaling=yarn"`.
Override anything of the base from the command line, e.g.
`--config.base.train.steps=300`.
"""

from __future__ import annotations

import ml_collections

from configs import default  # the repository root is on sys.path (python -m experiments...)


def _grid(**kw) -> ml_collections.ConfigDict:
    g = dict(tasks=("copy",), positions=("rope",), placements=("pre",), norms=("rms",), seeds=(0,),
             vmap_seeds=False)
    g.update(kw)
    return ml_collections.ConfigDict(g)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The comparison ``arg`` (quick, full, norms, scaling)."""
    arg = arg or "quick"
    c = ml_collections.ConfigDict()
    c.name = arg
    c.base = default.get_config()
    c.variants = ml_collections.ConfigDict()
    if arg == "quick":
        b = c.base
        b.task.train_length = 16
        b.model.update(d_model=64, num_layers=2, num_heads=4)
        b.train.update(steps=1500, batch_size=32, learning_rate=3e-3, warmup_steps=75,
                       log_every=250, checkpoint_every=500, progress=False)
        b.eval.update(lengths=(16, 32, 64, 128), batch_size=32, num_batches=2)
        c.grid = _grid(positions=("nope", "sinusoidal", "learned", "rope", "alibi", "t5"), seeds=(0, 1))
    elif arg == "full":
        from posenc import registry

        c.base.train.progress = False
        c.grid = _grid(tasks=("copy", "reverse"), positions=tuple(registry.POSITION_KINDS), seeds=(0, 1, 2))
    elif arg == "norms":
        from posenc import registry

        c.base.train.update(learning_rate=3e-3, progress=False)
        c.grid = _grid(placements=tuple(registry.PLACEMENTS), seeds=(0, 1))
    elif arg == "scaling":
        c.base.train.progress = False
        # Zero-shot context extension of one trained RoPE model per seed: the same
        # training, evaluated with each frequency scaling at factor 4 (4x the training length).
        for name, kind in {"pi": "linear", "ntk": "ntk", "dynamic_ntk": "dynamic", "yarn": "yarn",
                           "llama3": "llama3"}.items():
            c.variants[f"rope_{name}_zeroshot"] = (
                f"model.position.kind=rope;eval.position_overrides=scaling={kind},scaling_factor=4.0")
        c.variants["rope_yarn_trained"] = (
            "model.position.kind=rope;model.position.scaling=yarn;model.position.scaling_factor=4.0")
        c.grid = _grid(positions=("rope", *c.variants, "alibi"), seeds=(0, 1))
    else:
        raise ValueError(f"unknown configs/compare.py argument {arg!r}; choose one of: quick, full, norms, scaling")
    return c
