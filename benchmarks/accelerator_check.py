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
import os
import sys
import tempfile

from check_runner import Stop
from check_stages import (
    ADDITION,
    ADDITION_STEPS,
    BUDGET_S,
    DRY_POSITIONS,
    POSITIONS,
    STAGES,
    TRAIN_FIRST,
    Check,
)


def main(argv=None):
    """Parse the flags, then print the plan (--plan) or run the stages; exit 0, 1 (a failed dry run) or 2 (stopped)."""
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
