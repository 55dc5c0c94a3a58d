"""Kimi Delta Attention (``model.layer_types`` entry ``kda``; options ``model.recurrent.kda``).

Kimi Team 2025 (``posenc.kda``). The linear-attention layer of Kimi Linear
(transformers' ``KimiLinearDeltaAttention``; fla's ``KimiDeltaAttention``)::

    q, k, v = silu(causal_conv([q_proj x | k_proj x | v_proj x]))   # width W, no bias; [H, Dk] each
    g    = -exp(A_log) softplus(forget_gate_up(forget_gate_down(x)) + dt_bias)   # a decay per key channel
           (lower_bound c < 0: c sigmoid(exp(A_log) (f + dt_bias)))
    beta = sigmoid(beta_proj x)
    o    = kda(l2norm(q), l2norm(k), v, g, beta)                   # chunked; one step when decoding
    out  = o_proj(w * rms(o) * sigmoid(output_gate_up(output_gate_down(x))))   # the norm per head

Parameters (transformers' names; ``weight.T`` for the linear layers; K = H Dk, Dv = Dk)::

    q_proj, k_proj, v_proj   [D, K]
    conv                     [3 K, W]   conv1d.weight[:, 0]: q's channels, then k's, then v's
                                        (fla / the released checkpoints: q_conv1d, k_conv1d, v_conv1d stacked)
    forget_gate_down [D, Dk], forget_gate_up [Dk, K]      (f_a_proj, f_b_proj)
    beta_proj        [D, H]                                (b_proj)
    A_log            [H]                                   (A_log [1, 1, H, 1] or [H, 1] flattened)
    dt_bias          [H, Dk]                               (dt_bias [H Dk] reshaped)
    output_gate_down [D, Dk], output_gate_up [Dk, K]      (g_a_proj, g_b_proj)
    o_norm           [Dk]; o_proj [K, D]

Cache state: ``conv`` [B, W - 1, 3 K] and ``ssm`` float32 [B, H, Dk, Dk].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc.model.mixers import base
from posenc.recurrent import kda


class KimiDeltaAttention(base.RecurrentMixer):
    """Kimi Linear's KDA layer (see the module docstring)."""

    kind = "kda"

    def __init__(self, spec, options, *, encoding, dtype, rngs, layer_index=0, out_gain=None):
        super().__init__(spec, encoding=encoding, dtype=dtype, layer_index=layer_index,
                         segment=options["segment"])
        o, D = options, spec.d_model
        H, Dk = o["num_heads"], o["head_dim"]
        self.num_heads, self.head_dim, self.width, self.chunk_size = H, Dk, o["conv_width"], o["chunk_size"]
        self.lower_bound = float(o["lower_bound"]) or None
        K = H * Dk
        self.q_proj, self.k_proj, self.v_proj = (base.weight(rngs, D, D, K) for _ in range(3))
        self.conv = base.conv_weight(rngs, 3 * K, self.width)
        self.forget_gate_down = base.weight(rngs, D, D, Dk)
        self.forget_gate_up = base.weight(rngs, Dk, Dk, K)
        self.beta_proj = base.weight(rngs, D, D, H)
        # fla.layers.KimiDeltaAttention's initialisation (Kimi Linear's official code): A ~ U(1, 16),
        # dt_bias 0
        self.A_log = base.log_uniform_a(rngs, H)
        self.dt_bias = base.constant(0.0, (H, Dk))
        self.output_gate_down = base.weight(rngs, D, D, Dk)
        self.output_gate_up = base.weight(rngs, Dk, Dk, K)
        self.o_norm = base.constant(1.0, (Dk,))
        self.o_proj = base.out_weight(rngs, K, D, out_gain)

    def init_state(self, batch_size: int) -> dict:
        H, Dk = self.num_heads, self.head_dim
        return {"conv": jnp.zeros((batch_size, self.width - 1, 3 * H * Dk), self.dtype),
                "ssm": jnp.zeros((batch_size, H, Dk, Dk), jnp.float32)}

    def mix(self, x, state):
        B, T, _ = x.shape
        H, Dk = self.num_heads, self.head_dim
        heads = (B, T, H, Dk)
        qkv = jnp.concatenate([self.dense(x, w) for w in (self.q_proj, self.k_proj, self.v_proj)], axis=-1)
        qkv, conv = self.convolve(qkv, self.conv, None, None if state is None else state["conv"])
        q, k, v = (t.reshape(heads) for t in jnp.split(qkv, 3, axis=-1))
        f = self.dense(self.dense(x, self.forget_gate_down), self.forget_gate_up).reshape(heads)
        g = kda.gate(f, self.A_log[...], self.dt_bias[...], lower_bound=self.lower_bound)
        beta = jax.nn.sigmoid(self.dense(x, self.beta_proj).astype(jnp.float32))
        initial = None if state is None else state["ssm"]
        if state is not None and T == 1:  # decoding one token: the recurrent (step) form
            o, ssm = kda.recurrent(q, k, v, g, beta, initial_state=initial, qk_l2norm=True)
        else:
            o, ssm = kda.chunked(q, k, v, g, beta, chunk_size=self.chunk_size, initial_state=initial, qk_l2norm=True)
        gate = self.dense(self.dense(x, self.output_gate_down), self.output_gate_up).reshape(heads)
        o = kda.gated_rms_norm(o, gate, self.o_norm[...], eps=self.eps)
        return self.dense(o.reshape(B, T, -1), self.o_proj), {"conv": conv, "ssm": ssm}
