"""Throughput and memory benchmark: one JSON line per measurement.

    python -m benchmarks.benchmark --config benchmarks/cases.py:R [--peer_python=/tmp/xt/bin/python]

Training lines: ``case, position, round, train_tokens_per_s`` (after warm-up,
the steps run in calls of ``steps_per_call`` = k, as the training loop runs
them: ``bench.steps_per_call``, "auto" by the loop's rule; the median over
calls of call time / k, ``step_s_spread`` its range), ``model_flops_per_s`` (PaLM accounting: 6 N + 12 l L d
per token, N the non-embedding parameters), ``matmul_peak_flops_per_s`` (a
float32 1024^3 matmul measured in the same run), ``compile_s``,
``peak_rss_mb``. Evaluation lines (case ``long``): ``case, position,
eval_length, eval_tokens_per_s, peak_rss_mb``, each from a fresh process.
With ``--peer_python``, the x-transformers script runs on the same config
right after each measurement and a ``ratio`` line gives posenc / peer; with
``bench.rounds`` > 1 every position is timed that many times (one compile),
each round followed by the peer, and a ``median_of_rounds`` line closes it.
When rope is in the run, ``step_s / rope step_s`` lines compare every
position with rope. Eval lengths in ``bench.peer_eval_lengths`` also run the
peer's ``--eval-seq`` (one forward, its own peak RSS) and print the ratio.
``--config.bench.one_per_call=True`` also times one step per call, the way the
loop ran before (``step_s_one_per_call`` beside ``step_s_chunked_round``);
``--config.bench.profile=True`` writes the per-op profile of both
(benchmarks.bench_profile). Cases ``quick_grids`` and ``main``
(benchmarks.bench_jobs): the quick grids' per-step times, and the main job's
wall time with a cold and a warm compilation cache.
Each row carries ``load_1min`` (os.getloadavg): distrust rows taken under load.
Training rows also carry ``involuntary_switches_per_step`` (the process's, over the
timed calls: thousands where XLA:CPU's workers shared a CPU) and ``pinned_threads``
(``--config.bench.pin_threads=True``: the workers pinned to one CPU each,
benchmarks.pinning).
Training and evaluation rows also carry ``device`` (jax's device kind),
``dtype`` (the resolved compute dtype) and, on accelerators,
``device_peak_mb``; where the chip's dense bf16 peak is known
(``CHIP_BF16_PEAK``), ``chip_bf16_peak_flops_per_s`` and ``mfu`` =
model_flops_per_s / that peak. Case G is the accelerator case; its peers
(x-transformers, FlexAttention) run from ``benchmarks/accelerator_check.py``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import flags

from benchmarks import workload


def define_flags() -> None:
    """The command line's flags (defined when run as a program, so that importing
    the module, as the tests do, defines none and modules do not clash)."""
    flags.DEFINE_string("config", "benchmarks/cases.py:R", "benchmark case (benchmarks/cases.py:ARG)")
    flags.DEFINE_string("peer_python", "", "python of a venv with torch and x-transformers")
    flags.DEFINE_string("peer_script", "../shared/bench/xt_bench.py", "the peer benchmark script")
    flags.DEFINE_list("positions", [], "subset of the case's positions")
    flags.DEFINE_string("eval_child", "", "internal: POSITION:LENGTH, one eval in this process")

PEER_PE = {"rope": "rotary", "alibi": "alibi", "t5": "t5", "nope": "none", "learned": "abs"}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


# Dense bf16 peak FLOP/s per chip (vendor data sheets, no sparsity), matched in order against
# jax's device_kind, for the model FLOP utilisation (mfu) of accelerator rows.
CHIP_BF16_PEAK = (("H200", 989.4e12), ("H100 PCIe", 756.0e12), ("H100", 989.4e12),
                  ("A100", 312.0e12), ("TPU v6", 918.0e12), ("TPU v5p", 459.0e12),
                  ("TPU v5", 197.0e12), ("TPU v4", 275.0e12))


def chip() -> dict:
    """The first device's kind, its dense bf16 peak (None if unknown) and its peak memory use."""
    import jax

    device = jax.devices()[0]
    kind = device.device_kind
    peak = next((p for name, p in CHIP_BF16_PEAK if name.lower() in kind.lower()), None)
    stats = (device.memory_stats() or {}) if device.platform != "cpu" else {}
    used = stats.get("peak_bytes_in_use")
    return dict(device=kind, chip_bf16_peak_flops_per_s=peak,
                device_peak_mb=None if used is None else round(used / 2 ** 20, 1))


