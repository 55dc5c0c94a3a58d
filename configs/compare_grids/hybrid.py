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
"""

from __future__ import annotations

from posenc.configs import default
from posenc.configs.compare_grids import common

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


GRIDS = {"hybrid_quick": hybrid_quick}
