"""The data-dependent hooks of the encoding protocol (FoX, stick-breaking, PaTH).

:class:`~posenc.model.encoding.Encoding` inherits them from
:class:`DataDependentHooks`; every default is neutral, so a unit overrides
only the ones it needs and attention calls them on every unit without
branching on the kind (``posenc.model.encoding`` has the rest of the protocol):

- ``prepare(x, q, k, v, positions, *, state) -> (q, k, v, features, state)``:
  terms computed from the layer input ``x`` [B, L, D] (after the q / k / v
  projection and the model's QK-norm, before ``qk``): per-token
  ``features`` (a dict of arrays with the token axis 1, [B, L, ...]: FoX's
  cumulative log forget gates, PaTH's w and beta, an output gate's logits)
  and changed q / k / v (FoX (Pro)'s token shift). ``state`` is the unit's
  decoding state before the first of these tokens and the returned one the
  state after the last: the KV cache carries it from one decoding call to
  the next, so that a prefill in pieces equals one pass;
- ``init_state(batch_size) -> dict``: the state before the first token
  (zeros; ``{}`` for units without one);
- ``cached_features`` (class attribute): the names of the features a key
  needs (FoX's ``c``). Attention gets them for every key (``k_features``;
  the KV cache keeps them per slot) and every feature of the queries
  (``q_features``);
- ``feature_bias(q_features, k_features, *, causal)``: a logit bias [B, H,
  Lq, Lk] from the features (FoX's ``c_i - c_j``), like ``bias`` computed
  per (query block, key block), never as a full [L, L] array;
- ``attention(q, k, v, q_positions, k_positions, call)``: the unit's own
  attention weights instead of the softmax (stick-breaking, PaTH) ->
  [B, Lq, H, Dh] (and the stats dict with ``call.stats``); ``call`` is the
  ``posenc.model.attention.AttentionCall`` (scale, mask, offsets, span,
  soft-cap, path, features). In the full forward pass ``call.q_offset`` is 0
  and q, k are the same tokens; when decoding (``call.reads_cache``), k and v
  are the cache's buffers [B, S, K, Dh], the queries sit at key indices
  ``q_offset + i`` and the slots from ``kv_length`` on are unused. The spans
  a layer of the unit may have are ``Encoding.supported_spans`` ("full"
  only for units with their own attention unless they declare ``spans``),
  the one rule config validation and attention both apply
  (``Encoding.check_span``);
- ``output(out, features)``: change the attention output [B, Lq, H, Dh]
  before the output projection (FoX (Pro)'s output gate);
- ``update_cache(k_cache, features, *, start)``: rewrite the cached keys
  [B, S, K, Dh] after a decoding step's attention (PaTH moves every cached
  key through the new tokens' transforms); the new tokens' keys sit at
  slots ``start .. start + T - 1``.

Attention called without features (no layer input, as in a unit test of
attention alone) gives such a unit its neutral terms: FoX's gates open, PaTH's
transforms the identity.
"""

from __future__ import annotations

from typing import ClassVar


class DataDependentHooks:
    """Terms from the layer input, a unit's own attention weights, its decoding state and cached keys."""

    cached_features: ClassVar[tuple[str, ...]] = ()  # features every key needs (kept by the cache)

    def init_state(self, batch_size: int) -> dict:
        return {}

    def prepare(self, x, q, k, v, positions, *, state):
        return q, k, v, {}, state

    def feature_bias(self, q_features, k_features, *, causal):
        return None

    def attention(self, q, k, v, q_positions, k_positions, call):
        return None

    def output(self, out, features):
        return out

    def update_cache(self, k_cache, features, *, start):
        return k_cache
