"""The prepared accelerator check: install, accelerator tests, case G side by side with PyTorch,
Cho et al.'s addition at their scale, long-context evaluation.

    python benchmarks/accelerator_check.py                 # on the GPU machine (at most 9.5 minutes)
    python benchmarks/accelerator_check.py --plan          # any host: each stage's H200 seconds, first
    python benchmarks/accelerator_check.py --dry_run       # CPU: tiny shapes, Pallas interpreter

Stages, each a subprocess under one time budget (``--budget_s``; a stage that
no longer fits is recorded as skipped), in order of importance, so that a
check cut short still leaves the rows that matter most (``--plan`` says
where the budget cuts):

1. install: the carried wheels of ``benchmarks/wheels`` (ml-collections,
   x-transformers and their pure-Python dependencies; the machine has no
   network) and posenc itself, all with ``--no-deps`` so that the machine's
   jax, flax, optax, orbax-checkpoint, chex and torch stay as they are
   (if the editable install cannot build, posenc runs from the checkout on
   PYTHONPATH);
2. environment: every library's version; below the versions ``pyproject.toml``
   requires, the check stops there with one line saying which (exit 2);
3. tests: ``pytest -m accelerator`` (compiled kernels vs the XLA path);
4. train: ``benchmarks.benchmark`` at ``benchmarks/cases.py:G`` for rope
   and alibi (train tokens/s, model FLOP utilisation of the chip's bf16
   peak), each followed by its PyTorch peers on the same GPU
   (``benchmarks/torch_peer.py``: x-transformers with SDPA flash for RoPE,
   x-transformers' ALiBi path, ALiBi in FlexAttention) and a ratio row with
   the speed target;
5. addition: ``compare:arithmetic_cho_small`` (``python -m posenc compare``), Cho et al. 2024's
   small run at their model and batch (operands of 1-5 digits, tested at 5,
   10 and 15; position coupling, NoPE and RoPE, 2 seeds vmapped) for
   ``--addition_steps`` steps of their 50,000 (the cosine schedule over those
   steps), a row per run and size (decoded exact match) and a mean per arm;
6. train_more: case G for t5 and fire as in 4 (x-transformers' T5 path);
7. eval: one forward over 128K tokens (rope first) and 32K tokens per
   position, each in a fresh process, then the peers' evaluations;
8. attention op: ``benchmarks/attention_op.py`` (the kernel's block sizes
   against cuDNN and XLA attention).

Every row is one JSON line, printed and appended to ``--out`` (default
``$OUT/accelerator_check.jsonl`` when ``$OUT`` is set, else a temporary
file), for docs/performance.md. ``--dry_run`` skips the installation (it
checks the wheels instead), runs every other stage at tiny shapes with
``attention_impl=pallas`` in the Pallas interpreter and bf16 compute, and
runs the peers only where torch and x-transformers import (on CPU).
``--plan`` runs nothing on a device: it prints each stage's estimated
seconds on one H200 (its model FLOPs at an assumed utilisation, plus fixed
costs for process start and compiles) beside what the same FLOPs take on
this host at the rate of a measured training step, and the total against
the budget, so that a check is sized before the machine starts.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
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
STAGES = ("install", "environment", "tests", "train", "addition", "train_more", "eval", "attention_op")
TRAIN_FIRST = 2  # train: the first positions (rope, alibi: the speed targets); train_more: the others
BUDGET_S = 570.0  # the stages' time on the device: 9.5 minutes of a 10-minute command
ADDITION = "compare:arithmetic_cho_small"  # a packaged config (configs/compare.py)
ADDITION_STEPS = 4000  # of Cho et al.'s 50,000: what a 10-minute check affords after train (--plan)
DRY_ADDITION = {"base.model.d_model": 32, "base.model.num_heads": 2, "base.train.batch_size": 8,
                "base.eval.batch_size": 8, "base.eval.num_batches": 1, "base.train.log_every": 2,
                "base.train.checkpoint_every": 4}
DRY_ADDITION_STEPS = 4
# The libraries whose versions the environment stage reports (pyproject.toml sets the minimums).
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "chex", "orbax-checkpoint", "ml-collections", "absl-py",
             "numpy", "matplotlib", "tqdm", "jax-cuda13-plugin", "jax-cuda12-plugin", "libtpu", "torch",
             "x-transformers", "einops")

DRY_POSITIONS = ("rope", "alibi")  # no term and a term: every code path, half the compiles


class Stop(Exception):
    """The check cannot go on here (its one-line reason); the stages after it are not run."""


def _version(text: str) -> tuple:
    """'0.11.2' -> (0, 11, 2); a pre-release or local suffix is dropped ('2.13.0+cu130' -> (2, 13, 0))."""
    out = []
    for part in text.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def minimum_versions() -> dict:
    """{distribution: minimum version} of pyproject.toml's dependencies (the ``>=`` ones)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    out = {}
    for dep in deps:
        name, _, minimum = dep.partition(">=")
        if minimum:
            out[name.strip().split("[")[0]] = minimum.split(",")[0].strip()
    return out


