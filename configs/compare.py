"""Length-extrapolation comparison grids (tasks x encodings x placements x norms x seeds).

    python -m posenc compare --config compare:quick --workdir /tmp/compare

Each run is `base` (the default config) with the grid point's fields set,
trained in WORKDIR/runs/<task>_<position>_<norm>-<placement>_s<seed>/;
complete runs are skipped, so an interrupted comparison resumes. Writes
WORKDIR/results.jsonl, WORKDIR/table.md and WORKDIR/plots/<task>_<metric>.png.

Args:
    smoke     two tiny runs of two seeds each (seconds; the engine's tests)
    quick     (default) nope, sinusoidal, learned, rope, alibi, t5 on copy of
              strings up to 7 symbols (15 tokens; 3 layers, d_model 64), 3 seeds
              trained together, each until 0.99 validation accuracy at the
              training size (at most 4000 steps), then evaluated in the size bins
              8-15, 16-31, 32-63 (to 8x; 31, 63, 127 tokens), decoded and
              teacher-forced. The learned table has 128 rows (untrained past 15).
    full      every registered encoding, the Gemma 3 / SWAN-GPT / Llama 4 layer
              presets, sliding-window RoPE, p-RoPE and RoPE with SSMax / log-n
              logit scaling, 3 seeds, copy and reverse, the default (longer)
              training.
    norms     RoPE with every norm placement, 2 seeds, a higher learning rate.
    scaling   RoPE context extension at factor 4: one RoPE model per seed, trained
              once and evaluated zero-shot with PI, NTK, dynamic NTK, YaRN (paper and
              quadratic temperature), dynamic YaRN, LongRoPE (the YaRN factors its
              search starts from; searched factors and fine-tuning: the extend study)
              and Llama 3 scaling (evaluation variants), beside RoPE trained with YaRN
              and ALiBi.
    chomsky   every task with a Chomsky-hierarchy level (R, DCF, CS; read off the
              task registry) x nope, sinusoidal, rope, alibi, t5, fire,
              transformer_xl and randomized sinusoidal / rope (Ruoss et al. 2023),
              3 seeds; trained on problem sizes up to 40 until 0.99 accuracy
              (at most 10000 steps), evaluated at sizes 40, 80, 160, 320, 500;
              token embeddings times sqrt(d_model) as the reference's model
              (also in chomsky_quick and the randomized grids).
    chomsky_quick  parity (R), reverse_string (DCF), duplicate_string (CS) x nope,
              rope, alibi, 3 seeds, sizes up to 8, evaluated at every size 9-64 (bins
              9-16, 17-32, 33-64), fit to 0.95 accuracy in at most 1500 steps.
    suite     recall, state tracking and Kazemnejad et al. 2023 tasks: mqar,
              flip_flop (p_ignore swept at evaluation), passkey (depth swept),
              induction, polynomial, summation, lego, count x nope, sinusoidal,
              rope, alibi, t5, fire, 3 seeds, each trained on its own problem sizes
              (mqar 12 pairs, flip_flop 32 instructions, induction 61, polynomial 14,
              summation 62, count 62, lego 5 variables, passkey 260 characters of
              filler) and evaluated at 2x, 4x, 8x the size; fit as chomsky.
    suite_quick  flip_flop (sizes 16 to 128, with its sweep) and count (30 to 240) x
              nope, rope, alibi, 3 seeds, fit as chomsky_quick.
    lm        Press et al. 2022: byte-level LM on the Python stdlib at L = 256
              (d_model 256, 4 layers, 10000 steps) x sinusoidal, rope, alibi, t5,
              kerple_log, fire, nope, 3 seeds; perplexity at L, 2L, 4L, 8L, 16L over
              all tokens and over the last L of each non-overlapping held-out window.
    lm_quick  the same at L = 64 (d_model 64, 2 layers, 750 steps, 2 MB of text),
              evaluated at 64-1024, 3 seeds.
    randomized  Ruoss et al. 2023: every encoding but NoPE with and without
              randomized positions (from [0, 2048)) on every Chomsky task, copy and
              reverse, trained on sizes up to 40, evaluated at sizes 40-500, 3 seeds;
              findings.md: the OOD accuracy gain per encoding (posenc.studies.findings).
    randomized_quick  sinusoidal, learned, rope (+ randomized) on copy,
              reverse_string, duplicate_string, sizes up to 8, evaluated at 8-64,
              3 seeds, fit to 0.95 accuracy in at most 3000 steps.
    interaction  rope, alibi, nope, t5, each with and without QK-norm (rms) x
              pre, post, sandwich, reordered, deepnorm, mixln, 3 seeds, on copy (the
              quick grid's model, fit to 0.99) and on text (length 64, 2000 steps);
              findings.md: the best placement per encoding, and whether it depends
              on the encoding.
    interaction_quick  rope, alibi, nope, t5 (no QK-norm) x pre, post, sandwich,
              3 seeds, copy fit to 0.95 in at most 3000 steps, text at length 32
              for 300 steps.
    arithmetic_quick  addition trained on operands of up to 8 digits, evaluated at
              exactly 8, 16 and 24 digits, in two tables: every number reversed
              (least significant digit first) and most significant first, both
              zero-padded; arms abacus (+ NoPE), position_coupling, FIRE +
              randomized positions + index hints (Zhou et al. 2024), rope, nope,
              fire; 1 layer, d_model 128, 3 seeds trained together, fit to 0.99 in at
              most 1250 steps; headline decoded exact match; findings.md: the
              target check at 16 digits (docs/results_arithmetic.md).
    arithmetic  the same arms at McLeish et al. 2024's sizes (operands of up to 20
              digits, evaluated at 20-100), sized for an accelerator (8 layers,
              d_model 512, at most 50000 steps).
    frontier_quick  the 2024-26 units on copy: pope, hard_alibi, rope and nope with
              the elementwise attention output gate (Qiu et al. 2025), rope with
              learned sinks (gpt-oss), against rope, nope and alibi; the quick
              grid's model and fit (0.99, at most 4000 steps), strings of up to 8
              symbols, decoded at exactly 8, 16 and 32 symbols, 3 seeds trained
              together; findings.md: the target check at 2x (a new arm >= 0.9
              decoded exact match where rope and nope stay < 0.2). Declared, run
              on demand (grid.positions): hard_alibi_h8 (4 of 8 heads windowed)
              and hard_alibi_h16 (8 of 16, d_model 128, the official head count).
    frontier_lm_quick  the same arms in lm_quick's byte-level LM (L = 64, 750 steps),
              perplexity at 64-1024, 3 seeds.
    arithmetic_cho  Cho et al. 2024's sizes: 1-30 digits, evaluated at 30-200.
    arithmetic_cho_small  Cho et al. 2024's small run as their code trains it
              (operands of 1-5 digits, tested at 5, 10 and 15; 1 layer, 4 heads,
              d_model 512, GeGLU d_ff 2048, RMSNorm before and after each block,
              AdamW lr 1e-4 no weight decay, batch 1000, 50,000 steps): position
              coupling against NoPE and RoPE, 2 seeds trained together; an
              accelerator's run (benchmarks/accelerator_check.py runs it with
              fewer steps when its budget is short).
    arithmetic_cpu  the official recipe on 2 CPU cores (Cho et al. 2024, McLeish et al.
              2024): coupling, Abacus (one layer looped twice, offsets up to 100),
              rope and nope on addition of 1-16 digit operands drawn independently,
              a fixed set of 100 000 examples in epochs, 4500 steps without a fit
              stop, evaluated during training; decoded at 16, 24, 32, 48 digits, the
              last parameters and those of lowest validation loss at 48 digits
              (checkpoint best_long_val), 3 seeds trained together (35-56 min).
    arithmetic_ladder  coupling's and Abacus's exact match at 32 digits against the
              training examples (1e5, 2e5, 5e5: a tasks entry per budget) with that
              recipe, 3 seeds; findings.md: the plot and the logistic trend to 0.9
              (posenc.studies.ladder; 55-88 min).
    grid_quick  2D extrapolation: grid_copy (a k x k grid posed row by row, copied
              after SEP; (t, h, w) ids as Qwen2-VL's get_rope_index) trained on
              k <= 3, evaluated at k = 3, 4, 5, 6 (19, 33, 51, 73 tokens); arms rope,
              nope, alibi (the sequence index), mrope (the (t, h, w) ids), rope_2d
              axial and rope_2d_mixed (RoPE-Mixed: (h, w)); 2 layers, d_model 64,
              3 seeds trained together, fit to 0.99 in at most 4000 steps; headline
              decoded exact match per grid size (minutes on 2 cores).

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

The grids themselves are defined in configs/compare_grids/, one module per
family (its ``GRIDS``): a new grid is an entry there and needs nothing here.
"""

from __future__ import annotations

import ml_collections

from posenc.config.schema import unknown_argument
from posenc.configs import compare_grids, default

GRIDS = compare_grids.grids()  # ARG -> fill(c, arg): the modules of configs/compare_grids/
ARGS = tuple(GRIDS)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The comparison ``arg`` (one of ARGS)."""
    arg = arg or "quick"
    if arg not in GRIDS:
        raise unknown_argument("compare config", arg, ARGS)
    c = ml_collections.ConfigDict()
    c.name = arg
    c.base = default.get_config()
    c.variants = default.fields({})
    c.findings = ""  # posenc.studies.findings kind written after the report ("" = none)
    c.targets = {}  # findings "sizes": a target check (posenc.studies.findings)
    GRIDS[arg](c, arg)
    return c
