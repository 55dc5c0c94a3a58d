"""The language-model grids (Press et al. 2022) and the 2024-26 attention forms on copy and text."""

from __future__ import annotations

from posenc.configs import default
from posenc.configs.compare_grids import common

LM_POSITIONS = ("sinusoidal", "rope", "alibi", "t5", "kerple_log", "fire", "nope")


def lm(c, *, quick: bool, positions=LM_POSITIONS) -> None:
    """Press et al. 2022: a byte-level LM trained at L, perplexity at L, 2L, 4L, 8L, 16L.

    Held-out split, non-overlapping windows; perplexity over all tokens and
    over the last L tokens of each window (posenc.training.evaluate).
    """
    c.base = default.get_config("text")
    b = c.base
    L = 64 if quick else 256
    b.task.train_length = L
    # every length scores the same first eval.tokens (2^17) held-out targets, batch_size windows per step
    # (num_batches applies to synthetic tasks only)
    b.eval.update(lengths=tuple(f * L for f in (1, 2, 4, 8, 16)), batch_size=8, num_batches=8)
    if quick:
        b.model.update(d_model=64, num_layers=2, num_heads=4)
        # 750 steps: 1000 took 11-12 minutes on 2 cores (training is 80% of it), over the ~10 asked
        b.train.update(steps=750, batch_size=32, learning_rate=3e-3, warmup_steps=100)
    else:  # the whole stdlib corpus, a larger model, 10x the steps (accelerators)
        b.task.options.max_bytes = None
        b.model.update(d_model=256, num_layers=4, num_heads=8)
        b.train.update(steps=10000, batch_size=32, learning_rate=1e-3, warmup_steps=500)
    b.train.update(log_every=250, checkpoint_every=1000, progress=False)
    c.grid = common.grid(tasks=("text",), positions=tuple(positions), seeds=(0, 1, 2))


# The 2024-26 attention forms against the encodings they build on: gated attention (Qiu et al. 2025,
# the elementwise output gate, their best "G1"), learned sinks (gpt-oss), PoPE, Hard-ALiBi.
FRONTIER_VARIANTS = {
    "rope_gated": {"model.position.kind": "rope", "model.attention_gate": "elementwise"},
    "nope_gated": {"model.position.kind": "nope", "model.attention_gate": "elementwise"},
    "rope_sinks": {"model.position.kind": "rope", "model.attention_sinks": "learned"},
}
FRONTIER_POSITIONS = ("rope", "nope", "alibi", "pope", "hard_alibi", *FRONTIER_VARIANTS)
# Hard-ALiBi nearer its paper's heads: half of the heads windowed as the official 8 of 16, here 4 of 8
# (windows of 1 to 4 keys; with 4 heads, 1 and 2), on the same width (head_dim 8). Not in the grid by
# default: --config.grid.positions='("hard_alibi_h8", "hard_alibi", "rope")'
FRONTIER_EXTRA = {"hard_alibi_h8": {"model.position.kind": "hard_alibi", "model.num_heads": 8},
                  # the official head count, 8 windowed of 16 (windows of 1-8 keys), head_dim 8 as h8's
                  "hard_alibi_h16": {"model.position.kind": "hard_alibi", "model.num_heads": 16,
                                     "model.d_model": 128}}
FRONTIER_SIZES = (8, 16, 32)  # copy trained on strings of up to 8 symbols, scored at exactly 8, 2x, 4x


def frontier_copy(c) -> None:
    """Copy (the quick grid's model and budget) at exact sizes 8, 16, 32: every new arm against
    RoPE, NoPE and ALiBi, with the issue's target at 2x (>= 0.9 decoded exact match for a new arm,
    < 0.2 for RoPE and NoPE)."""
    b = c.base
    common.quick_copy(b)
    b.update_from_flattened_dict(common.sized("copy", FRONTIER_SIZES[0], FRONTIER_SIZES))
    b.eval.sizes = "exact"
    c.variants = default.fields({**FRONTIER_VARIANTS, **FRONTIER_EXTRA})
    c.grid = common.grid(positions=FRONTIER_POSITIONS, seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "sizes"
    c.targets = {"size": 2 * FRONTIER_SIZES[0],
                 "at_least": {k: 0.9 for k in (*FRONTIER_POSITIONS, *FRONTIER_EXTRA)
                              if k not in ("rope", "nope", "alibi")},
                 "below": {"rope": 0.2, "nope": 0.2}}


def frontier_lm(c, arg: str) -> None:
    """The frontier arms on text, as ``lm_quick``."""
    lm(c, quick=True, positions=FRONTIER_POSITIONS)
    c.variants = default.fields(FRONTIER_VARIANTS)


GRIDS = {"lm": lambda c, arg: lm(c, quick=False), "lm_quick": lambda c, arg: lm(c, quick=True),
         "frontier_quick": lambda c, arg: frontier_copy(c), "frontier_lm_quick": frontier_lm}
