"""Decoding a sample of the failing rows (``eval.decode_rows``): the seeded draw and the unbiased estimate.

Only a row's answer tokens from its first error on need decoding: a row is
right decoded iff every teacher-forced prediction along the sequence as
decoding reads it is right (then it is not decoded at all), and up to its
first error a failing row predicts what teacher forcing predicted. So with
``eval.decode_rows = k`` and ``F > k`` failing rows at a length:

* every example keeps its exact decoded exact match (right iff no first
  error) and its first error;
* ``k`` of the ``F`` failing rows are decoded, drawn uniformly without
  replacement (:func:`draw`: seeded by ``eval.seed`` and the length; the
  rows of one model in the order of one permutation of the set, so the same
  model draws the same rows alone or in a seed group);
* the decoded accuracy counts exactly the tokens of right rows and the
  tokens before each failing row's first error, and estimates the right
  tokens from the first errors on with the Horvitz-Thompson expansion of the
  sample (:func:`estimate`):

      A = (K + (F / k) * sum_{i in S} d_i) / T,    SE(A) = F sqrt((1 - k / F) s_d^2 / k) / T

  ``T`` the answer tokens of the set, ``K`` the right tokens known without
  decoding, ``d_i`` the right tokens of sampled row ``i`` from its first
  error on, ``s_d^2`` their sample variance (``ddof=1``). ``E[A]`` is the
  accuracy of decoding every row (each failing row is in the sample with
  probability ``k / F``); ``SE`` is the standard error of simple random
  sampling without replacement (finite-population corrected: 0 when
  ``k = F``). A single estimate may leave [0, 1] by a little; it is not
  clipped, which would bias it.

``eval.decode_rows = "all"`` (or ``k >= F``) decodes every failing row, the
metric exactly.
"""

from __future__ import annotations

import math

import numpy as np

from posenc import checks

ALL = "all"
_SALT = 0x6465636F  # "deco": keeps this draw apart from other uses of (eval.seed, length)


def check_decode_rows(name: str, value):
    """``value`` (eval.decode_rows) if it is "all" or an integer >= 2, else a one-line ValueError."""
    if isinstance(value, str) and value == ALL:
        return ALL
    if checks.is_int(value) and value >= 2:
        return int(value)
    raise ValueError(f"{name} must be 'all' or an integer >= 2 (failing rows decoded per evaluation length; "
                     f"two at least, for the sampling error); got {value!r}")


def draw(first: np.ndarray, length: int, *, seed: int, rows: int) -> np.ndarray:
    """bool [M, N]: at most ``rows`` failing rows of each model (``first`` [M, N] < ``length``), uniform
    without replacement; the same for the same ``seed``, ``length`` and failing rows."""
    first = np.asarray(first)
    rank = np.empty(first.shape[1], np.int64)
    rank[np.random.default_rng([_SALT, int(seed), int(length)]).permutation(first.shape[1])] = \
        np.arange(first.shape[1])
    chosen = np.zeros(first.shape, bool)
    for m, errors in enumerate(first):
        failing = np.flatnonzero(errors < length)
        chosen[m, failing[np.argsort(rank[failing], kind="stable")[:rows]]] = True
    return chosen


def chooser(decode_rows, *, seed: int, length: int):
    """``choose(first) -> bool [M, N]`` of ``eval.decode_rows`` (None: every failing row)."""
    decode_rows = check_decode_rows("eval.decode_rows", decode_rows)
    if decode_rows == ALL:
        return None
    return lambda first: draw(first, length, seed=seed, rows=decode_rows)


def estimate(correct, mask, first, decoded) -> tuple[float, float | None]:
    """``(decoded accuracy, its standard error)`` from a sample (module docstring's A and SE).

    ``correct``, ``mask`` bool [N, L] (a failing row not decoded: right up to its first error, False
    from there); ``first`` int [N] (``L``: no error); ``decoded`` bool [N]: the sampled failing rows.
    """
    correct, mask = np.asarray(correct, bool), np.asarray(mask, bool)
    first, decoded = np.asarray(first), np.asarray(decoded, bool)
    length = mask.shape[1]
    failing, k = int((first < length).sum()), int(decoded.sum())
    if not k:
        raise ValueError("estimate needs at least one decoded row")
    after = np.arange(length) >= first[:, None]  # from the first error on: decoded, the rest is known
    d = (correct & after).sum(axis=1)[decoded].astype(np.float64)
    tokens = float(mask.sum())
    known = float(correct.sum()) - d.sum()
    accuracy = (known + failing / k * d.sum()) / tokens
    if k == failing:
        return accuracy, 0.0
    variance = float(np.var(d, ddof=1)) if k > 1 else math.nan
    return accuracy, failing * math.sqrt((1 - k / failing) * variance / k) / tokens
