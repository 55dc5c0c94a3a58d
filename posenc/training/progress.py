"""Progress bar on stderr: tqdm when installed, else a plain status line."""

from __future__ import annotations

import sys
import time


def progress(total: int, initial: int, enabled: bool):
    """A progress bar from ``initial`` to ``total`` steps, or None when not ``enabled``."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return PlainProgress(total, initial)
    return tqdm(total=total, initial=initial, file=sys.stderr, unit="step", dynamic_ncols=True)


class PlainProgress:
    """A minimal stderr progress line (step, steps/s, ETA) when tqdm is missing."""

    def __init__(self, total, initial):
        self.total, self.n, self.start, self.first = total, initial, time.time(), initial

    def update(self, k):
        self.n += k

    def set_postfix_str(self, s):
        done = self.n - self.first
        rate = done / max(time.time() - self.start, 1e-9)
        eta = (self.total - self.n) / rate if rate > 0 else float("inf")
        print(f"\rstep {self.n}/{self.total} {rate:.1f} step/s ETA {eta:.0f}s {s}", end="",
              file=sys.stderr, flush=True)

    def close(self):
        print(file=sys.stderr, flush=True)
