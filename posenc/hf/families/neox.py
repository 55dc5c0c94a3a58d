"""GPT-NeoX and BLOOM: LayerNorms with biases, one fused per-head query_key_value, a GELU MLP.

GPT-NeoX rotates a quarter of each head (``rotary_pct``) and may add its
attention and MLP to the residual in parallel; BLOOM has ALiBi and a
LayerNorm after the embedding (its preset).
"""

from __future__ import annotations

import numpy as np

from posenc.hf import fields, hf_params, rope_fields
from posenc.hf.checkpoint import View
from posenc.hf.hf_params import heads_out, norm
from posenc.hf.registry import Family, register, unsupported


def neox_fields(hf):
    """GPT-NeoX's fields: biases everywhere, its GELU, parallel residual and partial RoPE."""
    out = fields.base(hf, "gpt_neox", eps_key="layer_norm_eps")
    if not hf.get("attention_bias", True):
        raise unsupported(hf, "attention_bias", "GPT-NeoX's MLP keeps its biases; posenc's bias "
                          "choice 'all' needs the attention biases too")
    out["model.mlp"] = fields.act(hf, "hidden_act", {"gelu": "gelu_erf", "gelu_new": "gelu",
                                                     "gelu_pytorch_tanh": "gelu"})
    out["model.parallel_residual"] = bool(hf.get("use_parallel_residual", True))
    p = rope_fields.rope_params(hf)
    p.setdefault("partial_rotary_factor", 0.25)
    rope_fields.set_rope(out, rope_fields.rope_options(hf, p))
    return out


def bloom_fields(hf):
    """BLOOM's fields: its config names (n_embed, n_layer, n_head) read as the others'."""
    fields.refuse(hf, {"apply_residual_connection_post_layernorm": ((False,), "posenc's residual adds "
                                                                    "the block input"),
                       "pretraining_tp": ((None, 1), "tensor-parallel slicing changes the sums")})
    hf = {**hf, "hidden_size": hf.get("hidden_size", hf.get("n_embed")),
          "num_hidden_layers": hf.get("n_layer"), "num_attention_heads": hf.get("n_head")}
    out = fields.base(hf, "bloom", eps_key="layer_norm_epsilon", tie_default=True)
    out["model.mlp_hidden"] = 4 * out["model.d_model"]
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
    """The tensors of a NeoX-like checkpoint under ``root`` (its module names as keywords)."""
    t, out = hf_params.Tensors(tensors), {}
    H, Dh = spec.num_heads, spec.head_dim
    hf_params.head(out, spec, t, f"{root}.{embed}.weight", head)
    norm(out, ("final_norm",), t, f"{root}.{final}", "layer")
    if spec.norm.embed_norm:
        norm(out, ("embed_norm",), t, f"{root}.word_embeddings_layernorm", "layer")
    layers = "h" if root == "transformer" else "layers"
    for i in range(spec.num_layers):
        p, b = f"{root}.{layers}.{i}.", ("blocks", i)
        _fused_qkv(out, b, t, p + attn + ".query_key_value", spec)
        out[b + ("attn", "wo")] = heads_out(t(p + attn + ".dense.weight"), H, Dh)
        out[b + ("attn", "biases", "o")] = t(p + attn + ".dense.bias")
        out[b + ("mlp", "w1")] = t(p + "mlp.dense_h_to_4h.weight").T
        out[b + ("mlp", "b1")] = t(p + "mlp.dense_h_to_4h.bias")
        out[b + ("mlp", "w2")] = t(p + "mlp.dense_4h_to_h.weight").T
        out[b + ("mlp", "b2")] = t(p + "mlp.dense_4h_to_h.bias")
        norm(out, b + ("norm1",), t, p + "input_layernorm", "layer")
        norm(out, b + ("norm2",), t, p + "post_attention_layernorm", "layer")
    t.done()
    return out


def neox_params(hf, tensors, spec):
    """GPT-NeoX's tensors (``gpt_neox.*``, the head ``embed_out``)."""
    return _neox_like_params(hf, tensors, spec, root="gpt_neox", embed="embed_in",
                             head="embed_out.weight", final="final_layer_norm", attn="attention")


def bloom_params(hf, tensors, spec):
    """BLOOM's tensors (``transformer.*``, the prefix added where a checkpoint drops it)."""
    tensors = View(tensors, {k if k.startswith("transformer.") or k == "lm_head.weight" else f"transformer.{k}": k
                             for k in tensors})  # some BLOOM checkpoints drop the prefix
    return _neox_like_params(hf, tensors, spec, root="transformer", embed="word_embeddings",
                             head="lm_head.weight", final="ln_f", attn="self_attention")


register("gpt_neox", Family("gpt_neox", neox_fields, neox_params))
register("bloom", Family("bloom", bloom_fields, bloom_params))
