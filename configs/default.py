"""Default experiment: a small decoder on `copy`, trained at length 32, evaluated up to 8x.

    python -m experiments.train --config configs/default.py --workdir /tmp/run
    python -m experiments.train --config configs/default.py:text,alibi --workdir /tmp/text
    python -m experiments.train --config configs/default.py \
        --config.model.position.kind=alibi --config.train.steps=500 --workdir /tmp/alibi
    python -m experiments.train --config configs/default.py --workdir /tmp/yarn \
        --config.model.position.rope.scaling=yarn --config.model.position.rope.factor=4

Trains in about two minutes on a 2-core CPU. The `:ARG` is a comma-separated
list of variant tokens, applied left to right:

    <task>        any posenc.tasks.TASKS name (default copy); text: byte-level LM on
                  the Python stdlib, length 64, eval to 1024
    <position>    any posenc.model.ENCODINGS name (default rope), e.g. alibi
    <placement>   any posenc.registry.PLACEMENTS name (default pre), e.g. post
    randomized    randomized positions (Ruoss et al. 2023) at training and evaluation
    fit           train until validation accuracy at the training length reaches 0.99
                  (checked every 250 steps), at most train.steps
    tiny          test-sized: 1 layer, d_model 32, 20 steps, short evals
    gemma3        Gemma 3 attention: 6 RoPE layers, 5 sliding-window : 1 global
                  (model.global_every=6), QK-norm (rms)
    swan          SWAN-GPT: 4 layers, global NoPE layers (iRoPE nope_every=4) between
                  sliding-window RoPE layers, log-n scaling on the NoPE layers (a
                  multiplier of 1 up to the training length: it acts at evaluation)
    llama4        Llama 4 iRoPE: 4 layers, chunked RoPE layers and a global NoPE layer
                  every 4th, QK-norm (rms) on the RoPE layers only, the attention
                  temperature on the NoPE layers (floor_scale = the chunk, as Llama 4's
                  8192 and 8192)
                  The presets size the window / chunk to half of task.train_length at
                  the time they are applied: put a task token first.

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

from posenc import registry, tasks
from posenc.model import ENCODINGS, model_config
from posenc.training.overrides import fields


def _base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.task = ml_collections.ConfigDict(dict(
        name="copy",
        train_length=32,
        min_size=0,  # 0: 1 (smallest problem); training sizes are uniform in [min_size, max_size(L)]
        seed=0,  # folded into the data keys (a different data stream, same model init)
        options=ml_collections.ConfigDict(),  # keyword options of posenc.tasks.make
    ))
    c.model = model_config()
    c.train = ml_collections.ConfigDict(dict(
        steps=5000,
        batch_size=32,
        learning_rate=1e-3,
        warmup_steps=200,
        min_lr_ratio=0.1,  # cosine decays to learning_rate * min_lr_ratio
        weight_decay=0.1,  # on matrices only
        clip_norm=1.0,  # global-norm clipping; 0 = off
        b1=0.9,
        b2=0.98,
        eps=1e-9,
        z_loss=0.0,  # PaLM z-loss weight (1e-4 typical); 0 = off
        seed=0,  # model init and data keys
        fit_accuracy=0.0,  # > 0: stop once validation accuracy at the training length reaches it
        fit_check_every=250,  # steps between fit checks (with fit_accuracy > 0)
        # train steps per compiled call: an int >= 1 or "auto" (docs/performance.md); same results
        steps_per_call=ml_collections.FieldReference("auto", field_type=object),
        log_every=250,
        checkpoint_every=1000,
        keep_checkpoints=2,
        tensorboard=False,  # event files in WORKDIR/tensorboard (needs tensorboardX)
        progress=True,  # progress bar on stderr
    ))
    c.eval = ml_collections.ConfigDict(dict(
        lengths=(32, 64, 128, 256),
        batch_size=32,
        num_batches=4,
        seed=1234,
        position_buckets=8,  # text: loss over 8 position ranges per length
        max_tokens_per_step=16384,  # evaluation memory bound: rows per forward * length (0 = off)
    ))
    # name -> {dotted model.* field: value}: the trained parameters evaluated with these
    # fields changed, e.g. {"yarn4": {"model.position.rope.scaling": "yarn",
    # "model.position.rope.factor": 4.0}} (zero-shot context extension)
    c.eval.variants = fields({})
    c.mesh = ml_collections.ConfigDict(dict(
        data=-1,  # data-parallel devices; -1: all (every process's); batch sizes must divide by it
        fsdp=False,  # True: shard each parameter and its Adam moments over the devices (FSDP)
    ))
    return c


def _local_size(c) -> int:
    return max(int(c.task.train_length) // 2, 1)


def _gemma3(c) -> None:
    m = c.model
    m.position.kind = "rope"
    m.num_layers = 6
    m.update(attention_span="window", attention_window=_local_size(c), global_every=6)
    m.norm.qk_norm = "rms"


def _swan(c) -> None:
    m = c.model
    m.position.kind = "irope"
    m.position.irope.nope_every = 4
    m.num_layers = 4
    m.update(attention_span="window", attention_window=_local_size(c), global_every=4)
    m.logit_scale.update(kind="logn", layers="nope")


def _llama4(c) -> None:
    m = c.model
    m.position.kind = "irope"
    m.position.irope.nope_every = 4
    m.num_layers = 4
    chunk = _local_size(c)
    m.update(attention_span="chunk", attention_chunk=chunk, global_every=4)
    m.norm.update(qk_norm="rms", qk_norm_layers="positional")
    m.logit_scale.update(kind="temperature", layers="nope", floor_scale=float(chunk))


PRESETS = {"gemma3": _gemma3, "swan": _swan, "llama4": _llama4}


def _apply(c: ml_collections.ConfigDict, token: str) -> None:
    if token in tasks.TASKS:
        c.task.name = token
        if token == "text":
            c.task.train_length = 64
            c.task.options = ml_collections.ConfigDict(dict(max_bytes=2_000_000))
            c.eval.lengths = (64, 128, 256, 512, 1024)
            c.eval.num_batches = 4
            c.eval.batch_size = 8
            c.train.steps = 1000
    elif token in ENCODINGS:
        c.model.position.kind = token
    elif token in registry.PLACEMENTS:
        c.model.norm.placement = token
    elif token == "randomized":
        c.model.position.randomized = True
        c.model.position.randomized_max_position = 4 * max(c.eval.lengths)
    elif token == "fit":
        c.train.fit_accuracy = 0.99
    elif token in PRESETS:
        PRESETS[token](c)
    elif token == "tiny":
        c.model.d_model, c.model.num_layers, c.model.num_heads = 32, 1, 2
        c.task.train_length = 16
        c.train.update(steps=20, batch_size=8, warmup_steps=2, log_every=5, checkpoint_every=10,
                       progress=False)
        c.eval.update(lengths=(16, 32), batch_size=8, num_batches=1)
    else:
        allowed = [*tasks.TASKS, *ENCODINGS, *registry.PLACEMENTS, "randomized", "fit", "tiny",
                   *PRESETS]
        raise ValueError(f"unknown configs/default.py argument {token!r}; choose a comma-separated "
                         f"list of: {', '.join(allowed)}")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The default config, changed by the comma-separated variant tokens of ``arg``."""
    c = _base()
    for token in (arg or "").split(","):
        if token.strip():
            _apply(c, token.strip())
    return c
