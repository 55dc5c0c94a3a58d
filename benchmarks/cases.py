"""Benchmark cases: training and long-context evaluation throughput and memory.

    python -m benchmarks.benchmark --config benchmarks/cases.py:R
    python -m benchmarks.benchmark --config benchmarks/cases.py:T
    python -m benchmarks.benchmark --config benchmarks/cases.py:long
    # side by side with the PyTorch peer (x-transformers) in the same run:
    python -m benchmarks.benchmark --config benchmarks/cases.py:R \
        --peer_python=/tmp/xt/bin/python --peer_script=../shared/bench/xt_bench.py

Cases (the model matches the peer's x-transformers decoder: pre-LayerNorm,
GELU MLP x4, untied head, random-token language modelling):
    R     d_model 256, 4 layers, 4 heads, batch 16, seq 256, vocab 256
    T     d_model 64, 2 layers, 4 heads, batch 32, seq 64, vocab 32
    long  case R evaluated on one sequence of 2K, 8K, 16K and 64K tokens,
          each length in a fresh process (its peak RSS is its own); at 8K the
          peer evaluates too (rope, alibi; it needs 13-15 GB and ~1 min)
    relative  case R, step time of every relative encoding (t5, shaw,
          transformer_xl, kerple_log, fire, cope, fox, stickbreaking, path,
          path_fox) against rope's; no peer
    window    case R with sliding-window attention (model.attention_span=window,
          W = 256) evaluated on one sequence of 16K and 64K tokens (each in a
          fresh process): O(L W) time and memory, beside case long's full rope
    quick_grids  the per-step time of the quick grids' models (the compare config's
          *quick grids: each task variant with rope, or the grid's first position),
          trained on their own tasks in calls of k steps, the seeds vmapped where
          the grid trains them so
    main  the main job (`python -m posenc compare --config compare:quick`)
          twice in fresh processes: with an empty compilation cache (cold), then
          with the cache the first run filled (warm); wall time of each
    G     the accelerator case (one GPU / TPU): d_model 1024, 12 layers, 16
          heads, batch 16 x seq 2048 (32K tokens a step), vocab 256,
          model.dtype auto (bf16 there) and attention_impl auto (the fused
          Pallas kernel); rope, alibi, t5, fire; eval at 32K and 128K tokens.
          Run with its PyTorch peers by benchmarks/accelerator_check.py

Timings on a shared 2-core machine are noisy: compare ratios from one run,
take the median of ``bench.rounds`` (``--config.bench.rounds=3``).
``--config.bench.stats_ab=True`` times the train step with diagnostics inside
its forward (every step) against the current one (none; a separate pass on
logging steps), interleaved in one process.
"""

from __future__ import annotations

import ml_collections

from posenc.configs import default

CASES = ("R", "T", "long", "relative", "window", "G", "quick_grids", "main")


def get_config(arg: str | None = "R") -> ml_collections.ConfigDict:
    case = arg or "R"
    if case not in CASES:
        raise ValueError(f"unknown benchmark case {case!r}; choose one of: {', '.join(CASES)}")
    c = default.get_config()
    m = c.model
    m.norm.kind, m.norm.placement, m.mlp, m.mlp_ratio = "layer", "pre", "gelu", 4.0
    m.tie_embeddings = False
    small = case == "T"
    m.d_model, m.num_layers, m.num_heads = (64, 2, 4) if small else (256, 4, 4)
    m.vocab_size = 32 if small else 256
    c.task.train_length = 64 if small else 256
    c.train.batch_size = 32 if small else 16
    c.train.warmup_steps = 0
    if case == "window":
        m.attention_span, m.attention_window = "window", 256
    c.bench = ml_collections.ConfigDict(dict(
        case=case,
        positions=(("rope", "t5", "shaw", "transformer_xl", "kerple_log", "fire", "cope", "fox",
                    "stickbreaking", "path", "path_fox")
                   if case == "relative" else ("rope", "alibi") if case == "long"
                   else ("rope",) if case == "window"
                   else ("rope", "alibi", "t5", "nope")),
        rounds=2,  # timed repeats per position (one compile), each followed by the peer
        train=case not in ("long", "window", "quick_grids", "main"),
        # train steps per timed call, as train.steps_per_call ("auto": the loop's rule)
        steps_per_call=ml_collections.FieldReference("auto", field_type=object),
        one_per_call=False,  # True: also time one step per call (the loop before chunks), interleaved
        pin_threads=False,  # True: pin XLA:CPU's worker threads to one CPU each (benchmarks.pinning)
        grids=("quick", "chomsky_quick", "suite_quick", "lm_quick", "randomized_quick",
               "interaction_quick"),  # case quick_grids
        main_workdir="/tmp/posenc_main_job",  # case main: runs, and the cold run's cache, go here
        main_args=(),  # case main: extra arguments of python -m posenc compare (e.g. --config.base.x=y)
        peer=case not in ("relative", "window"),  # run the peer (when --peer_python is given)
        warmup=5,
        steps=50 if small else 20,
        eval_lengths=((2048, 8192, 16384, 65536) if case == "long" else (16384, 65536)
                      if case == "window" else ()),
        peer_eval_lengths=(8192,) if case == "long" else (),
        eval_repeats=1,  # timed forward passes per eval length (median), after the compile
        # True: also time the train step that collects diagnostics in its own forward (every
        # step, as before they moved to a separate pass on logging steps), interleaved with the
        # current step in this process; rows "stats_in_step" and their ratio
        stats_ab=False,
        profile=False,  # True: per-op profile of the train step, one step per call vs k (no peer)
    ))
    if case == "G":
        m.d_model, m.num_layers, m.num_heads, m.dtype = 1024, 12, 16, "auto"
        c.task.train_length, c.train.batch_size = 2048, 16
        c.bench.update(positions=("rope", "alibi", "t5", "fire"), rounds=1, warmup=3, steps=10,
                       eval_lengths=(32768, 131072), peer=False)  # peers: benchmarks/
    return c
