"""LFM2's gated short convolution (``model.layer_types`` entry ``short_conv``; options ``model.recurrent.short_conv``).

Liquid AI 2025 (``posenc.short_conv.gated_conv``): transformers' ``Lfm2ShortConv``,
the token mixer of LFM2's "conv" layers::

    B, C, x = in_proj(h)             # three chunks of D, in this order (BCx.chunk(3))
    y = C * causal_conv(B * x)       # depthwise, width W (conv_L_cache), no activation
    out = out_proj(y)

Parameters (transformers' names; ``weight.T`` for the linear layers)::

    in_proj  [D, 3 D]   in_proj.weight.T      (in_proj_bias [3 D] with bias)
    conv     [D, W]     conv.weight[:, 0]     (conv_bias [D])
    out_proj [D, D]     out_proj.weight.T     (out_proj_bias [D])

Cache state: ``conv`` [B, W - 1, D], the last W - 1 values of ``B * x``
(transformers' ``conv_states`` [B, D, W] transposed, its oldest column dropped).
"""

from __future__ import annotations

import jax.numpy as jnp

from posenc.model.mixers import base
from posenc.recurrent import short_conv


class ShortConv(base.RecurrentMixer):
    """LFM2's short-convolution operator (see the module docstring)."""

    kind = "short_conv"

    def __init__(self, spec, options, *, encoding, dtype, rngs, layer_index=0, out_gain=None):
        super().__init__(spec, encoding=encoding, dtype=dtype, layer_index=layer_index,
                         segment=options["segment"])
        D, bias = spec.d_model, options["bias"]
        self.width = options["conv_width"]
        self.in_proj = base.weight(rngs, D, D, 3 * D)
        self.in_proj_bias = base.optional_zeros(bias, (3 * D,))
        self.conv = base.conv_weight(rngs, D, self.width)
        self.conv_bias = base.optional_zeros(bias, (D,))
        self.out_proj = base.out_weight(rngs, D, D, out_gain)
        self.out_proj_bias = base.optional_zeros(bias, (D,))

    def init_state(self, batch_size: int) -> dict:
        return {"conv": jnp.zeros((batch_size, self.width - 1, self.d_model), self.dtype)}

    def mix(self, x, state):
        bcx = self.dense(x, self.in_proj, self.in_proj_bias)
        y, conv = short_conv.gated_conv(bcx, self.conv[...],
                                        bias=None if self.conv_bias is None else self.conv_bias[...],
                                        state=None if state is None else state["conv"])
        return self.dense(y, self.out_proj, self.out_proj_bias), {"conv": conv}
