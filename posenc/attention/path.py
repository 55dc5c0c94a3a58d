"""PaTH attention: logits through a data-dependent product of Householder-like transforms.

Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating
Householder Transformations" (NeurIPS 2025). Official code:
fla-org/flash-linear-attention (commit bc3b101): layer
``fla/layers/path_attn.py``, naive reference ``naive_path_attn`` in
``fla/ops/path_attn/naive.py`` (used by ``tests/ops/test_path_attn.py``)::

    H_s = I - beta_s w_s w_s^T,      beta_s = 2 sigmoid(.) in (0, 2)
    logit_ij = scale * (q_i^T H_i H_{i-1} ... H_{j+1} k_j + c_i - c_j),   j <= i

``j = i`` is plain ``q_i . k_i``. ``c`` is the optional FoX cumulative log
forget gate (PaTH-FoX, ``posenc.fox.cumulative``); as in the official code
(naive ``(A + g_i - g_j) * scale``; kernels add ``g`` before ``* sm_scale``)
the gate term is multiplied by ``scale`` too, unlike FoX. ``w_s`` comes from a
low-rank projection, a causal depthwise convolution with SiLU
(:func:`short_conv`) and an L2 normalisation (:func:`normalize_w`); ``beta``
from :func:`beta`. Grouped-query heads: key head h serves query heads
``h*G .. h*G+G-1``; ``k``, ``w``, ``beta`` have the key heads, ``c`` the query heads.

Computation (as the naive reference, chunks of ``chunk`` tokens): inside a
chunk the product of the H's is kept in the UT/WY form ``I - W^T T (beta W)``
with ``T = (I + strict_lower(beta W W^T))^{-1}``; queries are moved to the
chunk start, keys to the chunk end, and a reverse scan over key chunks carries
every query through one [Dh, Dh] chunk product per step. Time O(L^2 Dh +
L^2 Dh^2 / chunk), memory O(L^2 + L Dh) per head for :func:`logits` and
O(L (chunk + Dh)) for :func:`blocked_attention` (online softmax): never
O(L^2 Dh^2).

Decoding (the official layer's cache, ``rank_one_update``): the cache holds,
per token and key head, the key transformed through every later token,
``k_j^(t) = H_t ... H_{j+1} k_j`` (one [Dh] vector, the size of a plain key),
plus the value and, for PaTH-FoX, ``c_j``; per layer also the last
``conv_size - 1`` inputs of the w convolution (:func:`short_conv_state`). A
step with new tokens computes ``logits(q, k, w, beta, prefix=cache)`` (new
queries against cached and new keys) and then appends:
``cache <- concat(update_keys(cache, w, beta), transform_keys(k, w, beta))``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks

_F32 = jnp.float32
_HI = jax.lax.Precision.HIGHEST  # the chained transforms are float32 algebra, not bf16 matmuls
_mm = functools.partial(jnp.matmul, precision=_HI)
_ACTIVATIONS = ("silu", "swish")


def beta(beta_logits) -> jax.Array:
    """``beta = 2 sigmoid(x)`` in float32: eigenvalue ``1 - beta`` of H in (-1, 1).

    Official: ``self.bt_proj(hidden_states).float().sigmoid() * 2`` (path_attn.py
    L111). Shape preserved: [..., L, Hkv].
    """
    return 2.0 * jax.nn.sigmoid(jnp.asarray(beta_logits).astype(_F32))


def normalize_w(w, *, eps=1e-6) -> jax.Array:
    """``w / sqrt(sum w^2 + eps)`` over the last axis, float32 out.

    fla ``l2_norm(w, output_dtype=torch.float32)`` (fla/modules/l2norm.py,
    ``rstd = 1 / sqrt(sum(x * x) + eps)``, eps 1e-6), per head after the
    short convolution (path_attn.py L122-L124). Shapes: [..., Dh] -> float32.
    """
    checks.number("eps", eps, positive=True)
    w32 = jnp.asarray(w).astype(_F32)
    return w32 * jax.lax.rsqrt(jnp.sum(jnp.square(w32), axis=-1, keepdims=True) + eps)


def _conv_inputs(x, width, state):
    """``concat(state or zeros, x)`` along time: [..., W - 1 + L, D] float32."""
    x32 = x.astype(_F32)
    if state is None:
        return jnp.pad(x32, [(0, 0)] * (x.ndim - 2) + [(width - 1, 0), (0, 0)])
    state = jnp.asarray(state)
    if state.shape[-2:] != (width - 1, x.shape[-1]):
        raise ValueError(f"state must have shape [..., W - 1, D] = [..., {width - 1}, {x.shape[-1]}]; "
                         f"got {state.shape}")
    state = jnp.broadcast_to(state.astype(_F32), x.shape[:-2] + state.shape[-2:])
    return jnp.concatenate([state, x32], axis=-2)


def short_conv(x, weight, *, bias=None, activation="silu", state=None) -> jax.Array:
    """Causal depthwise convolution ``y_t = act(sum_w weight[:, w] x_{t-W+1+w} + bias)``.

    fla ``ShortConvolution`` (fla/modules/conv/short_conv.py; reference
    ``causal_conv1d_ref_torch`` / ``causal_conv1d_update_ref_torch`` in
    tests/modules/test_conv.py): ``F.conv1d`` with ``padding = W - 1``,
    ``groups = D``, the first L outputs, then SiLU; the last tap
    ``weight[:, W-1]`` multiplies the current token. PaTH uses it on the w
    projection with ``W = conv_size = 3``, no bias, SiLU (path_attn.py L81).
    ``state`` holds the W - 1 inputs before x (a decoding cache, from
    :func:`short_conv_state`; the reference's ``initial_state`` transposed to
    time-major), default zeros. ``activation``: "silu" / "swish" (the same) or None.
    float32 math.

    Shapes: x [..., L, D], weight [D, W] (torch's [D, 1, W] squeezed), bias [D],
    state [..., W - 1, D] -> like x.
    """
    x = jnp.asarray(x)
    weight = jnp.asarray(weight)
    if activation is not None:
        checks.choice("activation", activation, _ACTIVATIONS)
    if x.ndim < 2 or weight.ndim != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"x must have shape [..., L, D] and weight [D, W]; got {x.shape} and {weight.shape}")
    width, n = weight.shape[1], x.shape[-2]
    xp = _conv_inputs(x, width, state)
    w32 = weight.astype(_F32)
    y = sum(xp[..., t:t + n, :] * w32[:, t] for t in range(width))
    if bias is not None:
        y = y + jnp.asarray(bias, _F32)
    if activation is not None:
        y = jax.nn.silu(y)
    return y.astype(x.dtype)


def short_conv_state(x, *, width, state=None) -> jax.Array:
    """The last ``width - 1`` inputs of ``concat(state, x)``: the conv state after x.

    Shapes: x [..., L, D], state [..., W - 1, D] -> [..., W - 1, D] in x.dtype.
    """
    width = checks.integer("width", width, minimum=1)
    x = jnp.asarray(x)
    xp = _conv_inputs(x, width, state)
    return xp[..., xp.shape[-2] - (width - 1):, :].astype(x.dtype)


# ----------------------------------------------------------------------------- chunked algebra


def _chunks(x, chunk, axis):
    """Split the token axis into [N, C], zero-padded (beta = 0 there: H = I)."""
    pad = -x.shape[axis] % chunk
    if pad:
        x = jnp.pad(x, [(0, 0)] * axis + [(0, pad)] + [(0, 0)] * (x.ndim - axis - 1))
    return x.reshape(x.shape[:axis] + (x.shape[axis] // chunk, chunk) + x.shape[axis + 1:])


def _chunk_products(w, b):
    """UT form of each chunk: T, T (beta w), and H_mat = w^T T (beta w) with
    ``q^T (I - H_mat) = q^T H_last ... H_first`` (naive_path_attn's T_mat, Twb, H_mat).

    w [..., C, d], b [..., C] -> T [..., C, C], twb [..., C, d], h_mat [..., d, d].
    """
    c = w.shape[-2]
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    wb = w * b[..., None]
    a = jnp.where(strict, _mm(wb, jnp.swapaxes(w, -1, -2)), 0.0)
    eye = jnp.broadcast_to(jnp.eye(c, dtype=_F32), a.shape)
    # T = (I + A)^{-1}: the naive reference's row-by-row forward substitution, solved at once.
    t = jax.scipy.linalg.solve_triangular(eye + a, eye, lower=True, unit_diagonal=True)
    twb = _mm(t, wb)
    return t, twb, _mm(jnp.swapaxes(w, -1, -2), twb)


def _key_terms(k, w, b, t):
    """Twbk and the keys moved to their chunk's end: k' = k - Twbk^T w."""
    c = w.shape[-2]
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    twbk = _mm(t, jnp.where(strict, _mm(w * b[..., None], jnp.swapaxes(k, -1, -2)), 0.0))
    return twbk, k - _mm(jnp.swapaxes(twbk, -1, -2), w)


def _prepare(q, k, w, b, chunk):
    """Per-chunk terms of aligned q [B, Hkv, G, L, d] and k, w [B, Hkv, 1, L, d], beta [B, Hkv, 1, L].

    -> q_start (queries moved to their chunk's start), k_end (keys moved to
    their chunk's end), a_local (in-chunk logits, zero above the diagonal)
    [.., N, C, C] and h_mat [.., N, d, d], as naive_path_attn.
    """
    qc, kc, wc, bc = (_chunks(x, chunk, 3) for x in (q, k, w, b))
    t, twb, h_mat = _chunk_products(wc, bc)
    twbk, k_end = _key_terms(kc, wc, bc, t)
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    qw = jnp.where(lower, _mm(qc, jnp.swapaxes(wc, -1, -2)), 0.0)
    a_local = jnp.where(lower, _mm(qc, jnp.swapaxes(kc, -1, -2)), 0.0) - _mm(qw, twbk)
    return qc - _mm(qw, twb), k_end, a_local, h_mat


def _chunk_scores(qs, j, kj, aj, ids):
    """Un-scaled logits of every query against key chunk j: through the carried products for
    later query chunks, a_local for chunk j itself, 0 before. -> [.., N, C, C]."""
    s = jnp.einsum("...ncd,...ed->...nce", qs, kj, precision=_HI)
    return jnp.where(ids > j, s, jnp.where(ids == j, aj[..., None, :, :], 0.0))


def _carry_past(qs, j, hj, ids):
    """Queries of chunks after j moved through chunk j's product (q^T <- q^T H_last ... H_first)."""
    return jnp.where(ids > j, qs - _mm(qs, hj[..., None, :, :]), qs)


def _key_chunks(*xs):
    """[.., N, ...] per-chunk arrays (chunk axis 3) -> scan inputs with the chunk axis first."""
    return tuple(jnp.moveaxis(x, 3, 0) for x in xs)


def _scan_logits(q, k, w, b, chunk):
    """Un-scaled Householder logits of aligned q [B, Hkv, G, L, d] and k, w [B, Hkv, 1, L, d].

    A reverse scan over key chunks carries every query backwards. -> (logits
    [B, Hkv, G, Lp, Lp] (zeros above the diagonal), queries carried to the
    first token [B, Hkv, G, Lp, d]), Lp = L rounded up to chunks.
    """
    q_start, k_end, a_local, h_mat = _prepare(q, k, w, b, chunk)
    n = q_start.shape[3]
    ids = jnp.arange(n)[:, None, None]

    def step(qs, xs):
        j, kj, aj, hj = xs
        return _carry_past(qs, j, hj, ids), _chunk_scores(qs, j, kj, aj, ids)

    q_first, s = jax.lax.scan(step, q_start, (jnp.arange(n),) + _key_chunks(k_end, a_local, h_mat),
                              reverse=True)
    s = jnp.moveaxis(s, 0, -2)  # [Nk, B, Hkv, G, Nq, Cq, Ck] -> [B, Hkv, G, Nq, Cq, Nk, Ck]
    lp = n * chunk
    return s.reshape(s.shape[:3] + (lp, lp)), q_first.reshape(q_first.shape[:3] + (lp, -1))


def _apply_chunk_products(keys, h_mat, chunk_ids=None):
    """Keys moved through the chunks' products in order: ``k <- k - k H_mat^T`` per chunk.

    keys [B, Hkv, P, d] (every key moves), or [B, Hkv, N, C, d] with
    ``chunk_ids`` [N, 1, 1]: key chunk j moves through the chunks after j only.
    h_mat [B, Hkv, N, d, d].
    """
    def step(ks, xs):
        m, hm = xs
        hm_t = jnp.swapaxes(hm, -1, -2)
        if chunk_ids is None:
            return ks - _mm(ks, hm_t), None
        return jnp.where(chunk_ids < m, ks - _mm(ks, hm_t[..., None, :, :]), ks), None

    keys, _ = jax.lax.scan(step, keys, (jnp.arange(h_mat.shape[2]), jnp.moveaxis(h_mat, 2, 0)))
    return keys


# ----------------------------------------------------------------------------- public API


def _scale(scale):
    """Checked when concrete (Python / NumPy / JAX scalar), passed through when traced."""
    if isinstance(scale, jax.core.Tracer):
        return scale
    value = np.asarray(scale).item() if np.ndim(scale) == 0 and not checks.is_real(scale) else scale
    return checks.number("scale", value, positive=True)


def _check_chunk(chunk):
    return checks.integer("chunk", chunk, minimum=1)


def _kv_heads_first(k, w, b):
    """[..., L, Hkv, d] (and beta [..., L, Hkv]) -> float32 [B, Hkv, L, d] / [B, Hkv, L]."""
    k, w, b = jnp.asarray(k), jnp.asarray(w), jnp.asarray(b)
    if k.ndim < 3 or w.shape != k.shape or b.shape != k.shape[:-1]:
        raise ValueError(f"k, w must have shape [..., L, Hkv, Dh] and beta [..., L, Hkv]; "
                         f"got {k.shape}, {w.shape}, {b.shape}")
    lead = k.shape[:-3]
    bsz = math.prod(lead)
    f = lambda x: jnp.swapaxes(x.reshape((bsz,) + x.shape[len(lead):]).astype(_F32), 1, 2)
    return lead, f(k), f(w), f(b)


def _check_q(q, k):
    ks = jnp.shape(k)
    if q.shape[:-2] != ks[:-2] or q.shape[-1] != ks[-1] or q.shape[-2] % ks[-2]:
        raise ValueError(f"q must have shape [..., T, H, Dh] matching k {ks} (H a multiple of Hkv); "
                         f"got {q.shape}")


def transform_keys(k, w, beta, *, chunk: int = 64) -> jax.Array:
    """Keys moved through every later token: ``k_j -> H_{L-1} ... H_{j+1} k_j`` (the cache after a prefill).

    fla's ``prepare_k_cache_fn`` (``parallel_path_attn(..., use_cache=True)``).
    Shapes: k, w [..., L, Hkv, Dh], beta [..., L, Hkv] -> like k.
    """
    chunk = _check_chunk(chunk)
    dtype = jnp.asarray(k).dtype
    lead, k32, w32, b32 = _kv_heads_first(k, w, beta)
    bsz, hkv, length, d = k32.shape
    chunk = min(chunk, length)
    kc, wc, bc = (_chunks(x, chunk, 2) for x in (k32, w32, b32))
    t, _, h_mat = _chunk_products(wc, bc)
    _, k_end = _key_terms(kc, wc, bc, t)  # moved to the end of their own chunk
    n = kc.shape[2]
    out = _apply_chunk_products(k_end, h_mat, chunk_ids=jnp.arange(n)[:, None, None])
    out = out.reshape((bsz, hkv, n * chunk, d))[:, :, :length]
    return jnp.swapaxes(out, 1, 2).reshape(lead + (length, hkv, d)).astype(dtype)


def update_keys(keys, w, beta, *, chunk: int = 64) -> jax.Array:
    """Cached keys moved through T new tokens: ``k <- H_{t+T-1} ... H_t k`` (official ``rank_one_update``).

    Shapes: keys [..., P, Hkv, Dh], w [..., T, Hkv, Dh], beta [..., T, Hkv] -> like keys.
    The official cache keeps the keys in the activation dtype and rounds after
    every step; pass float32 keys to keep full precision.
    """
    chunk = _check_chunk(chunk)
    keys = jnp.asarray(keys)
    lead, _, w32, b32 = _kv_heads_first(w, w, beta)  # only w, beta of the new tokens matter
    if keys.ndim != len(lead) + 3 or keys.shape[:len(lead)] != lead or keys.shape[-2:] != w.shape[-2:]:
        raise ValueError(f"keys must have shape [..., P, Hkv, Dh] with ... = {lead} and "
                         f"[Hkv, Dh] = {w.shape[-2:]}; got {keys.shape}")
    chunk = min(chunk, w32.shape[2])
    _, _, h_mat = _chunk_products(_chunks(w32, chunk, 2), _chunks(b32, chunk, 2))
    p = keys.shape[-3]
    k32 = jnp.swapaxes(keys.reshape((-1,) + keys.shape[-3:]).astype(_F32), 1, 2)
    out = _apply_chunk_products(k32, h_mat)
    return jnp.swapaxes(out, 1, 2).reshape(lead + (p,) + keys.shape[-2:]).astype(keys.dtype)


def logits(q, k, w, beta, *, scale=None, c_q=None, c_k=None, prefix=None, chunk: int = 64) -> jax.Array:
    """PaTH logits ``scale * (q_i^T H_i ... H_{j+1} k_j + c_i - c_j)``; -inf for keys after the query.

    Without ``prefix``: causal self-attention of L tokens -> [..., H, L, L].
    With ``prefix`` (cached keys already moved through the token before the
    first query, see :func:`transform_keys` / :func:`update_keys`): the T
    new tokens' queries against the P cached keys, then the new keys ->
    [..., H, T, P + T]. Every cached key is visible; with a fixed-size cache
    the caller masks the unused slots. ``c_q`` [..., H, T] and ``c_k``
    [..., H, P + T]: cumulative log forget gates (``posenc.fox.cumulative``)
    for PaTH-FoX, both or neither. ``scale`` defaults to ``1 / sqrt(Dh)``.

    Shapes: q [..., T, H, Dh]; k, w [..., T, Hkv, Dh] (w unit rows); beta [..., T, Hkv]
    -> float32 [..., H, T, P + T].
    """
    chunk = _check_chunk(chunk)
    q = jnp.asarray(q)
    lead, k32, w32, b32 = _kv_heads_first(k, w, beta)
    _check_q(q, k)
    bsz, length, h, d = k32.shape[0], q.shape[-3], q.shape[-2], q.shape[-1]
    hkv = k32.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else _scale(scale)
    if (c_q is None) != (c_k is None):
        raise ValueError("c_q and c_k go together (PaTH-FoX); got only one of them")
    chunk = min(chunk, length)
    q32 = jnp.swapaxes(q.reshape((bsz,) + q.shape[-3:]).astype(_F32), 1, 2)
    q32 = q32.reshape((bsz, hkv, h // hkv, length, d))
    s, q_first = _scan_logits(q32, k32[:, :, None], w32[:, :, None], b32[:, :, None], chunk)
    s = s[..., :length, :length]
    causal = np.tril(np.ones((length, length), bool))
    s = jnp.where(causal, s, -jnp.inf)
    if prefix is not None:
        prefix = jnp.asarray(prefix)
        if prefix.ndim != q.ndim or prefix.shape[:len(lead)] != lead or prefix.shape[-2:] != jnp.shape(k)[-2:]:
            raise ValueError(f"prefix must have shape [..., P, Hkv, Dh] with ... = {lead} and "
                             f"[Hkv, Dh] = {jnp.shape(k)[-2:]}; got {prefix.shape}")
        pk = jnp.swapaxes(prefix.reshape((bsz,) + prefix.shape[-3:]).astype(_F32), 1, 2)
        sp = jnp.einsum("bhgqd,bhkd->bhgqk", q_first[..., :length, :], pk, precision=_HI)
        s = jnp.concatenate([sp, s], axis=-1)
    s = s.reshape((bsz, h) + s.shape[-2:])
    if c_q is not None:
        lk = s.shape[-1]
        c_q = jnp.broadcast_to(jnp.asarray(c_q, _F32), lead + (h, length)).reshape((bsz, h, length))
        c_k = jnp.broadcast_to(jnp.asarray(c_k, _F32), lead + (h, lk)).reshape((bsz, h, lk))
        s = s + (c_q[..., :, None] - c_k[..., None, :])
    return (s * scale).reshape(lead + s.shape[1:])


def attention(q, k, v, w, beta, *, scale=None, c_q=None, c_k=None, chunk: int = 64) -> jax.Array:
    """Causal PaTH attention ``softmax(logits) @ v`` (the naive reference's output).

    Shapes: q [..., L, H, Dh]; k, v, w [..., L, Hkv, Dh]; beta [..., L, Hkv];
    c_q, c_k [..., H, L] -> like q.
    """
    q, v = jnp.asarray(q), jnp.asarray(v)
    s = logits(q, k, w, beta, scale=scale, c_q=c_q, c_k=c_k, chunk=chunk)
    p = jax.nn.softmax(s, axis=-1)
    groups = q.shape[-2] // v.shape[-2]
    v32 = jnp.repeat(v.astype(_F32), groups, axis=-2) if groups > 1 else v.astype(_F32)
    return jnp.einsum("...hqk,...khd->...qhd", p, v32, precision=_HI).astype(q.dtype)


_NEG = -1e30  # finite mask value for the running maximum: never inf - inf


def blocked_attention(q, k, v, w, beta, *, scale=None, c_q=None, c_k=None, chunk: int = 64) -> jax.Array:
    """:func:`attention` without the [L, L] logits: an online softmax over key chunks.

    The reverse scan of :func:`logits` (key chunks from the last to the
    first, every query carried backwards through one chunk product per
    step) folds each [L, chunk] tile of logits into a running maximum, sum
    and output (Rabe & Staats 2021 / FlashAttention) instead of keeping it.
    Memory O(L (chunk + Dh)) per head; the step is rematerialised
    (``jax.checkpoint``) so the gradient keeps only the carries.

    Shapes as :func:`attention` -> like q.
    """
    chunk = _check_chunk(chunk)
    q, v = jnp.asarray(q), jnp.asarray(v)
    lead, k32, w32, b32 = _kv_heads_first(k, w, beta)
    bsz, hkv, length, d = k32.shape
    _check_q(q, k)
    if v.shape[:-1] != jnp.shape(k)[:-1]:
        raise ValueError(f"v must have shape [..., T, Hkv, Dv] matching k {jnp.shape(k)}; got {v.shape}")
    h = q.shape[-2]
    g = h // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else _scale(scale)
    if (c_q is None) != (c_k is None):
        raise ValueError("c_q and c_k go together (PaTH-FoX); got only one of them")
    chunk = min(chunk, length)
    q32 = jnp.swapaxes(q.reshape((bsz,) + q.shape[-3:]).astype(_F32), 1, 2).reshape((bsz, hkv, g, length, d))
    v32 = jnp.swapaxes(v.reshape((bsz,) + v.shape[-3:]).astype(_F32), 1, 2)[:, :, None]
    q_start, k_end, a_local, h_mat = _prepare(q32, k32[:, :, None], w32[:, :, None], b32[:, :, None], chunk)
    n = q_start.shape[3]
    ids = jnp.arange(n)[:, None, None]
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    vc = _chunks(v32, chunk, 3)
    if c_q is None:
        cq = ck = jnp.zeros((bsz, hkv, g, n, chunk), _F32)
    else:
        def heads(c):
            c = jnp.broadcast_to(jnp.asarray(c, _F32), lead + (h, length)).reshape((bsz, hkv, g, length))
            return _chunks(c, chunk, 3)
        cq, ck = heads(c_q), heads(c_k)

    @jax.checkpoint
    def step(carry, xs):
        qs, m, l, acc = carry
        j, kj, aj, hj, vj, ckj = xs
        s = _chunk_scores(qs, j, kj, aj, ids)
        s = scale * (s + cq[..., None] - ckj[..., None, None, :])
        visible = ((ids > j) | ((ids == j) & lower)) & (j * chunk + jnp.arange(chunk) < length)
        m_new = jnp.maximum(m, jnp.max(jnp.where(visible, s, _NEG), axis=-1))
        # Mask inside the exp: exp(s - m) of a hidden entry may overflow, and inf * 0 is a NaN gradient.
        p = jnp.exp(jnp.where(visible, s - m_new[..., None], -jnp.inf))
        corr = jnp.exp(m - m_new)
        acc = acc * corr[..., None] + jnp.einsum("...nck,...kd->...ncd", p, vj, precision=_HI)
        return (_carry_past(qs, j, hj, ids), m_new, l * corr + jnp.sum(p, axis=-1), acc), None

    init = (q_start, jnp.full(q_start.shape[:-1], _NEG, _F32), jnp.zeros(q_start.shape[:-1], _F32),
            jnp.zeros(q_start.shape[:-1] + v.shape[-1:], _F32))
    xs = (jnp.arange(n),) + _key_chunks(k_end, a_local, h_mat, vc, ck)
    (_, _, l, acc), _ = jax.lax.scan(step, init, xs, reverse=True)
    out = (acc / l[..., None]).reshape((bsz, h, n * chunk, -1))[:, :, :length]
    return jnp.swapaxes(out, 1, 2).reshape(lead + (length, h, v.shape[-1])).astype(q.dtype)
