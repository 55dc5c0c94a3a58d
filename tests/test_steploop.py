"""k train steps per compiled call: bit-identical to one step per call (single run and vmapped
seeds), chunks end at every boundary, and "auto" picks k from the measured step time."""

import importlib.util
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc.training import loop, multiseed, prepare, steploop
from posenc.training import step as step_lib
from posenc.workdir import files
from posenc.workdir.checkpoint import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(seed=0, per_call=1):
    module = importlib.import_module("posenc.configs.default")
    c = module.get_config("tiny")
    # 11 steps, boundaries at 4, 6, 8, 11: chunks of 3 are cut short at every one of them
    c.train.update(steps=11, log_every=4, checkpoint_every=6, warmup_steps=2, learning_rate=3e-3,
                   seed=seed, steps_per_call=per_call)
    c.eval.lengths = (16,)
    return c


def leaves(state):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree.leaves(state)]


def assert_same_bits(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.atleast_1d(x).view(np.uint8), np.atleast_1d(y).view(np.uint8))


def final_state(c, workdir):
    r = prepare.resolve(c)
    _, _, _, state = loop.init_state(r)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
    state, record = ckpt.restore(state)
    ckpt.close()
    return leaves(state), record


# ----------------------------------------------------------------------- the schedule


class Recorder:
    """A trainer that records the calls the loop makes (no JAX work)."""

    def __init__(self):
        self.calls, self.boundaries = [], []

    def steps(self, t, n):
        self.calls.append(("steps", t, n))
        return {"loss": np.arange(t, t + n, dtype=np.float32)}

    def stats(self, t):
        self.calls.append(("stats", t))
        return {"log_z": np.float32(-t)}

    def boundary(self, s, fetched, at):
        self.boundaries.append((s, [k for k, _ in fetched], at))
        for k, m in fetched:
            assert m["loss"] == k - 1  # the metrics of step k (0-based k - 1)
            assert ("log_z" in m) == (at.log and k == s)
        return False


def test_chunks_end_at_every_boundary_and_stats_precede_the_logging_step():
    sched = steploop.Schedule(steps=11, end=11, log_every=4, checkpoint_every=6, per_call=3)
    rec = Recorder()
    assert steploop.train(rec, start=0, schedule=sched) == 11
    assert rec.calls == [("steps", 0, 3), ("stats", 3), ("steps", 3, 1),  # log at 4
                         ("steps", 4, 2),  # checkpoint at 6
                         ("steps", 6, 1), ("stats", 7), ("steps", 7, 1),  # log at 8
                         ("steps", 8, 2), ("stats", 10), ("steps", 10, 1)]  # last step: everything
    assert [s for s, _, _ in rec.boundaries] == [4, 6, 8, 11]
    assert [steps for _, steps, _ in rec.boundaries] == [[1, 2, 3, 4], [5, 6], [7, 8], [9, 10, 11]]
    assert [sched.next_stop(t) for t in (0, 3, 4, 5, 6, 8, 10)] == [4, 4, 6, 6, 8, 11, 11]
    # a process stopped early (end) and a resumed one (start) stop at end too
    short = steploop.Schedule(steps=11, end=5, log_every=4, checkpoint_every=6, per_call=8)
    rec = Recorder()
    assert steploop.train(rec, start=1, schedule=short) == 5
    assert rec.calls == [("steps", 1, 2), ("stats", 3), ("steps", 3, 1), ("steps", 4, 1)]


class Clock:
    """A fake perf_counter that a trainer advances by a cost per call plus a cost per step."""

    def __init__(self, call_s, step_s):
        self.now, self.call_s, self.step_s = 0.0, call_s, step_s

    def __call__(self):
        return self.now


class TimedRecorder(Recorder):
    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def steps(self, t, n):
        self.clock.now += self.clock.call_s + n * self.clock.step_s
        return super().steps(t, n)


