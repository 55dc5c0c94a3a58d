"""Context extension of a trained RoPE model: every scaling, zero-shot and after fine-tuning.

    python -m posenc extend --config extend:quick --workdir /tmp/extend
    python -m posenc extend --config extend --workdir /tmp/extend_full
    python -m posenc extend --config extend:quick --workdir /tmp/ext2 \
        --config.base_run=/tmp/run        # extend a finished RoPE run of posenc train

A base RoPE model is trained once per seed at length L on the byte-level
text task (or `base_run` is reused). For each method and factor s it is
evaluated zero-shot at L and s L, then fine-tuned at s L with that scaling
for each budget of `finetune_steps` (every budget from the same base
checkpoint, optimizer reset; with a constant learning rate a longer budget
continues the shorter one, which gives the same result) and evaluated
again. Passkey retrieval (posenc.tasks.passkey, bytes: the text model's
vocabulary) is scored at target lengths >= `passkey_min_length`: the two
measures of YaRN (Peng et al. 2023), perplexity and passkey accuracy.

Args:
    smoke   a tiny base, no scaling, LongRoPE and Self-Extend, budgets 0 and 2 (seconds; the engine's tests)
    quick   L = 128, factors 2 and 4, budgets 0, 30 and 120 steps, three seeds
            (about 20 minutes a seed on one CPU core; passkey at 512).
    retrieval  a base that retrieves in distribution: trained on passkey at
            L = 320 until its validation accuracy (per answer byte) reaches 0.99 (at most 2500
            steps), three seeds; zero-shot at 4 L = 1280 with no scaling, NTK,
            YaRN and the training-free remappings; passkey is the main task
            (the quick variant: about 14 min on 2 cores; results: docs/results_training_free.md)
    retrieval_full  the same bases at 2 L, 4 L and 8 L, zero-shot and after a
            100-step fine-tune of the methods that allow one (no scaling, NTK, YaRN, DCA)
    full    (default) L = 256, factors 2, 4 and 8, budgets 0, 50, 200 and 1000,
            two seeds; passkey at 512, 1024 and 2048.

Fields:
    base               the base run's config (the default config's fields)
    base_run           a finished run's workdir to extend instead of training
                       `base` (RoPE without scaling; its own seed)
    seeds              train.seed of each base run
    methods            names of posenc.studies.extend_methods.METHODS: default (no scaling,
                       extrapolation), linear (PI), ntk, dynamic (dynamic NTK,
                       s = n / L), yarn (temperature "paper": sqrt(1/t) = 0.1 ln s
                       + 1, as the paper and HF), yarn_quadratic (t = 1 + 0.1 ln s
                       + 0.07 ln^2 s), dynamic_yarn, longrope (factors searched
                       on the base model, posenc.rope_search), llama3; the
                       training-free remappings (model.position.rope.remap, zero-shot
                       only but dual_chunk): self_extend, rerope, leaky_rerope,
                       dual_chunk, string, streaming_llm, lm_infinite, with the
                       papers' settings at (s, L) (posenc.studies.extend_methods.METHODS);
                       and two that train, fine-tune only, at L: pose (PoSE's
                       positions skipping over s L, train.pose_length) and drope
                       (the base with RoPE removed, recalibrated)
    factors            s: each method extends L to s L
    finetune_steps     budgets (0 = zero-shot only)
    finetune           train.* fields of the fine-tunes; batch_size 0 keeps the
                       base's tokens per step (base batch * L / (s L))
    passkey_min_length the retrieval tasks at target lengths >= this (0: never)
    retrieval_tasks    byte-level retrieval tasks: passkey, RULER's niah_single,
                       niah_multikey, niah_multivalue, niah_multiquery,
                       variable_tracking, common_words, frequent_words (each at
                       the target lengths it fits)
    search             LongRoPE search: batch_size windows of training data at
                       s L; short=True also searches short_factor at L; the rest
                       are posenc.rope_search.search options
"""

from __future__ import annotations

import ml_collections

from posenc.config.schema import unknown_argument
from posenc.configs import default

ARGS = ("smoke", "quick", "retrieval", "retrieval_full", "full")
RETRIEVAL_METHODS = ("default", "ntk", "yarn", "self_extend", "rerope", "dual_chunk", "string",
                     "streaming_llm", "lm_infinite", "pose", "drope")
