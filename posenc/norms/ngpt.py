"""nGPT: the normalized Transformer, every hidden vector and weight row on the unit sphere.

Loshchilov, Hsieh, Sun, Ginsburg 2025, "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (ICLR 2025, arXiv 2410.01131),
official code ``NVIDIA/ngpt`` (``model.py`` ``Block.forward``, ``GPT.forward``;
``train.py`` ``normalize_matrices``). The pieces, with ``d`` the model width:

- :func:`normalize` (``justnorm``): ``x / ||x||_2``, no epsilon;
- residual update (:func:`residual_update`), per sublayer:
  ``h <- norm(norm(h) + |alpha| * (norm(block(h)) - norm(h)))``, a learned step
  ``alpha [d]`` per feature;
- queries and keys (:func:`scale_qk`): ``q <- s_qk * norm(q)`` per head (after
  RoPE), same for ``k``, and the softmax scale ``sqrt(Dh)`` instead of
  ``1/sqrt(Dh)`` (:func:`softmax_scale`);
- MLP (:func:`scale_uv`, :func:`swiglu`): ``uv <- s_uv * sqrt(d) * uv`` on the
  ``[u | v]`` output of the fused up-projection, then ``u * silu(v)``;
- logits (:func:`scale_logits`): ``z <- s_z * z`` per vocabulary entry;
- no norm layers and no final norm; after every optimizer step every matrix
  is renormalised along its model-width axis (:func:`renormalize`, see there).

The scale trick: each learned scale ``s`` is stored as ``p`` initialised to
``init_scaling`` and used as ``p * (init_value / init_scaling)`` (:func:`effective`),
so that its effective value starts at ``init_value`` while the stored
parameter, which the optimiser sees, has the size ``init_scaling``. The
official values (``base_scale = 1 / sqrt(d)``):

    alpha (attention and MLP)  init_value 0.05, init_scaling base_scale, [d]
    s_qk                       init_value 1.0,  init_scaling base_scale, [d] as [H, Dh]
    s_uv                       init_value 1.0,  init_scaling 1.0,        [2 * d_mlp]
    s_z                        init_value 1.0,  init_scaling base_scale, [V]

Math in float32; each function returns its first argument's dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from posenc import checks

_F32 = jnp.float32

ALPHA_INIT = 0.05  # attn_alpha_init_value, mlp_alpha_init_value
SQK_INIT = 1.0
SUV_INIT = 1.0
SUV_SCALING = 1.0
SZ_INIT = 1.0


def base_scale(dim):
    """``1 / sqrt(dim)``: nGPT's ``base_scale`` (also the init std of every matrix)."""
    return 1.0 / math.sqrt(checks.integer("dim", dim, minimum=1))


def normalize(x, *, axis=-1):
    """``x / ||x||_2`` along ``axis`` (``justnorm``), float32 inside, ``x.dtype`` out.

    As the official code, no epsilon: a zero vector gives NaN.
    """
    x = jnp.asarray(x)
    x32 = x.astype(_F32)
    return (x32 / jnp.linalg.norm(x32, axis=axis, keepdims=True)).astype(x.dtype)


def effective(param, *, init_value, init_scaling):
    """The value a stored scale stands for: ``param * (init_value / init_scaling)`` (float32)."""
    init_scaling = checks.number("init_scaling", init_scaling, positive=True)
    init_value = checks.number("init_value", init_value)
    return jnp.asarray(param, _F32) * (init_value / init_scaling)


def init_params(dim, vocab_size, *, mlp_dim=None):
    """The stored scales at initialisation (float32): ``alpha_attn``, ``alpha_mlp``, ``sqk`` ``[d]``
    filled with ``base_scale``; ``suv`` ``[2 * mlp_dim]`` ones (``mlp_dim`` default ``4 d``); ``sz``
    ``[V]`` filled with ``base_scale``."""
    b = base_scale(dim)
    vocab_size = checks.integer("vocab_size", vocab_size, minimum=1)
    mlp_dim = 4 * dim if mlp_dim is None else checks.integer("mlp_dim", mlp_dim, minimum=1)
    full = lambda n, v: jnp.full((n,), v, _F32)  # noqa: E731
    return {"alpha_attn": full(dim, b), "alpha_mlp": full(dim, b), "sqk": full(dim, b),
            "suv": full(2 * mlp_dim, SUV_SCALING), "sz": full(vocab_size, b)}


def residual_update(h, block_out, alpha, *, alpha_scaling, alpha_init=ALPHA_INIT):
    """nGPT's residual step: ``norm(A + |alpha_eff| * (norm(block_out) - A))`` with ``A = norm(h)``.

    Args:
      h: ``[..., d]`` hidden state (on the sphere already; normalised again as the code does).
      block_out: ``[..., d]`` attention or MLP output.
      alpha: ``[d]`` stored step size; its effective value is
        ``alpha * alpha_init / alpha_scaling`` (``alpha_scaling``: ``base_scale(d)``).
    Returns:
      ``[..., d]`` unit vectors in ``h.dtype``.
    """
    h = jnp.asarray(h)
    lr = jnp.abs(effective(alpha, init_value=alpha_init, init_scaling=alpha_scaling))
    a = normalize(h.astype(_F32))
    b = normalize(jnp.asarray(block_out).astype(_F32))
    return normalize(a + lr * (b - a)).astype(h.dtype)


