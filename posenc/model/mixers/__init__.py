"""The token mixers of a decoder layer other than attention: the recurrent layers of hybrid decoders.

``model.layer_types`` names each layer's mixer (``posenc.model.recurrent_options.KINDS``):
``attention`` (``posenc.model.layers.Attention``, or MLA) or one of :data:`MIXERS`,
one module each:

- ``mamba2``: Mamba-2 (``posenc.model.mixers.mamba2``; Bamba, Granite 4.0-H, Nemotron-H);
- ``gated_deltanet``: Gated DeltaNet (``.gated_deltanet``; Qwen3-Next, Qwen3.5);
- ``kda``: Kimi Delta Attention (``.kda``; Kimi Linear);
- ``short_conv``: LFM2's gated short convolution (``.short_conv``);
- ``parallel_mamba2``: attention and Mamba-2 side by side (``.parallel``; Falcon-H1).

Each takes the place of the layer's attention (``Block.attn``) with the same
calls (``posenc.model.mixers.base``); the layer's norms, residual and MLP stay.
"""

from __future__ import annotations

from posenc.model.mixers.gated_deltanet import GatedDeltaNet
from posenc.model.mixers.kda import KimiDeltaAttention
from posenc.model.mixers.mamba2 import Mamba2Mixer
from posenc.model.mixers.parallel import ParallelMamba2
from posenc.model.mixers.short_conv import ShortConv

MIXERS = {c.kind: c for c in (Mamba2Mixer, GatedDeltaNet, KimiDeltaAttention, ShortConv, ParallelMamba2)}


def build(kind: str, spec, encoding, *, dtype, rngs, layer_index: int, out_gain=None):
    """The mixer of layer ``layer_index`` of kind ``kind`` (``spec``: the ModelSpec, its ``recurrent`` set)."""
    return MIXERS[kind](spec, spec.recurrent.options[kind], encoding=encoding, dtype=dtype, rngs=rngs,
                        layer_index=layer_index, out_gain=out_gain)


__all__ = ["MIXERS", "GatedDeltaNet", "KimiDeltaAttention", "Mamba2Mixer", "ParallelMamba2", "ShortConv", "build"]
