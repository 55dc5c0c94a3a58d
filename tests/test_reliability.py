"""No lost work: SIGKILL at random moments, unreadable checkpoints, a second process on a workdir.

The kill test runs a two-run grid (default:tiny, seeds 0 and 1) in
child processes that announce each phase on stdout (``@ <run> <event>
<arg>``); a child told to stop inside an atomic file replace or a checkpoint
commit waits there for its SIGKILL, one killed while training runs on. The children only patch their own
modules (no production code path exists for the test); they are forked
from a server that has imported everything once (before any JAX backend
exists), to start fast. The test kills them at planned phases after random
delays, restarts until the grid ends, and compares every file with those
of an uninterrupted child. More kills
(every phase, several random step kills): ``POSENC_SLOW=1``; another draw of
the delays: ``POSENC_KILL_SEED=<int>``.
"""

import importlib.util
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from posenc.workdir import files, lock, records, results
from posenc.workdir.checkpoint import Checkpointer, CheckpointError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLOW = bool(os.environ.get("POSENC_SLOW"))
S0, S1, GRID = "copy_rope_rms-pre_s0", "copy_rope_rms-pre_s1", "grid"
TIMING = ("train_seconds", "eval_seconds", "wall_time", "finished_at")  # differ between runs

# A fork server: it imports everything once, then forks one child per "go WORKDIR LOG" line
# (no JAX backend exists before the fork, so the children start clean); each child runs the
# grid, announcing its phases, and the server reports "exit PID STATUS" when it ends.
ZYGOTE = r"""
import asyncio, os, sys, time, traceback
root, cache = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
import jax
jax.config.update("jax_compilation_cache_dir", cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from orbax.checkpoint._src.path import atomicity
from posenc.training import evaluate, loop
from posenc.configs import compare, default
from posenc import studies

current, stop = ["grid"], [None]

def mark(*words):
    print("@", current[0], *words, flush=True)
    return " ".join((current[0], *map(str, words))) == stop[0]

real_replace = os.replace
def replace(src, dst, *a, **k):  # an atomic write: the temp file is complete, not yet renamed
    if mark("replace", os.path.basename(dst)):
        time.sleep(600)  # the kill comes here
    return real_replace(src, dst, *a, **k)
os.replace = replace

real_finalize = atomicity.AtomicRenameTemporaryPath.finalize
async def finalize(self):  # every array of the checkpoint written, its directory not yet renamed
    if mark("finalize", self._final_path.name):
        time.sleep(600)
    return await real_finalize(self)
atomicity.AtomicRenameTemporaryPath.finalize = finalize

real_run = loop.run
def run(config, workdir, **kw):
    current[0] = kw.get("name") or os.path.basename(workdir)
    mark("run")
    try:
        return real_run(config, workdir, **kw)
    finally:
        current[0] = "grid"
loop.run = run

real_steps = loop._Trainer.steps
def steps(self, t, n):  # one call trains steps t + 1 .. t + n (1-based): each is announced
    for s in range(t + 1, t + n + 1):
        mark("step", s)
    return real_steps(self, t, n)
loop._Trainer.steps = steps

real_eval = evaluate.evaluate_length
def evaluate_length(model, task, config, spec, length, **kw):
    mark("eval", length)
    return real_eval(model, task, config, spec, length, **kw)
evaluate.evaluate_length = evaluate_length

def child(workdir):
    c = compare.get_config("quick")
    c.base = default.get_config("tiny")  # 20 steps, checkpoints at 10 and 20, evals at 16 and 32
    c.grid.positions, c.grid.seeds = ("rope",), (0, 1)
    c.grid.vmap_seeds = False  # one loop.run per seed: the phases patched above
    studies.run("compare", c, workdir)
    mark("done")

print("ready", flush=True)
for line in sys.stdin:
    _, workdir, log, target = line.split(None, 3)
    stop[0] = target.strip().replace(":", " ")  # the marker to wait at for the kill ("-": none)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        print("pid", os.getpid(), flush=True)
        code = 0
        try:
            child(workdir)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("exit", pid, os.waitstatus_to_exitcode(status), flush=True)
"""


def _marker(line: str):
    parts = line.split()
    return tuple(parts[1:]) if parts and parts[0] == "@" else None


