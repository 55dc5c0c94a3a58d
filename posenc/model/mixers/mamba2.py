"""The Mamba-2 mixer (``model.layer_types`` entry ``mamba2``; options ``model.recurrent.mamba2``).

Dao & Gu 2024 (``posenc.ssd``). The layer of transformers' ``Mamba2Mixer``
and of the hybrids built on it: Bamba and Granite 4.0-H (``BambaMixer``,
``GraniteMoeHybridMambaLayer``: norm "full"), Nemotron-H
(``NemotronHMamba2Mixer``: norm "grouped") and Falcon-H1's SSM branch
(``FalconH1Mixer``: its multipliers, an optional or grouped norm, norm before
the gate; ``posenc.model.mixers.parallel``)::

    zxbcdt = in_proj(x * ssm_in_multiplier) * mup      # [z | xBC | dt]: I + (I + 2 G N) + H
    xBC    = silu(causal_conv(xBC))                    # width W, with bias
    x, B, C = split(xBC)                               # x [H, P] (I = H P), B, C [G, N]
    dt     = clamp(softplus(dt + dt_bias), *dt_limit); A = -exp(A_log)
    y      = SSD(x, dt, A, B, C) + D x                 # chunked; one step when decoding
    y      = w * rms(y * silu(z))                      # per group of I / G channels with norm "grouped"
    out    = out_proj(y)

Parameters (transformers' names; ``weight.T`` for the linear layers):

    in_proj   [D, 2 I + 2 G N + H]   in_proj.weight.T, its parts in this order (in_proj_bias with bias)
    conv      [I + 2 G N, W]         conv1d.weight[:, 0]   (conv_bias [I + 2 G N]: conv1d.bias)
    dt_bias, A_log, D   [H]
    norm      [I]                    norm.weight (absent with norm "none")
    out_proj  [I, D]                 out_proj.weight.T     (out_proj_bias with bias)

Cache state: ``conv`` [B, W - 1, I + 2 G N] (the last W - 1 inputs of the
conv; transformers' ``conv_states`` [B, C, W] is ``conv`` transposed with one
older column in front) and ``ssm`` float32 [B, H, P, N] (``recurrent_states``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.model.mixers import base
from posenc.recurrent import gated_delta, ssd


class Mamba2Mixer(base.RecurrentMixer):
    """Mamba-2's mixer; ``in_multiplier`` and ``projection_multipliers`` (z, x, B, C, dt) are Falcon-H1's
    ``ssm_in_multiplier`` and ``ssm_multipliers`` (1: nothing traced)."""

    kind = "mamba2"

    def __init__(self, spec, options, *, encoding, dtype, rngs, layer_index=0, out_gain=None,
                 in_multiplier=1.0, projection_multipliers=(1.0,) * 5):
        super().__init__(spec, encoding=encoding, dtype=dtype, layer_index=layer_index,
                         segment=options["segment"])
        o = options
        D, P, N, G = spec.d_model, o["head_dim"], o["state_size"], o["n_groups"]
        H = o["num_heads"] or o["expand"] * D // P
        self.num_heads, self.head_dim, self.state_size, self.n_groups = H, P, N, G
        self.inner, self.conv_dim = H * P, H * P + 2 * G * N
        self.chunk_size, self.width = o["chunk_size"], o["conv_width"]
        low, high = o["dt_limit"]
        self.limit = (low, high or float("inf"))
        self.norm_kind, self.norm_before_gate = o["norm"], o["norm_before_gate"]
        self.in_multiplier = float(in_multiplier)
        self.multipliers = tuple(float(m) for m in projection_multipliers)

        width = self.inner + self.conv_dim + H
        self.in_proj = base.weight(rngs, D, D, width)
        self.in_proj_bias = base.optional_zeros(o["bias"], (width,))
        self.conv = base.conv_weight(rngs, self.conv_dim, self.width)
        self.conv_bias = base.optional_zeros(o["conv_bias"], (self.conv_dim,))
        self.dt_bias = nnx.Param(base.time_step_bias(rngs.params(), H))
        self.A_log = nnx.Param(jnp.log(jnp.arange(1, H + 1, dtype=jnp.float32)))
        self.D = base.constant(1.0, (H,))
        self.norm = None if self.norm_kind == "none" else base.constant(1.0, (self.inner,))
        self.out_proj = base.out_weight(rngs, self.inner, D, out_gain)
        self.out_proj_bias = base.optional_zeros(o["bias"], (D,))

    def init_state(self, batch_size: int) -> dict:
        return {"conv": jnp.zeros((batch_size, self.width - 1, self.conv_dim), self.dtype),
                "ssm": jnp.zeros((batch_size, self.num_heads, self.head_dim, self.state_size), jnp.float32)}

    def _mup(self, zxbcdt):
        """Falcon-H1's muP vector: each part of in_proj's output times its multiplier."""
        if self.multipliers == (1.0,) * 5:
            return zxbcdt
        I, GN = self.inner, self.n_groups * self.state_size
        sizes = (I, I, GN, GN, self.num_heads)
        vector = jnp.concatenate([jnp.full((n,), m, jnp.float32) for n, m in zip(sizes, self.multipliers)])
        return (zxbcdt.astype(jnp.float32) * vector).astype(zxbcdt.dtype)

    def _norm(self, y, gate):
        """The gated RMS norm of the scan's output y [B, T, I] with the gate z (or y * silu(z) without a norm)."""
        if self.norm_kind == "none":
            return (y.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))).astype(y.dtype)
        group = self.inner // self.n_groups if self.norm_kind == "grouped" else None
        w = self.norm[...]
        if not self.norm_before_gate:  # Mamba-2's w * rms(y * silu(z))
            return ssd.gated_rms_norm(y, gate, w, eps=self.eps, group_size=group)
        if group is None:  # Falcon-H1's w * rms(y) * silu(z)
            return gated_delta.gated_rms_norm(y, gate, w, eps=self.eps)
        normed = ssd.gated_rms_norm(y.astype(jnp.float32), None, w, eps=self.eps, group_size=group)
        return (normed * jax.nn.silu(gate.astype(jnp.float32))).astype(y.dtype)

    def mix(self, x, state):
        B, T, _ = x.shape
        H, P, N, G = self.num_heads, self.head_dim, self.state_size, self.n_groups
        zxbcdt = self._mup(self.dense(base.scaled(x, self.in_multiplier), self.in_proj, self.in_proj_bias))
        gate, xbc, dt = ssd.split_projection(zxbcdt, num_heads=H, head_dim=P, n_groups=G, state_size=N)
        xbc, conv = self.convolve(xbc, self.conv, self.conv_bias, None if state is None else state["conv"])
        xs, b, c = ssd.split_xbc(xbc, num_heads=H, head_dim=P, n_groups=G, state_size=N)
        dt = ssd.time_step(dt, self.dt_bias[...], limit=self.limit)
        a = -jnp.exp(self.A_log[...])
        if state is not None and T == 1:  # decoding one token: the step form
            y, ssm = ssd.step(xs[:, 0], dt[:, 0], a, b[:, 0], c[:, 0], state["ssm"], D=self.D[...])
            y = y[:, None]
        else:
            y, ssm = ssd.chunked(xs, dt, a, b, c, chunk_size=self.chunk_size, D=self.D[...],
                                 initial_state=None if state is None else state["ssm"])
        y = self._norm(y.reshape(B, T, self.inner), gate)
        return self.dense(y, self.out_proj, self.out_proj_bias), {"conv": conv, "ssm": ssm}
