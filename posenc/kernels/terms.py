"""Position terms for the fused attention kernel: ALiBi, Hard-ALiBi, T5, KERPLE, FIRE, FoX.

Each constructor returns a :class:`posenc.kernels.score_term.Term` whose
tile function reproduces the pure module's bias on one block:
``posenc.alibi.bias``, ``posenc.hard_alibi.bias`` (with the finite
:data:`HIDDEN` for its -inf), ``posenc.t5.bias``, ``posenc.kerple.bias``,
``posenc.fire.bias``; FoX (Lin et al. 2025) adds ``c_i - c_j`` from per-token
cumulative log forget gates. Parameter transforms that the pure modules apply
(KERPLE's clamp, FIRE's effective threshold, T5's [num_buckets, H] table layout)
happen here, outside the kernel, so JAX differentiates them as usual and the
kernel sees plain arrays. RoPE and NoPE need no term (pass ``score_terms=()``;
RoPE rotates q and k before the kernel).
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc import checks
from posenc.encodings import fire as fire_lib
from posenc.encodings import kerple as kerple_lib
from posenc.encodings import t5 as t5_lib
from posenc.kernels.score_term import Term, distance, make, pick, pick2

# ---- ALiBi (Press et al. 2021) ----

def _alibi_fn(head, shared, q_pos, k_pos, q_vec, k_vec, *, causal):
    d = distance(q_pos, k_pos).astype(jnp.float32)
    if not causal:
        d = jnp.abs(d)
    return -pick(head[0], 0) * d


def alibi(slopes, *, causal: bool = True) -> Term:
    """ALiBi ``-slopes[h] * (i - j)`` (``|i - j|`` when not causal), as ``posenc.alibi.bias``.

    Shapes: slopes [H].
    """
    slopes = jnp.asarray(slopes, jnp.float32)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must have shape [H]; got {slopes.shape}")
    return make(_alibi_fn, head=(slopes[:, None],), name="alibi",
                causal=checks.boolean("causal", causal))


# ---- Hard-ALiBi (Jelassi et al. 2024) ----

HIDDEN = -1e30  # a key outside a head's window: finite (terms must be), exp(HIDDEN - m) = 0


def _hard_alibi_fn(head, shared, q_pos, k_pos, q_vec, k_vec, *, causal):
    d = distance(q_pos, k_pos).astype(jnp.float32)
    if not causal:
        d = jnp.abs(d)
    w = pick(head[0], 0)
    return jnp.where((w == 0) | (d < w), 0.0, HIDDEN)


def hard_alibi(windows, *, causal: bool = True) -> Term:
    """Hard-ALiBi: 0 where ``i - j < windows[h]`` (``|i - j|`` when not causal) or the head has
    window 0, else :data:`HIDDEN`; ``posenc.hard_alibi.bias`` with -inf made finite.

    Shapes: windows int [H] (0: no window).
    """
    windows = jnp.asarray(windows)
    if windows.ndim != 1 or not jnp.issubdtype(windows.dtype, jnp.integer):
        raise ValueError(f"windows must be an integer array of shape [H]; got {windows.dtype} {windows.shape}")
    return make(_hard_alibi_fn, head=(windows[:, None],), name="hard_alibi",
                causal=checks.boolean("causal", causal))


# ---- T5 relative buckets (Raffel et al. 2020) ----

def _t5_fn(head, shared, q_pos, k_pos, q_vec, k_vec, *, bidirectional, num_buckets, exact,
           thresholds):
    # The bucket of posenc.t5.relative_position_bucket, with the host-computed
    # float32 step distances as a static sum of compares (bit-identical, no log).
    rp = -distance(q_pos, k_pos)  # key_pos - query_pos
    nb = num_buckets // 2 if bidirectional else num_buckets
    if bidirectional:
        bucket = jnp.where(rp > 0, nb, 0)
        rp = jnp.abs(rp)
    else:
        bucket = jnp.zeros_like(rp)
        rp = jnp.maximum(-rp, 0)
    large = jnp.full_like(rp, exact)
    for t in thresholds:
        large = large + (rp >= t).astype(jnp.int32)
    bucket = bucket + jnp.where(rp < exact, rp, large)
    # Table lookup as a sum of selects over the buckets: no gather in the kernel.
    row = head[0]
    out = jnp.zeros(bucket.shape, jnp.float32)
    for b in range(num_buckets):
        out = out + jnp.where(bucket == b, pick(row, b), 0.0)
    return out


def t5(table, *, bidirectional: bool = False, max_distance: int = 128) -> Term:
    """T5 ``table[bucket(k_pos - q_pos), h]``, as ``posenc.t5.bias``.

    Shapes: table [num_buckets, H].
    """
    table = jnp.asarray(table, jnp.float32)
    if table.ndim != 2:
        raise ValueError(f"table must have shape [num_buckets, H]; got {table.shape}")
    bidirectional = checks.boolean("bidirectional", bidirectional)
    num_buckets = int(table.shape[0])
    # Same validation and step distances as posenc.t5 (shared so they cannot drift).
    nb, exact = t5_lib._check_buckets(bidirectional, num_buckets, max_distance)
    thresholds = tuple(int(t) for t in t5_lib._thresholds(nb, exact, int(max_distance)))
    return make(_t5_fn, head=(table.T,), name="t5", bidirectional=bidirectional,
                num_buckets=num_buckets, exact=exact, thresholds=thresholds)


# ---- KERPLE (Chi et al. 2022) ----

def _kerple_fn(head, shared, q_pos, k_pos, q_vec, k_vec, *, kind):
    d = jnp.abs(distance(q_pos, k_pos)).astype(jnp.float32)
    a, p = pick(head[0], 0), pick(head[1], 0)
    if kind == "log":
        return -p * jnp.log1p(a * d)
    positive = d > 0
    # d^p as exp(p log d) (pow with a traced exponent does not lower everywhere);
    # d = 0 is guarded so neither the value nor the p-gradient sees log 0.
    dp = jnp.where(positive, jnp.exp(p * jnp.log(jnp.where(positive, d, 1.0))), 0.0)
    return -a * dp


def kerple(a, p, *, kind: str = "log") -> Term:
    """KERPLE log ``-p log(1 + a|i-j|)`` or power ``-a |i-j|^p``, as ``posenc.kerple.bias``.

    ``a``, ``p`` are clamped (straight-through gradient) exactly as there.
    Shapes: a [H], p [H].
    """
    kind = checks.choice("kind", kind, kerple_lib.KINDS)
    a = jnp.asarray(a, jnp.float32)
    p = jnp.asarray(p, jnp.float32)
    if a.ndim != 1 or p.shape != a.shape:
        raise ValueError(f"a and p must both have shape [H]; got {a.shape} and {p.shape}")
    a = kerple_lib._clamp(a, kerple_lib.MIN_PARAM)
    hi = kerple_lib.MAX_POWER if kind == "power" else None
    p = kerple_lib._clamp(p, kerple_lib.MIN_PARAM, hi)
    return make(_kerple_fn, head=(a[:, None], p[:, None]), name=f"kerple_{kind}", kind=kind)


# ---- FIRE (Li et al. 2023) ----

def _fire_fn(head, shared, q_pos, k_pos, q_vec, k_vec, *, hidden, eps):
    w1, b1, ct = shared
    w2, b2 = head
    c, thr = pick2(ct, 0, 0), pick2(ct, 0, 1)
    # posenc.fire.inputs on the tile: log(|c (i - j)| + 1) / (log(|c max(i, thr)| + 1) + eps)
    dist = distance(q_pos, k_pos).astype(jnp.float32)
    norm = jnp.log(jnp.abs(c * jnp.maximum(q_pos.astype(jnp.float32), thr)) + 1) + eps  # [bq, 1]
    x = jnp.log(jnp.abs(c * dist) + 1) / norm
    # The MLP 1 -> hidden -> 1 (this head's output unit), one hidden unit at a time so that
    # only [bq, bk] values are live.
    out = jnp.broadcast_to(pick(b2, 0), x.shape)
    for u in range(hidden):
        out = out + pick(w2, u) * jnp.maximum(pick(w1, u) * x + pick(b1, u), 0.0)
    return out


def fire(params, *, init_L=None, eps: float = 1e-6) -> Term:
    """FIRE ``MLP(log(|c (i-j)| + 1) / (log(|c max(i, L)| + 1) + eps))_h``, as ``posenc.fire.bias``.

    The threshold ``L`` is ``posenc.fire.effective_threshold(params, init_L=init_L)``
    (computed here, outside the kernel, so its parameterisation stays the pure
    module's). Shapes: params from ``posenc.fire.init_params`` (w1 [1, hidden],
    b1 [hidden], w2 [hidden, H], b2 [H], c [], and L_multiplier [] or threshold []).
    """
    thr = fire_lib.effective_threshold(params, init_L=init_L)
    p = {n: jnp.asarray(params[n], jnp.float32) for n in ("w1", "b1", "w2", "b2", "c")}
    eps = checks.number("eps", eps, minimum=0.0)
    hidden = int(p["w1"].shape[1])
    ct = jnp.stack([p["c"], thr])[None, :]  # [1, 2]: both scalars in one array
    return make(_fire_fn, head=(p["w2"].T, p["b2"][:, None]),
                shared=(p["w1"], p["b1"][None, :], ct), name="fire", hidden=hidden, eps=eps)


# ---- FoX: forgetting attention (Lin et al. 2025) ----

def _fox_fn(head, shared, q_pos, k_pos, q_vec, k_vec):
    return q_vec - k_vec


def fox(c_q, c_k=None) -> Term:
    """FoX ``D_ij = c_i - c_j`` with ``c`` the cumulative sum of log forget gates.

    ``c_i = sum_{l <= i} log f_l``, so ``D_ij = sum_{l=j+1..i} log f_l``.
    Shapes: c_q [B | 1, H, Lq] at the queries, c_k [B | 1, H, Lk] at the keys
    (default c_q: self-attention without a cache).
    """
    c_q = jnp.asarray(c_q, jnp.float32)
    c_k = c_q if c_k is None else jnp.asarray(c_k, jnp.float32)
    return make(_fox_fn, q_vec=c_q, k_vec=c_k, name="fox")


def fox_cumulative(log_forget, *, axis: int = -1):
    """``c = cumsum(log f)`` along the token axis, float32 (the FoX per-token vector)."""
    return jnp.cumsum(jnp.asarray(log_forget, jnp.float32), axis=axis)

