"""Statistics of seeds: Student-t intervals, paired differences.

A cell of a table is the mean over seeds with the half-width of its 95%
t-interval, ``t_{0.975, n-1} s / sqrt(n)`` (``s`` the sample standard
deviation of the ``n`` seeds; one seed: no interval). "X beats Y" is a
paired statement: the per-seed differences X_s - Y_s and their interval
(:func:`paired`), which must exclude zero.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class Interval(NamedTuple):
    """The mean of ``n`` seeds, the half-width of its 95% t-interval (None for one seed), their min and max."""

    mean: float
    half: float | None
    n: int
    low: float
    high: float

    def bounds(self, lo=None, hi=None) -> tuple[float, float]:
        """The interval ``mean -+ half`` clipped to the metric's range ``[lo, hi]`` (None: unbounded)."""
        a, b = (self.mean, self.mean) if self.half is None else (self.mean - self.half, self.mean + self.half)
        return (a if lo is None else max(a, lo), b if hi is None else min(b, hi))


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4, finite series)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + s * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` >= 1 degrees of freedom (bisection)."""
    if not 0.5 < p < 1 or int(df) != df or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and an integer df >= 1, got p={p!r}, df={df!r}")
    target, lo, hi = 2 * p - 1, 0.0, 1.0
    while _t_two_sided(hi, int(df)) < target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_two_sided(mid, int(df)) < target else (lo, mid)
    return (lo + hi) / 2


def interval(values, *, confidence: float = 0.95) -> Interval | None:
    """The t-interval over seeds of ``values`` (:class:`Interval`: mean, half-width, n, min, max).

    The half-width is None for one value; None for no values.
    """
    values = [float(v) for v in values]
    n = len(values)
    if not n:
        return None
    mean = float(np.mean(values))
    low, high = min(values), max(values)
    if n == 1:
        return Interval(mean, None, 1, low, high)
    s = float(np.std(values, ddof=1))
    return Interval(mean, t_quantile(0.5 + confidence / 2, n - 1) * s / math.sqrt(n), n, low, high)


def paired(xs: dict, ys: dict, *, confidence: float = 0.95) -> Interval | None:
    """The interval of ``xs[s] - ys[s]`` over the seeds ``s`` both have (None if none).

    ``xs``, ``ys``: ``{seed: value}``; seeds missing on either side are left out.
    """
    common = sorted(set(xs) & set(ys))
    return interval([xs[s] - ys[s] for s in common], confidence=confidence)


def excludes_zero(stat) -> bool:
    """Whether an interval lies entirely on one side of zero (one seed: never)."""
    return stat is not None and stat[1] is not None and abs(stat[0]) > stat[1]