@pytest.mark.parametrize("call_s,step_s,k", [(0.0, 0.01, 100), (0.015, 0.03, 34), (0.25, 1.0, 13),
                                             (0.0, 60.0, 1), (1.0, 1e-4, 256)])
def test_auto_fits_the_cost_of_a_call_and_of_a_step_then_picks_k(monkeypatch, call_s, step_s, k):
    clock = Clock(call_s, step_s)
    monkeypatch.setattr(steploop.time, "perf_counter", clock)
    sched = steploop.Schedule(steps=400, end=400, log_every=1000, checkpoint_every=1000, per_call="auto")
    rec = TimedRecorder(clock)
    steploop.train(rec, start=0, schedule=sched)
    calls = [c for c in rec.calls if c[0] == "steps"]
    probes = 1 + 2 * steploop.AUTO_PROBES  # one that compiles, then 1, 2, 1, 2, ... steps
    assert [n for _, _, n in calls[:probes]] == [1] + [1, 2] * steploop.AUTO_PROBES
    assert calls[probes][2] == k  # call cost <= 2% of the steps', calls >= 1 s and <= 30 s
    assert steploop.fit_call_time([(1, call_s + step_s), (2, call_s + 2 * step_s)]) == \
        pytest.approx((step_s, call_s), abs=1e-12)


def test_auto_reads_the_fastest_probe_of_each_length():
    # What else the host runs only adds time: a slow 1-step probe (case R, 2026-12-03: it made a
    # least-squares fit find no call cost and pick k = 1) must not hide the cost of a call.
    call_s, step_s = 0.25, 1.0
    probes = [(1, 1.25 + 0.3), (2, 2.25), (1, 1.25), (2, 2.25 + 0.05), (1, 1.25 + 0.2), (2, 2.25 + 0.4)]
    assert steploop.fit_call_time(probes) == pytest.approx((step_s, call_s), abs=1e-12)
    assert steploop.auto_steps_per_call(*steploop.fit_call_time(probes)) == 13
    assert steploop.fit_call_time([(3, 0.3), (3, 0.6)]) == pytest.approx((0.1, 0.0))  # one length: per step


@pytest.mark.parametrize("value", [0, -2, 1.5, "fast", True, None])
def test_steps_per_call_is_checked_before_anything_compiles(value, tmp_path):
    with pytest.raises(prepare.ConfigError, match=r"train.steps_per_call must be an integer >= 1 or 'auto'"):
        loop.run(config(per_call=value), str(tmp_path))
    assert not os.path.exists(tmp_path / "config.json")


def test_steps_per_call_is_not_part_of_the_experiment():
    assert prepare.resolve(config(per_call=1)).hash == prepare.resolve(config(per_call="auto")).hash


# ----------------------------------------------------------------------- bit-identical results


def test_chunk_equals_single_steps_bit_for_bit():
    r = prepare.resolve(config())
    _, _, graphdef, state = loop.init_state(r)
    root = loop.data_root(r.config)
    one = step_lib.train_step_fn(r.train)
    chunk = step_lib.train_chunk_fn(r.train, 4)
    a, singles = jax.tree.map(jnp.copy, state), []
    for t in range(7):
        a, m = one(graphdef, a, jax.random.fold_in(root, t))
        singles.append(jax.device_get(m))
    b, chunks = jax.tree.map(jnp.copy, state), []
    for t0, n in ((0, 4), (4, 1), (5, 2)):
        b, m = chunk(graphdef, b, root, np.int32(t0), np.int32(n))
        m = jax.device_get(m)
        assert all(v.shape[0] == 4 for v in m.values()) and not np.any(m["loss"][n:])
        chunks += [{k: v[i] for k, v in m.items()} for i in range(n)]
    assert_same_bits(leaves(a), leaves(b))
    assert sorted(singles[0]) == sorted(chunks[0])
    for x, y in zip(singles, chunks):
        assert_same_bits([x[k] for k in sorted(x)], [y[k] for k in sorted(x)])
    assert chunk._cache_size() == 1  # every chunk length: one program


