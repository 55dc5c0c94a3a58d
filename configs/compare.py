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
"""

from __future__ import annotations

import ml_collections

from posenc.config.schema import unknown_argument
from posenc.configs import default

ARGS = ("quick", "smoke", "full", "norms", "scaling", "chomsky", "chomsky_quick", "suite", "suite_quick", "lm",
        "lm_quick", "randomized", "randomized_quick", "interaction", "interaction_quick", "arithmetic",
        "arithmetic_cho", "arithmetic_cho_small", "arithmetic_quick", "frontier_quick", "frontier_lm_quick",
        "grid_quick")


def _grid(**kw) -> ml_collections.ConfigDict:
    g = dict(tasks=("copy",), positions=("rope",), placements=("pre",), norms=("rms",), seeds=(0,),
             vmap_seeds=False)
    g.update(kw)
    return ml_collections.ConfigDict(g)


def chomsky_tasks() -> tuple[str, ...]:
    """The 15 tasks of Delétang et al. 2023 (suite "chomsky" of the task registry, aliases left out)."""
    from posenc import tasks

    return tuple(n for n in tasks.TASKS if tasks.spec(n)["suite"] == "chomsky" and tasks.spec(n)["task"] == n)


def _sized(name: str, train_size: int, eval_sizes, **options) -> dict:
    """Fields of a task trained on problem sizes up to ``train_size`` and evaluated at ``eval_sizes``
    (tokens from the size law of the task with ``options``)."""
    from posenc import tasks

    task = tasks.make(name, **options)  # length L holds a size-n problem when seq_len(n) <= L + 1
    return {"task.name": name, "task.train_length": task.seq_len(train_size) - 1,
            "eval.lengths": tuple(task.seq_len(n) - 1 for n in eval_sizes)}


def _randomized(kinds, max_position: int) -> dict:
    """Randomized-position variants (Ruoss et al. 2023) of ``kinds``: ``<kind>_randomized``."""
    return {f"{k}_randomized": {"model.position.kind": k, "model.position.randomized": True,
                                "model.position.randomized_max_position": max_position} for k in kinds}


def _reference_embedding(b) -> None:
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


def _task_grid(c, per_task: dict, positions, *, quick: bool) -> None:
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
    c.grid = _grid(tasks=tuple(per_task), positions=tuple(positions), seeds=(0, 1, 2), vmap_seeds=True)


def _more_zero_shot(base, factor: float) -> dict:
    """Dynamic YaRN (s = n / L), YaRN with the quadratic temperature, and LongRoPE with the
    YaRN factors its search starts from (searched factors: the extend study)."""
    from posenc.encodings.rope import rope, rope_search
    from posenc.model import spec as spec_lib

    m = base.model
    rotary = rope.rotary_dim(spec_lib.unit_head_dim(m), m.position.rope.rotary_fraction)  # MLA: its rotary part
    start = rope_search.seed_factors(rotary, factor=factor, original_length=base.task.train_length)["yarn"]
    return {
        "dynamic_yarn": {"model.position.rope.scaling": "dynamic_yarn"},
        "yarn_quadratic": {"model.position.rope.scaling": "yarn", "model.position.rope.factor": factor,
                           "model.position.rope.temperature": "quadratic"},
        "longrope_yarn_start": {"model.position.rope.scaling": "longrope",
                                "model.position.rope.factor": factor,
                                "model.position.rope.short_factor": (1.0,) * len(start),
                                "model.position.rope.long_factor": tuple(float(v) for v in start)},
    }


def _preset_fields(base, name: str) -> dict:
    """The dotted model.* fields that the default config's preset ``name`` sets in ``base``."""
    return {k: v for k, v in default.PRESETS[name](base).items() if k.startswith("model.")}


