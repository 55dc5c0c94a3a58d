"""DeepSeek-V4 (transformers ``deepseek_v4``): refused, naming what posenc's decoder cannot express.

Its attention layers are compressed (``layer_types``: compressed sparse
attention, whose Lightning Indexer picks ``index_topk`` compressed entries
per query, and heavily compressed attention, at ``compress_rates`` 4 and 128,
with their own ``compress_rope_theta``), and its first ``mlp_layer_types``
are ``hash_moe``: experts chosen by a frozen hash of the token id, not by a
router. posenc has neither (its mHC residual, ``hc_mult`` streams, is
:mod:`posenc.norms.hyper_connections`; its routers are
:mod:`posenc.moe.routing`).
"""

from posenc.hf.registry import refuse

refuse("deepseek_v4", "its compressed attention (compressed sparse attention with the Lightning Indexer and "
       "heavily compressed attention, compress_rates) and its hash routing (mlp_layer_types 'hash_moe': "
       "experts chosen by a frozen hash of the token id) have no posenc counterpart")
