"""Position from recurrence: hybrid decoders (recurrent layers 3:1 with attention) against all-attention
and all-recurrent ones, on copy, multi-query associative recall, passkey retrieval and text to 16L.

The claims it tests (docs/results_hybrid.md):

* NoPE hybrids extrapolate (Granite 4.0-H: Mamba-2 with NoPE attention; Kimi Linear: KDA with NoPE MLA):
  ``mamba2_nope`` and ``gdn_nope`` against ``rope``;
* recurrent layers cannot copy beyond their state (Jelassi et al. 2024, arXiv 2402.01032):
  ``gdn_only`` and ``mamba2_only`` on copy, against the hybrids and attention;
* Mamba's length generalization breaks past its training length (DeciMamba, arXiv 2406.14528):
  ``mamba2_only`` at 2x-16x on text;
* SWAN-GPT (arXiv 2504.08719): global NoPE layers between sliding-window RoPE layers extrapolate (``swan``).

Every arm has 4 layers of d_model 64 and 4 heads; a 3:1 hybrid puts attention in the last layer of
every 4 (Qwen3-Next, Kimi Linear: layers 3, 7, ...). ``gdn_rope_partial`` is Qwen3-Next's attention:
RoPE on a quarter of each head. The recurrent layers keep their default state sizes
(posenc.model.recurrent_options: Mamba-2 expand 2, heads of 16 channels, state 16 per head; Gated
DeltaNet 2 key heads and 4 value heads of 16); ``--config.variants.<arm>.model.recurrent...`` resizes
them for a state-size ladder.

Beside it: ``hybrid_state`` (that ladder on copy), ``hybrid_text_long`` (the text runs evaluated to
128L), ``hybrid_mqar_probe`` (whether RoPE fits MQAR at this budget) and ``hybrid_passkey`` (the
passkey cells with the scans' chunks sized for a CPU) and ``hybrid_mqar`` (MQAR at Zoology's budget, for an
accelerator). Findings: docs/results_hybrid.md.
"""

from __future__ import annotations

from posenc.configs import default
from posenc.configs.compare_grids import common
from posenc.training import dataset

LAYERS = 4


def three_to_one(kind: str) -> tuple[str, ...]:
    """``kind`` in three layers of every four, attention in the fourth (the period the layers repeat)."""
    return tuple("attention" if (i + 1) % 4 == 0 else kind for i in range(LAYERS))


HYBRID_ARMS = {
    "rope": {"model.position.kind": "rope"},
    "nope": {"model.position.kind": "nope"},
    "gdn_nope": {"model.position.kind": "nope", "model.layer_types": three_to_one("gated_deltanet")},
    "gdn_rope_partial": {"model.position.kind": "rope", "model.position.rope.rotary_fraction": 0.25,
                         "model.layer_types": three_to_one("gated_deltanet")},
    "mamba2_nope": {"model.position.kind": "nope", "model.layer_types": three_to_one("mamba2")},
    "gdn_only": {"model.position.kind": "nope", "model.layer_types": ("gated_deltanet",)},
    "mamba2_only": {"model.position.kind": "nope", "model.layer_types": ("mamba2",)},
}
TEXT_LENGTH = 32  # text trained at L = 32 tokens, evaluated at L, 2L, 4L, 8L, 16L


def tasks() -> dict:
    """The task variants: copy to 8x, MQAR and passkey to about 4x their training length, text to 16L."""
    mqar = common.sized("mqar", 8, (8, 16, 32))
    passkey = common.sized("passkey", 40, (40, 333, 919))  # 293 tokens, then about 2x and 4x
    text = {"task.name": "text", "task.train_length": TEXT_LENGTH, "task.options": {"max_bytes": 2_000_000},
            "eval.batch_size": 8, "eval.num_batches": 4,
            "eval.lengths": tuple(f * TEXT_LENGTH for f in (1, 2, 4, 8, 16)),
            "train.fit_accuracy": 0.0, "train.steps": 600, "train.warmup_steps": 50}
    return {"copy": common.sized("copy", common.COPY_SIZES[0], common.COPY_SIZES), "mqar": mqar,
            "passkey": passkey, "text": text}


def hybrid_quick(c, arg: str) -> None:
    """The arms of HYBRID_ARMS and SWAN-GPT's interleave x the tasks of :func:`tasks`, 3 seeds trained
    together, the synthetic tasks fitted to 0.99 (at most 4000 steps), answers decoded."""
    b = c.base
    common.quick_copy(b)
    b.model.update(num_layers=LAYERS)
    swan = {k: v for k, v in default.PRESETS["swan"](b).items() if k.startswith("model.")}
    c.variants = default.fields({**tasks(), **HYBRID_ARMS, "swan": swan})
    c.grid = common.grid(tasks=tuple(tasks()), positions=(*HYBRID_ARMS, "swan"), seeds=(0, 1, 2), vmap_seeds=True)
    c.findings = "sizes"


