"""Hybrid decoders (recurrent layers 3:1 with attention) against the all-attention model of the same width.

    python -m benchmarks.hybrid_speed --rounds 3
    python -m benchmarks.hybrid_speed --parts train --train_length 512 --batch 2    # a quick check
    python -m benchmarks.hybrid_speed --parts train --train_length 293 --batch 32 --d_model 64 \
        --mamba2_chunk 32 --gdn_chunk 32     # the scans' chunk (the result does not depend on it)

The models (case R's, benchmarks/cases.py: 4 heads, vocab 256, LayerNorm pre-norm, GELU MLP, rope in the
attention layers; the recurrent layers keep posenc.model.recurrent_options' default sizes):

    attention     every layer attention
    gdn_3to1      gated_deltanet x3, attention in the 4th layer of every 4 (Qwen3-Next's placement)
    mamba2_3to1   mamba2 x3, attention in the 4th
    gdn_only      every layer gated_deltanet (decode only)
    mamba2_only   every layer mamba2 (decode only)

The attention model decodes too, as the contrast of the hybrids' growing attention layer.

Three parts (``--parts``), one JSON row per measurement, then a verdict line per part against its target:

* ``train``: tokens/s of the train chunk program (``--steps`` steps per timed call, as the loop runs them)
  at ``--train_length`` x ``--batch``, ``--d_model``, ``--layers``; the models alternate each round and
  each hybrid's ratio to the attention model is paired per round. Target: a hybrid at least half the
  attention model's tokens/s.
* ``decode``: per-token time of ``Decoder.decode`` (one jitted step, the cache donated) after a prefill of
  each ``--contexts`` length (prefilled through ``Decoder.decode`` in pieces of ``--prefill_piece``), at
  ``--decode_d_model``, batch 1. Target: an all-recurrent model's per-token time flat in the context
  (longest / shortest context at most ``--flat_tolerance``); the hybrid's attention layer grows with it.
* ``memory``: peak memory of the teacher-forced forward (``model(tokens)``, jitted, batch 1) at
  ``--memory_length``, ``--memory_d_model``, each model in its own child process: XLA's compiled memory
  analysis (temporaries + arguments + outputs: noise free) and the process's peak RSS during the call
  (VmHWM reset through /proc/self/clear_refs after compiling; ``--memory_timeout`` keeps the analysis
  alone of a forward that runs past it). Target: a hybrid's XLA temporaries (the evaluation's working
  memory) at most the attention model's; the totals, which add each model's own parameters, and the RSS
  peak are printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

TRAIN_MODELS = ("attention", "gdn_3to1", "mamba2_3to1")
DECODE_MODELS = ("gdn_only", "mamba2_only", "gdn_3to1", "mamba2_3to1", "attention")
MEMORY_MODELS = ("attention", "gdn_3to1", "mamba2_3to1")


def layer_types(name: str) -> tuple[str, ...]:
    if name == "attention":
        return ()
    kind, _, shape = name.partition("_")
    kind = {"gdn": "gated_deltanet", "mamba2": "mamba2"}[kind]
    return (kind,) if shape == "only" else (kind, kind, kind, "attention")


def config(name: str, *, d_model: int, layers: int, length: int, batch: int, chunks: dict | None = None):
    from benchmarks import cases, workload
    from posenc.config import overrides
    from posenc.training import schema

    c = workload.config_for(cases.get_config("R"), "rope")
    with c.unlocked():
        overrides.apply(c, {"model.d_model": d_model, "model.num_layers": layers, "task.train_length": length,
                            "train.batch_size": batch, "model.layer_types": layer_types(name),
                            **(chunks or {})}, schema=schema.Run)
    return c


def chunk_overrides(args, name: str | None = None) -> dict:
    """``--mamba2_chunk`` / ``--gdn_chunk`` as config fields (0: the option's default), for the kinds of
    model ``name`` (None: both; a model without the kind refuses its options)."""
    kinds = set(layer_types(name)) if name else {"mamba2", "gated_deltanet"}
    out = {}
    if args.mamba2_chunk and "mamba2" in kinds:
        out["model.recurrent.mamba2.chunk_size"] = args.mamba2_chunk
    if args.gdn_chunk and "gated_deltanet" in kinds:
        out["model.recurrent.gated_deltanet.chunk_size"] = args.gdn_chunk
    return out


def machine() -> dict:
    import jax

    return {"machine": f"{platform.machine()} {os.cpu_count()} cpus, jax {jax.__version__} {jax.default_backend()}",
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def train_part(args) -> None:
    import jax
    import numpy as np

    from benchmarks import workload
    from posenc.training import step as step_lib

    k = args.steps

    def trainer(name):
        c = config(name, d_model=args.d_model, layers=args.layers, length=args.train_length, batch=args.batch,
                   chunks=chunk_overrides(args, name))
        fn = step_lib.train_chunk_fn(workload.train_spec(c), k)
        _, graphdef, state = workload.fresh_state(c)
        box = {"state": state, "t": 0}

        def call():
            start = time.perf_counter()
            box["state"], metrics = fn(graphdef, box["state"], jax.random.key(0), np.int32(box["t"]), np.int32(k))
            jax.block_until_ready(metrics)
            box["t"] += k
            return time.perf_counter() - start

        began = time.perf_counter()
        call()  # compile
        print(json.dumps({"kind": "train_compile", "model": name, "seconds": round(time.perf_counter() - began, 1)}),
              flush=True)
        return call

    calls = {name: trainer(name) for name in TRAIN_MODELS}
    tokens = args.batch * args.train_length
    seen: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(args.rounds):
        order = list(calls) if r % 2 == 0 else list(calls)[::-1]  # alternate who goes first
        for name in order:
            seconds = calls[name]() / k
            seen[name].append(tokens / seconds)
            print(json.dumps({"kind": "train", "model": name, "round": r, "tokens_per_s": round(tokens / seconds),
                              "ms_per_step": round(seconds * 1e3, 1), "steps_per_call": k,
                              "load_average": round(os.getloadavg()[0], 2)}), flush=True)
    med = {n: statistics.median(v) for n, v in seen.items()}
    parts = []
    for name in TRAIN_MODELS[1:]:
        ratios = [h / a for h, a in zip(seen[name], seen["attention"])]
        ratio = statistics.median(ratios)
        parts.append(f"{name} / attention {ratio:.3f} ({', '.join(f'{x:.3f}' for x in ratios)}): "
                     f"{'HOLDS' if ratio >= 0.5 else 'MISSED'}")
    chunks = "".join(f", {k.split('.')[2]} chunk {v}" for k, v in chunk_overrides(args).items())
    print(f"train (L {args.train_length}, batch {args.batch}, d_model {args.d_model}, {args.layers} layers{chunks}) "
          "tokens/s median: " + ", ".join(f"{n} {v:,.0f}" for n, v in med.items())
          + "; target hybrid >= 0.5 x attention: " + "; ".join(parts), flush=True)


def decode_part(args) -> None:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from benchmarks import workload

    longest = max(args.contexts) + args.decode_steps + 1
    results: dict[str, dict[int, float]] = {}
    for name in args.decode_models:
        c = config(name, d_model=args.decode_d_model, layers=args.layers, length=longest, batch=1)
        model = workload.build(c)
        graphdef, state = nnx.split(model)

        @jax.jit
        def step(state, tokens, cache):
            return nnx.merge(graphdef, state).decode(tokens, cache)

        step_donating = jax.jit(lambda s, t, cache: nnx.merge(graphdef, s).decode(t, cache), donate_argnums=2)
        results[name] = {}
        for context in args.contexts:
            cache = model.init_cache(1, context + args.decode_steps + 1)
            piece = min(args.prefill_piece, context)
            tokens = jax.random.randint(jax.random.key(context), (1, context), 0, int(c.model.vocab_size))
            began = time.perf_counter()
            for start in range(0, context, piece):
                _, cache = step(state, tokens[:, start:start + piece], cache)
            jax.block_until_ready(cache)
            prefill = time.perf_counter() - began
            token = jnp.zeros((1, 1), jnp.int32)
            logits, cache = step_donating(state, token, cache)  # compile
            jax.block_until_ready(logits)
            times = []
            for _ in range(args.decode_steps):
                start = time.perf_counter()
                logits, cache = step_donating(state, token, cache)
                jax.block_until_ready(logits)
                times.append(time.perf_counter() - start)
            per_token = statistics.median(times)
            results[name][context] = per_token
            p10, p90 = statistics.quantiles(times, n=10)[::8]
            print(json.dumps({"kind": "decode", "model": name, "d_model": args.decode_d_model, "context": context,
                              "ms_per_token": round(per_token * 1e3, 3),
                              "ms_per_token_p10_p90": [round(p10 * 1e3, 3), round(p90 * 1e3, 3)],
                              "prefill_s": round(prefill, 1), "steps": args.decode_steps,
                              "load_average": round(os.getloadavg()[0], 2)}), flush=True)
            del cache
    lo, hi = min(args.contexts), max(args.contexts)
    parts = []
    for name, row in results.items():
        ratio = row[hi] / row[lo]
        verdict = ("HOLDS" if ratio <= args.flat_tolerance else "MISSED") if name.endswith("_only") else "(grows)"
        parts.append(f"{name} " + " ".join(f"{n}:{t * 1e3:.2f}" for n, t in row.items())
                     + f" ms, {hi}/{lo} {ratio:.2f} {verdict}")
    print(f"decode (d_model {args.decode_d_model}, batch 1) per-token median; target all-recurrent "
          f"{hi}/{lo} <= {args.flat_tolerance}: " + "; ".join(parts), flush=True)


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def memory_child(name: str, args) -> None:
    """One model's teacher-forced forward at --memory_length: one JSON line (run in its own process)."""
    import jax
    from flax import nnx

    from benchmarks import workload

    c = config(name, d_model=args.memory_d_model, layers=args.layers, length=args.memory_length, batch=1)
    model = workload.build(c)
    graphdef, state = nnx.split(model)
    tokens = jax.random.randint(jax.random.key(1), (1, args.memory_length), 0, int(c.model.vocab_size))
    compiled = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t)).lower(state, tokens).compile()
    analysis = compiled.memory_analysis()
    row = {"kind": "memory", "model": name, "length": args.memory_length, "d_model": args.memory_d_model,
           "xla_temp_mib": round(analysis.temp_size_in_bytes / 2**20, 1) if analysis else None,
           "xla_total_mib": round((analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
                                   + analysis.output_size_in_bytes) / 2**20, 1) if analysis else None}
    print(json.dumps(row), flush=True)  # the compiled program's, should the forward not finish in time
    before = _rss("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM: the peak below is the forward's, not the compile's
        reset = True
    except OSError:
        reset = False
    began = time.perf_counter()
    jax.block_until_ready(compiled(state, tokens))
    seconds = time.perf_counter() - began
    row.update(rss_before_mib=round(before / 2**20, 1), peak_rss_mib=round(_rss("VmHWM") / 2**20, 1),
               peak_reset=reset, forward_s=round(seconds, 1), load_average=round(os.getloadavg()[0], 2))
    row["peak_over_before_mib"] = round(row["peak_rss_mib"] - row["rss_before_mib"], 1)
    print(json.dumps(row), flush=True)


def memory_part(args, argv) -> None:
    rows = {}
    for name in MEMORY_MODELS:
        try:
            out = subprocess.run([sys.executable, "-m", "benchmarks.hybrid_speed", *argv, "--memory_child", name],
                                 capture_output=True, text=True, check=False, timeout=args.memory_timeout or None)
            stdout, stderr, failed = out.stdout, out.stderr, out.returncode
        except subprocess.TimeoutExpired as e:  # the compiled analysis only; no RSS peak
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr, failed = "timed out", 0
        lines = [x for x in stdout.splitlines() if x.startswith("{")]
        if failed or not lines:
            print(json.dumps({"kind": "memory", "model": name, "error": stderr[-2000:]}), flush=True)
            continue
        print(lines[-1], flush=True)
        rows[name] = json.loads(lines[-1])
    if "attention" not in rows:
        return
    base = rows["attention"]
    parts = []
    for name in MEMORY_MODELS[1:]:
        if name in rows:
            r = rows[name]
            # the evaluation's own memory: XLA's temporaries (the parameters, which differ by model, are in
            # the total printed beside them; the RSS peak too)
            ok = r["xla_temp_mib"] <= base["xla_temp_mib"]
            parts.append(f"{name} XLA temporaries {r['xla_temp_mib']:,.1f} MiB (total {r['xla_total_mib']:,.1f}), "
                         f"RSS peak +{r.get('peak_over_before_mib', '?')} MiB: {'HOLDS' if ok else 'MISSED'}")
    print(f"memory (L {args.memory_length}, d_model {args.memory_d_model}, batch 1): attention XLA temporaries "
          f"{base['xla_temp_mib']:,.1f} MiB (total {base['xla_total_mib']:,.1f}), RSS peak "
          f"+{base.get('peak_over_before_mib', '?')} MiB; target a hybrid's temporaries <= attention's: "
          + "; ".join(parts), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["train", "decode", "memory"],
                        choices=["train", "decode", "memory"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="train steps per timed call")
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--train_length", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--mamba2_chunk", type=int, default=0,
                        help="the Mamba-2 SSD scan's chunk (training); 0: its default (256)")
    parser.add_argument("--gdn_chunk", type=int, default=0,
                        help="the gated delta rule's chunk (training); 0: its default (64)")
    parser.add_argument("--decode_d_model", type=int, default=128)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--decode_models", nargs="+", default=list(DECODE_MODELS), choices=DECODE_MODELS)
    parser.add_argument("--decode_steps", type=int, default=32, help="timed one-token steps per context")
    parser.add_argument("--prefill_piece", type=int, default=4096, help="tokens per prefill call")
    parser.add_argument("--flat_tolerance", type=float, default=1.25,
                        help="largest longest/shortest per-token time ratio counted as flat")
    parser.add_argument("--memory_length", type=int, default=65536)
    parser.add_argument("--memory_d_model", type=int, default=128)
    parser.add_argument("--memory_timeout", type=int, default=0,
                        help="seconds a child may run (0: no limit); past it, its compiled analysis alone")
    parser.add_argument("--memory_child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        memory_child(args.memory_child, args)
        return
    print(json.dumps({"kind": "machine", **machine(), "argv": sys.argv[1:] if argv is None else argv}), flush=True)
    if "train" in args.parts:
        train_part(args)
    if "decode" in args.parts:
        decode_part(args)
    if "memory" in args.parts:
        memory_part(args, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
