"""KV-cache decoding: prefill + steps give the logits of the full forward pass (scaled RoPE,
dynamic re-rotation, the cache's pytree and limits; every encoding: tests/test_conformance.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc.model import Decoder, ModelSpec

L, PREFILL, OFFSET, MAX_LEN = 8, 5, 7, 11


def small_config(kind, placement="pre", norm="rms", **position):
    return helpers.model_cfg(kind, position=position, norm=dict(placement=placement, kind=norm),
                             num_kv_heads=2)


def spec(cfg, train_length=4):
    # training length 4: RoPE scalings that need an original length get 4 (< every prefix here)
    return ModelSpec.from_config(cfg, train_length=train_length)


def _tokens(batch=2, length=L):
    return jax.random.randint(jax.random.key(3), (batch, length), 0, 16)


# Cached decoding == the full forward for every registered encoding (token by token and in
# pieces, each with a norm placement and norm kind in turn) is a check of
# posenc.model.check_encoding: tests/test_conformance.py runs it over the registry.


@pytest.mark.smoke
def test_cached_decoding_with_scaled_rope_and_gaps_in_positions():
    """Static scaling (YaRN), partial rotary and non-contiguous positions given to decode."""
    cfg = small_config("rope", scaling="yarn", factor=4.0, rotary_fraction=0.5)
    positions = jnp.array([0, 3, 4, 9, 10, 11, 20, 21])
    model = Decoder(spec(cfg), rngs=nnx.Rngs(1))
    tokens = _tokens()
    full = model(tokens, positions)
    cache = model.init_cache(2, MAX_LEN)
    first, cache = model.decode(tokens[:, :PREFILL], cache, positions[:PREFILL])
    outs = [first]
    for t in range(PREFILL, L):
        out, cache = model.decode(tokens[:, t:t + 1], cache, positions[t:t + 1])
        outs.append(out)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(full),
                               rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("scaling", ["dynamic", "dynamic_yarn"])
def test_dynamic_scaling_rerotates_the_cache(scaling):
    """Step t equals the full forward of the prefix of length t + 1 (keys re-rotated).

    original_length 4 < every prefix length here, so the frequencies change at
    each step; keeping keys rotated under an older base would not match.
    """
    # dynamic_yarn derives its factor from the length: its scaling_factor stays 1.
    factor = 2.0 if scaling == "dynamic" else 1.0
    cfg = small_config("rope", scaling=scaling, **({"factor": factor} if scaling == "dynamic" else {}))
    cfg.num_layers = 1
    model = Decoder(spec(cfg), rngs=nnx.Rngs(2))
    tokens = _tokens()
    positions = OFFSET + jnp.arange(L)
    cache = model.init_cache(2, MAX_LEN)
    out, cache = model.decode(tokens[:, :PREFILL], cache, positions[:PREFILL])
    prefix = model(tokens[:, :PREFILL], positions[:PREFILL])
    np.testing.assert_allclose(np.asarray(out), np.asarray(prefix), rtol=1e-5, atol=2e-5)
    for t in range(PREFILL, L):
        out, cache = model.decode(tokens[:, t:t + 1], cache)
        prefix_next = model(tokens[:, :t + 1], positions[:t + 1])
        np.testing.assert_allclose(np.asarray(out[:, 0]), np.asarray(prefix_next[:, t]),
                                   rtol=1e-5, atol=2e-5)
        # The length-dependent frequencies really change the earlier logits.
        assert float(jnp.abs(prefix_next[:, t - 1] - prefix[:, t - 1]).max()) > 1e-4
        prefix = prefix_next


def test_cache_is_a_plain_pytree_and_overflow_raises():
    model = Decoder(small_config("alibi"), rngs=nnx.Rngs(0))
    cache = model.init_cache(2, 4)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(cache))
    assert len(cache["k"]) == 2 and cache["k"][0].shape == (2, 4, 2, 8)
    _, cache = model.decode(_tokens(length=3), cache)
    with pytest.raises(ValueError, match="cache overflow: length 3 \\+ 2 tokens > max_length 4"):
        model.decode(_tokens(length=2), cache)


def test_learned_positions_past_the_table_raise_at_init_cache():
    model = Decoder(small_config("learned", max_length=8), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="exceeds what the position encoding can represent"):
        model.init_cache(1, 9)
