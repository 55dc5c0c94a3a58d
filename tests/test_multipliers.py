"""posenc.multipliers against MiniCPM's and Granite's forward passes (numpy transcriptions of a toy decoder)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from posenc import multipliers, norms

D, V, L, T, DH = 8, 13, 3, 4, 4


def _rms(x, eps=1e-6):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


def _toy(seed):
    rng = np.random.default_rng(seed)
    return {"embed": rng.normal(size=(V, D)), "head": rng.normal(size=(V, D)),
            "attn": [rng.normal(size=(D, D)) / 3 for _ in range(L)],
            "mlp": [rng.normal(size=(D, D)) / 3 for _ in range(L)]}


# MiniCPM (modeling_minicpm.py of the MiniCPM checkpoints; transformers models/minicpm3/modular_minicpm3.py):
#   MiniCPMModel.forward:        inputs_embeds = self.embed_tokens(input_ids) * self.config.scale_emb
#   MiniCPMDecoderLayer.forward: hidden_states = residual + hidden_states * (self.scale_depth /
#                                math.sqrt(self.num_hidden_layers))   (after attention and after the MLP)
#   MiniCPMForCausalLM.forward:  logits = self.lm_head(hidden_states / (self.config.hidden_size /
#                                self.config.dim_model_base))
# Sublayers are toy tanh maps; norms are weightless RMSNorms.
def _toy_sublayers(p):
    return [(lambda h, w=p["attn"][i]: np.tanh(h @ w), lambda h, w=p["mlp"][i]: np.tanh(h @ w)) for i in range(L)]


def _minicpm_forward(tokens, p, scale_emb, scale_depth, dim_model_base, sublayers=None):
    """``sublayers``: per layer (attention, mlp) of the normed stream; default the toy tanh maps."""
    h = p["embed"][tokens] * scale_emb
    for attn, mlp in sublayers or _toy_sublayers(p):
        h = h + attn(_rms(h)) * (scale_depth / math.sqrt(L))
        h = h + mlp(_rms(h)) * (scale_depth / math.sqrt(L))
    return (_rms(h) / (D / dim_model_base)) @ p["head"].T


# Granite (transformers models/granite/modeling_granite.py): GraniteModel.forward inputs_embeds * embedding_multiplier;
# GraniteDecoderLayer.forward residual + hidden_states * residual_multiplier (both sublayers);
# GraniteForCausalLM.forward logits = lm_head(hidden_states) / logits_scaling.
def _granite_forward(tokens, p, embedding_multiplier, residual_multiplier, logits_scaling, sublayers=None):
    h = p["embed"][tokens] * embedding_multiplier
    for attn, mlp in sublayers or _toy_sublayers(p):
        h = h + attn(_rms(h)) * residual_multiplier
        h = h + mlp(_rms(h)) * residual_multiplier
    return (_rms(h) @ p["head"].T) / logits_scaling


def _posenc_forward(tokens, p, m):
    ones = jnp.ones(D)
    h = multipliers.scale(jnp.asarray(p["embed"], jnp.float32)[tokens], m.embedding)
    for i in range(L):
        for w in (p["attn"][i], p["mlp"][i]):
            h = multipliers.residual(h, jnp.tanh(norms.rms_norm(h, ones) @ w), m.residual)
    return multipliers.scale(norms.rms_norm(h, ones), m.logits) @ p["head"].T


def test_minicpm_matches_reference():
    p, tokens = _toy(0), np.array([[1, 5, 7, 2]])
    ref = _minicpm_forward(tokens, p, scale_emb=12.0, scale_depth=1.4, dim_model_base=2)
    m = multipliers.minicpm(hidden_size=D, num_layers=L, scale_emb=12, scale_depth=1.4, dim_model_base=2)
    assert m == multipliers.Multipliers(embedding=12.0, residual=1.4 / math.sqrt(L), logits=0.25)
    np.testing.assert_allclose(_posenc_forward(tokens, p, m), ref, rtol=1e-4, atol=1e-4)


def test_granite_matches_reference():
    p, tokens = _toy(1), np.array([[3, 3, 0, 12]])
    ref = _granite_forward(tokens, p, embedding_multiplier=6.0, residual_multiplier=0.3, logits_scaling=4.0)
    m = multipliers.granite(embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.05,
                            logits_scaling=4.0)
    np.testing.assert_allclose(_posenc_forward(tokens, p, m), ref, rtol=1e-4, atol=1e-4)
    assert multipliers.attention_scale(m, DH) == 0.05


def test_defaults_are_llama():
    assert multipliers.minicpm(hidden_size=D, num_layers=1) == multipliers.Multipliers()
    assert multipliers.granite() == multipliers.Multipliers()
    assert multipliers.attention_scale(multipliers.granite(), 16) == 0.25
    x = jnp.ones((2, D), jnp.bfloat16)
    assert multipliers.residual(x, jnp.ones((2, D), jnp.float32), 0.5).dtype == jnp.bfloat16


@pytest.mark.parametrize("call,match", [
    (lambda: multipliers.minicpm(hidden_size=D, num_layers=0), "num_layers"),
    (lambda: multipliers.minicpm(hidden_size=D, num_layers=2, scale_depth=0.0), "scale_depth"),
    (lambda: multipliers.granite(logits_scaling=-1.0), "logits_scaling"),
    (lambda: multipliers.granite(attention_multiplier=0), "attention_multiplier")])
def test_bad_values(call, match):
    with pytest.raises(ValueError, match=match):
        call()
