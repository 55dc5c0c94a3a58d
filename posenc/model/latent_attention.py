"""Multi-head latent attention in the model (``model.mla``; DeepSeek-V2 / V3, ``posenc.mla``).

:class:`LatentAttention` replaces the layer's q / k / v projections by MLA's:
a query of ``H`` heads of ``N + R`` (one projection, or the low-rank
``wq_a``, RMSNorm, ``wq_b`` with ``model.mla.q_lora_rank``), a normalised
latent ``c`` [C] and one rotary key ``k_pe`` [R] per token, expanded per
head into ``k_nope`` [N] and ``v`` [V] by ``wkv_b``. The layer's encoding
acts on the rotary parts only (the unit is built with ``head_dim = R``):
``qk(q_pe, k_pe)``, its key transform on a key of one head shared by all;
position-only biases (ALiBi, T5, ...) add to the logits of every head as
usual. Everything else of a call (scale, span, soft-cap, sinks, logit
scale, dense / blocked / fused path) is the layer's
:meth:`~posenc.model.layers.Attention.softmax_attention`.

The full forward pass attends in the explicit form (``q = [q_nope | q_pe]``,
``k = [k_nope | k_pe]`` for every head). The KV cache of a layer holds
``[c | k_pe]`` [B, S, 1, C + R] in its ``k`` slot (``k_pe`` rotated when the
unit's key transform is static, else raw and transformed at every step, as
for the usual keys) and nothing in ``v`` ([B, S, 1, 0]). Decoding attends
in the absorbed form (``model.mla.absorb``, the official ``attn_impl =
"absorb"``): multi-query attention of ``[q_nope W_kvb^K | q_pe]`` over keys
``[c | k_pe]`` and values ``c``, then ``W_kvb^V`` per head; or, with
``absorb=False``, it expands the cached latent into keys and values.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from posenc.attention import mla
from posenc.model import cache as cache_lib
from posenc.model.layers import Attention, lecun_normal, linear, xavier_normal
from posenc.norms import norms, qk_clip


class LatentAttention(Attention):
    """MLA's projections, cache and absorbed decoding around the layer's softmax attention."""

    def __init__(self, spec, encoding, *, dtype, vo_gain, rngs, layer_index=0):
        m = spec.mla
        D, H = spec.d_model, spec.num_heads
        self.num_heads, self.num_kv_heads, self.dtype = H, 1, dtype
        self.kv_lora_rank, self.q_lora_rank = m.kv_lora_rank, m.q_lora_rank
        self.nope, self.rope, self.v_dim, self.absorb = (m.qk_nope_head_dim, m.qk_rope_head_dim,
                                                         m.v_head_dim, m.absorb)
        self.head_dim = m.qk_head_dim  # the width of q . k
        self.norm_eps = mla.LATENT_EPS  # DeepSeek's latent norms keep RMSNorm's default, not model.norm.eps
        lay = self._setup_call(spec, layer_index)
        self.encoding = encoding

        def proj(shape, fan_in, fan_out, gain):
            if gain is None:
                return nnx.Param(lecun_normal(rngs.params(), shape, fan_in))
            return nnx.Param(xavier_normal(rngs.params(), shape, fan_in, fan_out, gain))

        qk_gain = None if vo_gain is None else 1.0  # DeepNorm, as the usual attention
        C, Cq, Dq = m.kv_lora_rank, m.q_lora_rank, m.qk_head_dim
        if Cq:
            self.wq_a = proj((D, Cq), D, Cq, qk_gain)
            self.q_norm = nnx.Param(jnp.ones((Cq,), jnp.float32))
            self.wq_b = proj((Cq, H, Dq), Cq, H * Dq, qk_gain)
        else:
            self.wq = proj((D, H, Dq), D, H * Dq, qk_gain)
        self.wkv_a = proj((D, C + m.qk_rope_head_dim), D, C + m.qk_rope_head_dim, qk_gain)
        self.kv_norm = nnx.Param(jnp.ones((C,), jnp.float32))
        self.wkv_b = proj((C, H, m.qk_nope_head_dim + m.v_head_dim), C, H * (m.qk_nope_head_dim + m.v_head_dim),
                          vo_gain)
        self.wo = proj((H, m.v_head_dim, D), H * m.v_head_dim, D, vo_gain)
        self._setup_scales(lay.logit_scale)

    # -- projections ------------------------------------------------------------------------

    def project(self, x):
        """x [B, L, D] -> (q_nope [B, L, H, N], q_pe [B, L, H, R], c [B, L, C], k_pe [B, L, 1, R]),
        not rotated (``posenc.mla.queries``, ``posenc.mla.latent``)."""
        dt, eps = self.dtype, self.norm_eps
        if self.q_lora_rank:
            q = linear(norms.rms_norm(linear(x, self.wq_a[...].astype(dt)), self.q_norm[...], eps=eps),
                       self.wq_b[...].astype(dt).reshape(self.q_lora_rank, -1))
        else:
            q = linear(x, self.wq[...].astype(dt).reshape(x.shape[-1], -1))
        q = q.reshape(x.shape[:-1] + (self.num_heads, self.head_dim))
        kv = linear(x, self.wkv_a[...].astype(dt))
        c = norms.rms_norm(kv[..., :self.kv_lora_rank], self.kv_norm[...], eps=eps)
        return q[..., :self.nope], q[..., self.nope:], c, kv[..., None, self.kv_lora_rank:]

    def _expand(self, c):
        """c [B, S, C] -> (k_nope [B, S, H, N], v [B, S, H, V])."""
        return mla.expand(c, self.wkv_b[...].astype(self.dtype), qk_nope_head_dim=self.nope)

    def _explicit(self, q_nope, q_pe, k_nope, k_pe):
        """The explicit form's q [.., H, N + R] and k [.., H, N + R] (k_pe shared by the heads)."""
        q = jnp.concatenate([q_nope, q_pe.astype(q_nope.dtype)], axis=-1)
        k_pe = jnp.broadcast_to(k_pe.astype(k_nope.dtype), k_nope.shape[:-1] + (k_pe.shape[-1],))
        return q, jnp.concatenate([k_nope, k_pe], axis=-1)

    def qk_clip(self, max_logits, threshold: float) -> None:
        """QK-Clip's MLA case after an optimizer step (``train.qk_clip``; Kimi K2, Megatron-LM's MLA
        ``get_qk_clip_factors``; ``posenc.qk_clip.clip_mla``): per head ``gamma = min(1, threshold /
        its largest logit)``; its query and key "nope" parts (``wq`` / ``wq_b`` [.., H, :N], ``wkv_b``
        [C, H, :N]) times ``gamma ** 0.5``, its rotary query part (``[.., H, N:]``) times gamma; the
        rotary key (``wkv_a``), shared by every head, and the values stay. ``max_logits`` [H]."""
        wq = self.wq_b if self.q_lora_rank else self.wq
        q, kv = wq[...], self.wkv_b[...]
        q_nope, q_rope, k_nope = qk_clip.clip_mla(q[..., :self.nope], q[..., self.nope:], kv[..., :self.nope],
                                                  max_logits, head_axis=1, threshold=threshold)
        wq[...] = jnp.concatenate([q_nope, q_rope], axis=-1)
        self.wkv_b[...] = jnp.concatenate([k_nope, kv[..., self.nope:]], axis=-1)

    # -- the layer ---------------------------------------------------------------------------

    def forward(self, x, positions, *, seq_len, causal=True, return_stats=False):
        """The full forward pass (explicit form): x [B, L, D] -> [B, L, D] (, stats)."""
        q_nope, q_pe, c, k_pe = self.project(x)
        q_pe, k_pe = self.encoding.qk(q_pe, k_pe, positions, positions, seq_len=seq_len)
        k_nope, v = self._expand(c)
        q, k = self._explicit(q_nope, q_pe, k_nope, k_pe)
        out, stats = self.softmax_attention(q, k, v, positions, positions, q_offset=0, kv_length=None,
                                            causal=causal, return_stats=return_stats)
        y = self.project_out(out)
        return (y, stats) if return_stats else y

    @property
    def keys_cached_transformed(self) -> bool:
        return self.encoding.static_key()

    @property
    def cached_key_dim(self) -> int:
        """The width of this layer's cached keys: the latent and the rotary key, C + R."""
        return self.kv_lora_rank + self.rope

    @property
    def cached_value_dim(self) -> int:
        return 0  # the values come from the latent

    @property
    def cached_kv_heads(self) -> int:
        return 1

    def decode(self, x, positions, all_positions, entry, *, seq_len, length):
        """Append x [B, T, D] to the cache ``entry`` ({"k": [B, S, 1, C + R], "v": [B, S, 1, 0]});
        -> (y [B, T, D], new entry). Absorbed form unless ``model.mla.absorb`` is False."""
        q_nope, q_pe, c, k_pe = self.project(x)
        enc, C = self.encoding, self.kv_lora_rank
        rotated = self.keys_cached_transformed
        if rotated:  # the cache holds rotated keys: a step rotates its own tokens only
            k_pe = enc.key(k_pe, positions, seq_len=seq_len)
        ck = cache_lib.write(entry["k"], jnp.concatenate([c[..., None, :], k_pe.astype(c.dtype)], axis=-1),
                             length)
        keys = ck.astype(q_nope.dtype)
        c_all, kpe_all = keys[..., :C], keys[..., C:]
        if rotated:
            q_pe = enc.query(q_pe, positions, seq_len=seq_len)
        else:
            q_pe, kpe_all = enc.qk(q_pe, kpe_all, positions, all_positions, seq_len=seq_len)
        kw = dict(q_offset=length, kv_length=length + x.shape[1], causal=True, return_stats=False)
        wkv_b = self.wkv_b[...].astype(self.dtype)
        if self.absorb:  # multi-query attention over [c | k_pe] with values c, then W_kvb^V per head
            q_abs = mla.absorb_query(q_nope, wkv_b, qk_nope_head_dim=self.nope)
            q = jnp.concatenate([q_abs, q_pe.astype(q_abs.dtype)], axis=-1)
            k = jnp.concatenate([c_all, kpe_all], axis=-1) if not rotated else keys
            out, _ = self.softmax_attention(q, k, c_all, positions, all_positions, **kw)
            out = mla.absorbed_output(out, wkv_b, qk_nope_head_dim=self.nope)
        else:
            k_nope, v = self._expand(c_all[:, :, 0])
            q, k = self._explicit(q_nope, q_pe, k_nope, kpe_all)
            out, _ = self.softmax_attention(q, k, v, positions, all_positions, **kw)
        return self.project_out(out), {"k": ck, "v": entry["v"], "features": entry["features"],
                                       "state": entry["state"]}
