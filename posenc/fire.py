"""FIRE: functional interpolation for relative positions.

Li et al. 2023, "Functional Interpolation for Relative Positions Improves
Long Context Transformers".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc.absolute import check_positions, relative_distances

PARAM_SHAPES = ("w1 [1, hidden]", "b1 [hidden]", "w2 [hidden, H]", "b2 [H]", "c []", "threshold []")


def init_params(key, num_heads: int, *, hidden: int = 32, c: float = 0.1, threshold: float = 512.0) -> dict:
    """FIRE parameters: an MLP 1 -> hidden -> H, the log scale ``c`` and threshold ``L``.

    MLP weights use the PyTorch ``nn.Linear`` default, U(-1/sqrt(fan_in),
    1/sqrt(fan_in)), as in the paper's reference code. ``c`` (init 0.1) and
    ``threshold`` (init 512) are learned scalars; ``bias`` uses their
    absolute values, which keeps them positive as the reference code does.

    Returns dict(w1 [1, hidden], b1 [hidden], w2 [hidden, H], b2 [H],
    c float32 [], threshold float32 []).
    """
    for name, value in (("num_heads", num_heads), ("hidden", hidden)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    k1, k2, k3, k4 = jax.random.split(key, 4)
    bound2 = 1.0 / np.sqrt(hidden)

    def uniform(k, shape, bound):
        return jax.random.uniform(k, shape, jnp.float32, -bound, bound)

    return {
        "w1": uniform(k1, (1, hidden), 1.0),
        "b1": uniform(k2, (hidden,), 1.0),
        "w2": uniform(k3, (hidden, num_heads), bound2),
        "b2": uniform(k4, (num_heads,), bound2),
        "c": jnp.asarray(c, jnp.float32),
        "threshold": jnp.asarray(threshold, jnp.float32),
    }


def _check_params(params) -> None:
    names = ("w1", "b1", "w2", "b2", "c", "threshold")
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"FIRE params missing {', '.join(missing)}; expected {', '.join(PARAM_SHAPES)}")
    w1, b1, w2, b2 = (jnp.shape(params[n]) for n in names[:4])
    hidden = w1[-1] if len(w1) == 2 else None
    ok = (
        len(w1) == 2 and w1[0] == 1 and b1 == (hidden,) and len(w2) == 2 and w2[0] == hidden
        and b2 == (w2[1],) and jnp.shape(params["c"]) == () and jnp.shape(params["threshold"]) == ()
    )
    if not ok:
        got = ", ".join(f"{n} {jnp.shape(params[n])}" for n in names)
        raise ValueError(f"bad FIRE param shapes: {got}; expected {', '.join(PARAM_SHAPES)}")


def bias(q_positions, k_positions, params, *, eps: float = 1e-6) -> jax.Array:
    """FIRE attention bias.

    ::

        psi(x) = log(|c| x + 1)
        bias[h, i, j] = f_h( psi(max(i - j, 0)) / (psi(max(|L|, i)) + eps) )
        f(x) = W2 relu(W1 x + b1) + b2        # MLP 1 -> hidden -> H

    ``i``, ``j`` are the query and key positions. Distances are causal:
    keys after the query (j > i) get distance 0 (they are masked anyway).
    The normaliser ``psi(max(L, i))`` is the paper's progressive
    interpolation with a threshold for short sequences.

    Shapes: q_positions int [..., Lq], k_positions int [..., Lk], params from
    ``init_params`` -> float32 [..., H, Lq, Lk].
    """
    _check_params(params)
    p = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), dict(params))
    c = jnp.abs(p["c"])
    dist = jnp.maximum(relative_distances(q_positions, k_positions), 0).astype(jnp.float32)
    qpos = check_positions(q_positions, "q_positions").astype(jnp.float32)
    norm = jnp.log1p(c * jnp.maximum(jnp.abs(p["threshold"]), qpos)) + eps  # [..., Lq]
    x = jnp.log1p(c * dist) / norm[..., :, None]  # [..., Lq, Lk]
    h = jax.nn.relu(x[..., None] * p["w1"][0] + p["b1"])  # [..., Lq, Lk, hidden]
    out = h @ p["w2"] + p["b2"]  # [..., Lq, Lk, H]
    return jnp.moveaxis(out, -1, -3)
