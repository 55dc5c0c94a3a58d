"""The recurrent mixers' tensors in place, and the layers of the hybrid checkpoints around them.

Each function places one mixer of a layer (its transformers module's tensors
under ``prefix``) at the layer's ``attn`` (``posenc.model.mixers``: the
parameters carry transformers' names, linear weights transposed to [in, out],
depthwise conv kernels [C, 1, W] squeezed to [C, W]). :func:`attention`
places a Llama-style attention layer (q / k / v / o, optional per-head
QK-norm); :func:`mlp` a gated MLP.
"""

from __future__ import annotations

from posenc.hf.hf_params import heads_in, heads_out


def _linear(out, path, t, name):
    out[path] = t(name + ".weight").T


def _conv(t, name):
    return t(name)[:, 0, :]  # [C, 1, W] -> [C, W]


def _opt_bias(out, path, t, name, on):
    if on:
        out[path] = t(name)


def gated_deltanet(out, b, t, prefix, mixer):
    """Qwen3-Next's / Qwen3.5's Gated DeltaNet (``posenc.model.mixers.gated_deltanet``)."""
    a = b + ("attn",)
    names = ("in_proj_qkvz", "in_proj_ba") if mixer["projections"] == "qkvz" else (
        "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
    for n in names + ("out_proj",):
        _linear(out, a + (n,), t, prefix + n)
    out[a + ("conv",)] = _conv(t, prefix + "conv1d.weight")
    out[a + ("dt_bias",)] = t(prefix + "dt_bias")
    out[a + ("A_log",)] = t(prefix + "A_log")
    out[a + ("norm",)] = t(prefix + "norm.weight")


def mamba2(out, a, t, prefix, options):
    """A Mamba-2 mixer at path ``a`` (``posenc.model.mixers.mamba2``); ``options``: model.recurrent.mamba2's."""
    _linear(out, a + ("in_proj",), t, prefix + "in_proj")
    _opt_bias(out, a + ("in_proj_bias",), t, prefix + "in_proj.bias", options["bias"])
    out[a + ("conv",)] = _conv(t, prefix + "conv1d.weight")
    _opt_bias(out, a + ("conv_bias",), t, prefix + "conv1d.bias", options["conv_bias"])
    for n in ("dt_bias", "A_log", "D"):
        out[a + (n,)] = t(prefix + n)
    if options["norm"] != "none":
        out[a + ("norm",)] = t(prefix + "norm.weight")
    _linear(out, a + ("out_proj",), t, prefix + "out_proj")
    _opt_bias(out, a + ("out_proj_bias",), t, prefix + "out_proj.bias", options["bias"])


def attention_or_mamba2(out, b, t, spec, i, *, attention_prefix, mamba_prefix):
    """Layer ``i``'s mixer at ``b + ("attn",)``: Llama's attention under ``attention_prefix``, or Mamba-2
    under ``mamba_prefix`` (Bamba, Granite 4.0-H, Nemotron-H), as ``spec`` gives the layer."""
    if spec.layer_type(i) == "attention":
        attention(out, b + ("attn",), t, attention_prefix, spec)
    else:
        mamba2(out, b + ("attn",), t, mamba_prefix, spec.recurrent.options["mamba2"])


def short_conv(out, b, t, prefix, options):
    """LFM2's gated short convolution (``posenc.model.mixers.short_conv``)."""
    a = b + ("attn",)
    for n in ("in_proj", "out_proj"):
        _linear(out, a + (n,), t, prefix + n)
        _opt_bias(out, a + (n + "_bias",), t, prefix + n + ".bias", options["bias"])
    out[a + ("conv",)] = _conv(t, prefix + "conv.weight")
    _opt_bias(out, a + ("conv_bias",), t, prefix + "conv.bias", options["bias"])


def attention(out, a, t, prefix, spec, *, offset=0.0, q_norm="q_norm", k_norm="k_norm", o="o_proj",
              key_multiplier=1.0):
    """A Llama-style attention at path ``a``: q / k / v / o (q_proj may hold each head's gate after its
    query: Qwen3-Next), per-head QK-norm gains (+ ``offset``) when the checkpoint has them; the keys
    times ``key_multiplier`` (Falcon-H1) folded into wk."""
    H, K, Dh = spec.num_heads, spec.num_kv_heads, spec.head_dim
    q = t(prefix + "q_proj.weight")
    out[a + ("wq",)] = heads_in(q, H, q.shape[0] // H)
    out[a + ("wk",)] = heads_in(t(prefix + "k_proj.weight") * key_multiplier, K, Dh)
    out[a + ("wv",)] = heads_in(t(prefix + "v_proj.weight"), K, Dh)
    out[a + ("wo",)] = heads_out(t(prefix + o + ".weight"), H, Dh)
    if spec.bias != "none":
        for n, heads, m in (("q", H, 1.0), ("k", K, key_multiplier), ("v", K, 1.0)):
            out[a + ("biases", n)] = (t(prefix + f"{n}_proj.bias") * m).reshape(heads, -1)
        if spec.bias != "qkv":
            out[a + ("biases", "o")] = t(prefix + o + ".bias")
    if t.has(prefix + q_norm + ".weight"):
        out[a + ("qk_params", "q_scale")] = offset + t(prefix + q_norm + ".weight")
        out[a + ("qk_params", "k_scale")] = offset + t(prefix + k_norm + ".weight")


def mlp(out, b, t, prefix, *, gate="gate_proj", up="up_proj", down="down_proj", gate_scale=1.0,
        down_scale=1.0):
    """A gated MLP (w1 gate, w3 up, w2 down) at ``b`` + mlp; ``gate`` None: an ungated one (w1 = up);
    gate_scale and down_scale fold multipliers of w1 and w2 into the weights."""
    m = b + ("mlp",)
    if gate is None:
        out[m + ("w1",)] = t(prefix + up + ".weight").T * gate_scale
    else:
        out[m + ("w1",)] = t(prefix + gate + ".weight").T * gate_scale
        out[m + ("w3",)] = t(prefix + up + ".weight").T
    out[m + ("w2",)] = t(prefix + down + ".weight").T * down_scale
