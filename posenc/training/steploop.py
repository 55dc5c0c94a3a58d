"""The step loop shared by every trainer: chunks of steps, boundaries, one host sync per boundary.

A trainer (one run, or several seeds vmapped together) implements three
methods and :func:`train` drives them::

    steps(t, n) -> device metrics                # train steps t .. t + n - 1 (0-based) in one call
    stats(t) -> device diagnostics               # of step t's batch, before step t updates the state
    boundary(s, fetched, at: Boundary) -> bool   # host work at step s (1-based); True stops

``steps`` runs ``n`` steps inside one compiled call
(:func:`posenc.training.step.train_chunk_fn`) and returns every metric
stacked on a leading axis (at least ``n`` rows). A chunk never crosses a
boundary: it ends at the next log, checkpoint or fit step at the latest, so
``boundary`` sees the state of exactly that step. ``boundary`` receives the
host metrics of every step since the previous boundary, one ``(s,
metrics)`` pair per step: it checks them for NaN / Inf, logs, checkpoints
and checks the fit, as ``at`` says. Between boundaries nothing leaves the
device. On logging steps the diagnostics (max attention logit, attention
entropy, log Z) come from a separate forward pass (``stats``) on the state
before that step, so every other step takes the fused attention path: a
chunk that ends on a logging step runs as ``n - 1`` steps, ``stats``, then
its last step.

Steps per call (``train.steps_per_call``): an integer k >= 1, or ``"auto"``.
A call has a fixed cost besides its steps: dispatch, and above all
XLA:CPU's temporary buffers, allocated (and, above glibc's mmap threshold,
faulted in page by page) at every call: about 15 ms per call for a case-T
step of 30 ms, 250 ms for a case-R step of 1 s (docs/performance.md).
``"auto"`` measures both. After one call that compiles it runs
:data:`AUTO_PROBES` calls of 1 step and as many of 2, alternating, fits
``seconds = call_s + steps * step_s`` through the fastest call of each
length (:func:`fit_call_time`) and takes the smallest k whose call
cost is at most :data:`AUTO_CALL_SHARE` (2%) of its steps and whose call
lasts at least :data:`AUTO_CALL_SECONDS`, within
:data:`AUTO_MAX_CALL_SECONDS` and :data:`AUTO_MAX` steps
(:func:`auto_steps_per_call`). Since a chunk of k steps gives exactly the
results of k single steps, k changes only the speed.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import sys
import threading
import time

import jax

from posenc import checks

AUTO = "auto"
AUTO_MAX = 256  # most steps per call "auto" picks (the metrics buffer of its compiled chunk)
AUTO_CALL_SHARE = 0.02  # "auto": the fixed cost of a call at most this share of its steps' time
AUTO_CALL_SECONDS = 1.0  # "auto": calls of at least this long
AUTO_MAX_CALL_SECONDS = 30.0  # "auto": calls of at most this long (Ctrl-C waits for the call)
AUTO_PROBES = 3  # "auto": timed probe calls of each length, 1 and 2 steps (after one that compiles)


def check_steps_per_call(value):
    """``value`` if it is an integer >= 1 or ``"auto"``, else ValueError."""
    if value == AUTO and isinstance(value, str):
        return value
    if checks.is_int(value) and value >= 1:
        return int(value)
    raise ValueError(f"train.steps_per_call must be an integer >= 1 or 'auto'; got {value!r}")


def steps_per_call(config):
    """``config.train.steps_per_call`` (``"auto"`` when the config has no such field)."""
    return check_steps_per_call(config.train.get("steps_per_call", AUTO))


def buffer_size(config) -> int:
    """Rows of the compiled chunk's metrics: the most steps one call may run."""
    k = steps_per_call(config)
    return AUTO_MAX if k == AUTO else k