def _gdn_state(heads: int, dim: int, value_dim: int | None = None, key_heads: int | None = None) -> dict:
    return {"model.recurrent.gated_deltanet.num_key_heads": key_heads or heads,
            "model.recurrent.gated_deltanet.num_value_heads": heads,
            "model.recurrent.gated_deltanet.key_head_dim": dim,
            "model.recurrent.gated_deltanet.value_head_dim": value_dim or dim}


def _mamba2_state(heads: int, head_dim: int, state: int) -> dict:
    return {"model.recurrent.mamba2.num_heads": heads, "model.recurrent.mamba2.head_dim": head_dim,
            "model.recurrent.mamba2.state_size": state}


# The recurrent state per layer (numbers): Gated DeltaNet Hv x Dk x Dv, Mamba-2 H x P x N. The
# stateN arms narrow the layer with its state (a Gated DeltaNet's state is its heads' key x value
# width); the _n and _dk arms shrink the state at the default width (Mamba-2's N; Gated DeltaNet's
# key dimension, values kept 4 heads of 16).
STATE_LADDER = {
    **{f"gdn_only_state{h * d * d}": {**HYBRID_ARMS["gdn_only"], **_gdn_state(h, d)}
       for h, d in ((1, 8), (1, 4), (1, 2))},
    **{f"mamba2_only_state{h * p * n}": {**HYBRID_ARMS["mamba2_only"], **_mamba2_state(h, p, n)}
       for h, p, n in ((2, 8, 8), (1, 4, 4), (1, 2, 2))},
    "gdn_nope_state4": {**HYBRID_ARMS["gdn_nope"], **_gdn_state(1, 2)},
    "mamba2_only_n4_state512": {**HYBRID_ARMS["mamba2_only"], **_mamba2_state(8, 16, 4)},
    "mamba2_only_n1_state128": {**HYBRID_ARMS["mamba2_only"], **_mamba2_state(8, 16, 1)},
    "gdn_only_dk2_state128": {**HYBRID_ARMS["gdn_only"], **_gdn_state(4, 2, value_dim=16, key_heads=2)},
}


def hybrid_state(c, arg: str) -> None:
    """Jelassi et al.'s regime on copy: the all-recurrent arms with their state shrunk from the defaults
    (1,024 numbers a layer for Gated DeltaNet, 2,048 for Mamba-2) to 4, until strings of 7-63 symbols
    exceed it, beside RoPE attention and a NoPE hybrid with the smallest state; the model, budget, fit and
    evaluation of hybrid_quick's copy cells, 3 seeds trained together."""
    hybrid_quick(c, arg)
    c.variants = default.fields({**c.variants.to_dict(), **STATE_LADDER})
    c.grid = common.grid(tasks=("copy",), positions=("rope", "gdn_only", "mamba2_only", *STATE_LADDER),
                         seeds=(0, 1, 2), vmap_seeds=True)


def _mqar(keys: int, pairs: int, random_non_queries: bool = True) -> dict:
    options = {"keys": keys, "values": keys, **({} if random_non_queries else {"random_non_queries": False})}
    return {**common.sized("mqar", pairs, (pairs, 2 * pairs), **options), "task.options": options}


# name -> MQAR with `keys` keys and as many values, `pairs` pairs trained, and random filler (or blanks)
MQAR_PROBES = {"mqar_k16_p8": _mqar(16, 8), "mqar_k16_p8_blank": _mqar(16, 8, False),
               "mqar_k512_p8": _mqar(512, 8), "mqar_k64_p4": _mqar(64, 4)}


def hybrid_mqar_probe(c, arg: str) -> None:
    """Whether RoPE attention fits MQAR at this grid's CPU budget as the vocabulary, the pairs and the filler
    change (hybrid_quick's MQAR, 64 keys and 8 pairs, did not fit in 4000 steps): hybrid_quick's model and
    optimizer, 2000 steps, one seed; evaluated at the trained size and 2x."""
    hybrid_quick(c, arg)
    c.base.train.steps = 2000
    c.variants = default.fields({**c.variants.to_dict(), **MQAR_PROBES})
    c.grid = common.grid(tasks=tuple(MQAR_PROBES), positions=("rope",), seeds=(0,))


CPU_CHUNKS = {"mamba2": 32, "gated_deltanet": 32}  # docs/performance.md: the scans' chunk on 2 CPU cores


def hybrid_passkey(c, arg: str) -> None:
    """hybrid_quick's passkey cells with the recurrent scans in chunks of 32 (the defaults, 256 and 64, make
    the recurrent arms 1.5-3.4x slower at 293 tokens on a CPU; the chunk changes only the rounding)."""
    hybrid_quick(c, arg)
    variants = c.variants.to_dict()
    for arm, fields in HYBRID_ARMS.items():
        kinds = set(fields.get("model.layer_types", ())) & set(CPU_CHUNKS)
        variants[arm] = {**fields, **{f"model.recurrent.{k}.chunk_size": CPU_CHUNKS[k] for k in sorted(kinds)}}
    c.variants = default.fields(variants)
    c.grid.tasks = ("passkey",)


TEXT_LONG_FACTORS = (1, 2, 4, 8, 16, 32, 64, 128)


