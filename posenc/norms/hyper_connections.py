"""Hyper-connections (HC) and manifold-constrained hyper-connections (mHC): n residual streams.

The residual stream becomes ``n`` streams ``X [..., n, D]``: the embedding is
copied into each (:func:`expand`), every sublayer ``F`` reads a mix of them and
writes back into each, and the decoder sums them at the end (:func:`reduce`;
mHC collapses them with :func:`mhc_head`).

**HC** (Zhu et al., ICLR 2025, arXiv 2409.19606; ``lucidrains/hyper-connections``
``HyperConnections``). Width connection (:func:`hc_width`) and depth connection
(:func:`hc_depth`) of one sublayer, with ``alpha [..., n, 1 + n]`` and ``beta
[..., n]``:

    [h, X'] = alpha^T X        h = sum_s alpha[s, 0] X_s   (the sublayer's input)
    X_next = X' + beta (x) F(h)                             X'_t = sum_s alpha[s, 1 + t] X_s

Static HC uses the learned ``alpha = [A_m | A_r]`` and ``beta = B``, initialised
(:func:`hc_init`) to ``A_m = e_(k mod n)`` for layer ``k`` (one stream feeds the
layer), ``A_r = I``, ``B = 1``: a plain residual on each stream. Dynamic HC adds
``s_alpha * tanh(norm(X) W_alpha)`` and ``s_beta * tanh(norm(X) W_beta)`` per
token (``W`` zeros, ``s`` 0.01 at init), with ``norm`` a norm over ``D`` of each
stream (the paper: LayerNorm; lucidrains: RMSNorm with a gain).

**mHC** (Xie et al., DeepSeek 2025, arXiv 2512.24880; as DeepSeek-V4 uses it,
transformers ``models/deepseek_v4`` ``DeepseekV4HyperConnection``): from the
flattened, RMS-normalised streams ``x = rmsnorm(vec X) [n D]`` (no gain),

    pre  = sigmoid(scale_0 * x fn_pre  + base_pre) + eps                      [n]
    post = 2 sigmoid(scale_1 * x fn_post + base_post)                          [n]
    res  = SinkhornKnopp(scale_2 * x fn_res + base_res)                        [n, n]
    h = sum_s pre_s X_s,   X_next_i = post_i F(h) + sum_j res[i, j] X_j

``res`` is (approximately) doubly stochastic: the streams are mixed by a convex
combination of permutations, so the residual path neither grows nor decays.
:func:`mhc_coefficients` returns ``res`` in this (paper) layout; DeepSeek-V4's
``comb`` is its transpose. :func:`sinkhorn` is V4's projection (softmax over
rows, then alternate column and row normalisation with ``eps``); with ``eps =
0`` it is the paper's ``exp`` followed by alternating row and column
normalisation.

Math in float32; results in the streams' dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks

_F32 = jnp.float32

SINKHORN_ITERS = 20  # mHC's t_max and DeepSeek-V4's hc_sinkhorn_iters
HC_EPS = 1e-6  # DeepSeek-V4's hc_eps
DYNAMIC_SCALE = 0.01  # HC's initial s_alpha, s_beta
# The kinds the decoder's model.hyper_connections selects: dynamic HC, static HC (hc_init(dynamic=False)), mHC.
KINDS = ("dynamic", "static", "mhc")


def expand(x, num_streams):
    """``[..., D] -> [..., n, D]``: the embedding copied into each stream."""
    n = checks.integer("num_streams", num_streams, minimum=1)
    x = jnp.asarray(x)
    return jnp.broadcast_to(x[..., None, :], (*x.shape[:-1], n, x.shape[-1]))


def reduce(streams):
    """``[..., n, D] -> [..., D]``: the streams summed (HC's output)."""
    streams = jnp.asarray(streams)
    return jnp.sum(streams.astype(_F32), axis=-2).astype(streams.dtype)


def _check_streams(streams):
    streams = jnp.asarray(streams)
    if streams.ndim < 2:
        raise ValueError(f"streams must be [..., n, D]; got shape {tuple(streams.shape)}")
    return streams


# --------------------------------------------------------------------------- HC


def hc_init(num_streams, dim, *, layer_index, dynamic=True):
    """Initial float32 HC parameters of one sublayer (the paper's init, lucidrains' shapes).

    ``static_alpha [n, 1 + n]``: column 0 the one-hot ``e_(layer_index mod n)``,
    columns 1.. the identity; ``static_beta [n]`` ones. Dynamic adds
    ``dynamic_alpha [D, 1 + n]`` and ``dynamic_beta [D]`` zeros and the scalars
    ``dynamic_alpha_scale``, ``dynamic_beta_scale`` 0.01.
    """
    n = checks.integer("num_streams", num_streams, minimum=1)
    dim = checks.integer("dim", dim, minimum=1)
    k = checks.integer("layer_index", layer_index, minimum=0)
    checks.boolean("dynamic", dynamic)
    a_m = jnp.zeros((n, 1), _F32).at[k % n, 0].set(1.0)
    params = {"static_alpha": jnp.concatenate([a_m, jnp.eye(n, dtype=_F32)], axis=1),
              "static_beta": jnp.ones((n,), _F32)}
    if dynamic:
        params.update(dynamic_alpha=jnp.zeros((dim, 1 + n), _F32), dynamic_beta=jnp.zeros((dim,), _F32),
                      dynamic_alpha_scale=jnp.asarray(DYNAMIC_SCALE, _F32),
                      dynamic_beta_scale=jnp.asarray(DYNAMIC_SCALE, _F32))
    return params


_STATIC = ("static_alpha", "static_beta")
_DYNAMIC = _STATIC + ("dynamic_alpha", "dynamic_alpha_scale", "dynamic_beta", "dynamic_beta_scale")


def hc_coefficients(streams, params, *, norm=None, tanh=True):
    """``(alpha [..., n, 1 + n], beta [..., n])`` of HC, float32.

    Args:
      streams: ``[..., n, D]``.
      params: from :func:`hc_init` (static keys only, or static and dynamic).
      norm: dynamic HC only (required there): ``[..., D] -> [..., D]`` applied to each stream.
      tanh: the dynamic terms through tanh (the paper; lucidrains' default).
    """
    streams = _check_streams(streams)
    keys = tuple(sorted(params))
    if keys not in (tuple(sorted(_STATIC)), tuple(sorted(_DYNAMIC))):
        raise ValueError(f"HC params must have the keys ({', '.join(sorted(_STATIC))}) or "
                         f"({', '.join(sorted(_DYNAMIC))}); got ({', '.join(keys)})")
    n = streams.shape[-2]
    alpha = jnp.asarray(params["static_alpha"], _F32)
    beta = jnp.asarray(params["static_beta"], _F32)
    if alpha.shape != (n, 1 + n) or beta.shape != (n,):
        raise ValueError(f"static_alpha must be [{n}, {1 + n}] and static_beta [{n}] for {n} streams; got "
                         f"{tuple(alpha.shape)} and {tuple(beta.shape)}")
    dynamic = len(keys) > 2
    if dynamic != (norm is not None):
        raise ValueError("dynamic HC (params with dynamic_*) needs norm=; static HC takes none"
                         f"; got norm={norm!r} with params ({', '.join(keys)})")
    if not dynamic:
        return jnp.broadcast_to(alpha, (*streams.shape[:-1], 1 + n)), jnp.broadcast_to(beta, streams.shape[:-1])
    act = jnp.tanh if tanh else (lambda t: t)
    normed = jnp.asarray(norm(streams)).astype(_F32)
    alpha = alpha + act(normed @ jnp.asarray(params["dynamic_alpha"], _F32)) * params["dynamic_alpha_scale"]
    beta = beta + act(normed @ jnp.asarray(params["dynamic_beta"], _F32)) * params["dynamic_beta_scale"]
    return alpha, beta


def hc_width(streams, alpha):
    """Width connection: ``(h [..., D], X' [..., n, D])`` with ``[h, X'] = alpha^T X``."""
    streams = _check_streams(streams)
    mix = jnp.einsum("...st,...sd->...td", jnp.asarray(alpha, _F32), streams.astype(_F32))
    return mix[..., 0, :].astype(streams.dtype), mix[..., 1:, :].astype(streams.dtype)


def hc_depth(layer_output, mixed, beta):
    """Depth connection: ``X' + beta (x) F(h)``, ``[..., n, D]`` in ``mixed.dtype``."""
    mixed = jnp.asarray(mixed)
    out = jnp.asarray(beta, _F32)[..., :, None] * jnp.asarray(layer_output, _F32)[..., None, :]
    return (mixed.astype(_F32) + out).astype(mixed.dtype)


def hc_block(streams, params, sublayer, *, norm=None, tanh=True):
    """One sublayer ``F`` wrapped by HC: ``X -> X' + beta (x) F(h)``."""
    alpha, beta = hc_coefficients(streams, params, norm=norm, tanh=tanh)
    h, mixed = hc_width(streams, alpha)
    return hc_depth(sublayer(h), mixed, beta)


# -------------------------------------------------------------------------- mHC


def sinkhorn(logits, *, iters=SINKHORN_ITERS, eps=0.0):
    """Sinkhorn-Knopp projection of ``logits [..., n, n]`` towards a doubly stochastic matrix.

    DeepSeek-V4's form: ``M = softmax(logits, rows) + eps``; ``M /= colsum + eps``;
    then ``iters - 1`` times ``M /= rowsum + eps``, ``M /= colsum + eps``. Columns
    sum to 1 (up to ``eps``) exactly, rows approximately. With ``eps = 0``: the
    paper's ``M = exp(logits)`` and ``iters`` rounds of row then column
    normalisation. Float32 out.
    """
    iters = checks.integer("iters", iters, minimum=1)
    eps = checks.number("eps", eps, minimum=0.0)
    x = jnp.asarray(logits, _F32)
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"logits must be [..., n, n]; got shape {tuple(x.shape)}")
    m = jax.nn.softmax(x, axis=-1) + eps
    m = m / (jnp.sum(m, axis=-2, keepdims=True) + eps)

    def step(_, m):
        m = m / (jnp.sum(m, axis=-1, keepdims=True) + eps)
        return m / (jnp.sum(m, axis=-2, keepdims=True) + eps)

    return jax.lax.fori_loop(0, iters - 1, step, m)