@dataclasses.dataclass(frozen=True)
class Boundary:
    """What happens at step ``s``: log, checkpoint, check the fit, evaluate (``train.eval_every``)."""

    log: bool
    checkpoint: bool
    fit: bool
    evaluate: bool = False

    @property
    def any(self) -> bool:
        return self.log or self.checkpoint or self.fit or self.evaluate


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The step numbers (1-based) of each boundary kind; ``end`` is where this process stops.

    ``per_call``: steps per compiled call, an integer or ``"auto"``.
    """

    steps: int
    end: int
    log_every: int
    checkpoint_every: int
    fit_every: int = 0  # 0: no fit checks
    per_call: int | str = 1
    eval_every: int = 0  # 0: no evaluations during training

    @classmethod
    def of(cls, config, end: int) -> Schedule:
        train = config.train
        return cls(steps=int(train.steps), end=end, log_every=int(train.log_every),
                   checkpoint_every=int(train.checkpoint_every),
                   fit_every=int(train.fit_check_every) if float(train.fit_accuracy) > 0 else 0,
                   per_call=steps_per_call(config), eval_every=int(train.get("eval_every", 0)))

    def at(self, s: int) -> Boundary:
        last = s == self.steps
        return Boundary(log=s % self.log_every == 0 or last,
                        checkpoint=s % self.checkpoint_every == 0 or last or s == self.end,
                        fit=bool(self.fit_every) and (s % self.fit_every == 0 or last),
                        evaluate=bool(self.eval_every) and (s % self.eval_every == 0 or last))

    def next_stop(self, t: int) -> int:
        """The first boundary step ``s > t`` (``end`` at the latest)."""
        s = t + 1
        stops = [self.end, self.steps]
        for every in (self.log_every, self.checkpoint_every, self.fit_every, self.eval_every):
            if every:
                stops.append(-(-s // every) * every)
        return min(x for x in stops if x >= s)


class _PerCall:
    """How many steps the next call runs: fixed, or ``"auto"`` (probe calls of 1 and 2 steps, then choose)."""

    def __init__(self, per_call):
        self.auto = per_call == AUTO
        self.fixed = 1 if self.auto else int(per_call)
        self.calls, self.probes = 0, []  # (steps, seconds) of each timed probe call

    @property
    def k(self) -> int:
        if not self.auto:
            return self.fixed
        return 1 + len(self.probes) % 2 if self.calls else 1  # compile with 1, then 1, 2, 1, 2, ...

    def timed(self, run, pending, n: int, extra=None):
        """``run()`` (``n`` steps), timed after the work already queued while ``"auto"`` is probing."""
        if not self.auto:
            return run()
        jax.block_until_ready((pending, extra))
        t0 = time.perf_counter()
        out = jax.block_until_ready(run())
        self.calls += 1
        if self.calls > 1:  # the first call compiles
            self.probes.append((n, time.perf_counter() - t0))
        if len(self.probes) == 2 * AUTO_PROBES:
            self.fixed, self.auto = auto_steps_per_call(*fit_call_time(self.probes)), False
        return out


def probe_steps_per_call(call) -> int:
    """``"auto"``'s k for ``call(n)`` (runs ``n`` steps, returns when they are done; compiled
    already): the loop's probe, for benchmarks."""
    probes = []
    for i in range(2 * AUTO_PROBES):
        t0 = time.perf_counter()
        call(1 + i % 2)
        probes.append((1 + i % 2, time.perf_counter() - t0))
    return auto_steps_per_call(*fit_call_time(probes))


def fit_call_time(probes) -> tuple[float, float]:
    """``(step_s, call_s)`` of ``seconds = call_s + steps * step_s`` from the probes ``[(steps, seconds)]``.

    Each call length's fastest probe stands for it: what else the host runs
    only ever adds time, so the minima are the estimates least disturbed by it
    (a least-squares fit over every probe took a slow 1-step call for a cheap
    call and picked k = 1 at case R). The line through the fastest call of the
    shortest and of the longest length; ``call_s`` at least 0. Calls of one
    length only: the fastest time per step, no call cost.
    """
    fastest = {}
    for n, t in probes:
        fastest[n] = min(t, fastest.get(n, t))
    lo, hi = min(fastest), max(fastest)
    if lo == hi:
        return fastest[lo] / lo, 0.0
    step = max((fastest[hi] - fastest[lo]) / (hi - lo), 1e-9)
    return step, max(fastest[lo] - step * lo, 0.0)


