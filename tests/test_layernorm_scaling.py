"""posenc.layernorm_scaling against the LNS decoder layer of lmsdss/LayerNorm-Scaling."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import layernorm_scaling, norms

D = 8


def _np_rms(x, w, eps=1e-6):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


# lmsdss/LayerNorm-Scaling at 3ac54dde961b04780b152bc8b38b71b2f8e1c16a, peft_pretraining/modeling_llama.py,
# LlamaDecoderLayer.forward, norm_type 'LNS' (layer_index counts from 0):
#     residual = h; h = input_layernorm(h); h = 1 / math.sqrt(layer_index + 1) * h; h = residual + self_attn(h)
#     residual = h; h = post_attention_layernorm(h); h = 1 / math.sqrt(layer_index + 1) * h
#     h = residual + mlp(h)
def _official_lns_layer(h, layer_index, attn, mlp, w1, w2):
    residual = h
    h = _np_rms(h, w1)
    h = 1 / math.sqrt(layer_index + 1) * h
    h = residual + attn(h)
    residual = h
    h = _np_rms(h, w2)
    h = 1 / math.sqrt(layer_index + 1) * h
    return residual + mlp(h)


@pytest.mark.parametrize("layer_index", [0, 3, 11])
def test_block_matches_official_lns_layer(layer_index):
    rng = np.random.default_rng(layer_index)
    x = rng.normal(size=(2, 3, D)).astype(np.float32)
    wa, wm = (rng.normal(size=(D, D)).astype(np.float32) for _ in range(2))
    w1, w2 = (rng.uniform(0.5, 1.5, D).astype(np.float32) for _ in range(2))
    ref = _official_lns_layer(x.astype(np.float64), layer_index, lambda h: np.tanh(h @ wa), lambda h: h @ wm,
                              w1, w2)
    got = layernorm_scaling.block(
        jnp.asarray(x), lambda h: jnp.tanh(h @ wa), lambda h: h @ wm,
        lambda h: norms.rms_norm(h, w1), lambda h: norms.rms_norm(h, w2), layer_index=layer_index)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_factor_one_based_values_and_traced_index():
    assert layernorm_scaling.factor(0) == 1.0
    assert layernorm_scaling.factor(3) == 0.5
    idx = jnp.arange(4)
    np.testing.assert_allclose(jax.jit(layernorm_scaling.factor)(idx), 1 / np.sqrt([1, 2, 3, 4]), rtol=1e-6)
    # under a scan over layers the index is traced: the scaled output of layer 8 is a third of its norm
    ys = jax.lax.map(lambda i: layernorm_scaling.scale(jnp.full((D,), 3.0, jnp.bfloat16), i), jnp.array([0, 8]))
    assert ys.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(ys, np.float32)[:, 0], [3.0, 1.0], rtol=1e-2)


@pytest.mark.parametrize("bad", [-1, 1.0, True, "2", jnp.array([1.0])])
def test_factor_rejects_bad_layer_index(bad):
    with pytest.raises(ValueError, match="layer_index"):
        layernorm_scaling.factor(bad)
