"""The step loop shared by every trainer: steps, boundaries, one host sync per boundary.

A trainer (one run, or several seeds vmapped together) implements two
methods and :func:`train` drives them::

    step(t, stats: bool) -> device metrics       # train step t (0-based) and advance the state
    boundary(s, fetched, at: Boundary) -> bool   # host work at step s (1-based); True stops

``boundary`` receives the host metrics of every step since the previous
boundary: it checks them for NaN / Inf, logs, checkpoints and checks the
fit, as ``at`` says. Between boundaries nothing leaves the device.
``stats`` is True on logging steps only: diagnostics (max attention logit,
attention entropy, log Z) are collected by a separate forward pass there,
so every other step takes the fused attention path.
"""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class Boundary:
    """What happens at step ``s``: log, checkpoint, check the fit."""

    log: bool
    checkpoint: bool
    fit: bool

    @property
    def any(self) -> bool:
        return self.log or self.checkpoint or self.fit


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The step numbers (1-based) of each boundary kind; ``end`` is where this process stops."""

    steps: int
    end: int
    log_every: int
    checkpoint_every: int
    fit_every: int = 0  # 0: no fit checks

    @classmethod
    def of(cls, config, end: int) -> "Schedule":
        train = config.train
        return cls(steps=int(train.steps), end=end, log_every=int(train.log_every),
                   checkpoint_every=int(train.checkpoint_every),
                   fit_every=int(train.fit_check_every) if float(train.fit_accuracy) > 0 else 0)

    def at(self, s: int) -> Boundary:
        last = s == self.steps
        return Boundary(log=s % self.log_every == 0 or last,
                        checkpoint=s % self.checkpoint_every == 0 or last or s == self.end,
                        fit=bool(self.fit_every) and (s % self.fit_every == 0 or last))


def train(trainer, *, start: int, schedule: Schedule, bar=None) -> int:
    """Run steps ``start .. schedule.end - 1`` of ``trainer``; returns the last step done (1-based)."""
    unchecked = []
    for t in range(start, schedule.end):
        s = t + 1
        at = schedule.at(s)
        unchecked.append((s, trainer.step(t, at.log)))
        if not at.any:
            continue
        fetched = jax.device_get(unchecked)
        unchecked = []
        if bar is not None:
            bar.update(len(fetched))
        if trainer.boundary(s, fetched, at):
            return s
    return max(start, schedule.end)
