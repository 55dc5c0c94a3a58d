"""The 2D grid: grid_copy trained on small grids, evaluated on larger ones (multi-axis RoPE)."""

from __future__ import annotations

from posenc.configs import default
from posenc.configs.compare_grids import common

GRID_SIZES = (3, 4, 5, 6)  # grid side k: trained on k <= 3 (19 tokens), evaluated at k = 3-6 (19-73 tokens)
GRID_POSITIONS = ("rope", "nope", "alibi", "mrope", "rope_2d", "rope_2d_mixed")


def grid_quick(c, arg: str) -> None:
    """2D extrapolation: grid_copy trained on grids up to 3 x 3, evaluated at 3 x 3 to 6 x 6.

    The one-axis encodings read the sequence index; mrope reads the task's (t, h, w) ids
    (Qwen2-VL's get_rope_index), rope_2d (axial) and rope_2d_mixed (RoPE-Mixed, learned
    frequencies) their (h, w); 2 layers, d_model 64, 3 seeds trained together, fit to 0.99
    at the training size (at most 4000 steps); headline decoded exact match. At fit 0.95 and
    3000 steps the grid took 3 min 50 s on 2 cores (docs/results_frontier.md).
    """
    b = c.base
    b.update_from_flattened_dict(common.sized("grid_copy", GRID_SIZES[0], GRID_SIZES))
    b.eval.sizes = "exact"
    b.model.update(d_model=64, num_layers=2, num_heads=4)
    # fit to 0.99 as the copy grids: at 0.95, ALiBi, NoPE and M-RoPE stopped at 0.65-0.73 exact match
    # at the training size (first run, commit 565157d), too little to judge extrapolation by
    b.train.update(steps=4000, batch_size=32, learning_rate=3e-3, warmup_steps=50, fit_accuracy=0.99,
                   fit_check_every=250, log_every=250, checkpoint_every=1000, progress=False)
    b.eval.update(batch_size=32, num_batches=2)
    c.variants = default.fields({"rope_2d_mixed": {"model.position.kind": "rope_2d",
                                                   "model.position.rope_2d.variant": "mixed"}})
    c.grid = common.grid(tasks=("grid_copy",), positions=GRID_POSITIONS, seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "sizes"


GRIDS = {"grid_quick": grid_quick}
