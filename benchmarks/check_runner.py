"""The accelerator check's runner: each command a subprocess under one deadline, every row one JSON line.

:class:`Runner` holds the check's time budget (``--budget_s``), runs a
stage's command with a timeout of what is left (or records it as skipped),
reads the JSON rows it prints and writes each row to stdout and ``--out``.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Stop(Exception):
    """The check cannot go on here (its one-line reason); the stages after it are not run."""


class Runner:
    """Runs commands under one deadline and writes every row."""

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
        self.failures = []  # stages whose command failed

    def emit(self, row):
        """Print ``row`` as one JSON line and append it to ``--out``."""
        row = {"check": "accelerator", "dry_run": self.args.dry_run, **row}
        line = json.dumps(row)
        print(line, flush=True)
        self.out.write(line + "\n")
        self.out.flush()

    def left(self):
        """Seconds left of the budget."""
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

