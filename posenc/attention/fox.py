"""FoX: the Forgetting Transformer's data-dependent decay bias, and the pieces of FoX (Pro).

Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget
Gate" (ICLR 2025). Official code: zhixuan-lin/forgetting-transformer (commit
883f260), ``src/forgetting_transformer/model/forgetting_transformer/``.
Each head has a scalar forget gate per token, ``f_t = sigmoid(w_f . x_t + b_f)``,
and the logits get the bias::

    D_ij = sum_{l=j+1..i} log f_l = c_i - c_j,    c_i = sum_{l<=i} log f_l

so ``logit_ij = q_i . k_j / sqrt(d) + D_ij`` (the bias is not scaled) and
``D_ii = 0``. FoX uses no positional encoding: the bias depends on the content
of the tokens between key and query only.

Blocked attention never builds the [L, L] bias: it keeps ``c`` (one float32
per token and head, also the per-token state of a KV cache) and takes
``block_bias(c_q, c_k)`` per (query block, key block). ``cumulative`` accepts
the ``c`` of the token before the first one (``initial``) so a cached prefix
and the new tokens share one running sum.

FoX (Pro) (``configs/experiment/longcrawl64/forgetting_transformer/pro_*.yaml``:
``use_k_shift``, ``use_v_shift``, ``qk_norm``, ``use_output_gate``,
``use_output_norm``) adds, in ``ForgettingAttentionLayer.forward``
(modeling_forgetting_transformer.py L304-L325, L417-L434):

1. data-dependent token shift of the key and value projections,
   :func:`token_shift` (``ShiftLinear``, L44-L95);
2. QK-norm: an RMSNorm per head with a separate gain per head (GroupNorm
   with ``num_groups=num_heads``, ``is_rms_norm=True``, default eps 1e-5,
   L264-L265), applied to the *shifted* keys: :func:`head_rms_norm`;
3. an output RMSNorm per head (eps ``norm_eps`` = 1e-6) times a sigmoid
   output gate ``sigmoid(W_g x)`` before ``o_proj`` (``FusedGroupNormGated``,
   L243 and L417-L423): :func:`output_gate`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks

_F32 = jnp.float32


def log_forget(forget_logits) -> jax.Array:
    """``log f = log sigmoid(forget_logits)`` in float32 (stable for large |logits|).

    The official layer casts to float32 *before* the logsigmoid
    (``F.logsigmoid(fgate_logit.float())``, L346). Shape preserved.
    """
    return jax.nn.log_sigmoid(jnp.asarray(forget_logits).astype(_F32))


def cumulative(forget_logits, *, initial=None) -> jax.Array:
    """Running sum of log forget gates ``c_i = initial + sum_{l<=i} log sigmoid(f_l)``.

    ``initial`` is ``c`` of the token before the first one (a cached
    prefix), default 0; any constant cancels in ``c_i - c_j``. float32
    cumulative sum, as ``torch.cumsum(log_fgate, dim=-1)`` in the official
    code (ops/forgetting_attention.py L127).

    Shapes: forget_logits [..., L, H], initial [..., H] -> float32 [..., H, L].
    """
    f = jnp.asarray(forget_logits)
    if f.ndim < 2:
        raise ValueError(f"forget_logits must have shape [..., L, H]; got {f.shape}")
    c = jnp.cumsum(jnp.swapaxes(log_forget(f), -1, -2), axis=-1)
    if initial is not None:
        initial = jnp.asarray(initial, _F32)
        if initial.shape[-1:] != f.shape[-1:]:
            raise ValueError(f"initial must have shape [..., H] with H = {f.shape[-1]}; "
                             f"got {initial.shape}")
        c = c + initial[..., None]
    return c


def block_bias(c_q, c_k) -> jax.Array:
    """Decay bias of one (query block, key block): ``c_q[i] - c_k[j]``.

    For a key at or before its query this is ``sum_{l=j+1..i} log f_l <= 0``.
    Entries with the key after the query hold ``c_i - c_j =
    -sum_{l=i+1..j} log f_l >= 0`` (finite, growing with distance): they are
    not a bias and the caller must mask them.

    Shapes: c_q [..., H, Lq], c_k [..., H, Lk] (from :func:`cumulative`)
    -> float32 [..., H, Lq, Lk].
    """
    c_q, c_k = jnp.asarray(c_q, _F32), jnp.asarray(c_k, _F32)
    if c_q.ndim < 1 or c_k.ndim < 1:
        raise ValueError(f"c_q and c_k must have shape [..., H, L]; got {c_q.shape} and {c_k.shape}")
    return c_q[..., :, None] - c_k[..., None, :]


def decay_bias(forget_logits) -> jax.Array:
    """Full causal FoX bias ``D_ij = sum_{l=j+1..i} log sigmoid(f_l)``; -inf above the diagonal.

    Computed as ``c_i - c_j`` from the float32 cumulative sum (the official
    ``decay_bias = log_lambda[..., :, None] - log_lambda[..., None, :]``,
    modeling_forgetting_transformer.py L442-L443). Keys after the query get
    -inf, so the bias is also the causal mask; blocked code uses
    :func:`block_bias` instead and masks by index.

    Shapes: forget_logits [..., L, H] -> float32 [..., H, L, L].
    """
    c = cumulative(forget_logits)
    n = c.shape[-1]
    causal = np.tril(np.ones((n, n), bool))
    return jnp.where(causal, block_bias(c, c), -jnp.inf)


def bias_init(num_heads: int, *, decay_time_min: float, decay_time_max: float) -> jax.Array:
    """Forget-gate biases with decay times log-spaced in [T_min, T_max] over heads.

    For the data-independent gates (``fgate_type`` "bias_only" / "fixed",
    ``fgate_bias_init=True``, L221-L230): ``t_h = exp(linspace(log T_min,
    log T_max, H))`` and ``b_h = -log(expm1(1 / t_h))``, so that
    ``-1 / log sigmoid(b_h) = t_h``.

    -> float32 [H].
    """
    h = checks.integer("num_heads", num_heads, minimum=1)
    lo = checks.number("decay_time_min", decay_time_min, positive=True)
    hi = checks.number("decay_time_max", decay_time_max, positive=True)
    decay_time = np.exp(np.linspace(math.log(lo), math.log(hi), h))
    return jnp.asarray(-np.log(np.expm1(1.0 / decay_time)), _F32)


def token_shift(x, shift_logits, *, previous=None) -> jax.Array:
    """FoX (Pro) data-dependent token shift: ``y_t = a_t x_{t-1} + (1 - a_t) x_t``.

    ``a_t = sigmoid(shift_logits_t)`` per head (``ShiftLinear``: ``alpha =
    sigmoid(shift_proj(x).float())``, modeling_forgetting_transformer.py L73;
    ``token_shift(out, alpha, 1 - alpha)``, L83; the kernel's ``x * curr_weight
    + x_prev * prev_weight`` with ``x_prev = 0`` at t = 0, token_shift.py
    L52-L66). ``x`` is the projection (keys or values) *before* the shift;
    ``shift_logits`` come from the layer input (``shift_proj``, one per head,
    no bias). ``previous`` is the unshifted projection of the token before
    the first one (the decoding ``shift_state``, which the official layer
    stores as ``out[:, -1]``: keep ``x[..., -1, :, :]``), default zeros.

    The official layer uses the stored state only for single-token steps and
    restarts from zeros for a multi-token call with a cache (its TODO at
    L82); here ``previous`` is used whenever given, so chunked prefill equals
    the full forward pass. float32 math, output in ``x.dtype``.

    Shapes: x [..., L, H, Dh], shift_logits [..., L, H], previous [..., H, Dh]
    -> like x.
    """
    x = jnp.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"x must have shape [..., L, H, Dh]; got {x.shape}")
    a = jnp.asarray(shift_logits)
    if a.shape[-2:] != x.shape[-3:-1]:
        raise ValueError(f"shift_logits must have shape [..., L, H] = [..., {x.shape[-3]}, "
                         f"{x.shape[-2]}]; got {a.shape}")
    alpha = jax.nn.sigmoid(a.astype(_F32))[..., None]
    x32 = x.astype(_F32)
    if previous is None:
        first = jnp.zeros_like(x32[..., :1, :, :])
    else:
        previous = jnp.asarray(previous)
        if previous.shape[-2:] != x.shape[-2:]:
            raise ValueError(f"previous must have shape [..., H, Dh] = [..., {x.shape[-2]}, "
                             f"{x.shape[-1]}]; got {previous.shape}")
        first = jnp.broadcast_to(previous.astype(_F32)[..., None, :, :], x32[..., :1, :, :].shape)
    x_prev = jnp.concatenate([first, x32[..., :-1, :, :]], axis=-3)
    return (x32 * (1.0 - alpha) + x_prev * alpha).astype(x.dtype)


def head_rms_norm(x, scale, *, eps=1e-5) -> jax.Array:
    """RMSNorm of each head over ``Dh`` with its own gain: ``x * rsqrt(mean(x^2) + eps) * scale[h]``.

    The official GroupNorm with ``num_groups = num_heads`` and
    ``is_rms_norm=True`` over the flat ``H * Dh`` projection (layernorm.py
    ``group_norm_ref``, upcast to float32). FoX (Pro) QK-norm uses its default
    eps 1e-5; the output norm uses ``norm_eps`` 1e-6.

    Shapes: x [..., H, Dh], scale [H, Dh] -> like x.
    """
    checks.number("eps", eps, positive=True)
    x = jnp.asarray(x)
    scale = jnp.asarray(scale)
    if scale.shape != x.shape[-2:]:
        raise ValueError(f"scale must have shape [H, Dh] = {x.shape[-2:]}; got {scale.shape}")
    x32 = x.astype(_F32)
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (x32 * rstd * scale.astype(_F32)).astype(x.dtype)


GATE_ACTIVATIONS = ("sigmoid", "silu")


def output_gate(o, gate_logits, scale=None, *, eps=1e-6, activation="sigmoid") -> jax.Array:
    """FoX (Pro) output gate, applied to the attention output before ``o_proj``.

    With ``scale`` (``use_output_norm``, as in Pro): ``head_rms_norm(o, scale)
    * sigmoid(gate_logits)`` (fuse_norm_gate.py ``group_norm_gated_ref``).
    Without (``use_output_gate`` only): ``act(gate_logits) * o`` with ``act``
    sigmoid (glu_linear.py ``glu_fwd``) or, ``activation="silu"``,
    ``g * sigmoid(g)`` (``swiglu_fwd``; ``ogate_act="silu"``, which the
    official layer allows without the norm only). ``gate_logits = W_g x``
    from the layer input (``ogate_proj``, no bias), reshaped to heads.
    float32 math.

    Shapes: o [..., L, H, Dh], gate_logits like o, scale [H, Dh] -> like o.
    """
    checks.choice("activation", activation, GATE_ACTIVATIONS)
    if activation == "silu" and scale is not None:
        raise ValueError("the official output norm gates with sigmoid only (FusedGroupNormGated); "
                         "activation='silu' takes no scale")
    o = jnp.asarray(o)
    g = jnp.asarray(gate_logits)
    if g.shape[-3:] != o.shape[-3:]:
        raise ValueError(f"gate_logits must have the shape of o [..., L, H, Dh] = {o.shape}; "
                         f"got {g.shape}")
    y = o.astype(_F32) if scale is None else head_rms_norm(o.astype(_F32), scale, eps=eps)
    g32 = g.astype(_F32)
    gate = jax.nn.sigmoid(g32) if activation == "sigmoid" else g32 * jax.nn.sigmoid(g32)
    return (y * gate).astype(o.dtype)
