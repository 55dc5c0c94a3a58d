"""Each tensor of an HF checkpoint in its place among posenc's parameters (``posenc.hf`` families).

The tensors come in torch's ``[out, in]`` layout under HF's names; each
function returns ``{flat parameter path: float32 array}`` for a
:class:`posenc.model.ModelSpec`. Every tensor is taken exactly once: a missing
one and one left over are errors naming them.
"""

from __future__ import annotations

import numpy as np


class _Tensors:
    """The checkpoint's tensors, each taken once; the ones left over are an error."""

    def __init__(self, tensors: dict, ignore=("rotary_emb.inv_freq", "attention.bias",
                                              "attention.masked_bias")):
        self.t = {k: v for k, v in tensors.items() if not k.endswith(ignore)}
        self.used: set[str] = set()

    def __call__(self, name):
        if name not in self.t:
            raise ValueError(f"checkpoint has no tensor {name!r} (its names start with "
                             f"{sorted(self.t)[:3]})")
        self.used.add(name)
        return self.t[name]

    def has(self, name):
        return name in self.t

    def done(self):
        left = sorted(set(self.t) - self.used)
        if left:
            raise ValueError(f"checkpoint tensors posenc has no place for: {left[:4]}"
                             + (f" and {len(left) - 4} more" if len(left) > 4 else ""))


def _heads_in(w, heads, dh):  # torch [heads * dh, D] -> posenc [D, heads, dh]
    return w.T.reshape(w.shape[1], heads, dh)


def _heads_out(w, heads, dh):  # torch [D, heads * dh] -> posenc [heads, dh, D]
    return w.T.reshape(heads, dh, w.shape[0])


def _norm(out, path, t, name, kind):
    out[path + ("params", "scale")] = t(name + ".weight")
    if kind == "layer":
        out[path + ("params", "bias")] = t(name + ".bias")


def _head(out, spec, t, embed, head):
    out[("embedding",)] = t(embed)
    if spec.tie_embeddings:
        if t.has(head):
            t(head)  # a tied checkpoint may store the head too: HF ties it to the embedding
    else:
        out[("head",)] = t(head).T


# posenc's block norms -> HF names, per residual placement (GLM-4 and Cohere name their own)
PRE_NORMS = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
GEMMA_NORMS = {"norm1": "input_layernorm", "norm1_out": "post_attention_layernorm",
               "norm2": "pre_feedforward_layernorm", "norm2_out": "post_feedforward_layernorm"}
GLM4_NORMS = {"norm1": "input_layernorm", "norm1_out": "post_self_attn_layernorm",
              "norm2": "post_attention_layernorm", "norm2_out": "post_mlp_layernorm"}
# OLMo 2 / 3, EXAONE 4: x + N(F(x)) (placement "reordered") normalise the sublayer outputs
REORDERED_NORMS = {"norm1": "post_attention_layernorm", "norm2": "post_feedforward_layernorm"}
# Cohere: one input norm feeds attention and the MLP in parallel; posenc's two norms get its gains
PARALLEL_NORMS = {"norm1": "input_layernorm", "norm2": "input_layernorm"}