def hybrid_text_long(c, arg: str) -> None:
    """hybrid_quick's text cells evaluated to 128L (4096 tokens), past the 7x-16x where Mamba fails in
    DeciMamba (arXiv 2406.14528, Fig. 1 and its passkey grid), for the arms whose
    verdicts hang on the ratio: RoPE, NoPE, the NoPE hybrids and the all-recurrent models. Trained exactly
    as hybrid_quick's text cells (the same runs: copy them into the workdir to evaluate without training)."""
    hybrid_quick(c, arg)
    text = {**tasks()["text"], "eval.lengths": tuple(f * TEXT_LENGTH for f in TEXT_LONG_FACTORS)}
    c.variants = default.fields({**c.variants.to_dict(), "text": text})
    c.grid = common.grid(tasks=("text",), positions=("rope", "nope", "gdn_nope", "mamba2_nope", "gdn_only",
                                                      "mamba2_only"), seeds=(0, 1, 2), vmap_seeds=True)


# Zoology's Figure 2 MQAR (official HazyResearch/zoology,
# zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py): a vocabulary of 8,192 (keys and
# values from its two halves), blank filler (random_non_queries=False), 100,000 training examples for 64
# epochs in batches of 512, the learning rate swept over np.logspace(-4, -2, 4). Their (input length,
# pairs) are (64, 4), (128, 8) and (256, 16): 7 two-token query slots per pair, so ``slots`` 7.
ZOOLOGY_MQAR = {"keys": 4096, "values": 4096, "slots": 7, "random_non_queries": False}
ZOOLOGY_PAIRS = (8, 16, 32)  # trained on up to 8 pairs (130 tokens: Zoology's 128 and BOS, SEP), then 2x, 4x
ZOOLOGY_EXAMPLES, ZOOLOGY_EPOCHS, ZOOLOGY_BATCH = 100_000, 64, 512
ZOOLOGY_LEARNING_RATES = {"mqar_lr1e-4": 1e-4, "mqar_lr4.6e-4": 4.64e-4, "mqar_lr2.2e-3": 2.15e-3,
                          "mqar_lr1e-2": 1e-2}  # np.logspace(-4, -2, 4), rounded in the names only
ZOOLOGY_DEFAULT_RATES = ("mqar_lr4.6e-4", "mqar_lr2.2e-3")  # the sweep's middle; the ends run on demand


def hybrid_mqar(c, arg: str) -> None:
    """MQAR at Zoology's Figure 2 budget, for an accelerator: hybrid_quick's arms (4 layers, width 128),
    3 seeds trained together, on :data:`ZOOLOGY_MQAR` with up to 8 pairs; a fixed set of 100,000 examples
    for 64 epochs in batches of 512 (12,544 steps: 6.4 million examples, 50x hybrid_quick's MQAR cell),
    stopped once validation accuracy reaches 0.99 at the trained size (checked every 500 steps); decoded
    at 8, 16 and 32 pairs. A tasks entry per learning rate of Zoology's sweep (:data:`ZOOLOGY_LEARNING_RATES`;
    the grid runs :data:`ZOOLOGY_DEFAULT_RATES`, ``grid.tasks`` the others) and, as Zoology reports, the
    best rate per arm is the arm's result. Not Zoology's: 4 layers with MLPs (theirs 2, no MLP, for the
    3:1 hybrids), no dropout (their attention's 0.1), several heads (their attention's 1) and evaluation
    past the trained length (theirs at it). Hours of an H200; nothing of it runs on 2 CPU cores."""
    hybrid_quick(c, arg)
    b = c.base
    b.model.update(d_model=128)
    steps = ZOOLOGY_EPOCHS * dataset.steps_per_epoch(ZOOLOGY_EXAMPLES, ZOOLOGY_BATCH)
    b.train.update(steps=steps, batch_size=ZOOLOGY_BATCH, dataset_size=ZOOLOGY_EXAMPLES, warmup_steps=steps // 100,
                   fit_check_every=500, log_every=500, checkpoint_every=2500)
    b.eval.update(batch_size=100, num_batches=30)  # Zoology's test set: 3,000 examples
    task = {**common.sized("mqar", ZOOLOGY_PAIRS[0], ZOOLOGY_PAIRS, **ZOOLOGY_MQAR),
            **{f"task.options.{k}": v for k, v in ZOOLOGY_MQAR.items()}}
    rates = {name: {**task, "train.learning_rate": lr} for name, lr in ZOOLOGY_LEARNING_RATES.items()}
    c.variants = default.fields({**c.variants.to_dict(), **rates})
    c.grid = common.grid(tasks=ZOOLOGY_DEFAULT_RATES, positions=(*HYBRID_ARMS, "swan"), seeds=(0, 1, 2),
                         vmap_seeds=True)


GRIDS = {"hybrid_quick": hybrid_quick, "hybrid_state": hybrid_state, "hybrid_mqar_probe": hybrid_mqar_probe,
         "hybrid_text_long": hybrid_text_long, "hybrid_passkey": hybrid_passkey, "hybrid_mqar": hybrid_mqar}