def unsupported(versions: dict) -> list[str]:
    """'name found < minimum' for each installed-or-missing dependency below pyproject.toml's minimum."""
    out = []
    for name, minimum in minimum_versions().items():
        found = versions.get(name)
        if found is None:
            out.append(f"{name} missing (needs >= {minimum})")
        elif _version(found) < _version(minimum):
            out.append(f"{name} {found} < {minimum}")
    return out


def _distribution(wheel: str) -> str:
    """'.../orbax_checkpoint-0.12.8-py3-none-any.whl' -> 'orbax-checkpoint'."""
    return os.path.basename(wheel).split("-")[0].replace("_", "-").lower()


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
    def _versions(self, stage="install") -> dict:
        """{distribution: version} of the check's python, for LIBRARIES and pyproject's dependencies."""
        names = sorted(set(LIBRARIES) | set(minimum_versions()))
        code = ("import json, importlib.metadata as md\n"
                "def v(n):\n"
                "    try: return md.version(n)\n"
                "    except md.PackageNotFoundError: return None\n"
                f"print(json.dumps({{n: v(n) for n in {names!r}}}))")
        _, rows, _ = self.run(stage, [sys.executable, "-c", code], cap=60)
        return {n: v for n, v in (rows[-1] if rows else {}).items() if v}

    def install(self):
        wheels = sorted(glob.glob(os.path.join(WHEELS, "*.whl")))
        fallback = sorted(glob.glob(os.path.join(WHEELS, "fallback", "*.whl")))
        if self.args.dry_run:  # no installation on a developer's machine: check the wheels
            for w in wheels + fallback:
                with zipfile.ZipFile(w) as z:
                    assert any(n.endswith(".dist-info/METADATA") for n in z.namelist()), w
            self.emit({"stage": "install", "skipped": "dry run", "wheels_ok": len(wheels + fallback),
                       "wheels": [os.path.basename(w) for w in wheels + fallback]})
            return
        pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
        rc, _, tail = self.run("install", pip + wheels, cap=120)
        # The image's own flax, optax, chex, orbax where they meet pyproject.toml; the carried
        # ones (the versions pip resolves beside jax 0.11.2) only where they do not.
        below = {line.split()[0] for line in unsupported(self._versions())}
        needed = [w for w in fallback if _distribution(w) in below]
        rc3 = self.run("install", pip + needed, cap=120)[0] if needed else None
        rc2, _, tail2 = self.run("install", pip + ["--no-build-isolation", "-e", ROOT], cap=120)
        self.emit({"stage": "install", "wheels_rc": rc, "posenc_rc": rc2, "fallback_rc": rc3,
                   "posenc": "installed (editable)" if rc2 == 0 else "from the checkout (PYTHONPATH)",
                   "wheels": [os.path.basename(w) for w in wheels + needed]})

    def environment(self):
        code = ("import json, sys, jax, flax, posenc; from posenc.model import fused; "
                "d = jax.devices()[0]; print(json.dumps(dict(python=sys.version.split()[0], "
                "platform=jax.default_backend(), device=d.device_kind, devices=jax.device_count(), "
                "accelerator=fused.on_accelerator())))")
        versions = self._versions("environment")
        below = unsupported(versions)  # before anything imports them
        if below:
            self.emit({"stage": "environment", "versions": versions})
            raise Stop(f"below the supported versions (pyproject.toml): {'; '.join(below)}")
        _, rows, tail = self.run("environment", [sys.executable, "-c", code], cap=120)
        self.emit({"stage": "environment", **(rows[-1] if rows else {"error": tail}), "versions": versions})
        code = "import json, torch; print(json.dumps(dict(torch=torch.__version__, cuda=torch.cuda.is_available())))"
        _, rows, tail = self.run("environment", [self.args.peer_python, "-c", code], cap=60,
                                 required=False)  # no torch: the peers are skipped
        self.torch = rows[-1] if rows else None
        self.emit({"stage": "environment", "peer_python": self.args.peer_python,
                   **(self.torch or {"torch": None, "error": tail})})

    def tests(self):
        cmd = [sys.executable, "-m", "pytest", "-m", "accelerator", "-p", "no:cacheprovider",
               "tests/test_fused_model.py", "tests/test_flash_kernel.py"]
        rc, _, tail = self.run("tests", cmd, cap=180, need=30)
        if rc is not None:
            counts = [line for line in tail.splitlines() if " passed" in line or " failed" in line
                      or " error" in line or " skipped" in line]
            self.emit({"stage": "tests", "rc": rc, "summary": counts[-1] if counts else tail[-300:]})

    def _overrides(self):
        if self.args.dry_run:
            return [f"--config.{k}={v}" for k, v in DRY.items()]
        return [f"--config.train.batch_size={self.args.batch}"] if self.args.batch else []

    def _bench(self, stage, extra, cap):
        cmd = [sys.executable, "-m", "benchmarks.benchmark", "--config=benchmarks/cases.py:G",
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

    def train_stage(self, positions):
        if not positions:
            return
        groups = [list(positions)] if self.args.dry_run else [[p] for p in positions]
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

    def addition_stage(self):
        """Cho et al.'s small addition run (ADDITION) for --addition_steps steps; rows per run and size."""
        steps = DRY_ADDITION_STEPS if self.args.dry_run else self.args.addition_steps
        # Checkpoints stay out of --out's folder. A rerun of the check resumes the same run.
        workdir = (tempfile.mkdtemp(prefix="posenc_check_addition_") if self.args.dry_run else
                   os.path.join(tempfile.gettempdir(), f"posenc_check_addition_{steps}"))
        over = {"base.train.steps": steps, "base.train.warmup_steps": max(steps // 100, 0 if
                                                                             self.args.dry_run else 1)}
        if self.args.dry_run:
            over.update(DRY_ADDITION)
        cmd = [sys.executable, "-m", "posenc", "compare", f"--config={ADDITION}", f"--workdir={workdir}",
               *(f"--config.{k}={v}" for k, v in over.items())]
        rc, _, tail = self.run("addition", cmd, cap=self.args.addition_cap_s, need=60)
        rows = []
        if os.path.exists(os.path.join(workdir, "results.jsonl")):
            with open(os.path.join(workdir, "results.jsonl")) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        keep = ("variant", "seed", "problem_size", "eval_length", "decoded_exact_match", "decoded_accuracy",
                "exact_match", "accuracy", "steps_trained", "seeds_trained_together", "train_seconds")
        means = {}
        for row in rows:
            self.emit({"stage": "addition", "config": ADDITION, **{k: row.get(k) for k in keep}})
            means.setdefault((row["variant"], row["problem_size"]), []).append(row["decoded_exact_match"])
        for (variant, size), values in sorted(means.items()):
            self.emit({"stage": "addition", "variant": variant, "problem_size": size, "steps": steps,
                       "seeds": len(values), "mean_decoded_exact_match": round(sum(values) / len(values), 4)})
        if rc is not None and not rows:
            self.emit({"stage": "addition", "rc": rc, "rows": 0, "tail": tail[-1500:]})
        for name in ("table.md", "findings.md", "results.jsonl"):  # beside --out, for the docs
            src = os.path.join(workdir, name)
            if os.path.exists(src):
                with open(src) as f, open(os.path.join(os.path.dirname(self.args.out),
                                                       f"addition_{name}"), "w") as g:
                    g.write(f.read())

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
                    help=f"time for all stages (default {BUDGET_S:.0f} s; 1200 s for --dry_run, slow CPUs)")
    ap.add_argument("--positions", default=",".join(POSITIONS))
    ap.add_argument("--batch", type=int, default=0, help="train batch of case G (0: the config's 16)")
    ap.add_argument("--peer_python", default=sys.executable, help="python with torch (+ x-transformers)")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--addition_steps", type=int, default=ADDITION_STEPS,
                    help=f"training steps of {ADDITION} (Cho et al.: 50000)")
    ap.add_argument("--addition_cap_s", type=float, default=240.0, help="the addition stage's time cap")
    ap.add_argument("--plan", action="store_true",
                    help="print each stage's estimated seconds on one H200 and exit (runs nothing there)")
    args = ap.parse_args(argv)
    args.budget_s = args.budget_s or (1200.0 if args.dry_run else BUDGET_S)
    args.positions = tuple(p for p in args.positions.split(",") if p)
    if args.dry_run and args.positions == POSITIONS:
        args.positions = DRY_POSITIONS
    if not args.out:
        folder = os.environ.get("OUT") or tempfile.mkdtemp(prefix="posenc_check_")
        args.out = os.path.join(folder, "accelerator_check.jsonl")
    unknown = [n for n in args.stages.split(",") if n not in STAGES]
    if unknown:
        ap.error(f"unknown stage {unknown[0]!r}; choose from: {', '.join(STAGES)}")
    if args.plan:
        import check_plan  # beside this script

        return check_plan.main(args)
    check = Check(args)
    stages = {"install": check.install, "environment": check.environment, "tests": check.tests,
              "train": lambda: check.train_stage(args.positions[:TRAIN_FIRST]),
              "addition": check.addition_stage,
              "train_more": lambda: check.train_stage(args.positions[TRAIN_FIRST:]),
              "eval": check.eval_stage,
              "attention_op": check.attention_op}
    try:
        for name in args.stages.split(","):
            stages[name]()
    except Stop as e:
        check.emit({"stage": "stop", "reason": str(e)})
        print(f"accelerator_check: stopped: {e}", file=sys.stderr)
        check.summary()
        return 2
    check.summary()
    # The dry run is a test (CI): any failed command fails it. On the accelerator every
    # stage is attempted and reported, whatever failed.
    return 1 if (args.dry_run and check.failures) else 0


if __name__ == "__main__":
    sys.exit(main())