def auto_steps_per_call(step_seconds: float, call_seconds: float = 0.0) -> int:
    """``"auto"``'s steps per call k for a step time and a fixed cost per call.

    The larger of ``call_s / (AUTO_CALL_SHARE * step_s)`` (the cost of a call
    at most 2% of its steps') and ``AUTO_CALL_SECONDS / step_s`` (calls of
    at least 1 s), at most ``AUTO_MAX_CALL_SECONDS / step_s`` (a call
    returns within 30 s) and :data:`AUTO_MAX`, at least 1.
    """
    step = max(step_seconds, 1e-9)
    k = max(math.ceil(call_seconds / (AUTO_CALL_SHARE * step)), math.ceil(AUTO_CALL_SECONDS / step))
    return max(1, min(k, AUTO_MAX, int(AUTO_MAX_CALL_SECONDS / step)))


def _per_step(fetched):
    """``[(s, metrics)]`` of every step in the fetched chunks ``[(t, n, rows, extra)]``."""
    out = []
    for t, n, rows, extra in fetched:
        for i in range(n):
            m = {name: v[i] for name, v in rows.items()}
            if extra is not None and i == n - 1:
                m.update(extra)
            out.append((t + i + 1, m))
    return out


class Interrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C after a checkpoint at ``step``: rerunning the command resumes there."""

    def __init__(self, step: int):
        super().__init__(step)
        self.step = step


class _CtrlC:
    """SIGINT while training: the first asks the loop to checkpoint when the running call returns
    (at most ``AUTO_MAX_CALL_SECONDS``; with "auto", about a second) and stop; a second one ends the
    process at once, the steps since the last checkpoint lost.

    After the first (seen, and its message printed, when the main thread next runs Python), SIGINT
    takes its default action: a Python handler runs only between bytecodes of the main thread, which
    may be waiting inside a compiled call for many seconds, while the default action ends the
    process wherever it is. Nothing is lost but those steps: every write
    is atomic, and the next start takes over the dead process's lock and resumes."""

    def __init__(self):
        self.asked, self._old = False, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        self.asked = True
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        print("\ninterrupted: checkpointing when this call returns (Ctrl-C again to stop at once, "
              "losing the steps since the last checkpoint)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False


def train(trainer, *, start: int, schedule: Schedule, bar=None) -> int:
    """Run steps ``start .. schedule.end - 1`` of ``trainer``; returns the last step done (1-based).

    Ctrl-C checkpoints at the step the running call reaches, then raises :class:`Interrupted`.
    """
    with _CtrlC() as ctrl_c:
        t = _train(trainer, start=start, schedule=schedule, bar=bar, ctrl_c=ctrl_c)
    if ctrl_c.asked and t < schedule.end:
        raise Interrupted(t)
    return t


def _train(trainer, *, start: int, schedule: Schedule, bar, ctrl_c) -> int:
    per_call = _PerCall(schedule.per_call)
    pending, t = [], start
    while t < schedule.end:
        stop = schedule.next_stop(t)
        at = schedule.at(stop)
        n = min(per_call.k, stop - t)
        extra = None
        if at.log and t + n == stop:  # diagnostics of the logging step, before it trains
            if n > 1:
                pending.append((t, n - 1, per_call.timed(lambda: trainer.steps(t, n - 1), pending,
                                                         n - 1), None))
                t, n = t + n - 1, 1
            extra = trainer.stats(t)
        t0 = t
        pending.append((t0, n, per_call.timed(lambda: trainer.steps(t0, n), pending, n, extra), extra))
        t += n
        if ctrl_c.asked:  # checkpoint the state this call reached, and stop
            at = dataclasses.replace(at, checkpoint=True) if t == stop else Boundary(False, True, False)
            stop = t
        if t < stop:
            continue
        fetched = _per_step(jax.device_get(pending))
        pending = []
        if bar is not None:
            bar.update(len(fetched))
        if trainer.boundary(t, fetched, at) or ctrl_c.asked:
            return t
    return max(start, schedule.end)
