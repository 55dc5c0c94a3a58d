"""The arithmetic grids: addition with Abacus, position coupling and the encodings they beat."""

from __future__ import annotations

from posenc.configs import default
from posenc.configs.compare_grids import common
from posenc.training import dataset

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
    hints = common.sized("addition", train_size, eval_sizes, index_hints=True)
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


def arithmetic(c, train_size: int, eval_sizes, *, max_position: int, quick: bool) -> None:
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
    per_task = {entry: dict(common.sized("addition", train_size, eval_sizes), **{"task.options.format": fmt,
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
    c.grid = common.grid(tasks=tuple(per_task), positions=ARITHMETIC_POSITIONS, seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "sizes"
    # the target at twice the training size: coupling and Abacus generalize, RoPE and NoPE do not
    c.targets = {"size": 2 * train_size, "at_least": {"position_coupling": 0.9, "abacus": 0.9},
                 "below": {"rope": 0.2, "nope": 0.2}}


CHO_SMALL = dict(train_size=5, eval_sizes=(5, 10, 15), max_position=17)  # run_coupling.sh's small run


def arithmetic_cho_small(c) -> None:
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
    task = {**common.sized("addition", n, sizes, format="reversed_output", zero_pad=True),
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
    c.grid = common.grid(tasks=("addition_cho",), positions=("position_coupling", "nope", "rope"),
                   placements=("sandwich",), seeds=(0, 1), vmap_seeds=True)
    c.findings = "sizes"
    c.targets = {"size": 2 * n, "at_least": {"position_coupling": 0.9}, "below": {"rope": 0.2, "nope": 0.2}}


# The official recipe on 2 CPU cores (compare:arithmetic_cpu, compare:arithmetic_ladder): what each paper sets.
OFFICIAL = dict(
    dataset_size=100_000,  # Cho et al. scripts/addition/run_coupling.sh n_data (README and the other scripts: 1e6)
    max_k=100,  # McLeish et al. max_abacus_len
    max_position=100,  # coupled ids: 2x the longest test's answer (as run_coupling.sh's 150 for 100 digits)
)
CPU_SIZES = (16, 24, 32, 48)  # trained on 1-16 digits; 1.5x, 2x, 3x
CPU_STEPS = 4500  # the budget of compare:arithmetic_cpu: 35-56 minutes (docs/results_arithmetic.md: the timing)
CPU_RECURRENCES = 2  # Abacus's looped layer: passes through its one layer (McLeish et al.: 16)


def official_recipe(c, train_size: int, eval_sizes, *, steps: int, select_size: int | None) -> None:
    """Addition trained as the official code trains it, sized for 2 CPU cores (``c.base`` and the arms).

    From Cho et al. 2024 (HanseulJo/position-coupling ``run.py``,
    ``scripts/addition/run_coupling.sh``, ``configs/training/default.yaml``):
    operand lengths drawn independently (``operand_lengths``), both zero-padded;
    a fixed set of 100 000 examples visited in epochs in a fresh order
    (``train.dataset_size``); a fixed step count, no fit stop (``fit_accuracy``
    0); evaluation during training at every test size (``train.eval_every``: 10
    times) and, with ``select_size``, the parameters of lowest validation loss
    at that size reported beside the last (``train.select_length``: their
    val_long choice); AdamW without weight decay, betas (0.9, 0.95), clipping
    at 1.0, 1% warmup, cosine to 0.1 of the peak. From McLeish et al. 2024
    (mcleish7/arithmetic): every number least significant digit first
    (reverse_all), Abacus offsets k ~ U{0..100}, a looped layer with input
    injection (``model.recurrences``). Not theirs, for the budget: 1 layer of
    width 128 (Cho et al.: 1 layer, 4 heads, width 512-1024; McLeish et al.:
    width 1024, 16 passes), batch 64 (1000; 512), peak learning rate 1e-3
    (1e-4), ``steps`` steps (50 000), Abacus looped :data:`CPU_RECURRENCES`
    times (16).
    """
    b = c.base
    task = dict(common.sized("addition", train_size, eval_sizes), **{
        "task.options.format": "reversed", "task.options.zero_pad": True,
        "task.options.operand_lengths": "independent"})
    b.update_from_flattened_dict(task)
    b.eval.sizes = "exact"
    b.model.update(d_model=128, num_layers=1, num_heads=4)
    select = common.sized("addition", select_size, (select_size,))["eval.lengths"][0] if select_size else 0
    b.train.update(steps=steps, batch_size=64, learning_rate=1e-3, warmup_steps=max(steps // 100, 1),
                   min_lr_ratio=0.1, weight_decay=0.0, clip_norm=1.0, b1=0.9, b2=0.95, eps=1e-8,
                   fit_accuracy=0.0, dataset_size=OFFICIAL["dataset_size"], eval_every=max(steps // 10, 1),
                   select_length=select, log_every=max(steps // 10, 1), checkpoint_every=max(steps // 5, 1),
                   progress=False)
    b.eval.update(batch_size=64, num_batches=2)
    max_position = OFFICIAL["max_position"]
    coupling = arithmetic_variants(train_size, eval_sizes, max_position=max_position)["position_coupling"]
    c.variants = default.fields({
        "position_coupling": coupling,
        "abacus": {"model.position.kind": "abacus", "model.position.abacus.max_k": OFFICIAL["max_k"],
                   "model.recurrences": CPU_RECURRENCES},
    })


def arithmetic_cpu(c) -> None:
    """Coupling, Abacus (a looped layer), RoPE and NoPE trained on 1-16 digits with the official recipe
    (:func:`official_recipe`), decoded at 16, 24, 32 and 48 digits, 3 seeds trained together; the
    last parameters and those of lowest validation loss at 48 digits (rows checkpoint last /
    best_long_val). 35-56 minutes on 2 idle CPU cores, estimated from timed runs of each arm
    (docs/results_arithmetic.md)."""
    official_recipe(c, CPU_SIZES[0], CPU_SIZES, steps=CPU_STEPS, select_size=CPU_SIZES[-1])
    c.grid = common.grid(tasks=("addition",), positions=("position_coupling", "abacus", "rope", "nope"),
                         seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "sizes"
    c.targets = {"size": 2 * CPU_SIZES[0], "at_least": {"position_coupling": 0.9, "abacus": 0.9},
                 "below": {"rope": 0.2, "nope": 0.2}}


LADDER_BUDGETS = (100_000, 200_000, 500_000)  # examples trained on (whole epochs of the fixed set): 55-88 minutes
LADDER_SIZES = (16, 32)  # trained on 1-16 digits, evaluated there and at 2x


def arithmetic_ladder(c) -> None:
    """Coupling's and Abacus's exact match at 2x against the training examples: one grid, a tasks entry
    per budget (``examples_<N>``: N / 100 000 epochs of the official recipe over its fixed set of 100 000),
    3 seeds; the last parameters; rows carry ``train_examples``; findings ``ladder``
    (posenc.studies.ladder: the plot against log examples and the logistic trend to 0.9). 55-88 minutes
    on 2 idle CPU cores, estimated as :func:`arithmetic_cpu`'s."""
    official_recipe(c, LADDER_SIZES[0], LADDER_SIZES, steps=1, select_size=None)
    c.base.train.eval_every = 0
    budgets = {}
    for n in LADDER_BUDGETS:  # whole epochs of the fixed set: train_examples is the budget exactly
        steps = n // OFFICIAL["dataset_size"] * dataset.steps_per_epoch(OFFICIAL["dataset_size"], 64)
        budgets[f"examples_{n}"] = {"task.name": "addition", "train.steps": steps,
                                    "train.warmup_steps": max(steps // 100, 1),
                                    "train.log_every": max(steps // 10, 1),
                                    "train.checkpoint_every": max(steps // 5, 1)}
    c.variants = default.fields({**c.variants.to_dict(), **budgets})
    c.grid = common.grid(tasks=tuple(budgets), positions=("position_coupling", "abacus"), seeds=(0, 1, 2),
                         vmap_seeds=True)
    c.findings = "ladder"


GRIDS = {
    "arithmetic_quick": lambda c, arg: arithmetic(c, 8, ARITHMETIC_QUICK_SIZES, max_position=48, quick=True),
    # McLeish et al. 2024: operands of up to 20 digits, tested to 100
    "arithmetic": lambda c, arg: arithmetic(c, 20, (20, 40, 60, 80, 100), max_position=128, quick=False),
    # Cho et al. 2024: 1-30 digits, tested to 200
    "arithmetic_cho": lambda c, arg: arithmetic(c, 30, (30, 50, 100, 150, 200), max_position=256, quick=False),
    "arithmetic_cho_small": lambda c, arg: arithmetic_cho_small(c),
    "arithmetic_cpu": lambda c, arg: arithmetic_cpu(c),
    "arithmetic_ladder": lambda c, arg: arithmetic_ladder(c),
}
