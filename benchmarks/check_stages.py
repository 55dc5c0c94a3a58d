"""The accelerator check's stages, in the order they run, and what each runs at full and at dry-run shapes.

:class:`Check` runs each stage of :data:`STAGES` (``benchmarks/accelerator_check.py``
describes them) through :class:`check_runner.Runner`; the constants here size
them (``benchmarks/check_plan.py`` reads them for ``--plan``).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import zipfile

from check_runner import ROOT, Runner, Stop
from check_versions import LIBRARIES, distribution, minimum_versions, unsupported

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
DRY_POSITIONS = ("rope", "alibi")  # no term and a term: every code path, half the compiles


class Check(Runner):
    """The stages of the check, each run under the runner's deadline, and its summary row."""

    def __init__(self, args):
        super().__init__(args)
        self.train = {}  # position -> posenc train row
        self.torch = None  # the peer python's torch, once checked

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
        needed = [w for w in fallback if distribution(w) in below]
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

