"""The task-suite grids: the Chomsky hierarchy (Ruoss et al. 2023), the suite of synthetic tasks,
randomized positions, and encoding x norm placement x QK-norm."""

from __future__ import annotations

from posenc.configs import default
from posenc.configs.compare_grids import common


def randomizable_kinds() -> tuple[str, ...]:
    """Every registered encoding whose layers read positions (NoPE ignores them: nothing to randomize)."""
    from posenc.model import ENCODINGS

    return tuple(sorted(k for k in ENCODINGS if k != "nope"))


def randomized_grid(c, *, quick: bool) -> None:
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
        names, kinds = common.chomsky_tasks() + ("copy", "reverse"), randomizable_kinds()
        train_size, eval_sizes = 40, (40, 80, 160, 320, 500)
    per_task = {n: common.sized(n, train_size, eval_sizes) for n in names}
    longest = max(max(f["eval.lengths"]) for f in per_task.values())
    max_position = max(2048, 2 ** longest.bit_length())  # [0, 2048) as the reference, more if needed
    variants = {k: {"model.position.kind": k} for k in kinds}
    variants.update(common.randomized(kinds, max_position))
    if "learned" in kinds:
        variants["learned"]["model.position.learned.max_length"] = longest
        variants["learned_randomized"]["model.position.learned.max_length"] = max_position
    c.variants = default.fields(variants)
    common.reference_embedding(c.base)
    common.task_grid(c, per_task, tuple(k + s for k in kinds for s in ("", "_randomized")), quick=quick)
    if quick:  # randomized positions fit later than plain ones (learned: 0.90 at 1500 steps)
        c.base.train.steps = 3000
    c.grid.vmap_seeds = True
    c.findings = "randomized"


INTERACTION_POSITIONS = ("rope", "alibi", "nope", "t5")
INTERACTION_PLACEMENTS = ("pre", "post", "sandwich", "reordered", "deepnorm", "mixln")


def interaction(c, *, quick: bool) -> None:
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
    common.quick_copy(b)
    text_length = 32 if quick else 64
    copy = common.sized("copy", common.COPY_SIZES[0], common.COPY_SIZES)
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
    c.grid = common.grid(tasks=("copy", "text"), positions=positions, placements=placements,
                   seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "interaction"


def chomsky(c, arg: str) -> None:
    """Every task with a Chomsky-hierarchy level (``chomsky_quick``: three, at small sizes)."""
    # Ruoss et al. 2023: training sizes 1-40, test sizes 41-500, the score is the accuracy
    # over the test sizes; here decoder tasks, each at the lengths its size law gives.
    quick = arg == "chomsky_quick"
    names = ("parity", "reverse_string", "duplicate_string") if quick else common.chomsky_tasks()
    train_size, eval_sizes = (8, (8, 16, 32, 64)) if quick else (40, (40, 80, 160, 320, 500))
    per_task = {n: common.sized(n, train_size, eval_sizes) for n in names}
    # every test size between the evaluation lengths (41-80, ..., 321-500): the paper averages
    # over every test size; the aggregate weights each bin by its number of sizes
    c.base.eval.sizes = "bin"
    longest = max(max(f["eval.lengths"]) for f in per_task.values())
    # randomized positions from [0, 2048) as the reference, more if an eval length needs it
    c.variants = default.fields(common.randomized(("sinusoidal", "rope"), max(2048, 2 ** longest.bit_length())))
    common.reference_embedding(c.base)
    common.task_grid(c, per_task, ("nope", "rope", "alibi") if quick else (
        "nope", "sinusoidal", "sinusoidal_randomized", "rope", "rope_randomized", "alibi", "t5", "fire",
        "transformer_xl"), quick=quick)


def suite(c, arg: str) -> None:
    """The synthetic task suite at 1x-8x its training problem size (``suite_quick``: two tasks)."""
    quick = arg == "suite_quick"
    # problem sizes, tokens derived (each task's size law): training sizes up to the first,
    # then 2x, 4x, 8x larger problems
    if quick:
        sizes = {"flip_flop": 16, "count": 30}
    else:
        sizes = {"mqar": 12, "flip_flop": 32, "induction": 61, "polynomial": 14, "summation": 62,
                 "count": 62}
    per_task = {n: common.sized(n, k, (k, 2 * k, 4 * k, 8 * k)) for n, k in sizes.items()}
    if not quick:
        per_task["lego"] = common.sized("lego", 5, (5, 10, 20))  # at most 26 variables
        per_task["passkey"] = common.sized("passkey", 260, (260, 772, 1796, 3844))  # filler characters
    common.task_grid(c, per_task, ("nope", "rope", "alibi") if quick else (
        "nope", "sinusoidal", "rope", "alibi", "t5", "fire"), quick=quick)


GRIDS = {"chomsky": chomsky, "chomsky_quick": chomsky, "suite": suite, "suite_quick": suite,
         "randomized": lambda c, arg: randomized_grid(c, quick=False),
         "randomized_quick": lambda c, arg: randomized_grid(c, quick=True),
         "interaction": lambda c, arg: interaction(c, quick=False),
         "interaction_quick": lambda c, arg: interaction(c, quick=True)}
