"""Default experiment: a small decoder on `copy`, trained at length 32, evaluated up to 8x.

    python -m posenc train --config default --workdir /tmp/run
    python -m posenc train --config default:text,alibi --workdir /tmp/text
    python -m posenc train --config default \
        --config.model.position.kind=alibi --config.train.steps=500 --workdir /tmp/alibi
    python -m posenc train --config default --workdir /tmp/yarn \
        --config.model.position.rope.scaling=yarn --config.model.position.rope.factor=4

Trains in about two minutes on a 2-core CPU. The `:ARG` is a comma-separated
list of variant tokens, applied left to right:

    <task>        any posenc.tasks.TASKS name (default copy); text: byte-level LM on
                  the Python stdlib, length 64, eval to 1024
    <position>    any posenc.model.ENCODINGS name (default rope), e.g. alibi
    <placement>   any posenc.norm_names.PLACEMENTS name (default pre), e.g. post
    randomized    randomized positions (Ruoss et al. 2023) at training and evaluation
    fit           train until validation accuracy at the training length reaches 0.99
                  (checked every 250 steps), at most train.steps
    tiny          test-sized: 1 layer, d_model 32, 20 steps, short evals
    gemma3        Gemma 3 (posenc.model.presets): 6 layers, 5 sliding-window : 1 global,
                  RoPE base 10k on the window layers and 1M on the global one, QK-norm,
                  Gemma norms (1 + w, sandwich), GeGLU, embeddings times sqrt(d)
    swan          SWAN-GPT: 4 layers, a global NoPE layer every 4th between
                  sliding-window RoPE layers, log-n scaling on the NoPE layers (a
                  multiplier of 1 up to the training length: it acts at evaluation)
    llama4        Llama 4: 4 layers, chunked RoPE layers (base 500k, interleaved pairs)
                  and a global NoPE layer every 4th, the weight-free QK-norm after RoPE
                  on the RoPE layers only, the attention temperature on the NoPE layer
                  (floor_scale = the chunk, as Llama 4's 8192 and 8192), SwiGLU
                  The presets size the window / chunk to half of task.train_length at
                  the time they are applied (the published models: 1024, 512, 8192):
                  put a task token first.

Fields: `task.*` (name, train_length, min_size (0 = 1), seed, options passed
to `posenc.tasks.make`), `model.*` (all of `posenc/model/config.py`: each
encoding's options under `model.position.<kind>.*`; `vocab_size` comes from
the task, and options that take the training length when 0, such as
`model.position.rope.original_length` and `model.position.learned.max_length`,
get it), `train.*` (`fit_accuracy` > 0: fit, then extrapolate), `eval.*`
(`variants`: name -> dotted `model.*` fields to evaluate the trained
parameters with, e.g. zero-shot RoPE scalings; `max_tokens_per_step` bounds
evaluation memory), `mesh.*` (devices: `data` = number of data-parallel
devices, -1 = all of them; `fsdp` = shard parameters and optimizer moments
over them; see docs/multidevice.md; not part of the config hash). With
`lock_config=True` a typo in `--config.x=y` is an error, and a field the
chosen encoding does not use is an error if it is set.
"""

from __future__ import annotations

import ml_collections

from posenc import tasks
from posenc.config import overrides
from posenc.config.schema import unknown_argument
from posenc.model import ENCODINGS, presets
from posenc.model.spec import placement_fields
from posenc.norms import norm_names
from posenc.training.schema import Run, run_config

fields = overrides.fields  # the configs build their variants with default.fields


def _local_size(c) -> int:
    return max(int(c.task.train_length) // 2, 1)


def _preset(name: str, *scaled):
    """The fields of ``posenc.model.presets`` ``name`` with its window / chunk sized to the task."""

    def preset_fields(c) -> dict:
        size = _local_size(c)
        return {**presets.get(name), **{f: float(size) if f.endswith("floor_scale") else size for f in scaled}}

    return preset_fields


# The architectures of posenc.model.presets at this config's scale: the window / chunk (and
# Llama 4's temperature floor, its chunk in the original) are half of task.train_length.
_gemma3 = _preset("gemma3", "model.attention_window")
_swan = _preset("swan", "model.attention_window")
_llama4 = _preset("llama4", "model.attention_chunk", "model.logit_scale.floor_scale")


# preset -> the dotted fields it sets in a config (from its task length)
PRESETS = {"gemma3": _gemma3, "swan": _swan, "llama4": _llama4}

TEXT = {"task.name": "text", "task.train_length": 64, "task.options": {"max_bytes": 2_000_000},
        "eval.lengths": (64, 128, 256, 512, 1024), "eval.num_batches": 4, "eval.batch_size": 8,
        "train.steps": 1000}
TINY = {"model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "task.train_length": 16,
        "train.steps": 20, "train.batch_size": 8, "train.warmup_steps": 2, "train.log_every": 5,
        "train.checkpoint_every": 10, "train.progress": False, "eval.lengths": (16, 32),
        "eval.batch_size": 8, "eval.num_batches": 1}


def word_fields(c: ml_collections.ConfigDict, token: str) -> dict:
    """The dotted fields that the ``:ARG`` word ``token`` sets in ``c`` (the config so far)."""
    if token == "text":
        return TEXT
    if token in tasks.TASKS:
        return {"task.name": token}
    if token in ENCODINGS:
        return {"model.position.kind": token}
    if token in norm_names.PLACEMENTS:
        return placement_fields(token)
    if token == "randomized":
        return {"model.position.randomized": True,
                "model.position.randomized_max_position": 4 * max(c.eval.lengths)}
    if token == "fit":
        return {"train.fit_accuracy": 0.99}
    if token == "tiny":
        return TINY
    if token in PRESETS:
        return PRESETS[token](c)
    allowed = [*tasks.TASKS, *ENCODINGS, *norm_names.PLACEMENTS, "randomized", "fit", "tiny", *PRESETS]
    raise unknown_argument("default config", token, allowed)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The default config, changed by the comma-separated variant words of ``arg``."""
    c = run_config()
    for token in (arg or "").split(","):
        if token.strip():
            overrides.apply(c, word_fields(c, token.strip()), schema=Run,
                            where=f"default:{token.strip()}")
    return c