def mhc_init(key, num_streams, dim, *, std=0.02):
    """Initial float32 mHC parameters of one sublayer, as DeepSeek-V4's ``_init_weights``.

    ``fn [(2 + n) n, n D]`` normal with ``std`` (V4: ``initializer_range``),
    ``base [(2 + n) n]`` zeros, ``scale [3]`` ones: at init ``pre = 1/2 + eps``,
    ``post`` about 1 and ``res`` about uniform ``1/n``.
    """
    n = checks.integer("num_streams", num_streams, minimum=1)
    dim = checks.integer("dim", dim, minimum=1)
    std = checks.number("std", std, minimum=0.0)
    mix = (2 + n) * n
    return {"fn": std * jax.random.normal(key, (mix, n * dim), _F32), "base": jnp.zeros((mix,), _F32),
            "scale": jnp.ones((3,), _F32)}


def _rms_plain(x, eps):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


def mhc_coefficients(streams, params, *, iters=SINKHORN_ITERS, eps=HC_EPS, norm_eps=1e-6):
    """``(pre [..., n], post [..., n], res [..., n, n])`` of mHC, float32.

    Args:
      streams: ``[..., n, D]``.
      params: ``fn [(2 + n) n, n D]``, ``base [(2 + n) n]``, ``scale [3]`` (:func:`mhc_init`);
        ``fn`` rows are ordered pre, post, res (row-major ``[n, n]``, V4's ``comb``).
      iters, eps: of :func:`sinkhorn` (20, 1e-6); ``eps`` is also added to ``pre``.
      norm_eps: of the RMS norm of the flattened streams (V4: ``rms_norm_eps``).
    Returns:
      ``res`` in the paper's layout: ``X_next_i = post_i F(h) + sum_j res[i, j] X_j``.
    """
    streams = _check_streams(streams)
    n, d = streams.shape[-2:]
    fn, base, scale = (jnp.asarray(params[k], _F32) for k in ("fn", "base", "scale"))
    if fn.shape != ((2 + n) * n, n * d) or base.shape != ((2 + n) * n,) or scale.shape != (3,):
        raise ValueError(f"mHC params for {n} streams of width {d} must be fn [{(2 + n) * n}, {n * d}], base "
                         f"[{(2 + n) * n}], scale [3]; got {tuple(fn.shape)}, {tuple(base.shape)}, "
                         f"{tuple(scale.shape)}")
    flat = _rms_plain(streams.astype(_F32).reshape(*streams.shape[:-2], n * d), norm_eps)
    mixes = flat @ fn.T
    pre_w, post_w, res_w = mixes[..., :n], mixes[..., n:2 * n], mixes[..., 2 * n:]
    pre = jax.nn.sigmoid(pre_w * scale[0] + base[:n]) + eps
    post = 2.0 * jax.nn.sigmoid(post_w * scale[1] + base[n:2 * n])
    comb = sinkhorn((res_w * scale[2] + base[2 * n:]).reshape(*res_w.shape[:-1], n, n), iters=iters, eps=eps)
    return pre, post, jnp.swapaxes(comb, -1, -2)