class Zygote:
    """The fork server; :meth:`run` runs one child, SIGKILLing it ``delay`` s after a marker."""

    def __init__(self, base):
        (base / "zygote.py").write_text(ZYGOTE)
        self.log = open(base / "zygote.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(base / "zygote.py"), ROOT, str(base / "jax_cache")],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"), start_new_session=True)
        # never hang the suite: the server and every child it forked (they share its stdout)
        self.watchdog = threading.Timer(600, lambda: os.killpg(self.proc.pid, signal.SIGKILL))
        self.watchdog.start()
        assert self.proc.stdout.readline().strip() == "ready"

    def run(self, workdir, log, target=None, delay=0.0, wait=False):
        """``(exit code, markers, the marker it was killed at or None)`` of one child.

        The child is SIGKILLed ``delay`` s after it announces ``target``; with ``wait`` it
        waits there (inside the write it announced) for the kill, else it runs on.
        """
        stop = ":".join(target) if wait else "-"
        self.proc.stdin.write(f"go {workdir} {log} {stop}\n")
        self.proc.stdin.flush()
        pid, markers, killed_at = None, [], None
        for line in self.proc.stdout:
            words = line.split()
            if words[:1] == ["pid"]:
                pid = int(words[1])
            elif words[:1] == ["exit"]:
                return int(words[2]), markers, killed_at
            elif (m := _marker(line)) is not None:
                markers.append(m)
                if killed_at is None and m == target:
                    time.sleep(delay)
                    os.kill(pid, signal.SIGKILL)
                    killed_at = m
        raise AssertionError("the fork server died")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
        self.watchdog.cancel()
        self.log.close()


def _plan(rng):
    """(what, predicate, delay) of each kill, in order; delays are random within each phase."""
    inside = lambda: rng.uniform(0.0, 0.2)  # noqa: E731  (the child waits inside the write)
    soon = lambda: rng.uniform(0.0, 0.02)  # noqa: E731  (the child runs on)

    def at(what, marker, delay):
        return (what, marker, delay, delay is not None and marker[1] != "step")

    writes = ["results.jsonl", "table.md", "copy_accuracy.png"]
    plan = [at("inside checkpoint 20 of s0", (S0, "finalize", "20"), inside())]
    mid = sorted(rng.sample(range(11, 20), 3 if SLOW else 1))
    plan += [at(f"s0 training, step {k}", (S0, "step", str(k)), soon()) for k in mid]
    plan.append(at("inside s0's results write", (S0, "replace", "results.jsonl"), inside()))
    if SLOW:
        plan += [at("inside checkpoint 10 of s1", (S1, "finalize", "10"), inside()),
                 at("inside s1's train_log write", (S1, "replace", "train_log.jsonl"), inside())]
    k = rng.randint(2, 19)  # a child that finishes s0, killed in s1: the next one starts with s0 complete
    plan.append(at(f"s1 training, step {k}", (S1, "step", str(k)), soon()))
    for w in writes if SLOW else [rng.choice(writes)]:
        plan.append(at(f"inside the grid's {w} write", (GRID, "replace", w), inside()))
    return plan


def _files_are_whole(workdir) -> dict:
    """Every results / log / config file parses and every checkpoint is complete; what was left."""
    left = {"tmp_checkpoints": 0, "tmp_files": 0}
    for dirpath, dirnames, filenames in os.walk(workdir):
        for f in filenames:
            path = os.path.join(dirpath, f)
            if f.endswith(".jsonl"):
                rows = files.read_jsonl(path)
                if f == "results.jsonl":
                    for r in rows:
                        results.validate_row(r)
            elif f == "config.json":
                json.load(open(path))
            elif f.startswith(".") and f.endswith((".tmp", ".png")):
                left["tmp_files"] += 1
        if os.path.basename(dirpath) == "checkpoints":
            for d in dirnames:
                if "orbax-checkpoint-tmp" in d:
                    left["tmp_checkpoints"] += 1
                else:
                    assert os.path.exists(os.path.join(dirpath, d, "commit_success.txt")), (dirpath, d)
    return left


