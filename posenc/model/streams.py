"""Hyper-connections in the decoder (model.residual_streams n > 1, model.hyper_connections kind).

The one place that knows the kinds of :mod:`posenc.hyper_connections` the
decoder offers: each sublayer's parameters and call, and the final collapse
of the streams.

- ``dynamic``: HC (Zhu et al. 2025) with its input-dependent terms, read
  through a norm of model.norm.kind (the caller's ``norm``);
- ``static``: HC's learned ``alpha``, ``beta`` only (``hc_init(dynamic=False)``);
- ``mhc``: DeepSeek-V4's mHC (``mhc_block``) around each sublayer and its
  ``DeepseekV4HyperHead`` (``mhc_head``) before the final norm; the streams'
  RMS norm uses model.norm.eps (V4: ``rms_norm_eps``).

HC's sublayer ``k = 2 layer + (0 attention, 1 MLP)`` reads stream ``k mod n``
at init; HC's streams are summed at the end (``reduce``).
"""

from __future__ import annotations

from flax import nnx

from posenc.norms import hyper_connections as hc

MHC_STD = 0.02  # DeepSeek-V4's initializer_range: the std of fn (the embedding's std here too)


def _params(values: dict) -> nnx.Dict:
    return nnx.Dict({k: nnx.Param(v) for k, v in values.items()})


def sublayer_params(kind: str, num_streams: int, dim: int, *, sublayer_index: int, rngs) -> nnx.Dict:
    """The float32 parameters of one sublayer's connection."""
    if kind == "mhc":
        return _params(hc.mhc_init(rngs.params(), num_streams, dim, std=MHC_STD))
    return _params(hc.hc_init(num_streams, dim, layer_index=sublayer_index, dynamic=kind == "dynamic"))


def needs_norm(kind: str) -> bool:
    """Dynamic HC reads the streams through a norm of model.norm.kind."""
    return kind == "dynamic"


def block(kind: str, streams, params: nnx.Dict, sublayer, *, norm=None, eps: float):
    """``streams [B, L, n, D]`` after ``sublayer`` wrapped by the connection."""
    values = {k: p[...] for k, p in params.items()}
    if kind == "mhc":
        return hc.mhc_block(streams, values, sublayer, norm_eps=eps)
    return hc.hc_block(streams, values, sublayer, norm=norm)


def head_params(kind: str, num_streams: int, dim: int, *, rngs) -> nnx.Dict | None:
    """mHC's final collapse (fn normal, base zeros, scale ones, as V4's ``_init_weights``); None for HC."""
    if kind != "mhc":
        return None
    return _params(hc.mhc_head_init(rngs.params(), num_streams, dim, std=MHC_STD))


def collapse(kind: str, streams, params: nnx.Dict | None, *, eps: float):
    """``[B, L, n, D] -> [B, L, D]``: mHC's head, or HC's sum."""
    if params is None:
        return hc.reduce(streams)
    return hc.mhc_head(streams, {k: p[...] for k, p in params.items()}, norm_eps=eps)