def attention_variants(base) -> dict:
    """Grid entries beside the encodings: the layer-span presets (Gemma 3, SWAN-GPT, Llama 4),
    sliding-window RoPE, p-RoPE (the lowest quarter of frequencies dropped) and RoPE with
    length-aware logit scaling (SSMax, log-n)."""
    window = max(int(base.task.train_length) // 2, 1)
    return {
        **{name: _preset_fields(base, name) for name in default.PRESETS},
        "rope_window": {"model.position.kind": "rope", "model.attention_span": "window",
                        "model.attention_window": window},
        "p_rope": {"model.position.kind": "rope", "model.position.rope.scaling": "proportional",
                   "model.position.rope.fraction": 0.75},
        "rope_ssmax": {"model.position.kind": "rope", "model.logit_scale.kind": "ssmax"},
        "rope_logn": {"model.position.kind": "rope", "model.logit_scale.kind": "logn"},
    }


COPY_SIZES = (7, 15, 31, 63)  # the quick grid: strings of up to 7 symbols, then 2x, 4x, 8x longer


def _quick_copy(b) -> None:
    """The quick grid's task, model and budget (chosen by measurement; its outcome: README "Results").

    Copy trained on strings of up to 7 symbols (16 tokens), evaluated in
    Kazemnejad et al.'s size bins up to 8x (sizes 8-15, 16-31, 32-63); 3
    layers, so that NoPE fits too (with 2 it reached 0.85-0.975 in 4000
    steps); trained until 0.99 validation token accuracy at the training
    size (checked every 250 steps), at most 4000 steps.
    """
    b.update_from_flattened_dict(_sized("copy", COPY_SIZES[0], COPY_SIZES))
    b.model.update(d_model=64, num_layers=3, num_heads=4)
    b.train.update(steps=4000, batch_size=32, learning_rate=3e-3, warmup_steps=75, fit_accuracy=0.99,
                   fit_check_every=250, log_every=250, checkpoint_every=1000, progress=False)
    b.eval.update(batch_size=32, num_batches=2)


LM_POSITIONS = ("sinusoidal", "rope", "alibi", "t5", "kerple_log", "fire", "nope")


def _lm(c, *, quick: bool, positions=LM_POSITIONS) -> None:
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
    c.grid = _grid(tasks=("text",), positions=tuple(positions), seeds=(0, 1, 2))


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


def _frontier_copy(c) -> None:
    """Copy (the quick grid's model and budget) at exact sizes 8, 16, 32: every new arm against
    RoPE, NoPE and ALiBi, with the issue's target at 2x (>= 0.9 decoded exact match for a new arm,
    < 0.2 for RoPE and NoPE)."""
    b = c.base
    _quick_copy(b)
    b.update_from_flattened_dict(_sized("copy", FRONTIER_SIZES[0], FRONTIER_SIZES))
    b.eval.sizes = "exact"
    c.variants = default.fields({**FRONTIER_VARIANTS, **FRONTIER_EXTRA})
    c.grid = _grid(positions=FRONTIER_POSITIONS, seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "sizes"
    c.targets = {"size": 2 * FRONTIER_SIZES[0],
                 "at_least": {k: 0.9 for k in (*FRONTIER_POSITIONS, *FRONTIER_EXTRA)
                              if k not in ("rope", "nope", "alibi")},
                 "below": {"rope": 0.2, "nope": 0.2}}


def randomizable_kinds() -> tuple[str, ...]:
    """Every registered encoding whose layers read positions (NoPE ignores them: nothing to randomize)."""
    from posenc.model import ENCODINGS

    return tuple(sorted(k for k in ENCODINGS if k != "nope"))


def _randomized_grid(c, *, quick: bool) -> None:
    """Ruoss et al. 2023: each encoding with and without randomized positions, Chomsky and copy-like tasks.

    Variants ``<kind>`` and ``<kind>_randomized``; the findings report the
    OOD accuracy gain per encoding (posenc.studies.findings). The learned
    table gets rows up to the longest position it can see (the longest
    evaluation length plain, randomized_max_position randomized).
    """
    if quick:
        names, kinds = ("copy", "reverse_string", "duplicate_string"), ("sinusoidal", "learned", "rope")
        train_size, eval_sizes = 8, (8, 16, 32, 64)
    else:
        names, kinds = chomsky_tasks() + ("copy", "reverse"), randomizable_kinds()
        train_size, eval_sizes = 40, (40, 80, 160, 320, 500)
    per_task = {n: _sized(n, train_size, eval_sizes) for n in names}
    longest = max(max(f["eval.lengths"]) for f in per_task.values())
    max_position = max(2048, 2 ** longest.bit_length())  # [0, 2048) as the reference, more if needed
    variants = {k: {"model.position.kind": k} for k in kinds}
    variants.update(_randomized(kinds, max_position))
    if "learned" in kinds:
        variants["learned"]["model.position.learned.max_length"] = longest
        variants["learned_randomized"]["model.position.learned.max_length"] = max_position
    c.variants = default.fields(variants)
    _reference_embedding(c.base)
    _task_grid(c, per_task, tuple(k + s for k in kinds for s in ("", "_randomized")), quick=quick)
    if quick:  # randomized positions fit later than plain ones (learned: 0.90 at 1500 steps)
        c.base.train.steps = 3000
    c.grid.vmap_seeds = True
    c.findings = "randomized"


INTERACTION_POSITIONS = ("rope", "alibi", "nope", "t5")
INTERACTION_PLACEMENTS = ("pre", "post", "sandwich", "reordered", "deepnorm", "mixln")


def _interaction(c, *, quick: bool) -> None:
    """Position encoding x norm placement x QK-norm, on copy (fit, then extrapolate) and on text.

    Encodings ``<kind>`` and ``<kind>_qknorm`` (QK RMSNorm); Mix-LN with
    one post-norm layer (the first), pre-norm after it. The findings give
    the best placement per encoding and whether it depends on the encoding
    (posenc.studies.findings). Both grids use the quick grid's 3-layer model
    (with 2 layers NoPE does not fit copy). The quick grid, sized for 2
    cores: the four encodings without the QK-norm dimension (the full grid
    has it), placements pre, post and sandwich, copy fitted to 0.95 in at
    most 3000 steps, text at length 32 for 300 steps, 3 seeds (with 2 the
    95% t-intervals, t = 12.7, were wider than the differences).
    """
    b = c.base
    _quick_copy(b)
    text_length = 32 if quick else 64
    copy = _sized("copy", COPY_SIZES[0], COPY_SIZES)
    text = {"task.name": "text", "task.train_length": text_length, "task.options": {"max_bytes": 2_000_000},
            "eval.batch_size": 8, "eval.num_batches": 4,
            "eval.lengths": tuple(f * text_length for f in (1, 2, 4, 8)),
            "train.fit_accuracy": 0.0, "train.steps": 300 if quick else 2000,
            "train.warmup_steps": 30 if quick else 100}
    if quick:  # fit to 0.95, as the other quick fit grids
        copy.update({"train.fit_accuracy": 0.95, "train.steps": 3000})
    variants = {"copy": copy, "text": text,
                "mixln": {"model.norm.placement": "mixln", "model.norm.mixln_fraction": 1 / b.model.num_layers}}
    for k in INTERACTION_POSITIONS:
        variants[k] = {"model.position.kind": k}
        variants[f"{k}_qknorm"] = {"model.position.kind": k, "model.norm.qk_norm": "rms"}
    c.variants = default.fields(variants)
    if quick:
        positions, placements = INTERACTION_POSITIONS, ("pre", "post", "sandwich")
    else:
        positions = tuple(k + s for k in INTERACTION_POSITIONS for s in ("", "_qknorm"))
        placements = INTERACTION_PLACEMENTS
    c.grid = _grid(tasks=("copy", "text"), positions=positions, placements=placements,
                   seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "interaction"


ARITHMETIC_POSITIONS = ("abacus", "position_coupling", "fire_randomized_hints", "rope", "nope", "fire")
ARITHMETIC_FORMATS = {"reversed": "reversed", "msd": "msd"}  # grid.tasks entry -> task.options.format


def arithmetic_variants(train_size: int, eval_sizes, *, max_position: int) -> dict:
    """The arms of the arithmetic grids: each encoding with its paper's recipe, nothing else changed.

    * ``abacus`` (McLeish et al. 2024): Abacus embeddings with NoPE in the
      layers (the unit's default companion, ``model.position.layer_kinds``);
      training offsets k ~ U{0..max_k}, max_k = ``max_position`` - (the
      training answer's digits), so rows 1 .. max_position are trained, as
      coupling's (the paper: 100 for 20-digit training, 100-digit tests);
    * ``position_coupling`` (Cho et al. 2024): the task's coupled ids
      (``coupled=True``) into learned tables of ``max_position`` + 1 rows,
      NoPE in the layers as the paper, a random start id at training in
      [1, max_position - answer digits];
    * ``fire_randomized_hints`` (Zhou et al. 2024): FIRE, randomized
      positions from [0, 2048) (Ruoss et al. 2023) and index hints; the
      hints double the tokens of every size, so this arm has its own
      ``task.train_length`` and ``eval.lengths`` for the same problem sizes;
    * ``rope``, ``nope``, ``fire``: the encodings alone.
    """
    hints = _sized("addition", train_size, eval_sizes, index_hints=True)
    return {
        "abacus": {"model.position.kind": "abacus", "model.position.abacus.max_k": max_position - (train_size + 1)},
        "position_coupling": {"model.position.kind": "position_coupling",
                              "model.position.position_coupling.max_position": max_position,
                              "task.options.coupled": True, "task.options.max_position": max_position},
        "fire_randomized_hints": {"model.position.kind": "fire", "model.position.randomized": True,
                                  "model.position.randomized_max_position": 2048,
                                  "task.options.index_hints": True,
                                  "task.train_length": hints["task.train_length"],
                                  "eval.lengths": hints["eval.lengths"]},
    }


ARITHMETIC_QUICK_SIZES = (8, 16, 24)  # trained on operands of up to 8 digits, then 2x and 3x


def _arithmetic(c, train_size: int, eval_sizes, *, max_position: int, quick: bool) -> None:
    """Addition in the reversed and the most-significant-first format x the arms of
    :func:`arithmetic_variants`, 3 seeds trained together; fit, then extrapolate; decoded exact match.

    Every size is a problem size: the digits of the longer operand (the
    other U{1..n}); ``eval.sizes`` exact (every evaluation example at that
    size, as the papers' per-length accuracy). Format ``reversed``: every
    number least significant digit first (McLeish et al.'s and Zhou et al.'s
    format; Cho et al. reverse the answer and zero-pad the operands);
    ``msd``: every number most significant first.
    """
    b = c.base
    per_task = {entry: dict(_sized("addition", train_size, eval_sizes), **{"task.options.format": fmt,
                                                                           "task.options.zero_pad": True})
                for entry, fmt in ARITHMETIC_FORMATS.items()}
    b.eval.sizes = "exact"
    if quick:
        # one layer as Cho et al. (1 layer, 4 heads, d_model 512), narrower: with 2 layers of width 64
        # coupling reached 0.57 decoded accuracy at 16 digits, with 1 of width 128 (zero-padded) 0.84
        b.model.update(d_model=128, num_layers=1, num_heads=4)
        b.train.update(steps=1250, batch_size=64, learning_rate=3e-3, warmup_steps=100, fit_accuracy=0.99,
                       fit_check_every=250, log_every=250, checkpoint_every=1000, progress=False)
        b.eval.update(batch_size=64, num_batches=2)
    else:  # accelerators
        b.model.update(d_model=512, num_layers=8, num_heads=8)
        b.train.update(steps=50000, batch_size=256, learning_rate=1e-4, warmup_steps=1000,
                       fit_accuracy=0.99, fit_check_every=1000, log_every=1000, checkpoint_every=5000,
                       progress=False)
        b.eval.update(batch_size=100, num_batches=10)
    c.variants = default.fields({**per_task, **arithmetic_variants(train_size, eval_sizes,
                                                                   max_position=max_position)})
    c.grid = _grid(tasks=tuple(per_task), positions=ARITHMETIC_POSITIONS, seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "sizes"
    # the target at twice the training size: coupling and Abacus generalize, RoPE and NoPE do not
    c.targets = {"size": 2 * train_size, "at_least": {"position_coupling": 0.9, "abacus": 0.9},
                 "below": {"rope": 0.2, "nope": 0.2}}


CHO_SMALL = dict(train_size=5, eval_sizes=(5, 10, 15), max_position=17)  # run_coupling.sh's small run


def _arithmetic_cho_small(c) -> None:
    """Cho et al. 2024's small addition run, as HanseulJo/position-coupling trains it.

    scripts/addition/run_coupling.sh (n_train=5, n_test=10, maxpos=17, 1 layer,
    4 heads, d_kv 128, d_ff 2048, gated-gelu, rmsnorm at pre_post, lr 1e-4,
    wd 0, batch 1000, 50,000 steps) and configs/training/default.yaml (AdamW
    betas 0.9, 0.999, eps 1e-8, clipping at 1.0, cosine with 1% warmup to 0.1
    of the peak). Their format: the answer reversed, both operands zero-padded
    (task.options.format reversed_output, zero_pad). Their val_long is 10-digit
    operands; 15 digits is added (max_position 17 holds a 16-digit answer).
    They train a fixed step count, no fit rule; exact match decoded.
    """
    b = c.base
    n, sizes, max_position = CHO_SMALL["train_size"], CHO_SMALL["eval_sizes"], CHO_SMALL["max_position"]
    task = {**_sized("addition", n, sizes, format="reversed_output", zero_pad=True),
            "task.options.format": "reversed_output", "task.options.zero_pad": True}
    b.eval.sizes = "exact"
    b.model.update(d_model=512, num_layers=1, num_heads=4, mlp="geglu", mlp_ratio=4.0)
    b.model.norm.update(kind="rms", placement="sandwich")  # pre_post: a norm before and after each sublayer
    b.train.update(steps=50000, batch_size=1000, learning_rate=1e-4, warmup_steps=500, min_lr_ratio=0.1,
                   weight_decay=0.0, clip_norm=1.0, b1=0.9, b2=0.999, eps=1e-8, fit_accuracy=0.0,
                   log_every=1000, checkpoint_every=5000, progress=False)
    b.eval.update(batch_size=500, num_batches=2)
    coupling = arithmetic_variants(n, sizes, max_position=max_position)["position_coupling"]
    c.variants = default.fields({"addition_cho": task, "position_coupling": coupling})
    c.grid = _grid(tasks=("addition_cho",), positions=("position_coupling", "nope", "rope"),
                   placements=("sandwich",), seeds=(0, 1), vmap_seeds=True)
    c.findings = "sizes"
    c.targets = {"size": 2 * n, "at_least": {"position_coupling": 0.9}, "below": {"rope": 0.2, "nope": 0.2}}


GRID_SIZES = (3, 4, 5, 6)  # grid side k: trained on k <= 3 (19 tokens), evaluated at k = 3-6 (19-73 tokens)
GRID_POSITIONS = ("rope", "nope", "alibi", "mrope", "rope_2d", "rope_2d_mixed")


def _grid_quick(c) -> None:
    """2D extrapolation: grid_copy trained on grids up to 3 x 3, evaluated at 3 x 3 to 6 x 6.

    The one-axis encodings read the sequence index; mrope reads the task's (t, h, w) ids
    (Qwen2-VL's get_rope_index), rope_2d (axial) and rope_2d_mixed (RoPE-Mixed, learned
    frequencies) their (h, w); 2 layers, d_model 64, 3 seeds trained together, fit to 0.99
    at the training size (at most 4000 steps); headline decoded exact match. At fit 0.95 and
    3000 steps the grid took 3 min 50 s on 2 cores (docs/results_frontier.md).
    """
    b = c.base
    b.update_from_flattened_dict(_sized("grid_copy", GRID_SIZES[0], GRID_SIZES))
    b.eval.sizes = "exact"
    b.model.update(d_model=64, num_layers=2, num_heads=4)
    # fit to 0.99 as the copy grids: at 0.95, ALiBi, NoPE and M-RoPE stopped at 0.65-0.73 exact match
    # at the training size (first run, commit 565157d), too little to judge extrapolation by
    b.train.update(steps=4000, batch_size=32, learning_rate=3e-3, warmup_steps=50, fit_accuracy=0.99,
                   fit_check_every=250, log_every=250, checkpoint_every=1000, progress=False)
    b.eval.update(batch_size=32, num_batches=2)
    c.variants = default.fields({"rope_2d_mixed": {"model.position.kind": "rope_2d",
                                                   "model.position.rope_2d.variant": "mixed"}})
    c.grid = _grid(tasks=("grid_copy",), positions=GRID_POSITIONS, seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "sizes"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The comparison ``arg`` (one of ARGS)."""
    arg = arg or "quick"
    c = ml_collections.ConfigDict()
    c.name = arg
    c.base = default.get_config()
    c.variants = default.fields({})
    c.findings = ""  # posenc.studies.findings kind written after the report ("" = none)
    c.targets = {}  # findings "sizes": a target check (posenc.studies.findings)
    if arg == "quick":
        _quick_copy(c.base)
        # a table of 8x rows (untrained past 16), so that 2x-8x show how it degrades instead of n/a
        c.variants = default.fields({"learned": {"model.position.kind": "learned",
                                                 "model.position.learned.max_length": 128}})
        c.grid = _grid(positions=("nope", "sinusoidal", "learned", "rope", "alibi", "t5"), seeds=(0, 1, 2),
                       vmap_seeds=True)
    elif arg == "smoke":  # the engine's tests: seconds per run on 2 cores
        c.base = default.get_config("tiny")
        c.base.task.train_length = 8
        c.base.train.update(steps=8, log_every=4, checkpoint_every=4)
        c.base.eval.update(lengths=(8, 16), batch_size=8)
        c.grid = _grid(positions=("rope", "alibi"), seeds=(0, 1), vmap_seeds=True)
    elif arg == "full":
        from posenc.model import ENCODINGS

        c.base.train.progress = False
        c.variants = default.fields(attention_variants(c.base))
        c.grid = _grid(tasks=("copy", "reverse"), positions=(*sorted(ENCODINGS), *c.variants), seeds=(0, 1, 2))
    elif arg == "norms":
        from posenc.norms import norm_names

        c.base.train.update(learning_rate=3e-3, progress=False)
        from posenc.model.spec import placement_fields

        c.grid = _grid(placements=tuple(norm_names.PLACEMENTS), seeds=(0, 1))
        # a placement that needs more than its name (nGPT's SwiGLU MLP) is a variant of those fields
        c.variants = default.fields({p: placement_fields(p) for p in norm_names.PLACEMENTS
                                     if len(placement_fields(p)) > 1})
    elif arg == "scaling":
        c.base.train.progress = False
        # Zero-shot context extension: one trained RoPE model per seed, evaluated with each
        # frequency scaling at factor 4 (4x the training length).
        zero_shot = {name: {"model.position.rope.scaling": kind, "model.position.rope.factor": 4.0}
                     for name, kind in (("pi", "linear"), ("ntk", "ntk"), ("dynamic_ntk", "dynamic"),
                                        ("yarn", "yarn"), ("llama3", "llama3"))}
        zero_shot.update(_more_zero_shot(c.base, 4.0))
        c.variants = default.fields({
            "rope": {"model.position.kind": "rope", "eval.variants": zero_shot},
            "rope_yarn_trained": {"model.position.kind": "rope", "model.position.rope.scaling": "yarn",
                                  "model.position.rope.factor": 4.0},
        })
        c.grid = _grid(positions=("rope", "rope_yarn_trained", "alibi"), seeds=(0, 1))
    elif arg in ("chomsky", "chomsky_quick"):
        # Ruoss et al. 2023: training sizes 1-40, test sizes 41-500, the score is the accuracy
        # over the test sizes; here decoder tasks, each at the lengths its size law gives.
        quick = arg == "chomsky_quick"
        names = ("parity", "reverse_string", "duplicate_string") if quick else chomsky_tasks()
        train_size, eval_sizes = (8, (8, 16, 32, 64)) if quick else (40, (40, 80, 160, 320, 500))
        per_task = {n: _sized(n, train_size, eval_sizes) for n in names}
        # every test size between the evaluation lengths (41-80, ..., 321-500): the paper averages
        # over every test size; the aggregate weights each bin by its number of sizes
        c.base.eval.sizes = "bin"
        longest = max(max(f["eval.lengths"]) for f in per_task.values())
        # randomized positions from [0, 2048) as the reference, more if an eval length needs it
        c.variants = default.fields(_randomized(("sinusoidal", "rope"), max(2048, 2 ** longest.bit_length())))
        _reference_embedding(c.base)
        _task_grid(c, per_task, ("nope", "rope", "alibi") if quick else (
            "nope", "sinusoidal", "sinusoidal_randomized", "rope", "rope_randomized", "alibi", "t5", "fire",
            "transformer_xl"), quick=quick)
    elif arg in ("suite", "suite_quick"):
        quick = arg == "suite_quick"
        # problem sizes, tokens derived (each task's size law): training sizes up to the first,
        # then 2x, 4x, 8x larger problems
        if quick:
            sizes = {"flip_flop": 16, "count": 30}
        else:
            sizes = {"mqar": 12, "flip_flop": 32, "induction": 61, "polynomial": 14, "summation": 62,
                     "count": 62}
        per_task = {n: _sized(n, k, (k, 2 * k, 4 * k, 8 * k)) for n, k in sizes.items()}
        if not quick:
            per_task["lego"] = _sized("lego", 5, (5, 10, 20))  # at most 26 variables
            per_task["passkey"] = _sized("passkey", 260, (260, 772, 1796, 3844))  # filler characters
        _task_grid(c, per_task, ("nope", "rope", "alibi") if quick else (
            "nope", "sinusoidal", "rope", "alibi", "t5", "fire"), quick=quick)
    elif arg in ("lm", "lm_quick"):
        _lm(c, quick=arg == "lm_quick")
    elif arg in ("randomized", "randomized_quick"):
        _randomized_grid(c, quick=arg == "randomized_quick")
    elif arg in ("interaction", "interaction_quick"):
        _interaction(c, quick=arg == "interaction_quick")
    elif arg == "arithmetic_quick":
        _arithmetic(c, 8, ARITHMETIC_QUICK_SIZES, max_position=48, quick=True)
    elif arg == "arithmetic":  # McLeish et al. 2024: operands of up to 20 digits, tested to 100
        _arithmetic(c, 20, (20, 40, 60, 80, 100), max_position=128, quick=False)
    elif arg == "arithmetic_cho":  # Cho et al. 2024: 1-30 digits, tested to 200
        _arithmetic(c, 30, (30, 50, 100, 150, 200), max_position=256, quick=False)
    elif arg == "arithmetic_cho_small":
        _arithmetic_cho_small(c)
    elif arg == "frontier_quick":
        _frontier_copy(c)
    elif arg == "frontier_lm_quick":
        _lm(c, quick=True, positions=FRONTIER_POSITIONS)
        c.variants = default.fields(FRONTIER_VARIANTS)
    elif arg == "grid_quick":
        _grid_quick(c)
    else:
        raise unknown_argument("compare config", arg, ARGS)
    return c
