"""Gated DeltaNet (``model.layer_types`` entry ``gated_deltanet``; options ``model.recurrent.gated_deltanet``).

Yang et al. 2025 (``posenc.gated_delta``). The linear-attention layer of
Qwen3-Next (transformers' ``Qwen3NextGatedDeltaNet``) and Qwen3.5
(``Qwen3_5GatedDeltaNet``)::

    q, k, v, z, b, a = projections(x)       # q, k [Hk, Dk]; v, z [Hv, Dv]; b, a [Hv]
    q, k, v = silu(causal_conv([q | k | v]))   # width W, no bias; channels q (all heads), k, v
    g = -exp(A_log) softplus(a + dt_bias); beta = sigmoid(b)
    o = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta)   # chunked; one step when decoding;
                                                             # key head h serves value heads h G .. h G + G - 1
    out = out_proj(w * rms(o) * silu(z))    # the norm per value head (Dv)

Parameters (transformers' names; ``weight.T`` for the linear layers; K = Hk Dk, V = Hv Dv, G = Hv / Hk),
``projections`` "qkvz" (Qwen3-Next)::

    in_proj_qkvz [D, 2 K + 2 V]   in_proj_qkvz.weight.T: per key head h, [q_h (Dk) | k_h (Dk) | v (G Dv) | z (G Dv)]
    in_proj_ba   [D, 2 Hv]        in_proj_ba.weight.T: per key head h, [b (G) | a (G)]

or "split" (Qwen3.5): ``in_proj_qkv`` [D, 2 K + V] (q of every head, then k, then v), ``in_proj_z``
[D, V], ``in_proj_b``, ``in_proj_a`` [D, Hv]; then for both::

    conv     [2 K + V, W]   conv1d.weight[:, 0] (no bias)
    dt_bias, A_log [Hv]
    norm     [Dv]           norm.weight
    out_proj [V, D]         out_proj.weight.T

Cache state: ``conv`` [B, W - 1, 2 K + V] and ``ssm`` float32 [B, Hv, Dk, Dv]
(transformers' ``recurrent_states``).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from posenc.model.mixers import base
from posenc.recurrent import gated_delta


class GatedDeltaNet(base.RecurrentMixer):
    """Qwen3-Next's / Qwen3.5's Gated DeltaNet layer (see the module docstring)."""

    kind = "gated_deltanet"

    def __init__(self, spec, options, *, encoding, dtype, rngs, layer_index=0, out_gain=None):
        super().__init__(spec, encoding=encoding, dtype=dtype, layer_index=layer_index,
                         segment=options["segment"])
        o, D = options, spec.d_model
        self.hk, self.hv = o["num_key_heads"], o["num_value_heads"]
        self.dk, self.dv = o["key_head_dim"], o["value_head_dim"]
        self.width, self.chunk_size, self.projections = o["conv_width"], o["chunk_size"], o["projections"]
        K, V, Hv = self.hk * self.dk, self.hv * self.dv, self.hv
        self.conv_dim = 2 * K + V
        if self.projections == "qkvz":
            self.in_proj_qkvz = base.weight(rngs, D, D, 2 * K + 2 * V)
            self.in_proj_ba = base.weight(rngs, D, D, 2 * Hv)
        else:
            self.in_proj_qkv = base.weight(rngs, D, D, 2 * K + V)
            self.in_proj_z = base.weight(rngs, D, D, V)
            self.in_proj_b = base.weight(rngs, D, D, Hv)
            self.in_proj_a = base.weight(rngs, D, D, Hv)
        self.conv = base.conv_weight(rngs, self.conv_dim, self.width)
        # the initialisation of the official training code (fla.layers.GatedDeltaNet, which Yang et
        # al.'s repository builds on): A ~ U(0, 16), softplus(dt_bias) = Mamba-2's dt in [1e-3, 0.1],
        # so that a head decays by exp(-A dt), about 0.92 a token at the medians. transformers'
        # Qwen3-Next fills dt_bias with 1 (exp(-1.3 A): the state forgotten at every token); its
        # layer serves checkpoints, which bring their own values.
        self.A_log = base.log_uniform_a(rngs, Hv, low=0.0)
        self.dt_bias = nnx.Param(base.time_step_bias(rngs.params(), Hv))
        self.norm = base.constant(1.0, (self.dv,))
        self.out_proj = base.out_weight(rngs, V, D, out_gain)

    def init_state(self, batch_size: int) -> dict:
        return {"conv": jnp.zeros((batch_size, self.width - 1, self.conv_dim), self.dtype),
                "ssm": jnp.zeros((batch_size, self.hv, self.dk, self.dv), jnp.float32)}

    def _project(self, x):
        """x [B, T, D] -> (qkv [B, T, 2 K + V] in the conv's channel order, z [B, T, Hv, Dv], b, a [B, T, Hv])."""
        B, T, _ = x.shape
        hk, hv, dk, dv = self.hk, self.hv, self.dk, self.dv
        if self.projections == "split":
            z = self.dense(x, self.in_proj_z).reshape(B, T, hv, dv)
            return self.dense(x, self.in_proj_qkv), z, self.dense(x, self.in_proj_b), self.dense(x, self.in_proj_a)
        g = hv // hk
        qkvz = self.dense(x, self.in_proj_qkvz).reshape(B, T, hk, 2 * dk + 2 * g * dv)
        q, k, v, z = jnp.split(qkvz, [dk, 2 * dk, 2 * dk + g * dv], axis=-1)
        ba = self.dense(x, self.in_proj_ba).reshape(B, T, hk, 2 * g)
        b, a = ba[..., :g].reshape(B, T, hv), ba[..., g:].reshape(B, T, hv)
        qkv = jnp.concatenate([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], axis=-1)
        return qkv, z.reshape(B, T, hv, dv), b, a

    def mix(self, x, state):
        B, T, _ = x.shape
        qkv, z, b, a = self._project(x)
        qkv, conv = self.convolve(qkv, self.conv, None, None if state is None else state["conv"])
        K = self.hk * self.dk
        q = qkv[..., :K].reshape(B, T, self.hk, self.dk)
        k = qkv[..., K:2 * K].reshape(B, T, self.hk, self.dk)
        v = qkv[..., 2 * K:].reshape(B, T, self.hv, self.dv)
        g, beta = gated_delta.gates(a, b, self.A_log[...], self.dt_bias[...])
        initial = None if state is None else state["ssm"]
        if state is not None and T == 1:  # decoding one token: the recurrent (step) form
            o, ssm = gated_delta.recurrent(q, k, v, g, beta, initial_state=initial, qk_l2norm=True)
        else:
            o, ssm = gated_delta.chunked(q, k, v, g, beta, chunk_size=self.chunk_size, initial_state=initial,
                                         qk_l2norm=True)
        o = gated_delta.gated_rms_norm(o, z, self.norm[...], eps=self.eps)
        return self.dense(o.reshape(B, T, -1), self.out_proj), {"conv": conv, "ssm": ssm}