def block(x, attention, mlp, alpha_attn, alpha_mlp, *, alpha_scaling, alpha_init=ALPHA_INIT):
    """One nGPT decoder layer: ``h <- residual_update(h, attention(h), alpha_attn)``, then the same
    with ``mlp`` and ``alpha_mlp`` (``Block.forward``; no norm layers).

    Args:
      x: ``[..., d]`` hidden state.
      attention, mlp: ``[..., d] -> [..., d]`` sublayers (nGPT's scaled attention and MLP).
      alpha_attn, alpha_mlp: ``[d]`` stored step sizes (see :func:`residual_update`).
    Returns:
      ``[..., d]`` unit vectors in ``x.dtype``.
    """
    h = residual_update(x, attention(x), alpha_attn, alpha_scaling=alpha_scaling, alpha_init=alpha_init)
    return residual_update(h, mlp(h), alpha_mlp, alpha_scaling=alpha_scaling, alpha_init=alpha_init)


def scale_qk(q, k, sqk, *, sqk_scaling, sqk_init=SQK_INIT):
    """``q <- s_qk * norm(q)``, ``k <- s_qk * norm(k)`` per head over ``Dh``.

    Args:
      q, k: ``[..., L, H, Dh]`` (after RoPE; the official model is multi-head,
        so ``k`` has the ``H`` heads of ``q``).
      sqk: stored ``[H * Dh]`` (or ``[H, Dh]``); effective ``sqk * sqk_init / sqk_scaling``.
    Returns:
      ``(q, k)`` in their dtypes; use :func:`softmax_scale` for the logits.
    """
    q, k = jnp.asarray(q), jnp.asarray(k)
    if q.ndim < 3 or q.shape[-2:] != k.shape[-2:]:
        raise ValueError(f"q and k must be [..., L, H, Dh] with the same H and Dh; got shapes "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    heads, dh = q.shape[-2:]
    if jnp.size(sqk) != heads * dh:
        raise ValueError(f"sqk must have H * Dh = {heads * dh} entries; got shape {jnp.shape(sqk)}")
    s = effective(sqk, init_value=sqk_init, init_scaling=sqk_scaling).reshape(heads, dh)
    return ((s * normalize(q.astype(_F32))).astype(q.dtype),
            (s * normalize(k.astype(_F32))).astype(k.dtype))


def softmax_scale(head_dim):
    """nGPT's attention scale ``sqrt(Dh)`` (logits ``sqrt(Dh) q.k`` of unit-norm, s_qk-scaled q, k)."""
    return math.sqrt(checks.integer("head_dim", head_dim, minimum=1))


def scale_uv(uv, suv, *, dim, suv_scaling=SUV_SCALING, suv_init=SUV_INIT):
    """``uv * s_uv * sqrt(d)`` on the fused up-projection output ``[..., 2 * d_mlp]`` (``d = dim``)."""
    uv = jnp.asarray(uv)
    s = effective(suv, init_value=suv_init, init_scaling=suv_scaling) * math.sqrt(
        checks.integer("dim", dim, minimum=1))
    if s.shape != (uv.shape[-1],):
        raise ValueError(f"suv shape {tuple(s.shape)} does not match the last axis of uv with shape "
                         f"{tuple(uv.shape)}")
    return (uv.astype(_F32) * s).astype(uv.dtype)


def swiglu(uv):
    """``u * silu(v)`` with ``u, v`` the first and second halves of the last axis (nGPT's order)."""
    uv = jnp.asarray(uv)
    u, v = jnp.split(uv.astype(_F32), 2, axis=-1)
    return (u * jax.nn.silu(v)).astype(uv.dtype)


def scale_logits(logits, sz, *, sz_scaling, sz_init=SZ_INIT):
    """``logits * s_z`` per vocabulary entry (``logits [..., V]``, ``sz [V]``)."""
    logits = jnp.asarray(logits)
    s = effective(sz, init_value=sz_init, init_scaling=sz_scaling)
    if s.shape != (logits.shape[-1],):
        raise ValueError(f"sz shape {tuple(s.shape)} does not match the last axis of logits with shape "
                         f"{tuple(logits.shape)}")
    return (logits.astype(_F32) * s).astype(logits.dtype)


def renormalize(w, *, axis):
    """A weight matrix renormalised along its model-width axis, after each optimizer step.

    ``train.py`` ``normalize_matrices`` normalises every matrix along the axis
    of size ``d`` (``justnorm``, computed in float32): in PyTorch's
    ``[out, in]`` layout the input embedding ``wte [V, d]`` and ``lm_head [V,
    d]`` along axis 1, ``query``, ``key``, ``value`` ``[d_proj, d]`` and
    ``c_fc [2 d_mlp, d]`` along axis 1 (each output unit's row), ``att_c_proj
    [d, d_proj]`` and ``mlp_c_proj [d, d_mlp]`` along axis 0. In posenc's
    layout (``wq [D, H, Dh]``, ``wo [H, Dh, D]``): axis 0 of ``wq``, ``wk``,
    ``wv`` and of an up-projection ``[D, F]``, the last axis of ``wo`` and of a
    down-projection ``[F, D]``, the last axis of an embedding ``[V, D]``.
    The scales (alpha, s_qk, s_uv, s_z) are not renormalised.
    """
    w = jnp.asarray(w)
    checks.integer("axis", axis, minimum=-w.ndim, maximum=w.ndim - 1)
    return normalize(w, axis=axis)
