"""The arithmetic grids: addition with Abacus, position coupling and the encodings they beat."""

from __future__ import annotations

from posenc.configs import default
from posenc.configs.compare_grids import common

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


GRIDS = {
    "arithmetic_quick": lambda c, arg: arithmetic(c, 8, ARITHMETIC_QUICK_SIZES, max_position=48, quick=True),
    # McLeish et al. 2024: operands of up to 20 digits, tested to 100
    "arithmetic": lambda c, arg: arithmetic(c, 20, (20, 40, 60, 80, 100), max_position=128, quick=False),
    # Cho et al. 2024: 1-30 digits, tested to 200
    "arithmetic_cho": lambda c, arg: arithmetic(c, 30, (30, 50, 100, 150, 200), max_position=256, quick=False),
    "arithmetic_cho_small": lambda c, arg: arithmetic_cho_small(c),
}