def mhc_width(streams, pre):
    """The sublayer's input ``h = sum_s pre_s X_s``, ``[..., D]`` in the streams' dtype."""
    streams = _check_streams(streams)
    h = jnp.sum(jnp.asarray(pre, _F32)[..., :, None] * streams.astype(_F32), axis=-2)
    return h.astype(streams.dtype)


def mhc_depth(layer_output, streams, post, res):
    """``X_next = post (x) F(h) + res X``, ``[..., n, D]`` in the streams' dtype."""
    streams = _check_streams(streams)
    out = jnp.asarray(post, _F32)[..., :, None] * jnp.asarray(layer_output, _F32)[..., None, :]
    mixed = jnp.einsum("...ij,...jd->...id", jnp.asarray(res, _F32), streams.astype(_F32))
    return (out + mixed).astype(streams.dtype)


def mhc_block(streams, params, sublayer, *, iters=SINKHORN_ITERS, eps=HC_EPS, norm_eps=1e-6):
    """One sublayer ``F`` wrapped by mHC (DeepSeek-V4's decoder-layer step)."""
    pre, post, res = mhc_coefficients(streams, params, iters=iters, eps=eps, norm_eps=norm_eps)
    return mhc_depth(sublayer(mhc_width(streams, pre)), streams, post, res)


