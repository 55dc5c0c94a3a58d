"""FIRE: functional interpolation for relative positions.

Li et al. 2023, "Functional Interpolation for Relative Positions Improves
Long Context Transformers" (arXiv 2310.04418), following the paper's
reference module (appendix; the same code is in mcleish7/arithmetic,
``cramming/architectures/embeddings.py``, class ``FIRE``)::

    threshold = |L_multiplier * init_L|            # init_L fixed (512), L_multiplier learned (init 1)
    x[i, j]   = log(|c (i - j)| + 1) / (log(|c max(i, threshold)| + 1) + eps)
    bias[h, i, j] = MLP(x[i, j])_h,   MLP: 1 -> hidden -> H, ReLU

Learning a multiplier of a fixed init_L rather than L itself scales the
gradient of the threshold by init_L (512x): under Adam, whose steps have
the size of the learning rate in parameter units, L itself would barely
move.

Not shift invariant by design: the normaliser max(i, threshold) depends on
the query position. The input x is invariant under a common shift only
while every query stays below the threshold; beyond it x(i, j) is a
function of the distance i - j and of i (progressive interpolation:
x(i, 0) = 1 for every i >= threshold, up to eps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.encodings.absolute import check_positions, relative_distances

PARAM_SHAPES = ("w1 [1, hidden]", "b1 [hidden]", "w2 [hidden, H]", "b2 [H]", "c []", "L_multiplier []")
LEGACY_THRESHOLD = "threshold"  # the previous layout: L learned directly instead of L_multiplier
INIT_L = 512.0


def init_params(key, num_heads: int, *, hidden: int = 32, c: float = 0.1, threshold=None) -> dict:
    """FIRE parameters: an MLP 1 -> hidden -> H, the log scale ``c`` and the threshold multiplier.

    Returns dict(w1 [1, hidden], b1 [hidden], w2 [hidden, H], b2 [H],
    c float32 [] (init 0.1), L_multiplier float32 [] (init 1)); every entry
    is learned. The fixed ``init_L`` (512 in the reference) is a keyword of
    :func:`bias`. MLP weights and biases use the PyTorch ``nn.Linear``
    default U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as in the reference.

    ``threshold=L`` returns the previous layout instead, with
    ``threshold float32 [] = L`` learned directly in place of L_multiplier
    (not the reference parameterisation; kept so existing callers work).
    """
    for name, value in (("num_heads", num_heads), ("hidden", hidden)):
        checks.integer(name, value, minimum=1)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    bound2 = 1.0 / np.sqrt(hidden)

    def uniform(k, shape, bound):
        return jax.random.uniform(k, shape, jnp.float32, -bound, bound)

    params = {
        "w1": uniform(k1, (1, hidden), 1.0),
        "b1": uniform(k2, (hidden,), 1.0),
        "w2": uniform(k3, (hidden, num_heads), bound2),
        "b2": uniform(k4, (num_heads,), bound2),
        "c": jnp.asarray(checks.number("c", c), jnp.float32),
    }
    if threshold is None:
        params["L_multiplier"] = jnp.asarray(1.0, jnp.float32)
    else:
        params[LEGACY_THRESHOLD] = jnp.asarray(checks.number("threshold", threshold, positive=True), jnp.float32)
    return params


def _check_params(params) -> str:
    """The threshold entry of ``params`` ("L_multiplier" or the legacy "threshold"); ValueError if malformed."""
    if "L_multiplier" in params and LEGACY_THRESHOLD in params:
        raise ValueError("FIRE params hold both L_multiplier and threshold; expected one of them")
    thr = LEGACY_THRESHOLD if LEGACY_THRESHOLD in params else "L_multiplier"
    names = ("w1", "b1", "w2", "b2", "c", thr)
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"FIRE params missing {', '.join(missing)}; expected {', '.join(PARAM_SHAPES)}")
    w1, b1, w2, b2 = (jnp.shape(params[n]) for n in names[:4])
    hidden = w1[-1] if len(w1) == 2 else None
    ok = (
        len(w1) == 2 and w1[0] == 1 and b1 == (hidden,) and len(w2) == 2 and w2[0] == hidden
        and b2 == (w2[1],) and jnp.shape(params["c"]) == () and jnp.shape(params[thr]) == ()
    )
    if not ok:
        got = ", ".join(f"{n} {jnp.shape(params[n])}" for n in names)
        raise ValueError(f"bad FIRE param shapes: {got}; expected {', '.join(PARAM_SHAPES)}")
    return thr


def effective_threshold(params, *, init_L=None) -> jax.Array:
    """The effective threshold |L_multiplier * init_L| (legacy layout: |threshold|), float32 []."""
    thr = _check_params(params)
    if thr == LEGACY_THRESHOLD:
        if init_L is not None:
            raise ValueError("init_L applies to params with L_multiplier; these hold a learned threshold")
        return jnp.abs(jnp.asarray(params[thr], jnp.float32))
    init_L = INIT_L if init_L is None else checks.number("init_L", init_L, positive=True)
    return jnp.abs(jnp.asarray(params["L_multiplier"], jnp.float32) * init_L)


def inputs(q_positions, k_positions, c, thr, *, eps: float = 1e-6) -> jax.Array:
    """The MLP input log(|c (i - j)| + 1) / (log(|c max(i, thr)| + 1) + eps), float32 [..., Lq, Lk]."""
    c = jnp.asarray(c, jnp.float32)
    dist = relative_distances(q_positions, k_positions).astype(jnp.float32)
    qpos = check_positions(q_positions, "q_positions").astype(jnp.float32)
    norm = jnp.log(jnp.abs(c * jnp.maximum(qpos, thr)) + 1) + eps  # [..., Lq]
    return jnp.log(jnp.abs(c * dist) + 1) / norm[..., :, None]


def bias(q_positions, k_positions, params, *, init_L=None, eps: float = 1e-6) -> jax.Array:
    """FIRE attention bias MLP(x[i, j])_h (module docstring), float32 [..., H, Lq, Lk].

    ``init_L``: the fixed base of the threshold (default 512, the
    reference's); only for params with ``L_multiplier``. Distances enter as
    |i - j| like the reference (keys after the query, masked in causal
    attention, mirror the ones before it).

    Shapes: q_positions int [..., Lq], k_positions int [..., Lk], params from
    :func:`init_params` -> float32 [..., H, Lq, Lk].
    """
    thr = effective_threshold(params, init_L=init_L)
    p = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), dict(params))
    x = inputs(q_positions, k_positions, p["c"], thr, eps=eps)
    h = jax.nn.relu(x[..., None] * p["w1"][0] + p["b1"])  # [..., Lq, Lk, hidden]
    out = h @ p["w2"] + p["b2"]  # [..., Lq, Lk, H]
    return jnp.moveaxis(out, -1, -3)