def llama_params(hf, tensors, spec, *, mlp="mlp", norms=None):
    t, out = _Tensors(tensors), {}
    H, K, Dh = spec.num_heads, spec.num_kv_heads, spec.head_dim
    offset = 1.0 if spec.norm.kind == "rms_offset" else 0.0  # Gemma's (1 + w) gains
    if norms is None:
        norms = GEMMA_NORMS if spec.norm.placement == "sandwich" else PRE_NORMS
    _head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    _norm(out, ("final_norm",), t, "model.norm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        a = p + "self_attn."
        if t.has(a + "qkv_proj.weight"):  # Phi-3: one fused projection [q; k; v]
            q, k, v = np.split(t(a + "qkv_proj.weight"), [H * Dh, (H + K) * Dh])
        else:
            q, k, v = (t(a + f"{n}_proj.weight") for n in "qkv")
        out[b + ("attn", "wq")] = _heads_in(q, H, q.shape[0] // H)  # Qwen3-Next: per head [q | gate]
        out[b + ("attn", "wk")] = _heads_in(k, K, Dh)
        out[b + ("attn", "wv")] = _heads_in(v, K, Dh)
        out[b + ("attn", "wo")] = _heads_out(t(a + "o_proj.weight"), H, Dh)
        if spec.bias != "none":
            for n, heads in (("q", H), ("k", K), ("v", K)):
                # -1: Dh, or Dh + the gate's width when q_proj holds the gates (Qwen3-Next)
                out[b + ("attn", "biases", n)] = t(a + f"{n}_proj.bias").reshape(heads, -1)
            if spec.bias != "qkv":
                out[b + ("attn", "biases", "o")] = t(a + "o_proj.bias")
        if t.has(a + "q_norm.weight"):  # per head (Gemma 3, Qwen 3) or whole projection (OLMo 2)
            out[b + ("attn", "qk_params", "q_scale")] = offset + t(a + "q_norm.weight")
            out[b + ("attn", "qk_params", "k_scale")] = offset + t(a + "k_norm.weight")
        m = p + mlp + "."
        if t.has(m + "gate_up_proj.weight"):  # Phi-3, GLM-4: [gate; up]
            gate, up = np.split(t(m + "gate_up_proj.weight"), 2)
        else:
            gate, up = t(m + "gate_proj.weight"), t(m + "up_proj.weight")
        out[b + ("mlp", "w1")], out[b + ("mlp", "w3")] = gate.T, up.T
        out[b + ("mlp", "w2")] = t(m + "down_proj.weight").T
        if spec.bias == "all":
            out[b + ("mlp", "b1")] = t(m + "gate_proj.bias")
            out[b + ("mlp", "b3")] = t(m + "up_proj.bias")
            out[b + ("mlp", "b2")] = t(m + "down_proj.bias")
        for ours, theirs in norms.items():
            _norm(out, b + (ours,), t, p + theirs, "rms")
    t.done()
    return out


def deepseek_v3_params(hf, tensors, spec):
    """DeepSeek-V3's dense layers: MLA's projections (posenc.model.latent_attention), SwiGLU MLPs."""
    t, out = _Tensors(tensors), {}
    m, H = spec.mla, spec.num_heads
    qk, nv = m.qk_head_dim, m.qk_nope_head_dim + m.v_head_dim
    _head(out, spec, t, "model.embed_tokens.weight", "lm_head.weight")
    _norm(out, ("final_norm",), t, "model.norm", "rms")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        a = p + "self_attn."
        if m.q_lora_rank:
            out[b + ("attn", "wq_a")] = t(a + "q_a_proj.weight").T
            out[b + ("attn", "q_norm")] = t(a + "q_a_layernorm.weight")
            out[b + ("attn", "wq_b")] = _heads_in(t(a + "q_b_proj.weight"), H, qk)
        else:
            out[b + ("attn", "wq")] = _heads_in(t(a + "q_proj.weight"), H, qk)
        out[b + ("attn", "wkv_a")] = t(a + "kv_a_proj_with_mqa.weight").T  # [D, C + R]: latent, rotary key
        out[b + ("attn", "kv_norm")] = t(a + "kv_a_layernorm.weight")
        out[b + ("attn", "wkv_b")] = _heads_in(t(a + "kv_b_proj.weight"), H, nv)  # [C, H, N + V]
        out[b + ("attn", "wo")] = _heads_out(t(a + "o_proj.weight"), H, m.v_head_dim)
        mp = p + "mlp."
        out[b + ("mlp", "w1")] = t(mp + "gate_proj.weight").T
        out[b + ("mlp", "w3")] = t(mp + "up_proj.weight").T
        out[b + ("mlp", "w2")] = t(mp + "down_proj.weight").T
        for ours, theirs in PRE_NORMS.items():
            _norm(out, b + (ours,), t, p + theirs, "rms")
    t.done()
    return out


def _fused_qkv(out, b, t, name, spec):
    """GPT-NeoX / BLOOM query_key_value: per head [q | k | v] (view [..., H, 3, Dh])."""
    H, Dh = spec.num_heads, spec.head_dim
    w = t(name + ".weight").reshape(H, 3, Dh, -1)
    bias = t(name + ".bias").reshape(H, 3, Dh)
    for j, n in enumerate("qkv"):
        out[b + ("attn", f"w{n}")] = np.transpose(w[:, j], (2, 0, 1))
        out[b + ("attn", "biases", n)] = bias[:, j]


def _neox_like_params(hf, tensors, spec, *, root, embed, head, final, attn):
    t, out = _Tensors(tensors), {}
    H, Dh = spec.num_heads, spec.head_dim
    _head(out, spec, t, f"{root}.{embed}.weight", head)
    _norm(out, ("final_norm",), t, f"{root}.{final}", "layer")
    if spec.norm.embed_norm:
        _norm(out, ("embed_norm",), t, f"{root}.word_embeddings_layernorm", "layer")
    layers = "h" if root == "transformer" else "layers"
    for i in range(spec.num_layers):
        p, b = f"{root}.{layers}.{i}.", ("blocks", i)
        _fused_qkv(out, b, t, p + attn + ".query_key_value", spec)
        out[b + ("attn", "wo")] = _heads_out(t(p + attn + ".dense.weight"), H, Dh)
        out[b + ("attn", "biases", "o")] = t(p + attn + ".dense.bias")
        out[b + ("mlp", "w1")] = t(p + "mlp.dense_h_to_4h.weight").T
        out[b + ("mlp", "b1")] = t(p + "mlp.dense_h_to_4h.bias")
        out[b + ("mlp", "w2")] = t(p + "mlp.dense_4h_to_h.weight").T
        out[b + ("mlp", "b2")] = t(p + "mlp.dense_4h_to_h.bias")
        _norm(out, b + ("norm1",), t, p + "input_layernorm", "layer")
        _norm(out, b + ("norm2",), t, p + "post_attention_layernorm", "layer")
    t.done()
    return out


def neox_params(hf, tensors, spec):
    return _neox_like_params(hf, tensors, spec, root="gpt_neox", embed="embed_in",
                             head="embed_out.weight", final="final_layer_norm", attn="attention")


def bloom_params(hf, tensors, spec):
    tensors = {k if k.startswith("transformer.") or k == "lm_head.weight" else f"transformer.{k}": v
               for k, v in tensors.items()}  # some BLOOM checkpoints drop the prefix
    return _neox_like_params(hf, tensors, spec, root="transformer", embed="word_embeddings",
                             head="lm_head.weight", final="ln_f", attn="self_attention")