def mhc_head_init(key, num_streams, dim, *, std=0.02):
    """Initial float32 :func:`mhc_head` parameters, as DeepSeek-V4's ``_init_weights``: ``fn [n, n D]``
    normal with ``std``, ``base [n]`` zeros, ``scale [1]`` ones."""
    n = checks.integer("num_streams", num_streams, minimum=1)
    dim = checks.integer("dim", dim, minimum=1)
    std = checks.number("std", std, minimum=0.0)
    return {"fn": std * jax.random.normal(key, (n, n * dim), _F32), "base": jnp.zeros((n,), _F32),
            "scale": jnp.ones((1,), _F32)}


def mhc_head(streams, params, *, eps=HC_EPS, norm_eps=1e-6):
    """The final collapse of the streams before the last norm (DeepSeek-V4's ``DeepseekV4HyperHead``).

    ``pre = sigmoid(scale * rmsnorm(vec X) fn + base) + eps``, ``sum_s pre_s X_s``;
    params ``fn [n, n D]``, ``base [n]``, ``scale [1]`` (:func:`mhc_head_init`).
    """
    streams = _check_streams(streams)
    n, d = streams.shape[-2:]
    fn, base, scale = (jnp.asarray(params[k], _F32) for k in ("fn", "base", "scale"))
    if fn.shape != (n, n * d) or base.shape != (n,) or scale.shape != (1,):
        raise ValueError(f"mHC head params for {n} streams of width {d} must be fn [{n}, {n * d}], base [{n}], "
                         f"scale [1]; got {tuple(fn.shape)}, {tuple(base.shape)}, {tuple(scale.shape)}")
    flat = _rms_plain(streams.astype(_F32).reshape(*streams.shape[:-2], n * d), norm_eps)
    pre = jax.nn.sigmoid((flat @ fn.T) * scale + base) + eps
    return mhc_width(streams, pre)
