"""PaTH attention (and PaTH-FoX): logits through data-dependent Householder products."""

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.attention import fox
from posenc.attention import path as pa
from posenc.checks import nonnegative_int, optional, positive_int
from posenc.model import attention as attn_lib
from posenc.model import cache as cache_lib
from posenc.model.encoding import Encoding
from posenc.model.layers import lecun_normal, linear
from posenc.model.options import Option
from posenc.model.registry import register_encoding
from posenc.norms import norms


def _heads_first(c):
    return None if c is None else jnp.swapaxes(c, 1, 2)  # [B, L, H] -> [B, H, L]


@register_encoding("path")
class PaTH(Encoding):
    """logit_ij = q_i^T H_i ... H_{j+1} k_j / sqrt(d), H_t = I - beta_t w_t w_t^T.

    As fla's ``PaTHAttention`` layer (fla-org/flash-linear-attention,
    ``fla/layers/path_attn.py``): ``w`` from a rank-32 projection (a full
    D x (K Dh) one under grouped-query attention: fla's rule when it added
    PaTH, c52acc04, and its comment since, "in MQA/GQA settings ... a
    standard linear projection"; ``w_rank`` sets either), a causal
    depthwise convolution of width 3 with SiLU and an L2 norm per head;
    ``beta = 2 sigmoid(W_b x + b_b)`` per kv head. ``posenc.path``
    computes the logits through chunked UT-form products (never O(L^2 Dh^2)
    memory; the blocked path is an online softmax over key chunks). The
    cache keeps each key moved through every later token (fla's cache and
    ``rank_one_update``) and the convolution's last inputs. Without the
    causal mask a later key j gets the transposed product,
    ``q_i^T H_{i+1} ... H_j k_j``. Projection weights are LeCun normal like
    the model's others, the convolution torch's default, biases 0.
    """

    relative = True
    paper = "Yang et al. 2025"
    pure = "posenc.attention.path"
    spans = ("full",)
    forget_gate = False  # PaTH-FoX: a FoX forget gate in the logits
    chunk = Option(64, positive_int, "tokens per chunk of the Householder products")
    w_rank = Option(None, optional(nonnegative_int), "rank of the w projection (0: a full D x (K Dh) "
                    "matrix; None: 32, full under GQA as fla)", type=int)
    conv_size = Option(3, nonnegative_int, "width of the causal convolution on w (0: none)")

    def setup(self, rngs, first):
        D, H, K, Dh = self.d_model, self.num_heads, self.num_kv_heads, self.head_dim
        width = K * Dh
        if self.w_rank is None:
            self.w_rank = 32 if K == H else 0
        if self.w_rank:
            self.w_down = nnx.Param(lecun_normal(rngs.params(), (D, self.w_rank), D))
            self.w_up = nnx.Param(lecun_normal(rngs.params(), (self.w_rank, width), self.w_rank))
        else:
            self.w_down, self.w_up = nnx.Param(lecun_normal(rngs.params(), (D, width), D)), None
        if self.conv_size:  # torch Conv1d's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = W
            bound = 1.0 / math.sqrt(self.conv_size)
            self.conv = nnx.Param(jax.random.uniform(rngs.params(), (width, self.conv_size),
                                                     minval=-bound, maxval=bound))
        self.w_beta = nnx.Param(lecun_normal(rngs.params(), (D, K), D))
        self.b_beta = nnx.Param(jnp.zeros((K,), jnp.float32))
        if self.forget_gate:
            self.w_g = nnx.Param(lecun_normal(rngs.params(), (D, H), D))
            self.b_g = nnx.Param(jnp.zeros((H,), jnp.float32))

    def init_state(self, batch_size):
        state = {}
        if self.conv_size:
            shape = (batch_size, self.conv_size - 1, self.num_kv_heads * self.head_dim)
            state["conv"] = jnp.zeros(shape, jnp.float32)
        if self.forget_gate:
            state["c"] = jnp.zeros((batch_size, self.num_heads), jnp.float32)
        return state

    def _proj(self, x, w):
        return linear(x, w[...].astype(x.dtype))

    def prepare(self, x, q, k, v, positions, *, state):
        new = {}
        wx = self._proj(x, self.w_down)
        if self.w_up is not None:
            wx = self._proj(wx, self.w_up)
        if self.conv_size:
            conv = self.conv[...]
            new["conv"] = pa.short_conv_state(wx, width=self.conv_size,
                                              state=state["conv"]).astype(jnp.float32)
            wx = pa.short_conv(wx, conv, activation="silu", state=state["conv"])
        w = pa.normalize_w(wx.reshape(k.shape))
        beta = pa.beta(self._proj(x, self.w_beta).astype(jnp.float32) + self.b_beta[...])
        features = {"w": w, "beta": beta}
        if self.forget_gate:
            g = self._proj(x, self.w_g).astype(jnp.float32) + self.b_g[...]
            c = fox.cumulative(g, initial=state["c"])
            features["c"], new["c"] = jnp.swapaxes(c, 1, 2), c[..., -1]
        return q, k, v, features, new

    def attention(self, q, k, v, q_positions, k_positions, call):
        q_features, k_features = call.q_features, call.k_features
        scale, softcap, block, return_stats = call.scale, call.softcap, call.block, call.stats
        if "w" not in q_features:  # called without the layer input: H = I (softmax attention)
            q_features = {"w": jnp.zeros(q.shape[:2] + k.shape[2:], jnp.float32),
                          "beta": jnp.zeros(q.shape[:2] + k.shape[2:3], jnp.float32)}
        w, beta = q_features["w"], q_features["beta"]
        c_q = _heads_first(q_features.get("c"))
        kw = dict(scale=scale, chunk=self.chunk)
        out = functools.partial(_softmax_out, dtype=q.dtype, softcap=softcap,
                                return_stats=return_stats)
        if call.reads_cache(q.shape[1], k.shape[1]):
            return self._from_cache(q, k, v, w, beta, c_q, _heads_first(k_features.get("c")),
                                    call.q_offset, out, kw)
        if not call.causal:
            s = self._bidirectional(q, k, w, beta, c_q, kw)
            return out(s, v, visible=jnp.ones(s.shape[-2:], bool))
        if not return_stats and call.runs_blocked(q.shape[1], k.shape[1]):
            if softcap:  # the online softmax of posenc.path has no cap: prefill blocks
                return self._prefill_blocks(q, k, v, w, beta, c_q, block, out, kw)
            return pa.blocked_attention(q, k, v, w, beta, c_q=c_q, c_k=c_q, **kw)
        s = pa.logits(q, k, w, beta, c_q=c_q, c_k=c_q, **kw)
        return out(s, v, visible=jnp.tril(jnp.ones(s.shape[-2:], bool)))

    def _prefill_blocks(self, q, k, v, w, beta, c, block, out, kw):
        """Causal attention a block of queries at a time, as a prefill in pieces: memory O(block L).

        The keys before the block are kept moved through the token before it
        (``update_keys``), exactly as a decoding cache (float32 here).
        """
        B, L, H, _ = q.shape
        bq = min(block, L)
        n = -(-L // bq)
        pad = lambda x: jnp.pad(x, [(0, 0), (0, n * bq - L)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
        # Padded tokens sit after every real one: beta = 0 (H = I) and causally masked.
        blocks = lambda x: jnp.moveaxis(pad(x).reshape((B, n, bq) + x.shape[2:]), 1, 0)  # noqa: E731
        v_all = pad(v)
        c_all = None if c is None else jnp.pad(c, ((0, 0), (0, 0), (0, n * bq - L)))
        c_blocks = None if c is None else jnp.moveaxis(c_all.reshape((B, H, n, bq)), 2, 0)

        @jax.checkpoint
        def step(keys, xs):
            i, q_i, k_i, v_i, w_i, b_i = xs[:6]
            c_i = None if c is None else xs[6]
            c_k = None if c is None else jnp.concatenate([c_all, c_i], axis=-1)
            s = pa.logits(q_i, k_i, w_i, b_i, c_q=c_i, c_k=c_k, prefix=keys, **kw)
            visible = jnp.concatenate([jnp.broadcast_to(jnp.arange(n * bq) < i * bq, (bq, n * bq)),
                                       jnp.tril(jnp.ones((bq, bq), bool))], axis=-1)
            o = out(s, jnp.concatenate([v_all, v_i], axis=1), visible=visible)
            keys = pa.update_keys(keys, w_i, b_i, chunk=self.chunk)
            keys = cache_lib.write(keys, pa.transform_keys(k_i, w_i, b_i, chunk=self.chunk), i * bq)
            return keys, o

        xs = (jnp.arange(n),) + tuple(blocks(x) for x in (q, k, v, w, beta))
        xs = xs + ((c_blocks,) if c is not None else ())
        keys = jnp.zeros((B, n * bq) + k.shape[2:], jnp.float32)
        _, o = jax.lax.scan(step, keys, xs)
        return jnp.moveaxis(o, 0, 1).reshape((B, n * bq) + q.shape[2:])[:, :L]

    def _from_cache(self, q, k, v, w, beta, c_q, c_cache, q_offset, out, kw):
        """Queries at slots q_offset + i against the cache: keys before q_offset are already moved
        through the token before the first query; the new tokens' keys are raw."""
        T, S = q.shape[1], k.shape[1]
        k_new = jax.lax.dynamic_slice_in_dim(k, q_offset, T, axis=1)
        v_new = jax.lax.dynamic_slice_in_dim(v, q_offset, T, axis=1)
        c_k = None if c_q is None else jnp.concatenate([c_cache, c_q], axis=-1)
        s = pa.logits(q, k_new, w, beta, c_q=c_q, c_k=c_k, prefix=k, **kw)  # [B, H, T, S + T]
        visible = jnp.concatenate([jnp.broadcast_to(jnp.arange(S) < q_offset, (T, S)),
                                   jnp.tril(jnp.ones((T, T), bool))], axis=-1)
        return out(s, jnp.concatenate([v, v_new], axis=1), visible=visible)

    def _bidirectional(self, q, k, w, beta, c, kw):
        """Causal logits below the diagonal, the transposed products above (dense; no mask)."""
        g = q.shape[2] // k.shape[2]
        rep = (lambda x: jnp.repeat(x, g, axis=2)) if g > 1 else (lambda x: x)
        lower = pa.logits(q, k, w, beta, c_q=c, c_k=c, **kw)
        upper = pa.logits(rep(k), q, rep(w), rep(beta), c_q=c, c_k=c, **kw)  # [.., j, i], i <= j
        tril = jnp.tril(jnp.ones(lower.shape[-2:], bool))
        return jnp.where(tril, lower, jnp.swapaxes(upper, -1, -2))

    def update_cache(self, k_cache, features, *, start):
        w, beta = features["w"], features["beta"]
        new = jax.lax.dynamic_slice_in_dim(k_cache, start, w.shape[1], axis=1)
        moved = pa.update_keys(k_cache, w, beta, chunk=self.chunk)
        return cache_lib.write(moved, pa.transform_keys(new, w, beta, chunk=self.chunk), start)


@register_encoding("path_fox")
class PaTHFoX(PaTH):
    """PaTH with a FoX forget gate: logit_ij = scale (q_i^T H_i ... H_{j+1} k_j + c_i - c_j).

    fla's ``use_forget_gate=True``: ``g = logsigmoid(W_g x + b_g)`` per head,
    its running sum ``c`` added inside the scale (as fla, unlike FoX).
    """

    forget_gate = True
    cached_features = ("c",)


def _softmax_out(s, v, *, dtype, softcap, return_stats, visible):
    """softmax(softcap(s)) over the visible keys @ v (GQA repeated); s float32 [B, H, Lq, Lk]."""
    if softcap:
        s = norms.softcap(jnp.where(visible, s, 0.0), softcap)
    s = jnp.where(visible, s, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(jnp.where(visible, s, attn_lib._NEG), -1, keepdims=True))
    e = jnp.where(visible, jnp.exp(s - m), 0.0)
    p = e / jnp.sum(e, -1, keepdims=True)
    vr = jnp.repeat(v, s.shape[1] // v.shape[2], axis=2).astype(jnp.float32)
    out = jnp.einsum("bhqk,bkhd->bqhd", p, vr, precision=jax.lax.Precision.HIGHEST).astype(dtype)
    if not return_stats:
        return out
    return out, attn_lib.weight_stats(s, p, visible)