@pytest.fixture(scope="module")
def killed_grid(tmp_path_factory):
    base = tmp_path_factory.mktemp("kill")
    ref, killed = str(base / "ref" / "grid"), str(base / "killed" / "grid")
    t0, cpu0 = time.time(), os.times()
    zygote = Zygote(base)
    try:
        rc, _, _ = zygote.run(ref, base / "ref.log")
        assert rc == 0, (base / "ref.log").read_text()[-3000:]
        rng = random.Random(int(os.environ.get("POSENC_KILL_SEED", "0")))
        kills, logs, s0_final = [], [], None
        s0_results = os.path.join(killed, "runs", S0, "results.jsonl")
        for i, (what, target, delay, wait) in enumerate(_plan(rng)):
            rc, markers, killed_at = zygote.run(killed, base / f"kill{i}.log", target, delay, wait)
            logs.append((base / f"kill{i}.log").read_text())
            assert killed_at is not None, f"kill {i} ({what}) never reached its phase: {logs[-1][-3000:]}"
            assert rc == -signal.SIGKILL
            kills.append(dict(what=what, markers=markers, left=_files_are_whole(killed),
                              s0_complete=s0_final is not None))
            if s0_final is None and len(files.read_jsonl(s0_results)) == 2:
                s0_final = open(s0_results, "rb").read()  # s0 finished in this child
        rc, markers, _ = zygote.run(killed, base / "last.log")
        logs.append((base / "last.log").read_text())
        assert rc == 0, logs[-1][-3000:]
        kills.append(dict(what="end", markers=markers, left=_files_are_whole(killed), s0_complete=True))
    finally:
        zygote.close()
    cpu = os.times()
    return dict(ref=ref, killed=killed, kills=kills, logs=logs, s0_final=s0_final,
                seconds=time.time() - t0, cpu=cpu.children_user + cpu.children_system
                - cpu0.children_user - cpu0.children_system)


def _without(rows, fields):
    return [{k: v for k, v in r.items() if k not in fields} for r in rows]