METHODS = ("default", "linear", "ntk", "dynamic", "yarn", "yarn_quadratic", "dynamic_yarn",
           "longrope", "llama3", "self_extend", "rerope", "leaky_rerope", "dual_chunk", "string",
           "streaming_llm", "lm_infinite", "pose", "drope")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The extension study ``arg`` (one of ARGS)."""
    arg = arg or "full"
    if arg not in ARGS:
        raise unknown_argument("extend config", arg, ARGS)
    c = ml_collections.ConfigDict()
    c.name = arg
    b = c.base = default.get_config("text")
    b.model.update(d_model=64, num_layers=2, num_heads=4)
    b.train.update(progress=False, warmup_steps=100, learning_rate=3e-3)
    b.eval.update(batch_size=8, num_batches=2)
    c.base_run = ""
    c.methods = METHODS
    c.retrieval_tasks = ("passkey",)
    c.finetune = ml_collections.ConfigDict(dict(
        learning_rate=3e-4, warmup_steps=10, min_lr_ratio=1.0, weight_decay=0.0, batch_size=0,
        log_every=10, checkpoint_every=1000))
    c.search = ml_collections.ConfigDict(dict(
        batch_size=4, short=False, population_size=16, parents_size=8, mutation_numbers=4,
        crossover_size=4, iterations=10))
    if arg == "smoke":  # the engine's tests: seconds per point on 2 cores
        b.update_from_flattened_dict({"model.d_model": 16, "model.num_layers": 1, "model.num_heads": 2})
        b.task.train_length = 16
        b.train.update(steps=10, batch_size=4, warmup_steps=2, log_every=5, checkpoint_every=5)
        b.eval.update(lengths=(16,), batch_size=4, num_batches=1)
        c.seeds = (0,)
        c.methods = ("default", "longrope", "self_extend")
        c.factors = (2,)
        c.finetune_steps = (0, 2)
        c.finetune.update(warmup_steps=1, log_every=2, checkpoint_every=2)
        c.passkey_min_length = 0
        c.search.update(batch_size=2, population_size=4, parents_size=2, mutation_numbers=2,
                        crossover_size=2, iterations=2)
    elif arg == "quick":
        b.task.train_length = 128
        b.train.update(steps=1500, batch_size=8, log_every=250, checkpoint_every=1500)
        b.eval.lengths = (128,)
        c.seeds = (0, 1, 2)
        c.factors = (2, 4)
        c.finetune_steps = (0, 30, 120)
        c.passkey_min_length = 512
        c.search.update(population_size=12, parents_size=6, iterations=6)
    elif arg in ("retrieval", "retrieval_full"):  # a base that retrieves: trained on passkey until it fits
        b.task.name = "passkey"
        b.task.options = ml_collections.ConfigDict()
        b.task.train_length = 320  # passkey needs >= 252 bytes; up to 67 filler bytes here
        b.train.update(steps=2500, batch_size=16, fit_accuracy=0.99, fit_check_every=250, log_every=250,
                       checkpoint_every=2500)
        b.eval.update(lengths=(320,), num_batches=4, decode=False)  # 32 keys a length; teacher-forced EM
        c.seeds = (0, 1, 2)
        c.methods = RETRIEVAL_METHODS
        c.factors = (4,)
        c.finetune_steps = (0,)
        c.passkey_min_length = 0
        if arg == "retrieval_full":  # 2x, 4x and 8x; a short fine-tune of the methods that allow one
            c.factors = (2, 4, 8)
            c.finetune_steps = (0, 100)
    else:
        b.task.train_length = 256
        b.task.options.max_bytes = 8_000_000
        b.train.update(steps=4000, batch_size=16, log_every=250, checkpoint_every=1000)
        b.eval.lengths = (256,)
        c.seeds = (0, 1)
        c.factors = (2, 4, 8)
        c.finetune_steps = (0, 50, 200, 1000)
        c.passkey_min_length = 512
        c.retrieval_tasks = ("passkey", "niah_single", "niah_multikey", "variable_tracking")
        c.search.short = True
    return c
