"""The prepared accelerator check: install, accelerator tests, case G side by side with PyTorch.

    python benchmarks/accelerator_check.py                 # on the GPU machine (about 8 minutes)
    python benchmarks/accelerator_check.py --dry_run       # CPU: tiny shapes, Pallas interpreter

Stages, each a subprocess under one time budget (``--budget_s``; a stage that
no longer fits is recorded as skipped):

1. install: the carried wheels of ``benchmarks/wheels`` (ml-collections,
   x-transformers and their pure-Python dependencies; the machine has no
   network) and posenc itself, all with ``--no-deps`` so that the machine's
   jax, flax, optax, orbax-checkpoint, chex and torch stay as they are
   (if the editable install cannot build, posenc runs from the checkout on
   PYTHONPATH);
2. tests: ``pytest -m accelerator`` (compiled kernels vs the XLA path);
3. train: ``experiments.benchmark`` at ``configs/benchmark.py:G`` for rope,
   alibi, t5 and fire (train tokens/s, model FLOP utilisation of the chip's
   bf16 peak), each followed by its PyTorch peers on the same GPU
   (``benchmarks/torch_peer.py``: x-transformers with SDPA flash for RoPE,
   x-transformers' ALiBi and T5 paths, ALiBi in FlexAttention) and a ratio
   row with the issue's target;
4. eval: one forward over 128K tokens (rope first) and 32K tokens per
   position, each in a fresh process, then the peers' evaluations;
5. attention op: ``benchmarks/attention_op.py`` (the kernel's block sizes
   against cuDNN and XLA attention).

Every row is one JSON line, printed and appended to ``--out`` (default
``$OUT/accelerator_check.jsonl`` when ``$OUT`` is set, else a temporary
file), for docs/performance.md. ``--dry_run`` skips the installation (it
checks the wheels instead), runs every other stage at tiny shapes with
``attention_impl=pallas`` in the Pallas interpreter and bf16 compute, and
runs the peers only where torch and x-transformers import (on CPU).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS = os.path.join(ROOT, "benchmarks", "wheels")
POSITIONS = ("rope", "alibi", "t5", "fire")
# position -> its PyTorch peers: (impl, pe) of benchmarks/torch_peer.py
PEERS = {"rope": (("xt", "rotary"),), "alibi": (("xt", "alibi"), ("flex", "alibi")),
         "t5": (("xt", "t5"),)}
# Issue targets: posenc train tokens/s over the peer's, per position (fire has no peer).
TARGETS = {"rope": 1.0, "alibi": 1.5, "t5": 1.5}
EVAL_LENGTHS = (131072, 32768)
PEER_EVALS = (("rope", "xt", "rotary", 32768), ("rope", "xt", "rotary", 131072),
              ("alibi", "flex", "alibi", 32768), ("alibi", "xt", "alibi", 32768))
# Tiny shapes for --dry_run (config overrides of case G).
DRY = {"model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "model.vocab_size": 16,
       "model.attention_impl": "pallas", "model.dtype": "bfloat16", "task.train_length": 32,
       "train.batch_size": 2, "bench.steps": 2, "bench.warmup": 1}
DRY_EVAL_LENGTHS = (64,)
DRY_POSITIONS = ("rope", "alibi")  # no term and a term: every code path, half the compiles


class Check:
    """Runs the stages under one deadline and writes every row."""

    def __init__(self, args):
        self.args = args
        self.deadline = time.monotonic() + args.budget_s
        self.out = open(args.out, "a")
        self.env = dict(os.environ)
        self.env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if not args.dry_run:  # a rerun on the same machine skips most compiles
            self.env.setdefault("JAX_COMPILATION_CACHE_DIR",
                                os.path.join(tempfile.gettempdir(), "posenc_jax_cache"))
        self.env["PYTHONPATH"] = ROOT + os.pathsep + self.env.get("PYTHONPATH", "")
        self.train = {}  # position -> posenc train row
        self.torch = None  # the peer python's torch, once checked
        self.failures = []  # stages whose command failed

    # -- plumbing ---------------------------------------------------------------------
    def emit(self, row):
        row = {"check": "accelerator", "dry_run": self.args.dry_run, **row}
        line = json.dumps(row)
        print(line, flush=True)
        self.out.write(line + "\n")
        self.out.flush()

    def left(self):
        return self.deadline - time.monotonic()

    def run(self, stage, cmd, *, cap, need=10.0, required=True):
        """Run ``cmd`` with a timeout of min(cap, time left); -> (rc, JSON rows, output tail).

        A failed ``required`` command fails the dry run."""
        budget = min(cap, self.left())
        if budget < need:
            self.emit({"stage": stage, "skipped": f"time budget ({self.left():.0f} s left)",
                       "cmd": " ".join(cmd)})
            return None, [], ""
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True,
                               timeout=budget)
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rows = []
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        tail = "\n".join(text.strip().splitlines()[-3:])
        if rc != 0 and required:
            self.failures.append(stage)
            self.emit({"stage": stage, "rc": rc, "seconds": round(time.monotonic() - t, 1),
                       "cmd": " ".join(cmd), "tail": tail[-1500:]})
        return rc, rows, tail

    # -- stages -----------------------------------------------------------------------
    def install(self):
        wheels = sorted(glob.glob(os.path.join(WHEELS, "*.whl")))
        if self.args.dry_run:  # no installation on a developer's machine: check the wheels
            for w in wheels:
                with zipfile.ZipFile(w) as z:
                    assert any(n.endswith(".dist-info/METADATA") for n in z.namelist()), w
            self.emit({"stage": "install", "skipped": "dry run", "wheels_ok": len(wheels),
                       "wheels": [os.path.basename(w) for w in wheels]})
            return
        pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
        rc, _, tail = self.run("install", pip + wheels, cap=120)
        rc2, _, tail2 = self.run("install", pip + ["--no-build-isolation", "-e", ROOT], cap=120)
        self.emit({"stage": "install", "wheels_rc": rc, "posenc_rc": rc2,
                   "posenc": "installed (editable)" if rc2 == 0 else "from the checkout (PYTHONPATH)",
                   "wheels": [os.path.basename(w) for w in wheels]})

    def environment(self):
        code = ("import json, sys, jax, flax, posenc; from posenc.model import fused; "
                "d = jax.devices()[0]; print(json.dumps(dict(python=sys.version.split()[0], "
                "jax=jax.__version__, flax=flax.__version__, platform=jax.default_backend(), "
                "device=d.device_kind, devices=jax.device_count(), accelerator=fused.on_accelerator())))")
        _, rows, tail = self.run("environment", [sys.executable, "-c", code], cap=120)
        self.emit({"stage": "environment", **(rows[-1] if rows else {"error": tail})})
        code = "import json, torch; print(json.dumps(dict(torch=torch.__version__, cuda=torch.cuda.is_available())))"
        _, rows, tail = self.run("environment", [self.args.peer_python, "-c", code], cap=60,
                                 required=False)  # no torch: the peers are skipped
        self.torch = rows[-1] if rows else None
        self.emit({"stage": "environment", "peer_python": self.args.peer_python,
                   **(self.torch or {"torch": None, "error": tail})})

    def tests(self):
        cmd = [sys.executable, "-m", "pytest", "-m", "accelerator", "-q", "-p", "no:cacheprovider",
               "tests/test_fused_model.py", "tests/test_flash_kernel.py"]
        rc, _, tail = self.run("tests", cmd, cap=180, need=30)
        if rc is not None:
            self.emit({"stage": "tests", "rc": rc, "summary": tail.splitlines()[-1] if tail else ""})

    def _overrides(self):
        if self.args.dry_run:
            return [f"--config.{k}={v}" for k, v in DRY.items()]
        return [f"--config.train.batch_size={self.args.batch}"] if self.args.batch else []

    def _bench(self, stage, extra, cap):
        cmd = [sys.executable, "-m", "experiments.benchmark", "--config=configs/benchmark.py:G",
               *self._overrides(), *extra]
        _, rows, _ = self.run(stage, cmd, cap=cap, need=20)
        return rows

    def _shape(self):
        if self.args.dry_run:
            d = {k.split(".")[-1]: v for k, v in DRY.items()}
            return dict(dim=d["d_model"], depth=d["num_layers"], heads=d["num_heads"],
                        batch=d["batch_size"], seq=d["train_length"], vocab=d["vocab_size"],
                        steps=d["steps"], warmup=d["warmup"])
        return dict(dim=1024, depth=12, heads=16, batch=self.args.batch or 16, seq=2048, vocab=256,
                    steps=10, warmup=3)

    def _peer(self, stage, position, impl, pe, eval_seq=0):
        if not self.torch:
            self.emit({"stage": stage, "position": position, "peer": impl,
                       "skipped": "torch is not importable by --peer_python"})
            return None
        s = self._shape()
        cmd = [self.args.peer_python, "benchmarks/torch_peer.py", "--impl", impl, "--pe", pe,
               *(x for k, v in s.items() for x in (f"--{k}", str(v)))]
        if eval_seq:
            cmd += ["--eval-seq", str(eval_seq), "--steps", "1", "--warmup", "0"]
        if not self.torch.get("cuda"):
            cmd += ["--device", "cpu"]
        _, rows, _ = self.run(stage, cmd, cap=150 if not eval_seq else 120, need=15)
        if not rows:
            return None
        row = {"stage": stage, "position": position, "peer": impl, **rows[-1]}
        self.emit(row)
        return row

    def train_stage(self):
        groups = [list(self.args.positions)] if self.args.dry_run else [[p] for p in self.args.positions]
        for group in groups:
            # Evaluations run below, one fresh process each.
            extra = [f"--positions={','.join(group)}", "--config.bench.eval_lengths=()"]
            rows = self._bench("train", extra, cap=200)
            if not any("train_tokens_per_s" in r for r in rows) and not self.args.dry_run:
                # The kernel path failed here: numbers from the XLA path, marked as such.
                rows = [{**r, "fallback": "attention_impl=blocked"} for r in self._bench(
                    "train", extra + ["--config.model.attention_impl=blocked"], cap=200)]
            for row in rows:
                self.emit({"stage": "train", **row})
                if "train_tokens_per_s" in row:
                    self.train[row["position"]] = row
            for position in group:
                for impl, pe in PEERS.get(position, ()):
                    peer = self._peer("train", position, impl, pe)
                    if peer and "train_tok_s" in peer and position in self.train:
                        ratio = self.train[position]["train_tokens_per_s"] / peer["train_tok_s"]
                        target = TARGETS.get(position)
                        self.emit({"stage": "train", "position": position,
                                   "ratio": f"train_tokens_per_s posenc/{impl}",
                                   "value": round(ratio, 3), "target": target,
                                   "met": None if target is None else ratio >= target})

    def eval_stage(self):
        lengths = DRY_EVAL_LENGTHS if self.args.dry_run else EVAL_LENGTHS
        order = [(L, p) for L in lengths for p in self.args.positions]
        if self.args.dry_run:
            order = [(lengths[0], "alibi")]
        evals = {}
        for length, position in order:
            rows = self._bench("eval", [f"--eval_child={position}:{length}"], cap=150)
            for row in rows:
                self.emit({"stage": "eval", **row})
                evals[(position, length)] = row
        peer_evals = [("alibi", "xt", "alibi", lengths[0])] if self.args.dry_run else PEER_EVALS
        for position, impl, pe, length in peer_evals:
            peer = self._peer("eval", position, impl, pe, eval_seq=length)
            mine = evals.get((position, length), {})
            if peer and "eval_tok_s" in peer and "eval_tokens_per_s" in mine:
                self.emit({"stage": "eval", "position": position, "eval_length": length,
                           "ratio": f"eval_tokens_per_s posenc/{impl}",
                           "value": round(mine["eval_tokens_per_s"] / peer["eval_tok_s"], 3)})

    def attention_op(self):
        cmd = [sys.executable, "benchmarks/attention_op.py"] + (["--dry_run"] if self.args.dry_run else [])
        _, rows, _ = self.run("attention_op", cmd, cap=150, need=30)
        for row in rows:
            self.emit({"stage": "attention_op", **row})

    def summary(self):
        targets = {}
        for position, target in TARGETS.items():
            if position in self.train:
                targets[position] = {"posenc_train_tokens_per_s": self.train[position]["train_tokens_per_s"],
                                     "mfu": self.train[position].get("mfu"), "target_ratio": target}
        self.emit({"stage": "summary", "positions_trained": sorted(self.train), "targets": targets,
                   "failed_stages": sorted(set(self.failures)),
                   "seconds_left": round(self.left(), 1), "out": self.args.out})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry_run", action="store_true", help="CPU: tiny shapes, Pallas interpreter")
    ap.add_argument("--out", default="", help="JSON lines file (default $OUT/accelerator_check.jsonl)")
    ap.add_argument("--budget_s", type=float, default=0.0,
                    help="time for all stages (default 470 s; 1200 s for --dry_run, slow CPUs)")
    ap.add_argument("--positions", default=",".join(POSITIONS))
    ap.add_argument("--batch", type=int, default=0, help="train batch of case G (0: the config's 16)")
    ap.add_argument("--peer_python", default=sys.executable, help="python with torch (+ x-transformers)")
    ap.add_argument("--stages", default="install,environment,tests,train,eval,attention_op")
    args = ap.parse_args(argv)
    args.budget_s = args.budget_s or (1200.0 if args.dry_run else 470.0)
    args.positions = tuple(p for p in args.positions.split(",") if p)
    if args.dry_run and args.positions == POSITIONS:
        args.positions = DRY_POSITIONS
    if not args.out:
        folder = os.environ.get("OUT") or tempfile.mkdtemp(prefix="posenc_check_")
        args.out = os.path.join(folder, "accelerator_check.jsonl")
    check = Check(args)
    stages = {"install": check.install, "environment": check.environment, "tests": check.tests,
              "train": check.train_stage, "eval": check.eval_stage,
              "attention_op": check.attention_op}
    for name in args.stages.split(","):
        stages[name]()
    check.summary()
    # The dry run is a test (CI): any failed command fails it. On the accelerator every
    # stage is attempted and reported, whatever failed.
    return 1 if (args.dry_run and check.failures) else 0


if __name__ == "__main__":
    sys.exit(main())
