"""FoX: the Forgetting Transformer's data-dependent forget-gate bias, and FoX (Pro)."""

import jax.numpy as jnp
from flax import nnx

from posenc import fox
from posenc.model.encoding import Encoding, register_encoding
from posenc.model.layers import lecun_normal, linear
from posenc.model.options import Option, boolean

_QK_EPS = 1e-5  # the official GroupNorm default (FoX (Pro) QK-norm)
_OUT_EPS = 1e-6  # the official norm_eps (FoX (Pro) output norm)


@register_encoding("fox")
class FoX(Encoding):
    """Per-head forget gate f_t = sigmoid(w_f . x_t + b_f); logits + sum_{l=j+1..i} log f_l.

    The bias is ``c_i - c_j`` of the running sum ``c`` of log forget gates
    (``posenc.fox.block_bias`` per block; the KV cache keeps ``c`` per key and
    the running sum as the decoding state), added to ``q . k / sqrt(d)``
    unscaled, as ``ForgettingAttentionLayer`` (zhixuan-lin/forgetting-transformer,
    fgate_type "full"). ``pro``: FoX (Pro) of the official configs
    (``pro_*.yaml``): data-dependent token shift of k and v, per-head
    QK-norm of q and the shifted k, and the output RMSNorm times a sigmoid
    output gate before the output projection. Gate weights are LeCun normal
    like the model's other projections; biases start at 0 (official).
    """

    relative = True
    paper = "Lin et al. 2025"
    pure = "posenc.fox"
    cached_features = ("c",)
    pro = Option(False, boolean, "FoX (Pro): k / v token shift, per-head QK-norm, output gate and norm")

    def setup(self, rngs, first):
        D, H, K, Dh = self.d_model, self.num_heads, self.num_kv_heads, self.head_dim
        self.w_f = nnx.Param(lecun_normal(rngs.params(), (D, H), D))
        self.b_f = nnx.Param(jnp.zeros((H,), jnp.float32))
        if not self.pro:
            return
        # ShiftLinear's shift_proj (no bias), one logit per kv head (the official code has no GQA).
        self.w_k_shift = nnx.Param(lecun_normal(rngs.params(), (D, K), D))
        self.w_v_shift = nnx.Param(lecun_normal(rngs.params(), (D, K), D))
        self.q_norm = nnx.Param(jnp.ones((H, Dh), jnp.float32))
        self.k_norm = nnx.Param(jnp.ones((K, Dh), jnp.float32))
        self.w_gate = nnx.Param(lecun_normal(rngs.params(), (D, H * Dh), D))  # ogate_proj, no bias
        self.out_norm = nnx.Param(jnp.ones((H, Dh), jnp.float32))

    def init_state(self, batch_size):
        state = {"c": jnp.zeros((batch_size, self.num_heads), jnp.float32)}
        if self.pro:  # the unshifted k / v projection of the last token (the official shift_state)
            shape = (batch_size, self.num_kv_heads, self.head_dim)
            state.update(k_prev=jnp.zeros(shape, jnp.float32), v_prev=jnp.zeros(shape, jnp.float32))
        return state

    def _proj(self, x, w):
        return linear(x, w[...].astype(x.dtype)).astype(jnp.float32)

    def prepare(self, x, q, k, v, positions, *, state):
        logits = self._proj(x, self.w_f) + self.b_f[...]
        c = fox.cumulative(logits, initial=state["c"])  # [B, H, L]
        features, new = {"c": jnp.swapaxes(c, 1, 2)}, {"c": c[..., -1]}
        if self.pro:
            new.update(k_prev=k[:, -1].astype(jnp.float32), v_prev=v[:, -1].astype(jnp.float32))
            k = fox.token_shift(k, self._proj(x, self.w_k_shift), previous=state["k_prev"])
            v = fox.token_shift(v, self._proj(x, self.w_v_shift), previous=state["v_prev"])
            q = fox.head_rms_norm(q, self.q_norm[...], eps=_QK_EPS)
            k = fox.head_rms_norm(k, self.k_norm[...], eps=_QK_EPS)
            features["gate"] = linear(x, self.w_gate[...].astype(x.dtype)).reshape(q.shape)
        return q, k, v, features, new

    def feature_bias(self, q_features, k_features, *, causal):
        if "c" not in q_features:  # attention called without the layer input: gates open
            return None
        bias = fox.block_bias(jnp.swapaxes(q_features["c"], 1, 2), jnp.swapaxes(k_features["c"], 1, 2))
        # Without the causal mask a later key gets the gates between it and the query, -|c_i - c_j|
        # (c_i - c_j itself would grow with the distance).
        return bias if causal else -jnp.abs(bias)

    def output(self, out, features):
        if not self.pro:
            return out
        return fox.output_gate(out, features["gate"], self.out_norm[...], eps=_OUT_EPS)
