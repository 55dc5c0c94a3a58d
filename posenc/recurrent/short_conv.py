"""The causal depthwise short convolution of the recurrent mixers, and LFM2's gated convolution block.

Every recurrent mixer here (Mamba-2, Gated DeltaNet / Qwen3-Next, Kimi Delta
Attention) passes its inputs through a causal depthwise convolution of width
``W`` (2-4) before the scan, and LFM2 (Liquid AI 2025) uses one as its whole
token mixer. Per channel d::

    y_t = act( sum_{w=0..W-1} weight[d, w] x_{t-W+1+w} + bias[d] )

so the last tap ``weight[:, W-1]`` multiplies the current token, as torch's
``F.conv1d(x, weight[:, None], padding=W-1, groups=D)[..., :L]``.
Official code (transformers 5.x, the pure-torch fallbacks): ``causal_conv1d_fn``
(the full sequence) and ``causal_conv1d_update`` (with a cached window) in
``models/{mamba2,qwen3_next,kimi_linear,lfm2}/modeling_*.py``; the older
``torch_causal_conv1d_update`` of Qwen3-Next is the same with SiLU.

The cache is the window of the last ``W - 1`` inputs, kept here time-major as
``[..., W - 1, D]`` (transformers keeps ``conv_states [B, D, W]``, the last
``W`` inputs, whose oldest column no output reads: ours is
``swapaxes(conv_states, -1, -2)[..., 1:, :]``). :func:`causal_conv` returns
the window after its inputs, so a sequence cut anywhere and fed piece by
piece with the window carried gives the outputs of one call; a single token
with the window is the decoding step (``causal_conv1d_update``).

LFM2 (``Lfm2ShortConv`` in ``models/lfm2/modeling_lfm2.py``): ``in_proj``
gives ``[B | C | x]`` (three chunks of D), then ``y = C * conv(B * x)`` with
no activation, width ``conv_L_cache``; :func:`gated_conv` does the part
between the two projections, its window the last ``W - 1`` values of ``B * x``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.recurrent._common import F32

ACTIVATIONS = ("silu", "swish")


def _window(x, width: int, state):
    """float32 ``concat(state, x)`` on the token axis; zeros for a missing state."""
    x32 = x.astype(F32)
    if state is None:
        return jnp.pad(x32, [(0, 0)] * (x.ndim - 2) + [(width - 1, 0), (0, 0)])
    state = jnp.broadcast_to(state.astype(F32), x.shape[:-2] + state.shape[-2:])
    return jnp.concatenate([state, x32], axis=-2)


def causal_conv(x, weight, *, bias=None, activation=None, state=None) -> tuple[jax.Array, jax.Array]:
    """Causal depthwise convolution with its window: ``(y, new_state)``.

    ``y_t = act(sum_w weight[:, w] x_{t-W+1+w} + bias)``; ``state`` holds the
    ``W - 1`` inputs before ``x`` (default zeros, a fresh sequence), and
    ``new_state`` the last ``W - 1`` inputs of ``concat(state, x)``, for the
    next call. ``activation``: None, "silu" or "swish" (the same). float32
    math; ``y`` and ``new_state`` in ``x.dtype``.

    Shapes: x [..., L, D], weight [D, W] (torch's ``conv1d.weight`` [D, 1, W]
    squeezed), bias [D], state [..., W - 1, D] -> (y like x, [..., W - 1, D]).
    """
    x = jnp.asarray(x)
    weight = jnp.asarray(weight)
    if activation is not None:
        checks.choice("activation", activation, ACTIVATIONS)
    if x.ndim < 2 or weight.ndim != 2 or weight.shape[0] != x.shape[-1] or weight.shape[1] < 1:
        raise ValueError(f"x must have shape [..., L, D] and weight [D, W]; got {x.shape} and {weight.shape}")
    if bias is not None and jnp.shape(bias) != (x.shape[-1],):
        raise ValueError(f"bias must have shape [D] = [{x.shape[-1]}]; got {jnp.shape(bias)}")
    width = weight.shape[1]
    if state is not None and jnp.shape(state)[-2:] != (width - 1, x.shape[-1]):
        raise ValueError(f"state must have shape [..., W - 1, D] = [..., {width - 1}, {x.shape[-1]}]; "
                         f"got {jnp.shape(state)}")
    return _conv(x, weight, bias, state, silu=activation is not None)


@functools.partial(jax.jit, static_argnames=("silu",))
def _conv(x, weight, bias, state, *, silu):
    width, n = weight.shape[1], x.shape[-2]
    xp = _window(x, width, state)
    w32 = weight.astype(F32)
    y = sum(xp[..., t:t + n, :] * w32[:, t] for t in range(width))
    if bias is not None:
        y = y + bias.astype(F32)
    if silu:
        y = jax.nn.silu(y)
    new_state = xp[..., xp.shape[-2] - (width - 1):, :]
    return y.astype(x.dtype), new_state.astype(x.dtype)


def gated_conv(bcx, weight, *, bias=None, state=None) -> tuple[jax.Array, jax.Array]:
    """LFM2's short-convolution block between its projections: ``y = C * conv(B * x)``.

    ``bcx`` is ``in_proj(h)``, the three chunks ``[B | C | x]`` of D channels
    in that order (``BCx.chunk(3)``); the convolution has no activation
    (``Lfm2ShortConv``); ``state`` / ``new_state`` the last ``W - 1`` values
    of ``B * x``, as :func:`causal_conv`. float32 math, output in
    ``bcx.dtype``; ``out_proj`` is the caller's.

    Shapes: bcx [..., L, 3 D], weight [D, W], bias [D], state [..., W - 1, D]
    -> (y [..., L, D], [..., W - 1, D]).
    """
    bcx = jnp.asarray(bcx)
    if bcx.ndim < 2 or bcx.shape[-1] % 3:
        raise ValueError(f"bcx must have shape [..., L, 3 D]; got {bcx.shape}")
    b, c, x = jnp.split(bcx.astype(F32), 3, axis=-1)
    y, new_state = causal_conv(b * x, weight, bias=bias, state=state)
    return (c * y).astype(bcx.dtype), new_state.astype(bcx.dtype)
