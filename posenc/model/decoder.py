"""Decoder-only transformer composing the pure position and norm functions.

``Decoder(config.model, rngs=nnx.Rngs(seed))`` (a ConfigDict, validated by
:class:`~posenc.model.spec.ModelSpec`, or a ModelSpec): token embedding (optional
sqrt(D) scale), an input position embedding when the kind has one, N blocks
of attention + MLP with any norm placement (a layer's attention may be a
recurrent mixer instead, ``model.layer_types``: ``posenc.model.mixers``), a
final norm when the placement has one, a tied or untied head, optional
final-logit soft-capping. The
embedding, residual and logit multipliers of MiniCPM / Granite / Cohere
(``posenc.multipliers``) apply where set. Params
are float32; compute runs in ``model.dtype``; logits are float32.

A looped transformer (``model.recurrences`` R > 1; McLeish et al. 2024,
mcleish7/arithmetic ``ScriptableRecurrentLM`` with ``input_injection_type``
"add"): the N blocks run R times with their weights shared, and before every
pass the input (the embeddings after the input unit, ``e``) is added to the
hidden state, ``h <- blocks(h + e)`` from ``h = 0`` (their ``state_init``
"zero"), so the first pass is the plain model's. Every pass has its own KV
cache entries (R x N layers of the cache).

Token embeddings and the untied head use N(0, 0.02) (GPT-2); projections
LeCun normal (DeepNorm: xavier normal, gain beta for v, out and MLP).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.model import cache as cache_lib
from posenc.model import encoding as encoding_lib
from posenc.model import registry, streams
from posenc.model.block import Block
from posenc.model.layers import Norm
from posenc.model.spec import ModelSpec
from posenc.norms import diagnostics, hyper_connections, multipliers, ngpt, norms, placements

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class Decoder(nnx.Module):
    """Decoder-only transformer; see the module docstring and docs/api.md."""

    def __init__(self, config, *, rngs: nnx.Rngs):
        spec = config if isinstance(config, ModelSpec) else ModelSpec.from_config(config)
        self.dtype = _DTYPES[spec.dtype]
        self.d_model, self.vocab_size = spec.d_model, spec.vocab_size
        self.num_layers = spec.num_layers
        self.recurrences = spec.recurrences
        self.num_kv_heads, self.head_dim = spec.num_kv_heads, spec.head_dim
        self.embed_scale = spec.norm.embed_scale
        self.final_softcap = spec.norm.final_softcap
        pos = spec.position
        # Units share parameters (T5's table) with the first unit of the same kind and options.
        first: dict[tuple, encoding_lib.Encoding] = {}
        layer_options = pos.layer_options or tuple(pos.options[k] for k in pos.layer_kinds)

        def build(kind, options, layer_index=0):
            cls = registry.get(kind)
            key = (kind, tuple(sorted(options.items())))
            unit = cls(dict(options), d_model=spec.d_model, num_heads=spec.num_heads,
                       num_kv_heads=spec.num_kv_heads, head_dim=spec.unit_head_dim,
                       layer_index=layer_index, num_layers=spec.num_layers, rngs=rngs,
                       first=first.get(key))
            first.setdefault(key, unit)
            return unit

        input_cls = registry.get(pos.kind)
        self.input_encoding = (build(pos.kind, pos.options[pos.kind]) if input_cls.acts_at_input()
                               else None)
        limits = [registry.get(k).longest_sequence(o) for k, o in pos.units]
        self.max_sequence = min((n for n in limits if n is not None), default=None)
        self.position_axes = pos.axes
        # per unit (input, then layers): reads every axis (else axis 0 of a multi-axis model's)
        self.reads_axes = tuple(self.position_axes > 1 and a > 1 for a in pos.unit_axes)
        self.embedding = nnx.Param(
            0.02 * jax.random.normal(rngs.params(), (spec.vocab_size, spec.d_model)))
        self.blocks = nnx.List([Block(spec, build(k, layer_options[i], i), layer_index=i,
                                      dtype=self.dtype, rngs=rngs)
                                for i, k in enumerate(pos.layer_kinds)])
        n = spec.norm
        self.embed_norm = Norm.of(n, spec.d_model) if n.embed_norm else None
        self.final_norm = Norm.of(n, spec.d_model) if placements.has_final_norm(n.placement) else None
        self.embedding_multiplier, self.logits_multiplier = spec.embedding_multiplier, spec.logits_multiplier
        self.head = (None if spec.tie_embeddings else nnx.Param(
            0.02 * jax.random.normal(rngs.params(), (spec.d_model, spec.vocab_size))))
        self.dropout = nnx.Dropout(spec.dropout, rngs=rngs)
        # nGPT (model.norm.placement 'ngpt'): s_z per vocabulary entry; every matrix starts on the sphere
        self.sphere = n.sphere
        self.residual_streams, self.hc_kind, self.hc_eps = spec.residual_streams, spec.hyper_connections, n.eps
        # mHC: the learned collapse of the streams before the final norm (DeepSeek-V4's hc_head)
        self.hc_head = (streams.head_params(self.hc_kind, spec.residual_streams, spec.d_model, rngs=rngs)
                        if spec.residual_streams > 1 else None)
        self.sz = nnx.Param(ngpt.init_params(spec.d_model, spec.vocab_size)["sz"]) if n.sphere else None
        if n.sphere:
            self._renormalize()

    def _renormalize(self) -> None:
        """nGPT: every matrix renormalised along its model-width axis (posenc.ngpt.renormalize)."""
        matrices = [(self.embedding, -1)] + ([] if self.head is None else [(self.head, 0)])
        for b in self.blocks:
            matrices += b.attn.sphere_matrices() + b.mlp.sphere_matrices()
        for w, axis in matrices:
            w[...] = ngpt.renormalize(w[...], axis=axis)

    def constrain(self) -> None:
        """Project every encoding's parameters into their domain (after an optimizer update); nGPT's
        matrices back onto the unit sphere."""
        units = [b.attn.encoding for b in self.blocks]
        if self.input_encoding is not None:
            units.append(self.input_encoding)
        for unit in units:
            unit.constrain()
        if self.sphere:
            self._renormalize()

    # -- pieces -------------------------------------------------------------------------
    def check_length(self, length: int) -> None:
        """Python check on a static length (learned tables have no rows past their end)."""
        if self.max_sequence is not None and length > self.max_sequence:
            raise ValueError(
                f"sequence length {length} exceeds what the position encoding can represent "
                f"({self.max_sequence} positions: e.g. the rows of a learned table, "
                "model.position.learned.max_length); raise that limit or choose another kind")

    def _positions(self, positions, batch, length, *, shared=False):
        """int32 [batch, length]; with ``shared``, [1, length] when no example differs.

        Shared positions let position-only biases (ALiBi, T5, KERPLE, FIRE) and
        rotary angles be computed once per layer instead of once per example.
        A model of A > 1 position axes: [batch | 1, length, A] (:meth:`_axis_positions`).
        """
        if self.position_axes > 1:
            return self._axis_positions(positions, batch, length, shared=shared)
        if positions is None:
            positions = jnp.arange(length, dtype=jnp.int32)
        positions = jnp.asarray(positions)
        if not jnp.issubdtype(positions.dtype, jnp.integer):
            raise ValueError(f"positions must be integers; got dtype {positions.dtype}")
        if positions.shape[-1] != length or positions.ndim not in (1, 2):
            raise ValueError(f"positions must have shape [L] or [B, L] with L={length}; "
                             f"got {positions.shape}")
        rows = positions.shape[0] if positions.ndim == 2 else 1
        if shared and rows == 1:
            batch = 1
        return jnp.broadcast_to(positions.astype(jnp.int32), (batch, length))

    def _axis_positions(self, positions, batch, length, *, shared):
        """int32 [batch | 1, length, A] of a model reading A > 1 axes.

        [B | 1, L, A'] with A' >= A: the last A axes (ids ordered coarse to fine, Qwen2-VL's
        (t, h, w): a 2D unit reads (h, w)); one axis [L] or [B, L] (None: 0..L-1): the
        same ids on every axis.
        """
        A = self.position_axes
        if positions is None:
            positions = jnp.arange(length, dtype=jnp.int32)
        positions = jnp.asarray(positions)
        if not jnp.issubdtype(positions.dtype, jnp.integer):
            raise ValueError(f"positions must be integers; got dtype {positions.dtype}")
        if positions.ndim in (1, 2) and positions.shape[-1] == length:
            positions = positions.reshape((-1, length))[..., None]
        elif not (positions.ndim == 3 and positions.shape[1] == length and positions.shape[2] >= A):
            raise ValueError(f"positions of a model reading {A} position axes must have shape [L], [B, L] "
                             f"(the same ids on every axis) or [B, L, A] with L={length}, A >= {A} (the "
                             f"last {A} axes are read); got {positions.shape}")
        rows = positions.shape[0]
        if not (shared and rows == 1):
            rows = batch
        positions = positions[..., positions.shape[-1] - A:] if positions.shape[-1] > 1 else positions
        return jnp.broadcast_to(positions.astype(jnp.int32), (rows, length, A))

    def _unit_positions(self, index, positions):
        """The positions unit ``index`` (0: the input unit, i + 1: layer i) reads: every axis, or
        axis 0 for a one-axis unit of a multi-axis model."""
        if self.position_axes == 1 or self.reads_axes[index]:
            return positions
        return positions[..., 0]

    def embed_tokens(self, tokens):
        """tokens int [B, L] -> [B, L, D] in the compute dtype (scaled by sqrt(D) if set)."""
        x = self.embedding[...].astype(self.dtype)[tokens]
        if self.embed_scale:
            x = x * norms.embed_scale(self.d_model, self.dtype)
        if self.embedding_multiplier != 1.0:
            x = multipliers.scale(x, self.embedding_multiplier)
        return x

    def _input(self, x, positions, deterministic, *, tokens=None, key=None, state=None):
        """Embeddings plus the input unit's vectors -> (h, the input unit's state after the tokens)."""
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        if self.input_encoding is not None:
            e, state = self.input_encoding.token_embed(tokens, positions, self.d_model, key=key,
                                                       state=state)
            x = x + e.astype(x.dtype)
        x = self.dropout(x, deterministic=deterministic)
        if self.residual_streams > 1:  # hyper-connections: the embedding copied into each stream
            x = hyper_connections.expand(x, self.residual_streams)
        return x, state

    def _output(self, x):
        if self.residual_streams > 1:
            x = streams.collapse(self.hc_kind, x, self.hc_head, eps=self.hc_eps)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.logits_multiplier != 1.0:  # MiniCPM divides the hidden state; the head is linear
            x = multipliers.scale(x, self.logits_multiplier)
        w = self.embedding[...].T if self.head is None else self.head[...]
        logits = jnp.einsum("bld,dv->blv", x, w.astype(self.dtype),
                            preferred_element_type=jnp.float32)
        if self.sz is not None:
            logits = ngpt.scale_logits(logits, self.sz[...], sz_scaling=ngpt.base_scale(self.d_model))
        if self.final_softcap:
            logits = norms.softcap(logits, self.final_softcap)
        return logits.astype(jnp.float32)

    # -- full forward -------------------------------------------------------------------
    def forward_embeddings(self, x, positions=None, *, deterministic=True, causal=True,
                           return_stats=False, tokens=None, key=None, routing=None):
        """Logits from token embeddings x [B, L, D] (before the input position embedding).

        The entry point for gradient tests (causality: d logits_i / d x_j = 0 for
        j > i). ``causal=False`` drops the causal mask (permutation tests).
        ``tokens`` [B, L]: the ids behind ``x``, for an input unit that reads
        them (Abacus; None: it sees no token ids); ``key``, ``routing``: see ``__call__``.
        """
        B, L, _ = x.shape
        self.check_length(L)
        # The current length, as HF computes it for length-dependent RoPE: the largest
        # position + 1 (L for the default positions 0..L-1).
        seq_len = L if positions is None else None
        positions = self._positions(positions, B, L, shared=True)
        if seq_len is None:
            seq_len = jnp.max(positions) + 1
        h, _ = self._input(x.astype(self.dtype), self._unit_positions(0, positions), deterministic,
                           tokens=tokens, key=key)

        def attend(attn, hin, i):
            return attn.forward(hin, self._unit_positions(i + 1, positions), seq_len=seq_len, causal=causal,
                                return_stats=return_stats)

        layer_stats, e = [], h
        for r in range(self.recurrences):
            if r:  # input injection: the embeddings added back before every pass after the first
                h = h + e
            for i, block in enumerate(self.blocks):
                h, s = block(h, lambda a, hin, i=i: _pair(attend(a, hin, i), return_stats),
                             deterministic=deterministic)
                layer_stats.append(s)
        for s in layer_stats:  # MoE layers (posenc.model.moe): their Routing to the caller, not the stats
            r = s.pop("routing", None)
            if r is not None and routing is not None:
                routing.append(r)
        logits = self._output(h)
        if not return_stats:
            return logits
        return logits, _collect_stats(layer_stats, logits, blocks=len(self.blocks))

    def __call__(self, tokens, positions=None, *, deterministic=True, return_stats=False, key=None,
                 routing=None):
        """tokens int [B, L]; positions int [B, L] or [L] (default arange) -> logits [B, L, V].

        A model of units reading A > 1 position axes (``Encoding.position_axes``: M-RoPE,
        2D RoPE) also takes [B | 1, L, A'] (A' >= A: the last A axes; one axis: the same
        ids on every axis).

        ``key``: a PRNG key for the training-time randomness of the input unit
        (Abacus's offset k); None (evaluation, the default) draws nothing.

        ``routing``: a list to which every mixture-of-experts layer (``model.moe``) appends its
        ``posenc.routing.Routing`` (indices, weights, router logits [B, L, E]) in the order the
        layers ran: what the router losses of training read. None: not collected.
        """
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape [B, L]; got {tokens.shape}")
        return self.forward_embeddings(self.embed_tokens(tokens), positions,
                                       deterministic=deterministic, return_stats=return_stats,
                                       tokens=tokens, key=key, routing=routing)

    # -- decoding -----------------------------------------------------------------------
    def init_cache(self, batch_size: int, max_length: int):
        """Empty KV cache (plain arrays) for up to ``max_length`` tokens; see posenc.model.cache."""
        self.check_length(max_length)
        unit = self.input_encoding
        R = self.recurrences  # every pass has its own entries: layer r * N + i is block i's pass r
        return cache_lib.init(self.num_layers * R, batch_size, max_length, self.num_kv_heads,
                              self.head_dim, self.dtype,
                              features=[self._feature_shapes(b.attn, batch_size) for b in self.blocks] * R,
                              states=[b.attn.init_state(batch_size) for b in self.blocks] * R,
                              input_state=None if unit is None else unit.init_state(batch_size),
                              key_dims=[b.attn.cached_key_dim for b in self.blocks] * R,
                              value_dims=[b.attn.cached_value_dim for b in self.blocks] * R,
                              kv_heads=[b.attn.cached_kv_heads for b in self.blocks] * R,
                              position_axes=self.position_axes)

    def _feature_shapes(self, attn, batch_size):
        """name -> ShapeDtypeStruct [B, 1, ...] of the features the layer's keys need (one token)."""
        enc = attn.encoding
        if not type(enc).cached_features:
            return {}
        x = jax.ShapeDtypeStruct((batch_size, 1, self.d_model), self.dtype)
        positions = jax.ShapeDtypeStruct((batch_size, 1), jnp.int32)

        def features(x, positions):
            q, k, v, _ = attn.project(x)
            return enc.prepare(x, q, k, v, positions, state=enc.init_state(batch_size))[3]

        shapes = jax.eval_shape(features, x, positions)
        return {n: shapes[n] for n in type(enc).cached_features}

    def decode(self, tokens, cache, positions=None, *, deterministic=True):
        """Append tokens [B, T] to ``cache``; -> (logits [B, T, V], new cache).

        T > 1 prefills, T = 1 is one step. ``positions`` [B, T] or [T] defaults to
        continuing after the last cached position (0, 1, ... for an empty cache); a
        multi-axis model (see ``__call__``) also takes [B | 1, T, A'] and continues after
        the largest cached id, the same on every axis (``posenc.model.cache.next_positions``).
        """
        tokens = jnp.asarray(tokens)
        B, T = tokens.shape
        S = cache["k"][0].shape[1]
        if T > S:
            raise ValueError(f"cannot append {T} tokens to a cache of max_length {S}")
        length = cache["length"]
        if not isinstance(length, jax.core.Tracer) and int(length) + T > S:
            raise ValueError(f"cache overflow: length {int(length)} + {T} tokens > max_length {S}")
        if positions is None:
            positions = cache_lib.next_positions(cache, T)
        positions = self._positions(positions, B, T)
        all_positions = cache_lib.write(cache["positions"], positions, length)
        written = jnp.arange(S) < length + T
        if self.position_axes > 1:  # the largest id over every axis
            written = written[:, None]
        seq_len = jnp.max(jnp.where(written[None, :], all_positions, 0)) + 1  # as in forward_embeddings
        h, input_state = self._input(self.embed_tokens(tokens), self._unit_positions(0, positions),
                                     deterministic, tokens=tokens, state=cache.get("input_state", {}))
        entries = []

        def attend_for(i, slot):
            def attend(attn, hin):
                y, entry = attn.decode(hin, self._unit_positions(i + 1, positions),
                                       self._unit_positions(i + 1, all_positions), cache_lib.layer(cache, slot),
                                       seq_len=seq_len, length=length)
                entries.append(entry)
                return y, None
            return attend

        e = h
        for r in range(self.recurrences):
            if r:  # input injection, as in forward_embeddings
                h = h + e
            for i, block in enumerate(self.blocks):
                h, _ = block(h, attend_for(i, r * len(self.blocks) + i), deterministic=deterministic)
        new_cache = cache_lib.assemble(entries, positions=all_positions, length=length + T,
                                       input_state=input_state)
        return self._output(h), new_cache


def _pair(res, return_stats):
    return res if return_stats else (res, None)


def _collect_stats(layer_stats, logits, *, blocks=None):
    """Max attention logit over layers, mean entropy over layers, output logit stats; and
    ``max_logit_per_head`` [num_layers, H], each layer's largest logit per query head (QK-Clip; a looped
    model's ``layer_stats`` hold every pass: each block's largest over its passes). A layer without
    attention (a recurrent mixer) reports none: its row of ``max_logit_per_head`` is -inf (QK-Clip leaves
    it), and the max and the entropy are over the layers with attention (absent in a model of none)."""
    attending = [s for s in layer_stats if "max_logit_per_head" in s]
    like = attending[0]["max_logit_per_head"] if attending else jnp.zeros((0,), jnp.float32)
    layer_stats = [s if "max_logit_per_head" in s else {**s, "max_logit_per_head": jnp.full_like(like, -jnp.inf)}
                   for s in layer_stats]
    per_head = jnp.stack([s["max_logit_per_head"] for s in layer_stats])
    if blocks is not None and len(layer_stats) > blocks:
        per_head = jnp.max(per_head.reshape((-1, blocks) + per_head.shape[1:]), axis=0)
    out = {
        "max_attention_logit": jnp.max(jnp.stack([s["max_attention_logit"] for s in attending])),
        "attention_entropy": jnp.mean(jnp.stack([s["attention_entropy"] for s in attending])),
        "max_logit_per_head": per_head,
    } if attending else {"max_logit_per_head": per_head}
    ls = diagnostics.logit_stats(logits)
    out["logit_mean"], out["log_z"] = ls["mean"], ls["log_z"]
    return out
