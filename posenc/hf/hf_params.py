"""Each tensor of an HF checkpoint in its place among posenc's parameters: the parts the families share.

The tensors come in torch's ``[out, in]`` layout under HF's names; a
family's ``params(hf, tensors, spec)`` returns ``{flat parameter path:
float32 array}`` for a :class:`posenc.model.ModelSpec`. Every tensor is
taken exactly once (:class:`Tensors`): a missing one and one left over are
errors naming them. :func:`llama_params` places the Llama-style layer that
most families share (separate or fused q / k / v, a gated MLP, RMSNorms
named per residual placement); a family with another layout places its
tensors in its own module (:mod:`posenc.hf.families`) with the helpers here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from posenc.hf.checkpoint import View


class Tensors:
    """The checkpoint's tensors (any mapping of name to array), each taken once; the ones left over are an
    error."""

    def __init__(self, tensors: Mapping, ignore=("rotary_emb.inv_freq", "attention.bias",
                                                 "attention.masked_bias")):
        # a view: a lazily read checkpoint (posenc.hf.checkpoint) is read a tensor at a time, as taken
        self.t = View(tensors, {k: k for k in tensors if not k.endswith(ignore)})
        self.used: set[str] = set()

    def __call__(self, name):
        if name not in self.t:
            raise ValueError(f"checkpoint has no tensor {name!r} (its names start with "
                             f"{sorted(self.t)[:3]})")
        self.used.add(name)
        return self.t[name]

    def has(self, name):
        """Whether the checkpoint has tensor ``name`` (it is not taken)."""
        return name in self.t

    def done(self):
        """Raise naming the tensors that no parameter took."""
        left = sorted(set(self.t) - self.used)
        if left:
            raise ValueError(f"checkpoint tensors posenc has no place for: {left[:4]}"
                             + (f" and {len(left) - 4} more" if len(left) > 4 else ""))


def heads_in(w, heads, dh):
    """A torch input projection ``[heads * dh, D]`` as posenc's ``[D, heads, dh]``."""
    return w.T.reshape(w.shape[1], heads, dh)


def heads_out(w, heads, dh):
    """A torch output projection ``[D, heads * dh]`` as posenc's ``[heads, dh, D]``."""
    return w.T.reshape(heads, dh, w.shape[0])


def norm(out, path, t, name, kind):
    """The norm ``name`` of the checkpoint at ``path``: its weight, and its bias for ``kind`` "layer"."""
    out[path + ("params", "scale")] = t(name + ".weight")
    if kind == "layer":
        out[path + ("params", "bias")] = t(name + ".bias")


def head(out, spec, t, embed, lm_head):
    """The embedding ``embed`` and, unless ``spec`` ties them, the output head ``lm_head``."""
    out[("embedding",)] = t(embed)
    if spec.tie_embeddings:
        if t.has(lm_head):
            t(lm_head)  # a tied checkpoint may store the head too: HF ties it to the embedding
    else:
        out[("head",)] = t(lm_head).T


# posenc's block norms -> HF names, per residual placement (GLM-4 and Cohere name their own)
PRE_NORMS = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
GEMMA_NORMS = {"norm1": "input_layernorm", "norm1_out": "post_attention_layernorm",
               "norm2": "pre_feedforward_layernorm", "norm2_out": "post_feedforward_layernorm"}
# OLMo 2 / 3, EXAONE 4: x + N(F(x)) (placement "reordered") normalise the sublayer outputs
REORDERED_NORMS = {"norm1": "post_attention_layernorm", "norm2": "post_feedforward_layernorm"}


def dense_mlp(out, path, t, m, spec):
    """The gated MLP whose tensors are named ``m`` + ``gate_proj`` / ``up_proj`` / ``down_proj``."""
    if t.has(m + "gate_up_proj.weight"):  # Phi-3, GLM-4: [gate; up]
        gate, up = np.split(t(m + "gate_up_proj.weight"), 2)
    else:
        gate, up = t(m + "gate_proj.weight"), t(m + "up_proj.weight")
    out[path + ("w1",)], out[path + ("w3",)] = gate.T, up.T
    out[path + ("w2",)] = t(m + "down_proj.weight").T
    if spec.bias == "all":
        out[path + ("b1",)] = t(m + "gate_proj.bias")
        out[path + ("b3",)] = t(m + "up_proj.bias")
        out[path + ("b2",)] = t(m + "down_proj.bias")


def llama_params(hf, tensors, spec, *, mlp="mlp", norms=None, moe=None):
    """The Llama-style layers: ``mlp`` names the MLP's module, ``norms`` maps posenc's block norms to HF's
    (default: by the spec's placement, :data:`PRE_NORMS` or :data:`GEMMA_NORMS`); ``moe(out, path, t,
    layer_prefix, spec)`` places the MLP of the layers that ``spec.moe`` makes mixture-of-experts."""
    t, out = Tensors(tensors), {}
    H, K, Dh = spec.num_heads, spec.num_kv_heads, spec.head_dim
    offset = 1.0 if spec.norm.kind == "rms_offset" else 0.0  # Gemma's (1 + w) gains
    if norms is None:
        norms = GEMMA_NORMS if spec.norm.placement == "sandwich" else PRE_NORMS
    head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    norm(out, ("final_norm",), t, "model.norm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        a = p + "self_attn."
        if t.has(a + "qkv_proj.weight"):  # Phi-3: one fused projection [q; k; v]
            q, k, v = np.split(t(a + "qkv_proj.weight"), [H * Dh, (H + K) * Dh])
        else:
            q, k, v = (t(a + f"{n}_proj.weight") for n in "qkv")
        out[b + ("attn", "wq")] = heads_in(q, H, q.shape[0] // H)  # Qwen3-Next: per head [q | gate]
        out[b + ("attn", "wk")] = heads_in(k, K, Dh)
        out[b + ("attn", "wv")] = heads_in(v, K, Dh)
        out[b + ("attn", "wo")] = heads_out(t(a + "o_proj.weight"), H, Dh)
        if spec.bias != "none":
            for n, heads in (("q", H), ("k", K), ("v", K)):
                # -1: Dh, or Dh + the gate's width when q_proj holds the gates (Qwen3-Next)
                out[b + ("attn", "biases", n)] = t(a + f"{n}_proj.bias").reshape(heads, -1)
            if spec.bias != "qkv":
                out[b + ("attn", "biases", "o")] = t(a + "o_proj.bias")
        if t.has(a + "q_norm.weight"):  # per head (Gemma 3, Qwen 3) or whole projection (OLMo 2)
            out[b + ("attn", "qk_params", "q_scale")] = offset + t(a + "q_norm.weight")
            out[b + ("attn", "qk_params", "k_scale")] = offset + t(a + "k_norm.weight")
        if moe is not None and spec.moe is not None and spec.moe.layers[i]:
            moe(out, b + ("mlp",), t, p, spec)  # a mixture-of-experts MLP (posenc.hf.moe_params)
        else:
            dense_mlp(out, b + ("mlp",), t, p + mlp + ".", spec)
        for ours, theirs in norms.items():
            norm(out, b + (ours,), t, p + theirs, "rms")
    t.done()
    return out