def _state(step_dir):
    with ocp.PyTreeCheckpointer() as c:
        tree = c.restore(os.path.join(step_dir, "state"))
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_killed_grid_ends_bit_identical_to_an_uninterrupted_one(killed_grid):
    ref, killed = killed_grid["ref"], killed_grid["killed"]
    for run in (S0, S1):
        a, b = os.path.join(ref, "runs", run), os.path.join(killed, "runs", run)
        steps = sorted(os.listdir(os.path.join(a, "checkpoints")))
        assert steps == sorted(os.listdir(os.path.join(b, "checkpoints"))) == ["10", "20"]
        for s in steps:
            sa, sb = _state(os.path.join(a, "checkpoints", s)), _state(os.path.join(b, "checkpoints", s))
            assert sa.keys() == sb.keys() and len(sa) > 10
            for k in sa:
                assert sa[k].dtype == sb[k].dtype and sa[k].tobytes() == sb[k].tobytes(), (run, s, k)
            ra, rb = (json.load(open(os.path.join(d, "checkpoints", s, "record", "metadata")))
                      for d in (a, b))
            assert {**ra, "train_seconds": 0} == {**rb, "train_seconds": 0}
        for f in ("train_log.jsonl", "config.json"):
            assert open(os.path.join(a, f)).read() == open(os.path.join(b, f)).read(), (run, f)
        ra, rb = (files.read_jsonl(os.path.join(d, "results.jsonl")) for d in (a, b))
        assert len(ra) == 2 and _without(ra, TIMING) == _without(rb, TIMING)
    ga, gb = (files.read_jsonl(os.path.join(d, "results.jsonl")) for d in (ref, killed))
    assert len(ga) == 4 and _without(ga, TIMING) == _without(gb, TIMING)
    assert open(os.path.join(ref, "table.md")).read() == open(os.path.join(killed, "table.md")).read()
    plots = [sorted(f for f in os.listdir(os.path.join(d, "plots")) if not f.startswith("."))
             for d in (ref, killed)]
    assert plots[0] == plots[1] and "copy_accuracy.png" in plots[0]
    for name in plots[1]:
        assert open(os.path.join(killed, "plots", name), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_kills_landed_inside_checkpoint_results_and_report_writes(killed_grid):
    kills = killed_grid["kills"]
    print(f"kill test: {len(kills) - 1} kills, {killed_grid['seconds']:.1f} s wall, "
          f"{killed_grid['cpu']:.1f} s CPU")
    assert kills[0]["markers"][-1] == (S0, "finalize", "20")
    # The kill inside the checkpoint commit left its temporary directory, the next start removed it.
    assert kills[0]["left"]["tmp_checkpoints"] == 1 and kills[1]["left"]["tmp_checkpoints"] == 0
    inside_results = next(k for k in kills if k["what"] == "inside s0's results write")
    assert inside_results["left"]["tmp_files"] >= 1  # the killed write's temp file, not results.jsonl
    assert any("inside the grid's" in k["what"] for k in kills)
    assert kills[-1]["left"] == {"tmp_checkpoints": 0, "tmp_files": 0}  # nothing left behind
    # Every restart after a kill inside a run found the dead child's lock on it and took it over.
    for kill, log in zip(kills, killed_grid["logs"][1:]):
        if not kill["what"].startswith("inside the grid's"):
            assert "taking over the stale lock" in log, kill["what"]
    # The restart after the kill inside the checkpoint commit trained s0 from step 1 again;
    # the one after the mid-training kill resumed from checkpoint 10.
    # The restart after the kill inside checkpoint 20's commit resumed s0 from checkpoint 10.
    assert [m for m in kills[1]["markers"] if m[:2] == (S0, "step")][0] == (S0, "step", "11")
    assert sum(k["what"].startswith("s0 ") or "s0" in k["what"].split()[-1] or "s0's" in k["what"]
               for k in kills) >= 3


def test_a_killed_grid_loses_no_finished_run(killed_grid):
    kills, s0_final = killed_grid["kills"], killed_grid["s0_final"]
    assert s0_final is not None
    later = [k for k in kills if k["s0_complete"]]
    assert len(later) >= 2  # at least one kill after s0 finished, and the last run
    for k in later:
        assert not [m for m in k["markers"] if m[0] == S0 and (m[1] in ("step", "eval", "finalize") or m[
            1:] in (("replace", "results.jsonl"), ("replace", "train_log.jsonl")))], k["what"]
    final = open(os.path.join(killed_grid["killed"], "runs", S0, "results.jsonl"), "rb").read()
    assert final == s0_final  # not evaluated or written again



# ---------------------------------------------------------------- seeds trained together


class _Killed(BaseException):
    """Stands for a SIGKILL in the process (the files are those it leaves: checkpoints are synchronous)."""


def _alibi_cell():
    """compare:smoke's alibi cell: seeds 0 and 1 vmapped together, 8 steps, checkpoints at 4
    and 8, rows at lengths 8 and 16."""
    from posenc.configs import compare

    c = compare.get_config("smoke")
    c.grid.positions = ("alibi",)
    assert c.grid.vmap_seeds and c.grid.seeds == (0, 1)
    return c


def test_a_seed_group_killed_between_its_seeds_writes_resumes_bit_identical(tmp_path, monkeypatch):
    """A kill between the checkpoints (or the rows) of the two seeds of a vmapped cell left them at
    different steps; the lagging seed trained on alone (``loop.run``: another program, other float32
    rounding: 1e-7 off) and wrote rows without ``seeds_trained_together``. Resumed, it trains in the
    stack of the uninterrupted cell (its sibling holding its place) and every row is bit-identical."""
    from posenc import studies
    from posenc.studies import rows as rows_lib
    from posenc.training import finish

    config, seed0 = _alibi_cell(), "copy_alibi_rms-pre_s0"
    reference = studies.run("compare", config, str(tmp_path / "ref"))
    assert len(reference) == 4 and {r["seeds_trained_together"] for r in reference} == {2}
    real_save, real_write = records.RunLog.save, finish.write_rows

    def kill_after(what, arg):
        def save(self, s, state, seconds):
            real_save(self, s, state, seconds)
            if what == "checkpoint" and s == arg and seed0 in self.ckpt.directory:
                raise _Killed

        def write_rows(workdir, rows):
            real_write(workdir, rows)
            if what == "rows" and os.path.basename(workdir) == seed0:
                raise _Killed

        return save, write_rows

    for what, arg in (("checkpoint", 4), ("checkpoint", 8), ("rows", None)):
        workdir = str(tmp_path / f"{what}{arg}")
        save, write_rows = kill_after(what, arg)
        with monkeypatch.context() as m:
            m.setattr(records.RunLog, "save", save)
            m.setattr(finish, "write_rows", write_rows)
            with pytest.raises(_Killed):  # after seed 0's write, before seed 1's
                studies.run("compare", config, workdir)
        rows = studies.run("compare", config, workdir)
        assert rows_lib.without_volatile(rows) == rows_lib.without_volatile(reference), (what, arg)
        for run in (seed0, "copy_alibi_rms-pre_s1"):
            a, b = (os.path.join(d, "runs", run) for d in (str(tmp_path / "ref"), workdir))
            log = "train_log.jsonl"
            assert open(os.path.join(a, log)).read() == open(os.path.join(b, log)).read(), (what, run)
            sa, sb = _state(os.path.join(a, "checkpoints", "8")), _state(os.path.join(b, "checkpoints", "8"))
            assert sa.keys() == sb.keys() and all(sa[k].tobytes() == sb[k].tobytes() for k in sa), (what, run)



def test_a_seed_restored_fitted_trains_no_more_in_a_resumed_cell(tmp_path, monkeypatch):
    """Fit, then extrapolate (the quick grids: seeds vmapped, train.fit_accuracy): seed 0 fits at the
    check of step 4, seed 1 never (12 steps). Killed after step 5 (both checkpointed at 4), the resumed
    cell stacked both again and seed 0 trained on to step 8 (steps_to_fit 8); killed between their
    checkpoints at 4, each trained alone. Resumed, both rows equal the uninterrupted cell's, bit for bit."""
    from posenc.studies import rows as rows_lib
    from posenc.training import loop, multiseed

    def config(seed):
        from posenc.configs import default

        c = default.get_config("tiny")
        c.train.update(steps=12, log_every=4, checkpoint_every=4, fit_check_every=4, fit_accuracy=0.5, seed=seed)
        c.eval.lengths = (16,)
        return c

    real_fit, real_save, real_steps = loop.record_fit, records.RunLog.save, multiseed._GroupTrainer.steps
    monkeypatch.setattr(loop, "record_fit", lambda resolved, fit, s, accuracy: real_fit(
        resolved, fit, s, 1.0 if int(resolved.config.train.seed) == 0 else 0.0))

    def cell(workdir):
        return multiseed.run_seeds([config(0), config(1)], [f"{workdir}/s0", f"{workdir}/s1"], names=["s0", "s1"])

    reference = cell(tmp_path / "ref")
    assert [(r[0]["steps_to_fit"], r[0]["steps_trained"]) for r in reference] == [(4, 4), (None, 12)]

    kill = None

    def save(self, s, state, seconds):
        real_save(self, s, state, seconds)
        if kill == "between" and s == 4 and os.path.basename(os.path.dirname(self.ckpt.directory)) == "s0":
            raise _Killed  # seed 0's (fitted) checkpoint written, seed 1's not

    def steps(self, t, n):
        if kill == "after" and t >= 5:
            raise _Killed  # both checkpointed at 4, step 6 not trained
        return real_steps(self, t, n)

    for kill in ("after", "between"):
        with monkeypatch.context() as m:
            m.setattr(records.RunLog, "save", save)
            m.setattr(multiseed._GroupTrainer, "steps", steps)
            with pytest.raises(_Killed):
                cell(tmp_path / kill)
        rows = cell(tmp_path / kill)
        assert [rows_lib.without_volatile(r) for r in rows] == [rows_lib.without_volatile(r) for r in reference], kill


# ---------------------------------------------------------------- checkpoints


class _Model(nnx.Module):
    def __init__(self, value=0.0):
        self.w = nnx.Param(jnp.arange(12.0).reshape(3, 4) + value)
        self.b = nnx.Param(jnp.full((5,), value))


def _saved(tmp_path, steps=(10, 20)):
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), max_to_keep=3)
    for s in steps:
        ckpt.save(s, nnx.state(_Model(float(s))), {"step": s})
    ckpt.close()
    return str(tmp_path / "checkpoints")


