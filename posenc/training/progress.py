"""Progress bar on stderr: tqdm when installed, else a plain status line."""

from __future__ import annotations

import sys
import time


def progress(total: int, initial: int, enabled: bool, *, desc: str | None = None, unit: str = "step",
             delay: float = 0.0, leave: bool = True):
    """A progress bar from ``initial`` to ``total`` steps, or None when not ``enabled``.

    ``desc``: a label before the bar; ``unit``: what a step is; ``delay``: seconds before the bar
    first shows (a short task shows nothing); ``leave``: keep the finished bar on screen.
    """
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return PlainProgress(total, initial, desc=desc, unit=unit, delay=delay)
    return tqdm(total=total, initial=initial, file=sys.stderr, unit=unit, dynamic_ncols=True, desc=desc,
                delay=delay, leave=leave)


class PlainProgress:
    """A minimal stderr progress line (step, steps/s, ETA) when tqdm is missing."""

    def __init__(self, total, initial, *, desc=None, unit="step", delay=0.0):
        self.total, self.n, self.start, self.first = total, initial, time.time(), initial
        self.desc, self.unit, self.delay, self.shown, self.born = desc, unit, delay, False, self.start

    def update(self, k):
        self.n += k

    def reset(self, total=None):
        self.n = self.first = 0
        self.start = time.time()
        if total is not None:
            self.total = total

    def set_description(self, desc):
        self.desc = desc

    def set_postfix_str(self, s):
        if time.time() - self.born < self.delay:
            return
        self.shown = True
        done = self.n - self.first
        rate = done / max(time.time() - self.start, 1e-9)
        eta = (self.total - self.n) / rate if rate > 0 else float("inf")
        label = f"{self.desc}: " if self.desc else ""
        print(f"\r{label}{self.unit} {self.n}/{self.total} {rate:.1f} {self.unit}/s ETA {eta:.0f}s {s}", end="",
              file=sys.stderr, flush=True)

    def close(self):
        if self.shown or not self.delay:
            print(file=sys.stderr, flush=True)