def matmul_peak_flops_per_s(n: int = 1024, repeats: int = 10) -> float:
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(a, a).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times)


def bench_train(config, position: str, peak: float, rounds: int = 1):
    """Yields one row per round; the chunk compiles once, each round times fresh steps.

    A round runs ``bench.warmup`` steps, then ``bench.steps`` steps in calls of k
    (``bench.steps_per_call``; "auto": the training loop's rule), each call
    timed: step_s is the median over calls of call time / k. With
    ``bench.one_per_call`` each round also runs ``bench.steps`` single-step
    calls of ``train_step_fn`` the way the loop ran them before k steps per call
    (the step's key folded on the host, no sync until the end), right after the
    chunked steps: ``step_s_one_per_call`` and ``step_s_chunked_round`` are the
    two rounds' wall time per step.
    """
    import jax

    from posenc.training import step as step_lib
    from posenc.training import steploop

    c = workload.config_for(config, position)
    model, graphdef, state = workload.fresh_state(c)
    buffer = steploop.AUTO_MAX if c.bench.steps_per_call == "auto" else int(c.bench.steps_per_call)
    chunks = workload.Chunks(c, buffer)
    t = time.perf_counter()
    state, metrics = chunks(graphdef, state, 1)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t
    pinned = {}
    if c.bench.pin_threads:  # the worker pool exists now
        from benchmarks import pinning

        pinned = pinning.pin_compute_threads()
    k, state = workload.steps_per_call(c, chunks, graphdef, state)
    single = None
    if c.bench.one_per_call:
        single = step_lib.train_step_fn(workload.train_spec(c))
        _, graphdef1, state1 = workload.fresh_state(c)
        root1 = jax.random.key(1)
        state1, m = single(graphdef1, state1, root1)
        jax.block_until_ready(m)
        i1 = 0
    for r in range(rounds):
        state, metrics = chunks(graphdef, state, int(c.bench.warmup))
        jax.block_until_ready(metrics)
        times, calls = [], max(1, -(-int(c.bench.steps) // k))
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        t_round = time.perf_counter()
        for _ in range(calls):
            t = time.perf_counter()
            state, metrics = chunks(graphdef, state, k)
            jax.block_until_ready(metrics)
            times.append((time.perf_counter() - t) / k)
        chunked_round = (time.perf_counter() - t_round) / (calls * k)
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches
        if single is not None:
            t_round, pending = time.perf_counter(), []
            for _ in range(calls * k):
                state1, m = single(graphdef1, state1, jax.random.fold_in(root1, i1))
                pending.append(m)
                i1 += 1
            jax.block_until_ready(pending)
            one_round = (time.perf_counter() - t_round) / (calls * k)
        tokens = int(c.train.batch_size) * int(c.task.train_length)
        step_s = statistics.median(times)
        tok_s = tokens / step_s
        dev = chip()
        if dev["chip_bf16_peak_flops_per_s"]:  # model FLOP utilisation of the chip's bf16 peak
            dev["mfu"] = round(tok_s * workload.flops_per_token(model, c) / dev["chip_bf16_peak_flops_per_s"], 4)
        dev["dtype"] = workload.spec(c).dtype
        row = dict(case=c.bench.case, position=position, round=r, train_tokens_per_s=round(tok_s, 1),
                   step_s=round(step_s, 5), steps_per_call=k,
                   step_s_spread=[round(min(times), 5), round(max(times), 5)],
                   involuntary_switches_per_step=round(switches / (calls * k), 1),
                   pinned_threads=len(pinned),
                   model_flops_per_s=round(tok_s * workload.flops_per_token(model, c), 1),
                   matmul_peak_flops_per_s=round(peak, 1), compile_s=round(compile_s, 2),
                   peak_rss_mb=round(peak_rss_mb(), 1),
                   loss=round(float(metrics["loss"][(k - 1)]), 4),
                   **dev, load_1min=round(os.getloadavg()[0], 2))
        if single is not None:
            row.update(step_s_one_per_call=round(one_round, 5), step_s_chunked_round=round(chunked_round, 5),
                       one_per_call_over_chunked=round(one_round / chunked_round, 3))
        yield row


def _stats_in_step(config):
    """The train step as it was before diagnostics left the hot path: the loss forward returns
    them (return_stats=True), which rules out the fused attention path on every step. Measurement
    only: the library's step (posenc.training.step) collects no diagnostics."""
    import jax
    import optax
    from flax import nnx

    from posenc.training import optim
    from posenc.training import step as step_lib

    spec = workload.train_spec(config)
    schedule = optim.learning_rate_schedule(spec.optimizer)

    def step(graphdef, state, key):
        model, optimizer = nnx.merge(graphdef, state)
        batch, positions = step_lib._train_batch(spec, key, None)
        mgraph, params, rest = nnx.split(model, nnx.Param, ...)

        def loss_fn(params):
            logits, stats = nnx.merge(mgraph, params, rest)(batch["inputs"], positions,
                                                            deterministic=False, return_stats=True)
            metrics = step_lib.masked_metrics(logits, batch["targets"], batch["mask"])
            return metrics["loss"], {**metrics, **stats}

        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["lr"] = schedule(optimizer.step[...])
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), metrics

    return jax.jit(step, donate_argnums=(1,))


def bench_stats_ab(config, position: str, rounds: int):
    """Median step time of the current step and of the stats-in-step one, interleaved step by step."""
    import jax
    from flax import nnx

    from posenc.training import optim
    from posenc.training import step as step_lib

    c = workload.config_for(config, position)
    fns = {"current": step_lib.train_step_fn(workload.train_spec(c)), "stats_in_step": _stats_in_step(c)}
    states = {}
    for name in fns:
        model = workload.build(c)
        optimizer = nnx.Optimizer(model, optim.make_optimizer(workload.train_spec(c).optimizer), wrt=nnx.Param)
        graphdef, states[name] = nnx.split((model, optimizer))
    key = jax.random.key(0)
    for name, fn in fns.items():  # compile
        states[name], m = fn(graphdef, states[name], key)
        jax.block_until_ready(m)
    times = {name: [] for name in fns}
    i = 0
    for _ in range(rounds * (int(c.bench.warmup) + int(c.bench.steps))):
        for name, fn in fns.items():
            t = time.perf_counter()
            states[name], m = fn(graphdef, states[name], jax.random.fold_in(key, i))
            jax.block_until_ready(m)
            times[name].append(time.perf_counter() - t)
        i += 1
    med = {n: statistics.median(v[int(c.bench.warmup):]) for n, v in times.items()}
    return dict(case=c.bench.case, position=position, measure="train step: diagnostics in the step vs not",
                step_s_current=round(med["current"], 5), step_s_stats_in_step=round(med["stats_in_step"], 5),
                ratio_stats_in_step_over_current=round(med["stats_in_step"] / med["current"], 3),
                steps_each=len(times["current"]) - int(c.bench.warmup),
                load_1min=round(os.getloadavg()[0], 2))


def bench_eval(config, position: str, length: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    c = workload.config_for(config, position)
    model = workload.build(c)
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, tokens):
        return nnx.merge(graphdef, state)(tokens, deterministic=True)[:, -1]

    tokens = jax.random.randint(jax.random.key(1), (1, length), 0, int(c.model.vocab_size), jnp.int32)
    t = time.perf_counter()
    forward = forward.lower(state, tokens).compile()  # compile without a (64K: minutes) run
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(int(c.bench.eval_repeats)):
        t = time.perf_counter()
        forward(state, tokens).block_until_ready()
        times.append(time.perf_counter() - t)
    return dict(case=c.bench.case, position=position, eval_length=length,
                eval_tokens_per_s=round(length / statistics.median(times), 1),
                eval_s=round(statistics.median(times), 3), compile_s=round(compile_s, 2),
                peak_rss_mb=round(peak_rss_mb(), 1), **chip(), dtype=workload.spec(c).dtype,
                load_1min=round(os.getloadavg()[0], 2))


def _peer(config, position: str, eval_length: int = 0) -> dict | None:
    if not flags.FLAGS.peer_python or position not in PEER_PE or not config.bench.peer:
        return None
    m = config.model
    cmd = [flags.FLAGS.peer_python, flags.FLAGS.peer_script, "--pe", PEER_PE[position], "--dim", str(m.d_model),
           "--depth", str(m.num_layers), "--heads", str(m.num_heads), "--batch", str(config.train.batch_size),
           "--seq", str(config.task.train_length), "--vocab", str(m.vocab_size),
           "--steps", str(config.bench.steps), "--warmup", str(config.bench.warmup)]
    if eval_length:
        cmd += ["--eval-seq", str(eval_length), "--steps", "1", "--warmup", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"case": config.bench.case, "position": position, "peer": "x-transformers",
                "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return {"case": config.bench.case, "position": position, "peer": "x-transformers", **row}


def _eval_in_child(position: str, length: int) -> dict:
    argv = [sys.executable, "-m", "benchmarks.benchmark", f"--config={_config_arg()}",
            f"--eval_child={position}:{length}"]
    argv += [a for a in sys.argv[1:] if a.startswith("--config.")]  # the same overrides
    from posenc.experiments import runtime

    plugins = runtime.plugin_names(sys.argv)
    if plugins:
        argv.append(f"--plugins={','.join(plugins)}")
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        return {"position": position, "eval_length": length, "error": tail}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _config_arg() -> str:
    for a in sys.argv[1:]:
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    i = sys.argv.index("--config") if "--config" in sys.argv else -1
    return sys.argv[i + 1] if i >= 0 else "benchmarks/cases.py:R"


def main(argv):
    del argv
    config = runtime.config(None)
    if flags.FLAGS.eval_child:
        position, length = flags.FLAGS.eval_child.split(":")
        _emit(bench_eval(config, position, int(length)))
        return
    positions = list(flags.FLAGS.positions) or list(config.bench.positions)
    case = config.bench.case
    if case in ("quick_grids", "main"):
        from benchmarks import bench_jobs

        return (bench_jobs.quick_grids if case == "quick_grids" else bench_jobs.main_job)(config, _emit)
    if config.bench.profile:
        from benchmarks import bench_profile

        for position in positions:
            for row in bench_profile.profile(config, position, workload.fresh_state):
                _emit(row)
        return
    if config.bench.stats_ab:
        for position in positions:
            _emit(bench_stats_ab(config, position, int(config.bench.rounds)))
        return
    if config.bench.train:
        peak = matmul_peak_flops_per_s()
        step_s = {}
        for position in positions:
            ratios, steps = [], []
            # Each round: posenc steps, then the peer right after (side by side).
            for row in bench_train(config, position, peak, int(config.bench.rounds)):
                _emit(row)
                steps.append(row["step_s"])
                peer = _peer(config, position)
                if peer is not None:
                    _emit(peer)
                    if "train_tok_s" in peer:
                        ratios.append(row["train_tokens_per_s"] / peer["train_tok_s"])
                        _emit({"case": case, "position": position, "round": row["round"],
                               "ratio": "train_tokens_per_s posenc/x-transformers",
                               "value": round(ratios[-1], 3)})
            step_s[position] = statistics.median(steps)
            if len(ratios) > 1:
                _emit({"case": case, "position": position, "ratio": "train_tokens_per_s posenc/x-transformers",
                       "median_of_rounds": round(statistics.median(ratios), 3),
                       "rounds": [round(r, 3) for r in ratios]})
        if "rope" in step_s:
            for position, s in step_s.items():
                _emit({"case": case, "position": position, "ratio": "step_s / rope step_s",
                       "value": round(s / step_s["rope"], 3)})
    for length in config.bench.eval_lengths:
        for position in positions:
            row = {"case": case, **_eval_in_child(position, int(length))}
            _emit(row)
            if int(length) in tuple(config.bench.peer_eval_lengths):
                peer = _peer(config, position, int(length))
                if peer is not None:
                    _emit(peer)
                    if "eval_s" in peer and "eval_tokens_per_s" in row:
                        _emit({"case": case, "position": position, "eval_length": int(length),
                               "ratio": "eval_tokens_per_s posenc/x-transformers",
                               "value": round(row["eval_tokens_per_s"] * peer["eval_s"] / int(length), 3),
                               "peak_rss_mb": [row["peak_rss_mb"], round(peer["peak_rss_mb"], 1)]})


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from posenc.experiments import runtime

    define_flags()
    runtime.main(main)