def test_seeds_chunk_equals_single_vmapped_steps_bit_for_bit():
    rs = [prepare.resolve(config(seed)) for seed in (0, 1)]
    states = [loop.init_state(r) for r in rs]
    graphdef = states[0][2]
    stacked = multiseed._stack([s[3] for s in states])
    roots = np.stack([jax.random.key_data(loop.data_root(r.config)) for r in rs])
    roots = jax.random.wrap_key_data(roots)
    one = step_lib.seeds_train_step_fn(rs[0].train)
    chunk = step_lib.seeds_train_chunk_fn(rs[0].train, 3)
    a, singles = jax.tree.map(jnp.copy, stacked), []
    for t in range(5):
        a, m = one(graphdef, a, roots, np.int32(t))
        singles.append(jax.device_get(m)["loss"])
    b, losses = jax.tree.map(jnp.copy, stacked), []
    for t0, n in ((0, 3), (3, 2)):
        b, m = chunk(graphdef, b, roots, np.int32(t0), np.int32(n))
        losses += list(jax.device_get(m)["loss"][:n])
    assert_same_bits(leaves(a), leaves(b))
    assert_same_bits(singles, losses)
    assert singles[0].shape == (2,) and singles[0][0] != singles[0][1]


@pytest.fixture(scope="module")
def one_per_call(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("k1"))
    return d, loop.run(config(per_call=1), d)


@pytest.mark.parametrize("per_call", [3, "auto"])
def test_run_with_k_steps_per_call_equals_one_per_call(per_call, one_per_call, tmp_path):
    ref_dir, ref_rows = one_per_call
    rows = loop.run(config(per_call=per_call), str(tmp_path))
    logs = [files.read_jsonl(os.path.join(d, "train_log.jsonl")) for d in (ref_dir, str(tmp_path))]
    assert [r["step"] for r in logs[0]] == [4, 8, 11]
    assert "log_z" in logs[0][0] and "grad_norm" in logs[0][0]
    assert logs[0] == logs[1]  # every logged metric, exactly
    assert [[r[k] for k in ("loss", "accuracy", "exact_match", "train_loss")] for r in rows] == \
        [[r[k] for k in ("loss", "accuracy", "exact_match", "train_loss")] for r in ref_rows]
    (pa, ra), (pb, rb) = final_state(config(), ref_dir), final_state(config(), str(tmp_path))
    assert ra["step"] == rb["step"] == 11
    assert_same_bits(pa, pb)  # parameters and optimizer state


def test_seeds_with_k_steps_per_call_equal_one_per_call(tmp_path):
    out = {}
    for per_call in (1, 3):
        dirs = [str(tmp_path / f"k{per_call}_s{s}") for s in (0, 1)]
        out[per_call] = dirs, multiseed.run_seeds([config(s, per_call) for s in (0, 1)], dirs)
    for j in (0, 1):
        a, b = out[1][0][j], out[3][0][j]
        assert files.read_jsonl(os.path.join(a, "train_log.jsonl")) == \
            files.read_jsonl(os.path.join(b, "train_log.jsonl"))
        assert [r["loss"] for r in out[1][1][j]] == [r["loss"] for r in out[3][1][j]]
        assert_same_bits(final_state(config(j), a)[0], final_state(config(j), b)[0])


def test_fine_tuning_with_k_steps_per_call_equals_one_per_call(one_per_call, tmp_path):
    """finetune.finetune runs loop.run from another run's parameters (init=): the same identity."""
    from posenc.training import finetune

    base = finetune.load_run(one_per_call[0])
    dirs = {}
    for per_call in (1, 4):
        c = config(per_call=per_call)
        c.train.update(steps=6, seed=3)
        dirs[per_call] = str(tmp_path / f"k{per_call}")
        finetune.finetune(base, c, dirs[per_call])
    logs = [files.read_jsonl(os.path.join(d, "train_log.jsonl")) for d in dirs.values()]
    assert [r["step"] for r in logs[0]] == [4, 6] and logs[0] == logs[1]
    assert_same_bits(final_state(config(), dirs[1])[0], final_state(config(), dirs[4])[0])


