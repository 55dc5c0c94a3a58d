"""KV-cache decoding: prefill + steps give the logits of the full forward pass."""

import itertools

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import registry
from posenc.model import ENCODINGS, Decoder, ModelSpec

L, PREFILL, OFFSET, MAX_LEN = 8, 5, 7, 11


def small_config(kind, placement="pre", norm="rms", **position):
    return helpers.model_cfg(kind, position=position, norm=dict(placement=placement, kind=norm),
                             num_kv_heads=2)


def spec(cfg, train_length=4):
    # training length 4: RoPE scalings that need an original length get 4 (< every prefix here)
    return ModelSpec.from_config(cfg, train_length=train_length)


def _tokens(batch=2, length=L):
    return jax.random.randint(jax.random.key(3), (batch, length), 0, 16)


def _full_and_cached(cfg, positions, perturb=0.02):
    """One jit: full-forward logits and prefill + step-by-step cached logits, [B, L, V] each.

    Parameters are perturbed so that zero-initialised ones (CoPE embeddings) take part."""
    model = Decoder(spec(cfg, train_length=MAX_LEN + OFFSET + 1), rngs=nnx.Rngs(0))
    if perturb:
        helpers.perturb_params(model, jax.random.key(7), perturb)
    g, state = nnx.split(model)
    tokens = _tokens()

    @jax.jit
    def run(state, tokens):
        m = nnx.merge(g, state)
        return (m(tokens, positions), *helpers.decode_stepwise(m, tokens, PREFILL, MAX_LEN, positions))

    return run(state, tokens)


# Every encoding, and every placement and norm kind, with as few models as possible:
# encodings are paired with placements and norms in turn.
_PLACEMENTS = itertools.cycle(registry.PLACEMENTS)
_NORMS = itertools.cycle(registry.NORM_KINDS)
CASES = [(kind, next(_PLACEMENTS), next(_NORMS)) for kind in sorted(ENCODINGS)]  # plugins included


def test_cases_cover_every_placement_and_norm():
    assert {p for _, p, _ in CASES} == set(registry.PLACEMENTS)
    assert {n for _, _, n in CASES} == set(registry.NORM_KINDS)


@pytest.mark.parametrize("kind,placement,norm", CASES)
def test_cached_decoding_equals_full_forward(kind, placement, norm):
    positions = OFFSET + jnp.arange(L)
    full, cached, cache = _full_and_cached(small_config(kind, placement, norm), positions)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=1e-5, atol=2e-5)
    assert int(cache["length"]) == L
    np.testing.assert_array_equal(np.asarray(cache["positions"][0, :L]), np.asarray(positions))


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
