"""FoX: the Forgetting Transformer's data-dependent forget-gate bias, FoX (Pro) and the official variants."""

import jax.numpy as jnp
from flax import nnx

from posenc.attention import fox
from posenc.checks import boolean, one_of, optional, positive
from posenc.model.encoding import Encoding
from posenc.model.layers import lecun_normal, linear
from posenc.model.options import Option
from posenc.model.registry import register_encoding

_QK_EPS = 1e-5  # the official GroupNorm default (FoX (Pro) QK-norm)
_OUT_EPS = 1e-6  # the official norm_eps (FoX (Pro) output norm)
GATES = ("full", "bias_only", "fixed", "none")
OUTPUT_GATES = ("none", "sigmoid", "silu")
_PRO_PARTS = ("k_shift", "v_shift", "qk_norm", "output_norm")


def _resolved(options: dict) -> dict:
    """The options with the parts left at None taken from ``pro`` (on in Pro, off otherwise)."""
    out = dict(options)
    for name in _PRO_PARTS:
        if out.get(name) is None:
            out[name] = bool(out["pro"])
    if out.get("output_gate") is None:
        out["output_gate"] = "sigmoid" if out["pro"] else "none"
    return out


@register_encoding("fox")
class FoX(Encoding):
    """Per-head forget gate f_t = sigmoid(w_f . x_t + b_f); logits + sum_{l=j+1..i} log f_l.

    The bias is ``c_i - c_j`` of the running sum ``c`` of log forget gates
    (``posenc.fox.block_bias`` per block; the KV cache keeps ``c`` per key and
    the running sum as the decoding state), added to ``q . k / sqrt(d)``
    unscaled, as ``ForgettingAttentionLayer`` (zhixuan-lin/forgetting-transformer).

    The official layer's options, each a field here:

    - ``gate`` (``fgate_type``): "full" (a projection of the token plus a bias),
      "bias_only" (a learned bias per head, no projection), "fixed" (a
      constant bias per head) or "none" (no forget gate); ``decay_time_min``,
      ``decay_time_max`` (``fgate_bias_init``) set the bias so that the decay
      times ``-1 / log sigmoid(b_h)`` are log-spaced over the heads
      (``posenc.fox.bias_init``; "fixed" needs them, "bias_only" may take
      them, "full" does not use them);
    - ``k_shift``, ``v_shift`` (``use_k_shift``, ``use_v_shift``): the
      data-dependent token shift of the keys and values;
    - ``qk_norm``: an RMSNorm per head with its own gains (GroupNorm, eps
      1e-5) of q and the shifted k;
    - ``output_gate`` (``use_output_gate``, ``ogate_act``): "sigmoid" or
      "silu" gate ``act(W_g x)`` on the attention output; ``output_norm``
      (``use_output_norm``): an RMSNorm per head (eps 1e-6) of the output,
      with or without the (sigmoid) gate;
    - ``pro``: FoX (Pro) of the official ``pro_*.yaml`` configs: every part
      above on; a part set explicitly (True / False / a gate) wins over it.

    Gate weights are LeCun normal like the model's other projections; biases
    start at 0 (official) unless the decay times set them.
    """

    relative = True
    paper = "Lin et al. 2025"
    pure = "posenc.attention.fox"
    cached_features = ("c",)
    pro = Option(False, boolean, "FoX (Pro): k / v token shift, per-head QK-norm, output gate and norm")
    gate = Option("full", one_of(*GATES), "forget gate: full (projection + bias) | bias_only | "
                  "fixed | none (official fgate_type)")
    decay_time_min = Option(None, optional(positive), "bias init: the shortest decay time T_min "
                            "(bias_only, fixed)", type=float)
    decay_time_max = Option(None, optional(positive), "bias init: the longest decay time T_max "
                            "(bias_only, fixed)", type=float)
    k_shift = Option(None, optional(boolean), "data-dependent token shift of the keys (None: pro)",
                     type=bool)
    v_shift = Option(None, optional(boolean), "data-dependent token shift of the values (None: pro)",
                     type=bool)
    qk_norm = Option(None, optional(boolean), "per-head RMSNorm of q and k (None: pro)", type=bool)
    output_gate = Option(None, optional(one_of(*OUTPUT_GATES)), "output gate: none | sigmoid | silu "
                         "(None: sigmoid with pro, else none)", type=str)
    output_norm = Option(None, optional(boolean), "per-head RMSNorm of the attention output "
                         "(None: pro)", type=bool)

    @classmethod
    def unused_options(cls, options):
        return ("decay_time_min", "decay_time_max") if options["gate"] in ("full", "none") else ()

    @classmethod
    def check(cls, options, *, prefix, **_):
        lo, hi = options["decay_time_min"], options["decay_time_max"]
        if (lo is None) != (hi is None):
            raise ValueError(f"{prefix}.decay_time_min and {prefix}.decay_time_max go together "
                             f"(the bias init); got {lo!r} and {hi!r}")
        if options["gate"] == "fixed" and lo is None:
            raise ValueError(f"{prefix}.gate 'fixed' needs {prefix}.decay_time_min and "
                             "decay_time_max (its constant bias; the official fgate_bias_init)")
        o = _resolved(options)
        if o["output_norm"] and o["output_gate"] == "silu":
            raise ValueError(f"{prefix}.output_gate 'silu' cannot be combined with "
                             f"{prefix}.output_norm (the official normed gate is sigmoid only)")

    @classmethod
    def own_qk_norm(cls, options):
        o = _resolved(options)
        if not o["qk_norm"]:
            return ""
        return "qk_norm" if options.get("qk_norm") else "pro"

    def setup(self, rngs, first):
        o = _resolved({n: getattr(self, n) for n in ("pro", *_PRO_PARTS, "output_gate")})
        for name in (*_PRO_PARTS, "output_gate"):
            setattr(self, name, o[name])
        D, H, K, Dh = self.d_model, self.num_heads, self.num_kv_heads, self.head_dim
        if self.gate == "full":
            self.w_f = nnx.Param(lecun_normal(rngs.params(), (D, H), D))
        if self.gate in ("full", "bias_only"):
            self.b_f = nnx.Param(self._bias_init())
        # ShiftLinear's shift_proj (no bias), one logit per kv head (the official code has no GQA).
        if self.k_shift:
            self.w_k_shift = nnx.Param(lecun_normal(rngs.params(), (D, K), D))
        if self.v_shift:
            self.w_v_shift = nnx.Param(lecun_normal(rngs.params(), (D, K), D))
        if self.qk_norm:
            self.q_norm = nnx.Param(jnp.ones((H, Dh), jnp.float32))
            self.k_norm = nnx.Param(jnp.ones((K, Dh), jnp.float32))
        if self.output_gate != "none":
            self.w_gate = nnx.Param(lecun_normal(rngs.params(), (D, H * Dh), D))  # ogate_proj
        if self.output_norm:
            self.out_norm = nnx.Param(jnp.ones((H, Dh), jnp.float32))

    def _bias_init(self):
        if self.decay_time_min is None:
            return jnp.zeros((self.num_heads,), jnp.float32)
        return fox.bias_init(self.num_heads, decay_time_min=self.decay_time_min,
                             decay_time_max=self.decay_time_max)

    def init_state(self, batch_size):
        state = {"c": jnp.zeros((batch_size, self.num_heads), jnp.float32)}
        shape = (batch_size, self.num_kv_heads, self.head_dim)
        # the unshifted k / v projection of the last token (the official shift_state)
        if self.k_shift:
            state["k_prev"] = jnp.zeros(shape, jnp.float32)
        if self.v_shift:
            state["v_prev"] = jnp.zeros(shape, jnp.float32)
        return state

    def _proj(self, x, w):
        return linear(x, w[...].astype(x.dtype)).astype(jnp.float32)

    def _gate_logits(self, x):
        """Forget-gate logits [B, L, H] (None for gate 'none': log f = 0)."""
        if self.gate == "full":
            return self._proj(x, self.w_f) + self.b_f[...]
        if self.gate == "none":
            return None
        b = self.b_f[...] if self.gate == "bias_only" else self._bias_init()  # fixed: a constant
        return jnp.broadcast_to(b, x.shape[:-1] + (self.num_heads,))

    def prepare(self, x, q, k, v, positions, *, state):
        logits = self._gate_logits(x)
        if logits is None:
            c = jnp.broadcast_to(state["c"][..., None], state["c"].shape + (x.shape[1],))
        else:
            c = fox.cumulative(logits, initial=state["c"])  # [B, H, L]
        features, new = {"c": jnp.swapaxes(c, 1, 2)}, {"c": c[..., -1]}
        if self.k_shift:
            new["k_prev"] = k[:, -1].astype(jnp.float32)
            k = fox.token_shift(k, self._proj(x, self.w_k_shift), previous=state["k_prev"])
        if self.v_shift:
            new["v_prev"] = v[:, -1].astype(jnp.float32)
            v = fox.token_shift(v, self._proj(x, self.w_v_shift), previous=state["v_prev"])
        if self.qk_norm:
            q = fox.head_rms_norm(q, self.q_norm[...], eps=_QK_EPS)
            k = fox.head_rms_norm(k, self.k_norm[...], eps=_QK_EPS)
        if self.output_gate != "none":
            features["gate"] = linear(x, self.w_gate[...].astype(x.dtype)).reshape(q.shape)
        return q, k, v, features, new

    def feature_bias(self, q_features, k_features, *, causal):
        if "c" not in q_features or self.gate == "none":  # no layer input or no gate: open gates
            return None
        bias = fox.block_bias(jnp.swapaxes(q_features["c"], 1, 2), jnp.swapaxes(k_features["c"], 1, 2))
        # Without the causal mask a later key gets the gates between it and the query, -|c_i - c_j|
        # (c_i - c_j itself would grow with the distance).
        return bias if causal else -jnp.abs(bias)

    def output(self, out, features):
        scale = self.out_norm[...] if self.output_norm else None
        if self.output_gate != "none":
            return fox.output_gate(out, features["gate"], scale, eps=_OUT_EPS,
                                   activation=self.output_gate)
        if scale is not None:
            return fox.head_rms_norm(out.astype(jnp.float32), scale, eps=_OUT_EPS).astype(out.dtype)
        return out

