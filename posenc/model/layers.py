"""Decoder layers: norm module, MLP and the attention sublayer (the residual block: posenc.model.block).

Parameters are float32 ``nnx.Param``; matmuls run in the compute dtype
(``model.dtype``) by casting the weights at use. Norm math is
``posenc.norms``, residual placements ``posenc.placements``, QK-norm
``posenc.qk_norm.qk_norm``, length-aware logit scaling
``posenc.logit_scale``. The attention sublayer runs the encoding's hooks
(``posenc.model.encoding``) in order: ``prepare`` (data-dependent terms from
the layer input), ``qk``, the logit scale, attention (the unit's own or the
softmax of ``posenc.model.attention`` with the layer's span and sinks,
``posenc.learned_sinks``), ``output``, then the output gate (``posenc.gated``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.attention import gated, logit_scale
from posenc.model import attention as attn_lib
from posenc.model import cache as cache_lib
from posenc.model import layout as layout_lib
from posenc.norms import hybrid_norm, ngpt, norms, qk_clip, qk_norm


def lecun_normal(key, shape, fan_in):
    return jax.random.normal(key, shape, jnp.float32) / math.sqrt(fan_in)


def xavier_normal(key, shape, fan_in, fan_out, gain=1.0):
    return gain * math.sqrt(2.0 / (fan_in + fan_out)) * jax.random.normal(key, shape, jnp.float32)


@jax.custom_vjp
def linear(x, w):
    """``x @ w`` for x [..., D], w [D, N] -> [..., N]; same values and gradients as ``x @ w``.

    The weight gradient is ``x^T @ g`` over all leading axes. Autodiff leaves
    XLA:CPU to transpose ``g`` (e.g. the [tokens, 4D] MLP activation
    gradient, fused into the GELU backward with strided writes); here ``x``
    is transposed instead, behind an optimization barrier so the transpose
    is not folded back into the dot. (Transposing whichever of ``x`` and
    ``g`` is smaller measured 4-7% slower at the benchmark configs R and T.)
    """
    return x @ w


def _linear_fwd(x, w):
    return x @ w, (x, w)


def _linear_bwd(res, g):
    x, w = res
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    dw = jax.lax.optimization_barrier(x2.T) @ g2
    return g @ w.T, dw.astype(w.dtype)


linear.defvjp(_linear_fwd, _linear_bwd)


class Norm(nnx.Module):
    """Any ``posenc.norms.NORMS`` norm over the last axis, params from posenc.norms.

    ``init``: keywords of ``posenc.norms.init_params`` (those the kind does not take are dropped).
    """

    def __init__(self, kind, dim, *, eps, **init):
        norm = norms.NORMS[kind]
        self.kind = kind
        self.eps = float(eps) if "eps" in norm.keywords else None
        params = norms.init_params(kind, dim, **{k: v for k, v in init.items() if k in norm.init_keywords})
        self.params = nnx.Dict({n: nnx.Param(v) for n, v in params.items()})

    @classmethod
    def of(cls, norm_spec, dim):
        """The norm ``model.norm`` describes (its kind, eps and initial values)."""
        return cls(norm_spec.kind, dim, eps=norm_spec.eps, **norm_spec.init_keywords)

    def __call__(self, x):
        return norms.normalize(self.kind, x, {n: p[...] for n, p in self.params.items()},
                               eps=self.eps)


_GATED = {"swiglu": jax.nn.silu, "geglu": functools.partial(jax.nn.gelu, approximate=True)}
_PLAIN = {"gelu": functools.partial(jax.nn.gelu, approximate=True),
          "gelu_erf": functools.partial(jax.nn.gelu, approximate=False),
          "relu2": lambda h: jnp.square(jax.nn.relu(h))}  # squared ReLU (Nemotron-H)


class MLP(nnx.Module):
    """``W2 act(W1 x)`` (gelu: tanh approximation; gelu_erf: exact, GPT-NeoX; relu2: relu(x)^2) or a gated
    ``W2 (act(W1 x) * W3 x)``: SwiGLU (silu, Shazeer 2020) and GeGLU (tanh GELU, Gemma)."""

    def __init__(self, kind, d_model, hidden, *, dtype, gain, rngs, bias=False, suv=None):
        if kind not in _GATED and kind not in _PLAIN:
            raise ValueError(f"unknown mlp {kind!r}; choose one of: {', '.join([*_PLAIN, *_GATED])}")
        self.kind, self.dtype, self.d_model = kind, dtype, d_model
        # nGPT (posenc.ngpt): the fused [u | v] = x [W3 | W1] times s_uv sqrt(d), then u silu(v)
        self.suv = None if suv is None else nnx.Param(suv)

        def init(shape, fan_in, fan_out):
            key = rngs.params()
            if gain is None:
                return nnx.Param(lecun_normal(key, shape, fan_in))
            return nnx.Param(xavier_normal(key, shape, fan_in, fan_out, gain))

        self.w1 = init((d_model, hidden), d_model, hidden)
        self.w2 = init((hidden, d_model), hidden, d_model)
        self.w3 = init((d_model, hidden), d_model, hidden) if kind in _GATED else None
        zeros = lambda n: nnx.Param(jnp.zeros((n,), jnp.float32)) if bias else None  # noqa: E731
        self.b1, self.b2 = zeros(hidden), zeros(d_model)
        self.b3 = zeros(hidden) if kind in _GATED else None

    def _dense(self, x, w, b):
        y = linear(x, w[...].astype(self.dtype))
        return y if b is None else y + b[...].astype(y.dtype)

    def sphere_matrices(self):
        """nGPT: each matrix with its model-width axis (renormalised after every optimizer step)."""
        return [(self.w1, 0), (self.w3, 0), (self.w2, -1)]

    def __call__(self, x):
        if self.suv is not None:
            w = jnp.concatenate([self.w3[...], self.w1[...]], axis=1).astype(self.dtype)
            uv = ngpt.scale_uv(linear(x, w), self.suv[...], dim=self.d_model)
            return self._dense(ngpt.swiglu(uv), self.w2, self.b2)
        h = self._dense(x, self.w1, self.b1)
        if self.kind in _GATED:
            h = _GATED[self.kind](h) * self._dense(x, self.w3, self.b3)
        else:
            h = _PLAIN[self.kind](h)
        return self._dense(h, self.w2, self.b2)


class Attention(nnx.Module):
    """Multi-head / grouped-query attention with QK-norm, a position encoding, the layer's span
    (full, sliding window or chunk), a length-aware logit scale (``posenc.logit_scale``),
    attention sinks (``model.attention_sinks``: ``sinks`` [H], gpt-oss) and an output gate
    (``model.attention_gate``: ``wq`` [D, H, Dh + gate_dim], each head's query then its gate,
    Qwen3-Next's ``q_proj`` layout)."""

    def __init__(self, spec, encoding, *, dtype, vo_gain, rngs, layer_index=0, sqk=None):
        D, H, K, head_dim = spec.d_model, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim, self.dtype = H, K, head_dim, dtype
        lay = self._setup_call(spec, layer_index)
        self.qk_norm_kind = spec.norm.qk_norm if lay.qk_norm[layer_index] else "none"
        self.qk_eps = None if self.qk_norm_kind == "none" else spec.norm.eps
        self.qk_norm_after_rope = spec.norm.qk_norm_after_rope
        # Value norm (Gemma 4) or HybridNorm's QKV-norm: both decided here, nothing traced when off.
        self.v_norm, self.norm_eps = spec.norm.v_norm, spec.norm.eps
        qkv = spec.norm.qkv_norm
        self.qkv_params = (nnx.Dict({f"{n}_scale": nnx.Param(jnp.ones((head_dim,), jnp.float32)) for n in "qkv"})
                           if qkv else None)
        self.encoding = encoding
        self.gate_mode = spec.attention_gate
        gate_dim = 0 if self.gate_mode == "none" else gated.gate_dim(self.gate_mode, head_dim)

        def proj(shape, fan_in, fan_out, gain):
            if gain is None:
                return nnx.Param(lecun_normal(rngs.params(), shape, fan_in))
            return nnx.Param(xavier_normal(rngs.params(), shape, fan_in, fan_out, gain))

        # DeepNorm: q/k xavier gain 1, v/out xavier gain beta.
        qk_gain = None if vo_gain is None else 1.0
        self.wq = proj((D, H, head_dim + gate_dim), D, H * (head_dim + gate_dim), qk_gain)
        self.wk = proj((D, K, head_dim), D, K * head_dim, qk_gain)
        self.wv = proj((D, K, head_dim), D, K * head_dim, vo_gain)
        self.wo = proj((H, head_dim, D), H * head_dim, D, vo_gain)
        bias = {"none": (), "qkv": ("q", "k", "v")}.get(spec.bias, ("q", "k", "v", "o"))
        heads = {"q": (H, head_dim + gate_dim), "k": (K, head_dim), "v": (K, head_dim)}
        self.biases = nnx.Dict({n: nnx.Param(jnp.zeros(heads.get(n, (D,)), jnp.float32)) for n in bias})
        qk = qk_norm.qk_norm_init(self.qk_norm_kind, H, K, head_dim)
        self.qk_params = nnx.Dict({n: nnx.Param(v) for n, v in qk.items()})
        self._setup_scales(lay.logit_scale)
        # nGPT (posenc.ngpt): s_qk [H Dh] scales the unit-norm rotated q and k of every head
        self.sqk = None if sqk is None else nnx.Param(sqk)
        self.sqk_scaling = ngpt.base_scale(D)

    def _setup_call(self, spec, layer_index):
        """The call's settings of the layer (soft-cap, path, span, scale, logit scale, sinks); -> its layout."""
        self.softcap = spec.norm.attn_softcap
        self.impl, self.block = spec.attention_impl, spec.attention_block
        self.causal_block = spec.attention_causal_block
        lay = spec.layout or layout_lib.Layout.default(spec.num_layers)
        span = lay.span(layer_index)
        self.window, self.chunk = span["window"], span["chunk"]
        self.scale = spec.attention_scale
        ls = lay.logit_scale
        self.logit_scale = ls.kind if lay.scaled[layer_index] else "none"
        self.logit_opts = {"train_length": ls.train_length, "floor_scale": ls.floor_scale,
                           "attn_scale": ls.attn_scale}
        self.sink_kind = spec.attention_sinks
        return lay

    def _setup_scales(self, ls):
        """The per-head parameters of the logit scale and the sinks (``self.num_heads`` heads)."""
        H = self.num_heads
        # Scalable-Softmax: s (and b) per head of this layer.
        ssmax = self.logit_scale == "ssmax"
        self.ssmax_s = nnx.Param(jnp.full((H,), ls.ssmax_init, jnp.float32)) if ssmax else None
        self.ssmax_b = nnx.Param(jnp.zeros((H,), jnp.float32)) if ssmax and ls.ssmax_bias else None
        # gpt-oss's learned sinks: one float32 logit per query head, init 0 (model.attention_sinks)
        self.sinks = nnx.Param(jnp.zeros((H,), jnp.float32)) if self.sink_kind == "learned" else None

    def sphere_matrices(self):
        """nGPT: each matrix with its model-width axis (renormalised after every optimizer step)."""
        return [(self.wq, 0), (self.wk, 0), (self.wv, 0), (self.wo, -1)]

    def qk_clip(self, max_logits, threshold: float) -> None:
        """QK-Clip after an optimizer step (``train.qk_clip``; Kimi K2, Megatron-LM): per key head's group,
        ``gamma = min(1, threshold / the group's largest logit)``; ``gamma ** 0.5`` on the group's query
        weights and biases and on the key head's (``posenc.qk_clip.clip_scales``). ``max_logits`` [H]."""
        def scaled(param, scale, head_axis, width):
            # the first ``width`` of each head: the query (or key) itself, not a gate beside it in ``wq``
            w = param[...]
            param[...] = w.at[..., :width].set(qk_clip.scale_heads(w[..., :width], scale, head_axis=head_axis))

        width = self.head_dim
        q_scale, k_scale = qk_clip.clip_scales(max_logits, num_kv_heads=self.num_kv_heads, threshold=threshold)
        scaled(self.wq, q_scale, 1, width)
        scaled(self.wk, k_scale, 1, width)
        for name, scale in (("q", q_scale), ("k", k_scale)):
            if name in self.biases:
                scaled(self.biases[name], scale, 0, width)

    def project(self, x):
        """x [B, L, D] -> q [B, L, H, Dh], k, v [B, L, K, Dh] (QK-, V- or QKV-normed, not yet rotated) and
        the gate logits [B, L, H, Dh | 1] (None without ``model.attention_gate``).

        One [D, (H (Dh + gate_dim) + 2K Dh] matmul for q (and its gate), k and v: the input is
        read (and, for the weight gradient, transposed) once instead of three times.
        """
        ws = [p[...].astype(self.dtype) for p in (self.wq, self.wk, self.wv)]
        w = jnp.concatenate([w.reshape(w.shape[0], -1) for w in ws], axis=1)
        qkv = linear(x, w)
        H, K, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        wq = ws[0].shape[-1] * H  # H (Dh + gate_dim)
        q, k, v = jnp.split(qkv, [wq, wq + K * Dh], axis=-1)
        lead = x.shape[:-1]
        k, v = k.reshape(lead + (K, Dh)), v.reshape(lead + (K, Dh))
        b = {n: p[...].astype(qkv.dtype) for n, p in self.biases.items()}
        gate = None
        if self.gate_mode == "none":
            q = q.reshape(lead + (H, Dh))
            if b:
                q = q + b["q"]
        else:  # the bias covers the whole widened projection, as q_proj's in Qwen3-Next
            if b:
                q = q + b["q"].reshape(-1)
            q, gate = gated.split_query_gate(q, num_heads=H, head_dim=Dh, mode=self.gate_mode)
        if b:
            k, v = k + b["k"], v + b["v"]
        if self.qkv_params is not None:  # HybridNorm: q, k, v per head, before any rotation
            g = self.qkv_params
            q, k, v = hybrid_norm.qkv_norm(q, k, v, g["q_scale"][...], g["k_scale"][...], g["v_scale"][...],
                                           eps=self.norm_eps)
        if self.v_norm:
            v = hybrid_norm.value_norm(v, eps=self.norm_eps)
        if not self.qk_norm_after_rope:
            q, k = self._qk_norm(q, k)
        return q, k, v, gate

    def _qk_norm(self, q, k):
        params = {n: p[...] for n, p in self.qk_params.items()}
        return qk_norm.qk_norm(self.qk_norm_kind, q, k, params, eps=self.qk_eps)

    def forward(self, x, positions, *, seq_len, causal=True, return_stats=False):
        """The full forward pass of the sublayer: x [B, L, D] -> [B, L, D] (, stats)."""
        q, k, v, gate = self.project(x)
        enc = self.encoding
        q, k, v, feats, _ = enc.prepare(x, q, k, v, positions, state=enc.init_state(x.shape[0]))
        return self.attend(q, k, v, positions, positions, seq_len=seq_len, causal=causal,
                           return_stats=return_stats, q_features=feats,
                           k_features=_cached(enc, feats), gate=gate)

    @property
    def keys_cached_transformed(self) -> bool:
        """Whether the cache holds keys through ``Encoding.key`` (a static key transform), written
        once; else raw keys that every decoding step transforms (and QK-norms, if after RoPE)."""
        return self.encoding.static_key() and not self.qk_norm_after_rope

    @property
    def cached_key_dim(self) -> int:
        """The width of this layer's cached keys (the encoding's ``qk_dim`` when transformed)."""
        return self.encoding.qk_dim if self.keys_cached_transformed else self.head_dim

    @property
    def cached_value_dim(self) -> int:
        return self.head_dim

    def init_state(self, batch_size: int) -> dict:
        """The cache entry's ``state`` before any token: the unit's decoding state (``Encoding.init_state``)."""
        return self.encoding.init_state(batch_size)

    @property
    def cached_kv_heads(self) -> int:
        return self.num_kv_heads

    def decode(self, x, positions, all_positions, entry, *, seq_len, length):
        """Append x [B, T, D] to this layer's cache ``entry``; -> (y [B, T, D], new entry).

        ``entry``: {"k", "v": [B, S, K, Dh], "features": the cached features
        [B, S, ...], "state": the unit's decoding state}; ``length`` slots are
        written. The queries sit at key indices ``length + i``.
        """
        q, k, v, gate = self.project(x)
        enc = self.encoding
        q, k, v, feats, state = enc.prepare(x, q, k, v, positions, state=entry["state"])
        rotated = self.keys_cached_transformed
        if rotated:  # the cache holds transformed keys: a step transforms its own tokens only
            k = enc.key(k, positions, seq_len=seq_len)
        ck = cache_lib.write(entry["k"], k, length)
        cv = cache_lib.write(entry["v"], v, length)
        cf = {n: cache_lib.write(entry["features"][n], f, length)
              for n, f in _cached(enc, feats).items()}
        y = self.attend(q, ck.astype(q.dtype), cv.astype(v.dtype), positions, all_positions,
                        seq_len=seq_len, q_offset=length, kv_length=length + x.shape[1],
                        q_features=feats, k_features=cf, keys_transformed=rotated, gate=gate)
        ck = enc.update_cache(ck, feats, start=length)
        return y, {"k": ck, "v": cv, "features": cf, "state": state}

    def _sinks(self):
        """The call's sink logits [H] (``AttentionCall.sinks``), or None without sinks."""
        if self.sink_kind == "learned":
            return self.sinks[...]
        if self.sink_kind == "zero":  # the off-by-one softmax: exp(l_ij) / (1 + sum_k exp(l_ik))
            return jnp.zeros((self.num_heads,), jnp.float32)
        return None

    def scale_queries(self, q, q_positions, *, q_offset, kv_length, causal):
        """Queries times the layer's length-aware multiplier (model.logit_scale; float32 math).

        Logits are linear in q, so this multiplies ``q . k`` and the content
        terms; position biases added to the logits are not scaled.
        """
        kind = self.logit_scale
        if kind == "none":
            return q
        if kind == "temperature":  # Llama 4: a function of the absolute position
            if q_positions.ndim == 3:  # several position axes: axis 0, as one-axis units read them
                q_positions = q_positions[..., 0]
            m = logit_scale.temperature(q_positions, floor_scale=self.logit_opts["floor_scale"],
                                        attn_scale=self.logit_opts["attn_scale"])
            m = m[..., :, None, None]
        else:  # a function of how many keys the query sees (its window or chunk included)
            n = attn_lib.visible_keys(q.shape[1], q_offset=q_offset, kv_length=kv_length,
                                      causal=causal, window=self.window, chunk=self.chunk)
            if kind == "ssmax":
                b = None if self.ssmax_b is None else self.ssmax_b[...]
                m = jnp.swapaxes(logit_scale.ssmax(n, self.ssmax_s[...], bias=b), -1, -2)[..., None]
            else:
                m = logit_scale.logn(n, train_length=self.logit_opts["train_length"])[:, None, None]
        return (q.astype(jnp.float32) * m).astype(q.dtype)

    def attend(self, q, k, v, q_positions, k_positions, *, seq_len, q_offset=0, kv_length=None,
               causal=True, return_stats=False, q_features=None, k_features=None, keys_transformed=False,
               gate=None):
        """Rotate with the encoding, scale, attend, gate, project out: -> [B, Lq, D] (, stats).

        Positions may have batch 1 (shared by every example); every encoding
        broadcasts them against the batch of q and k. ``keys_transformed``: ``k``
        holds keys already through ``Encoding.key`` (a cache of a static key transform).
        ``gate``: the queries' gate logits of :meth:`project` (None: no gate).
        """
        enc = self.encoding
        q_features, k_features = q_features or {}, k_features or {}
        if keys_transformed:
            q = enc.query(q, q_positions, seq_len=seq_len)
        else:
            q, k = enc.qk(q, k, q_positions, k_positions, seq_len=seq_len)
        if self.qk_norm_after_rope:  # the cache holds the keys before rotation and norm
            q, k = self._qk_norm(q, k)
        if self.sqk is not None:  # nGPT: after the rotation; the cache holds the keys before it
            q, k = ngpt.scale_qk(q, k, self.sqk[...], sqk_scaling=self.sqk_scaling)
        out, stats = self.softmax_attention(q, k, v, q_positions, k_positions, q_offset=q_offset,
                                            kv_length=kv_length, causal=causal, return_stats=return_stats,
                                            q_features=q_features, k_features=k_features)
        out = enc.output(out, q_features)
        if gate is not None:
            out = gated.gate(out, gate)
        y = self.project_out(out)
        if "o" in self.biases:
            y = y + self.biases["o"][...].astype(y.dtype)
        return (y, stats) if return_stats else y

    def softmax_attention(self, q, k, v, q_positions, k_positions, *, q_offset, kv_length, causal,
                          return_stats, q_features=None, k_features=None):
        """The logit scale, then ``posenc.model.attention.attention`` with the layer's call -> (out, stats | None)."""
        kv = k.shape[1] if kv_length is None else kv_length
        q = self.scale_queries(q, q_positions, q_offset=q_offset, kv_length=kv, causal=causal)
        call = attn_lib.AttentionCall(
            scale=self.scale, causal=causal, q_offset=q_offset, kv_length=kv_length, window=self.window,
            chunk=self.chunk, softcap=self.softcap, impl=self.impl, block=self.block,
            causal_block=self.causal_block, stats=return_stats, q_features=q_features or {},
            k_features=k_features or {}, sinks=self._sinks())
        res = attn_lib.attention(q, k, v, q_positions, k_positions, self.encoding, call=call)
        return res if return_stats else (res, None)

    def project_out(self, out):
        """The output projection: out [B, L, H, Dv] -> [B, L, D]."""
        wo = self.wo[...].astype(self.dtype)
        return linear(out.astype(self.dtype).reshape(out.shape[:-2] + (-1,)), wo.reshape(-1, wo.shape[-1]))


def _cached(encoding, features):
    """The features every key needs (``Encoding.cached_features``)."""
    return {n: features[n] for n in type(encoding).cached_features}