# ----------------------------------------------------------------------- Ctrl-C


class CtrlC(Recorder):
    """A trainer that receives SIGINT while running the call of step ``at`` (0-based)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def steps(self, t, n):
        if t <= self.at < t + n:
            os.kill(os.getpid(), signal.SIGINT)
        return super().steps(t, n)


@pytest.mark.parametrize("at,stop", [(4, 5), (3, 4), (0, 1)])
@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_checkpoints_the_step_the_call_reached_then_stops(at, stop):
    sched = steploop.Schedule(steps=11, end=11, log_every=4, checkpoint_every=6, per_call=1)
    rec = CtrlC(at)
    with pytest.raises(steploop.Interrupted) as e:
        steploop.train(rec, start=0, schedule=sched)
    assert e.value.step == stop
    s, steps, boundary = rec.boundaries[-1]
    assert s == stop and steps[-1] == stop and boundary.checkpoint
    assert boundary.log == (stop == 4)  # a logging step keeps its log row
    assert not any(c for c in rec.calls if c[0] == "steps" and c[1] >= stop)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is given back


# A process that has had its first Ctrl-C, then gets a second while its main thread waits for a
# compiled call of minutes (a Python handler would run only when the call returns).
_SECOND_CTRL_C = """
import os, signal, sys, threading
import jax, jax.numpy as jnp
from posenc.training import steploop

@jax.jit
def minutes(x):
    return jax.lax.while_loop(lambda c: c[0] < 2**31 - 1, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x))[1]

x = jnp.ones(4096)
minutes.lower(x).compile()
with steploop._CtrlC() as ctrl_c:
    os.kill(os.getpid(), signal.SIGINT)
    assert ctrl_c.asked
    print("asked", flush=True)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    jax.block_until_ready(minutes(x))
print("the call returned", flush=True)
"""


def test_a_second_ctrl_c_ends_the_process_inside_a_long_compiled_call():
    import subprocess
    import sys
    import time

    from helpers import ROOT

    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _SECOND_CTRL_C], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == -signal.SIGINT, (out.returncode, out.stdout, out.stderr[-2000:])
    assert out.stdout.split() == ["asked"]  # ended inside the call
    assert "Ctrl-C again to stop at once" in out.stderr
    assert time.monotonic() - t0 < 60


@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_then_rerun_gives_the_uninterrupted_run_bit_for_bit(one_per_call, tmp_path, monkeypatch):
    ref_dir, ref_rows = one_per_call
    real = loop._Trainer.steps

    def steps(self, t, n):  # Ctrl-C during step 5 (between the log at 4 and the checkpoint at 6)
        if t <= 4 < t + n:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, t, n)

    monkeypatch.setattr(loop._Trainer, "steps", steps)
    with pytest.raises(steploop.Interrupted):
        loop.run(config(per_call=1), str(tmp_path))
    assert final_state(config(), str(tmp_path))[1]["step"] == 5  # checkpointed where it stopped
    monkeypatch.setattr(loop._Trainer, "steps", real)
    rows = loop.run(config(per_call=1), str(tmp_path))
    logs = [files.read_jsonl(os.path.join(d, "train_log.jsonl")) for d in (ref_dir, str(tmp_path))]
    assert logs[0] == logs[1]
    keys = ("loss", "accuracy", "exact_match", "train_loss", "decoded_accuracy")
    assert [[r.get(k) for k in keys] for r in rows] == [[r.get(k) for k in keys] for r in ref_rows]
    assert_same_bits(final_state(config(), ref_dir)[0], final_state(config(), str(tmp_path))[0])
