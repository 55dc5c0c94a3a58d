"""posenc.short_conv (the causal depthwise conv of the recurrent mixers, LFM2's gated conv) against NumPy
transcriptions of transformers 5.18.0's pure-torch code.

References (numpy float64): ``causal_conv1d_fn`` and ``causal_conv1d_update`` (the same in
models/{mamba2,qwen3_next,kimi_linear,lfm2}/modeling_*.py), the cache's ``update_conv_state``
(src/transformers/cache_utils.py: a prefill keeps the last ``conv_kernel_size`` inputs, left-padded
with zeros), and the body of ``Lfm2ShortConv.forward`` (models/lfm2/modeling_lfm2.py:
``B, C, x = BCx.chunk(3)``, ``y = C * conv(B * x)``, no activation).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import short_conv

RNG = np.random.default_rng(0)


def silu(x):
    return x / (1.0 + np.exp(-x))


def ref_conv1d(x, weight, bias, padding):
    """F.conv1d(x, weight.unsqueeze(1), bias, padding=padding, groups=D): x [b, d, l], weight [d, w]."""
    w = weight.shape[-1]
    xp = np.pad(x, [(0, 0), (0, 0), (padding, padding)])
    out = np.stack([(xp[:, :, t:t + w] * weight).sum(-1) for t in range(xp.shape[-1] - w + 1)], -1)
    return out if bias is None else out + bias[:, None]


def ref_causal_conv1d_fn(hidden_states, weight, bias=None, activation=None):
    """causal_conv1d_fn: hidden_states [b, d, l] -> [b, d, l]."""
    out = ref_conv1d(hidden_states, weight, bias, weight.shape[-1] - 1)[:, :, :hidden_states.shape[-1]]
    return silu(out) if activation is not None else out


def ref_causal_conv1d_update(hidden_states, conv_state, weight, bias=None, activation=None):
    """causal_conv1d_update: hidden_states [b, d, l], conv_state [b, d, state_len] -> (out, new conv_state)."""
    seq_len, state_len = hidden_states.shape[-1], conv_state.shape[-1]
    new = np.concatenate([conv_state, hidden_states], -1)
    out = ref_conv1d(new, weight, bias, 0)[:, :, -seq_len:]
    return (silu(out) if activation is not None else out), new[:, :, -state_len:]


def ref_prefill_conv_state(hidden_states, conv_kernel_size):
    """update_conv_state on a prefill: left-pad to conv_kernel_size, keep the last conv_kernel_size inputs."""
    pad = max(conv_kernel_size - hidden_states.shape[-1], 0)
    return np.pad(hidden_states, [(0, 0), (0, 0), (pad, 0)])[:, :, -conv_kernel_size:]


def ours(conv_states):
    """transformers' conv_states [b, d, W] -> posenc's window [b, W - 1, d]."""
    return np.swapaxes(conv_states, -1, -2)[:, 1:]


@pytest.mark.parametrize("length,width,bias,activation", [(9, 4, True, "silu"), (2, 4, False, None),
                                                          (7, 2, True, None), (5, 1, False, "swish")])
def test_full_sequence_and_window_match_transformers(length, width, bias, activation):
    x = RNG.normal(size=(2, length, 6))
    weight, b = RNG.normal(size=(6, width)), (RNG.normal(size=6) if bias else None)
    y, state = short_conv.causal_conv(x.astype(np.float32), weight.astype(np.float32),
                                      bias=None if b is None else b.astype(np.float32), activation=activation)
    ref = ref_causal_conv1d_fn(np.swapaxes(x, 1, 2), weight, b, activation)
    np.testing.assert_allclose(y, np.swapaxes(ref, 1, 2), rtol=1e-5, atol=1e-5)
    assert state.shape == (2, width - 1, 6)
    np.testing.assert_allclose(state, ours(ref_prefill_conv_state(np.swapaxes(x, 1, 2), width)), rtol=1e-6)


@pytest.mark.parametrize("new_tokens", [1, 3])
def test_update_with_a_cached_window_matches_transformers(new_tokens):
    width = 4
    x, conv_state = RNG.normal(size=(2, new_tokens, 5)), RNG.normal(size=(2, 5, width))
    weight, b = RNG.normal(size=(5, width)), RNG.normal(size=5)
    ref, ref_state = ref_causal_conv1d_update(np.swapaxes(x, 1, 2), conv_state, weight, b, "silu")
    y, state = short_conv.causal_conv(x.astype(np.float32), weight.astype(np.float32), bias=b.astype(np.float32),
                                      activation="silu", state=ours(conv_state).astype(np.float32))
    np.testing.assert_allclose(y, np.swapaxes(ref, 1, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, ours(ref_state), rtol=1e-6)


def test_carried_window_equals_one_call():
    x = RNG.normal(size=(2, 10, 3)).astype(np.float32)
    weight = RNG.normal(size=(3, 4)).astype(np.float32)
    full, full_state = short_conv.causal_conv(x, weight, activation="silu")
    parts, state = [], None
    for lo, hi in ((0, 2), (2, 3), (3, 4), (4, 10)):   # a prefill shorter than the window, steps, the rest
        y, state = short_conv.causal_conv(x[:, lo:hi], weight, activation="silu", state=state)
        parts.append(y)
    np.testing.assert_allclose(np.concatenate(parts, 1), full, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(state, full_state)


def test_lfm2_gated_conv_matches_transformers():
    d, width = 4, 3
    bcx = RNG.normal(size=(2, 8, 3 * d))
    weight, b = RNG.normal(size=(d, width)), RNG.normal(size=d)
    bm, cm, xm = np.split(np.swapaxes(bcx, 1, 2), 3, axis=1)   # BCx.chunk(3, dim=-2)
    ref = cm * ref_causal_conv1d_fn(bm * xm, weight, b)
    y, state = short_conv.gated_conv(bcx.astype(np.float32), weight.astype(np.float32), bias=b.astype(np.float32))
    np.testing.assert_allclose(y, np.swapaxes(ref, 1, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, ours(ref_prefill_conv_state(bm * xm, width)), rtol=1e-6)
    # decoding: the cached B*x window and one token at a time give the same outputs
    y1, s = short_conv.gated_conv(bcx[:, :5].astype(np.float32), weight.astype(np.float32), bias=b.astype(np.float32))
    steps = []
    for t in range(5, 8):
        yt, s = short_conv.gated_conv(bcx[:, t:t + 1].astype(np.float32), weight.astype(np.float32),
                                      bias=b.astype(np.float32), state=s)
        steps.append(yt)
    np.testing.assert_allclose(np.concatenate([y1] + steps, 1), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, state, rtol=1e-6)


def test_dtype_causality_and_jit():
    x = jnp.asarray(RNG.normal(size=(1, 6, 2)), jnp.bfloat16)
    weight = jnp.asarray(RNG.normal(size=(2, 3)), jnp.float32)
    y, state = jax.jit(lambda x: short_conv.causal_conv(x, weight, activation="silu"))(x)
    assert y.dtype == jnp.bfloat16 and state.dtype == jnp.bfloat16
    grad = np.asarray(jax.grad(lambda x: short_conv.causal_conv(x, weight)[0][:, 3].sum())(x.astype(np.float32)))
    assert np.all(grad[:, 4:] == 0) and np.all(grad[:, 1:4] != 0) and np.all(grad[:, 0] == 0)


@pytest.mark.parametrize("call,match", [
    (lambda: short_conv.causal_conv(np.zeros((2, 5, 4)), np.zeros((3, 3))), "weight"),
    (lambda: short_conv.causal_conv(np.zeros((2, 5, 4)), np.zeros((4, 3)), activation="relu"), "activation"),
    (lambda: short_conv.causal_conv(np.zeros((2, 5, 4)), np.zeros((4, 3)), bias=np.zeros(3)), "bias"),
    (lambda: short_conv.causal_conv(np.zeros((2, 5, 4)), np.zeros((4, 3)), state=np.zeros((2, 3, 4))), "state"),
    (lambda: short_conv.gated_conv(np.zeros((2, 5, 4)), np.zeros((4, 3))), "bcx"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