def _restore(directory):
    ckpt = Checkpointer(directory, max_to_keep=3)
    try:
        state, record = ckpt.restore(nnx.state(_Model(-1.0)))
        return float(state["b"][...][0]), record
    finally:
        ckpt.close()


def _data_files(step_dir):  # the OCDBT data files of the state
    return [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(step_dir, "state")) for f in fs
            if os.path.basename(d) == "d"]


def _truncate(step_dir):
    for f in _data_files(step_dir):
        with open(f, "r+b") as fh:
            fh.truncate(max(1, os.path.getsize(f) // 2))


def _bad_record(step_dir):
    with open(os.path.join(step_dir, "record", "metadata"), "w") as f:
        f.write('{"step": 2')


def _other_state(step_dir):
    # Valid files holding other values (checkpoint 10's arrays): only the checksum can tell.
    import shutil

    shutil.rmtree(os.path.join(step_dir, "state"))
    shutil.copytree(os.path.join(os.path.dirname(step_dir), "10", "state"), os.path.join(step_dir, "state"))


@pytest.mark.parametrize("damage", [_truncate, _bad_record, _other_state])
def test_an_unreadable_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage):
    directory = _saved(tmp_path)
    damage(os.path.join(directory, "20"))
    with caplog.at_level(logging.WARNING):
        value, record = _restore(directory)
    assert (value, record) == (10.0, {"step": 10})
    text = caplog.text
    assert "resumed from checkpoint step 10 instead of the newest, step 20, which cannot be read" in text
    assert directory + "_unreadable" in text
    # Out of the way: the run can save step 20 again, and the evidence is kept.
    assert sorted(os.listdir(directory)) == ["10"]
    assert os.listdir(directory + "_unreadable") == ["20"]
    ckpt = Checkpointer(directory, max_to_keep=3)
    ckpt.save(20, nnx.state(_Model(20.0)), {"step": 20})
    ckpt.close()
    assert _restore(directory) == (20.0, {"step": 20})


def test_the_checksum_names_the_array_that_differs(tmp_path):
    directory = _saved(tmp_path)
    _other_state(os.path.join(directory, "20"))
    ckpt = Checkpointer(directory, max_to_keep=3)
    with pytest.raises(ValueError, match=r"state array \['b'\] does not match its checksum"):
        ckpt.restore(nnx.state(_Model()), step=20)  # an explicit step: no fallback
    ckpt.close()


def test_no_readable_checkpoint_is_an_error_listing_each_step(tmp_path):
    directory = _saved(tmp_path)
    _bad_record(os.path.join(directory, "10"))
    _truncate(os.path.join(directory, "20"))
    ckpt = Checkpointer(directory, max_to_keep=3)
    state = nnx.state(_Model(-1.0))
    with pytest.raises(CheckpointError, match=r"no checkpoint in .* can be read: step 20: .*; step 10: "):
        ckpt.restore(state)
    assert float(state["b"][...][0]) == -1.0  # the template is unchanged
    ckpt.close()
    assert sorted(os.listdir(directory)) == ["10", "20"]  # nothing moved: nothing was restored


def test_a_resumed_run_log_starts_at_the_fallback_step(tmp_path, caplog):
    config = _tiny()
    book = records.RunLog(config, str(tmp_path), main=True)
    for s in (10, 20):
        book.record.window = [(s, {"loss": float(s), "lr": 1e-3})]
        book.log(s)
        book.save(s, nnx.state(_Model(float(s))), train_seconds=float(s))
    book.close()
    _truncate(str(tmp_path / "checkpoints" / "20"))
    again = records.RunLog(config, str(tmp_path), main=True)
    with caplog.at_level(logging.WARNING):
        state = again.restore(nnx.state(_Model(-1.0)))
    again.close()
    assert again.start == 10 and float(state["b"][...][0]) == 10.0
    assert [r["step"] for r in again.log_rows] == [10]  # the log rows after step 10 will be logged again
    assert "instead of the newest, step 20" in caplog.text


# ---------------------------------------------------------------- the workdir lock

_HOLDER = r'''
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("lock", sys.argv[1])
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
path = lock.acquire(sys.argv[2])
print("held", flush=True)
time.sleep(float(sys.argv[3]))
lock.release(path)
'''


def _holder(workdir, seconds=300.0):
    """A process holding ``workdir``'s lock for ``seconds`` (lock.py loaded alone: starts in a fraction
    of a second)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, os.path.join(ROOT, "posenc", "workdir", "lock.py"),
                             str(workdir), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _tiny():
    module = importlib.import_module("posenc.configs.default")
    return module.get_config("tiny")


def test_a_second_process_on_a_workdir_in_use_is_refused_then_a_dead_holders_lock_is_taken(
        tmp_path, caplog, monkeypatch):
    from posenc import studies
    from posenc.training import loop

    def no_training(*a, **k):
        raise AssertionError("a refused run started")

    monkeypatch.setattr(loop, "init_state", no_training)
    work = tmp_path / "run"
    proc = _holder(work)
    try:
        with pytest.raises(lock.WorkdirInUse, match=rf"{work} is in use by pid {proc.pid} on host "
                           rf"{lock.socket.gethostname()} \(since .*\): it holds the lock"):
            loop.run(_tiny(), str(work))
        assert os.listdir(work) == [".lock"]  # nothing claimed, nothing written
        grid = load_compare_quick()
        with pytest.raises(lock.WorkdirInUse, match=f"in use by pid {proc.pid}"):
            studies.run("compare", grid, str(work))
    finally:
        proc.kill()
        proc.wait()
    with caplog.at_level(logging.WARNING):
        path = lock.acquire(str(work))
    assert f"taking over the stale lock {path} of pid {proc.pid}" in caplog.text
    held = json.load(open(path))
    assert held["pid"] == os.getpid() and held["host"] == lock.socket.gethostname()
    assert lock.acquire(str(work)) == path  # reentrant
    lock.release(path)
    assert os.path.exists(path)
    lock.release(path)
    assert not os.path.exists(path)  # a clean release leaves nothing behind



def test_a_study_waits_for_the_lock_a_process_started_beside_it_holds_briefly(tmp_path):
    # Two processes of one study started together: each checks and writes study.json under the
    # workdir's lock; the second waits for the first's milliseconds instead of being refused.
    from posenc.studies import engine

    work = tmp_path / "study"
    proc = _holder(work, seconds=1.0)
    try:
        with pytest.raises(lock.WorkdirInUse, match="it holds the lock"):
            lock.acquire(str(work))  # no wait: refused at once
        study = engine.study("compare")
        config, points = engine.expand(study, load_compare_quick())
        engine.claim(study, config, points, str(work))  # waits for the holder's release
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
    assert os.path.exists(work / engine.STUDY_FILE) and not os.path.exists(work / lock.LOCK_NAME)


def load_compare_quick():
    module = importlib.import_module("posenc.configs.compare")
    c = module.get_config("quick")
    c.base = _tiny()
    c.grid.positions, c.grid.seeds = ("rope",), (0,)
    return c


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("who,taken", [("dead", True), ("alive", False), ("other host", False)])
def test_without_flock_the_holder_record_decides(tmp_path, monkeypatch, caplog, who, taken):
    monkeypatch.setattr(lock, "_flock", lambda fd: None)  # a filesystem without flock
    proc = None
    record = lock.holder_record()
    if who == "dead":
        record.update(pid=_dead_pid(), start_ticks=None)
    elif who == "alive":
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        record.update(pid=proc.pid, start_ticks=lock._start_ticks(proc.pid))
    else:
        record.update(host="elsewhere.example", pid=1)
    (tmp_path / lock.LOCK_NAME).write_text(json.dumps(record))
    try:
        if taken:
            with caplog.at_level(logging.WARNING):
                with lock.hold(str(tmp_path)):
                    assert json.load(open(tmp_path / lock.LOCK_NAME))["pid"] == os.getpid()
            assert f"pid {record['pid']} on host" in caplog.text and "that process is gone" in caplog.text
        else:
            why = "that process is still running" if who == "alive" else "its host cannot be checked"
            with pytest.raises(lock.WorkdirInUse, match=f"pid {record['pid']} on host {record['host']}.*{why}"):
                lock.acquire(str(tmp_path))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def test_a_reused_pid_is_not_the_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "_flock", lambda fd: None)
    record = dict(lock.holder_record(), pid=os.getppid())  # alive, but started at another time
    record["start_ticks"] = (lock._start_ticks(os.getppid()) or 0) + 12345
    (tmp_path / lock.LOCK_NAME).write_text(json.dumps(record))
    if lock._start_ticks(os.getppid()) is None:
        pytest.skip("no /proc: start times cannot be compared")
    assert lock.holder_alive(record) is False
    with lock.hold(str(tmp_path)):
        pass
