"""What every recurrent mixer of a decoder layer shares: its place in the layer, its cache, its parameters.

A recurrent mixer takes the place of a layer's attention (``Block.attn``)
and offers the decoder the same calls: ``forward`` (the full pass: the
chunked form of its scan from a zero state), ``decode`` (appending tokens to
its cache entry: a prefill of several tokens in the chunked form from the
cached state, one token in the step form) and ``init_state`` (its entry's
``state``: the conv window and the scan state, ``posenc.model.cache``). A
full pass longer than ``model.recurrent.<kind>.segment`` tokens runs in
segments, each from the state the one before left, so its memory is the
segment's. It
has no keys, values or features (``cached_key_dim`` etc. are 0: the entry's
``k`` and ``v`` are [B, S, 0, 0]) and no attention statistics. Its position
unit is the layer's NoPE unit: the mixer reads tokens in order, which is all
the position it has (``Decoder`` builds it; ``constrain`` finds nothing to
project). Subclasses implement :meth:`RecurrentMixer.mix`.

Parameters are float32 ``nnx.Param``; matmuls run in the compute dtype, the
scans in float32 (``posenc.recurrent``). Each subclass names its parameters
after the transformers module it follows and documents the layout, so that a
checkpoint maps onto them one to one (a linear layer's ``weight`` [out, in]
is stored transposed, [in, out]; a depthwise ``conv1d.weight`` [C, 1, W]
squeezed to [C, W]).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.model.layers import lecun_normal, linear, xavier_normal
from posenc.recurrent import short_conv


class RecurrentMixer(nnx.Module):
    """Base of the recurrent mixers (see the module docstring); ``kind`` is the ``model.layer_types`` name."""

    kind = ""

    def __init__(self, spec, *, encoding, dtype, layer_index=0, segment=0):
        self.encoding = encoding  # the layer's position unit (NoPE)
        self.dtype, self.layer_index = dtype, layer_index
        self.segment = segment  # model.recurrent.<kind>.segment (0: one call)
        self.d_model, self.eps = spec.d_model, spec.norm.eps
        self.impl = "recurrent"  # not an attention path (the decoding programs leave it)

    def dense(self, x, w, b=None):
        """``x @ w (+ b)`` in the compute dtype."""
        y = linear(x, w[...].astype(self.dtype))
        return y if b is None else y + b[...].astype(y.dtype)

    @staticmethod
    def convolve(x, weight, bias=None, state=None, *, activation="silu"):
        """The causal depthwise conv (``posenc.short_conv.causal_conv``, float32 weights) -> (y, window)."""
        return short_conv.causal_conv(x, weight[...], bias=None if bias is None else bias[...],
                                      activation=activation, state=state)

    # -- the decoder's calls ---------------------------------------------------------------
    def mix(self, x, state):
        """x [B, T, D] -> (y [B, T, D], state after the tokens); ``state`` None: a fresh sequence (the full
        forward, chunked), else the state before them (chunked for T > 1, the step form for T = 1)."""
        raise NotImplementedError

    def init_state(self, batch_size: int) -> dict:
        """The cache entry's ``state`` before any token: the conv window and the scan state (zeros)."""
        raise NotImplementedError

    def forward(self, x, positions, *, seq_len, causal=True, return_stats=False):
        """The full pass over x [B, L, D] -> [B, L, D] (, ``{}``: no attention statistics).

        Positions are not read: the layer carries order by reading the tokens in it.
        """
        if not causal:
            raise ValueError(f"a {self.kind} layer reads the tokens in order (it is causal); forward_embeddings("
                             "causal=False) needs attention in every layer")
        y = self._segments(x) if self.segment and x.shape[1] > self.segment else self.mix(x, None)[0]
        return (y, {}) if return_stats else y

    def _segments(self, x):
        """The full pass in segments of ``self.segment`` tokens, each from the state the one before left
        (a scan): what a token's projections and the scan's chunk terms take is held for one segment."""
        B, L, D = x.shape
        n, s = L // self.segment, self.segment

        def one(state, piece):
            y, state = self.mix(piece, state)
            return state, y

        state, ys = jax.lax.scan(one, self.init_state(B), jnp.swapaxes(x[:, :n * s].reshape(B, n, s, D), 0, 1))
        y = jnp.swapaxes(ys, 0, 1).reshape(B, n * s, ys.shape[-1])
        if L > n * s:
            y = jnp.concatenate([y, self.mix(x[:, n * s:], state)[0]], axis=1)
        return y

    def decode(self, x, positions, all_positions, entry, *, seq_len, length):
        """Append x [B, T, D] to this layer's cache ``entry``; -> (y [B, T, D], new entry)."""
        y, state = self.mix(x, entry["state"])
        return y, {"k": entry["k"], "v": entry["v"], "features": entry["features"], "state": state}

    # the cache entry holds no keys or values: k, v [B, S, 0, 0]
    cached_key_dim = 0
    cached_value_dim = 0
    cached_kv_heads = 0
    keys_cached_transformed = False

    def qk_clip(self, max_logits, threshold: float) -> None:
        """QK-Clip has no query or key weights to rescale here."""


def weight(rngs, fan_in, *shape):
    """A LeCun-normal float32 matrix (a projection into the mixer)."""
    return nnx.Param(lecun_normal(rngs.params(), shape, fan_in))


def out_weight(rngs, fan_in, fan_out, gain=None):
    """The output projection [fan_in, fan_out]: LeCun normal, or DeepNorm's xavier normal with gain beta."""
    if gain is None:
        return nnx.Param(lecun_normal(rngs.params(), (fan_in, fan_out), fan_in))
    return nnx.Param(xavier_normal(rngs.params(), (fan_in, fan_out), fan_in, fan_out, gain))


def conv_weight(rngs, channels, width):
    """A depthwise conv kernel [channels, width] (fan-in: its width)."""
    return nnx.Param(lecun_normal(rngs.params(), (channels, width), width))


def constant(value, shape):
    return nnx.Param(jnp.full(shape, value, jnp.float32))


def optional_zeros(on, shape):
    """Zeros [shape] (a bias), or None when ``on`` is false."""
    return nnx.Param(jnp.zeros(shape, jnp.float32)) if on else None


def log_uniform_a(rngs, n, low=1.0, high=16.0):
    """``log(A)`` with ``A ~ U(low, high)`` per head (the delta rules' A_log initialisation)."""
    return nnx.Param(jnp.log(jax.random.uniform(rngs.params(), (n,), jnp.float32, low, high)))


def scaled(x, multiplier: float):
    """``x * multiplier`` in float32, cast back (nothing traced for 1.0)."""
    if multiplier == 1.0:
        return x
    return (x.astype(jnp.float32) * multiplier).astype(x.dtype)


def inverse_softplus(x):
    """``log(exp(x) - 1)``: the bias whose softplus is x."""
    return x + jnp.log(-jnp.expm1(-x))


def time_step_bias(key, num_heads, *, low=1e-3, high=0.1, floor=1e-4):
    """Mamba-2's dt_bias initialisation (transformers' init_mamba2_weights): softplus^-1 of
    dt = exp(U(log low, log high)), clamped below at ``floor``."""
    dt = jnp.exp(jax.random.uniform(key, (num_heads,), jnp.float32) * (math.log(high) - math.log(low))
                 + math.log(low))
    return inverse_softplus(jnp.maximum(dt, floor))
