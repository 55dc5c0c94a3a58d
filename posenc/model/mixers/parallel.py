"""Falcon-H1's hybrid layer: attention and Mamba-2 side by side (``model.layer_types`` entry ``parallel_mamba2``).

Falcon-H1 (TII 2025; transformers' ``FalconH1DecoderLayer``): both branches
read the same normed input, their outputs are added, then the residual::

    y = attention(h * attention_in_multiplier) * attention_out_multiplier
        + mamba2(h) * ssm_out_multiplier        # mamba2 reads h * ssm_in_multiplier, in_proj's parts
                                                # times ssm_multipliers (Falcon-H1's muP vector)

The multipliers are ``model.recurrent.parallel_mamba2``'s; the SSM branch's
sizes ``model.recurrent.mamba2``'s. The attention branch is the layer's usual
attention (``posenc.model.layers.Attention``): its position encoding, span,
QK-norm and KV cache are the layer's; Falcon-H1's ``key_multiplier`` (keys
times a constant, before RoPE) is the loader's to fold into ``wk``.
Parameters: ``attention`` (as an attention layer's ``attn``) and ``mamba``
(``posenc.model.mixers.mamba2``'s layout). The cache entry: the attention's
``k``, ``v`` and features, and ``state`` = ``{"attention": the unit's state,
"mamba": the Mamba-2 state}``.
"""

from __future__ import annotations

from flax import nnx

from posenc.model.layers import Attention
from posenc.model.mixers import base
from posenc.model.mixers.mamba2 import Mamba2Mixer


class ParallelMamba2(nnx.Module):
    """Falcon-H1's attention + Mamba-2 mixer (see the module docstring)."""

    kind = "parallel_mamba2"

    def __init__(self, spec, options, *, encoding, dtype, rngs, layer_index=0, out_gain=None):
        self.attention = Attention(spec, encoding, dtype=dtype, vo_gain=out_gain, rngs=rngs, layer_index=layer_index)
        self.mamba = Mamba2Mixer(spec, spec.recurrent.options["mamba2"], encoding=encoding, dtype=dtype, rngs=rngs,
                                 layer_index=layer_index, out_gain=out_gain,
                                 in_multiplier=options["ssm_in_multiplier"],
                                 projection_multipliers=options["ssm_multipliers"])
        self.attention_in = float(options["attention_in_multiplier"])
        self.attention_out = float(options["attention_out_multiplier"])
        self.ssm_out = float(options["ssm_out_multiplier"])

    # -- what the decoder and the training step read off a layer's mixer --------------------
    @property
    def encoding(self):
        return self.attention.encoding

    @property
    def impl(self):
        return self.attention.impl

    @impl.setter
    def impl(self, value):  # the decoding programs choose the attention path of a step
        self.attention.impl = value

    @property
    def block(self):
        return self.attention.block

    @property
    def cached_key_dim(self):
        return self.attention.cached_key_dim

    @property
    def cached_value_dim(self):
        return self.attention.cached_value_dim

    @property
    def cached_kv_heads(self):
        return self.attention.cached_kv_heads

    @property
    def keys_cached_transformed(self):
        return self.attention.keys_cached_transformed

    def project(self, x):
        return self.attention.project(x)

    def qk_clip(self, max_logits, threshold: float) -> None:
        self.attention.qk_clip(max_logits, threshold)

    def init_state(self, batch_size: int) -> dict:
        return {"attention": self.attention.init_state(batch_size), "mamba": self.mamba.init_state(batch_size)}

    # -- the layer ------------------------------------------------------------------------
    def _sum(self, a, m):
        return base.scaled(a, self.attention_out) + base.scaled(m, self.ssm_out)

    def forward(self, x, positions, *, seq_len, causal=True, return_stats=False):
        """The full pass: x [B, L, D] -> [B, L, D] (, the attention branch's statistics)."""
        a = self.attention.forward(base.scaled(x, self.attention_in), positions, seq_len=seq_len, causal=causal,
                                   return_stats=return_stats)
        a, stats = a if return_stats else (a, None)
        y = self._sum(a, self.mamba.forward(x, positions, seq_len=seq_len, causal=causal))
        return (y, stats) if return_stats else y

    def decode(self, x, positions, all_positions, entry, *, seq_len, length):
        """Append x [B, T, D] to the layer's cache ``entry``; -> (y [B, T, D], new entry)."""
        a, attention = self.attention.decode(base.scaled(x, self.attention_in), positions, all_positions,
                                             {**entry, "state": entry["state"]["attention"]}, seq_len=seq_len,
                                             length=length)
        m, mamba = self.mamba.mix(x, entry["state"]["mamba"])
        return self._sum(a, m), {**attention, "state": {"attention": attention["state"], "mamba": mamba}}
