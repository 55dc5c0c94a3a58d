"""The multi-axis units (mrope, rope_2d) in the decoder: positions [B, L, A] through the dense, blocked
and cached paths; M-RoPE with the same ids on every axis is RoPE; each axis is relative on its own; the
units equal their pure functions (posenc.mrope); the model's axis rules (last A axes, axis 0 for
one-axis units, one A per model)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc import mrope, rope
from posenc.model import Decoder, ModelSpec
from posenc.model import cache as cache_lib

B, L = 2, 9
# a text run, a 2 x 3 grid, text again (Qwen2-VL's get_rope_index): differs by axis
IDS = jnp.asarray(mrope.position_ids([2, (1, 2, 3), 1]).T)  # [L, 3]
UNITS = [("mrope", {}), ("mrope", {"interleaved": True}), ("rope_2d", {}),
         ("rope_2d", {"variant": "mixed"})]


def _positions(axes):
    return jnp.broadcast_to(IDS[:, 3 - axes:], (B, L, axes)) + jnp.arange(B)[:, None, None]


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mrope_with_one_axis_positions_is_rope(layout):
    """Text tokens (the same id on every axis) make M-RoPE plain RoPE, as Qwen2-VL's: the same logits."""
    tokens = helpers.tokens(B, L)
    pos = jnp.asarray([[0, 1, 2, 5, 6, 9, 10, 11, 20]] * B) + jnp.arange(B)[:, None]
    got = helpers.decoder("mrope", position={"layout": layout}, seed=3)(tokens, pos)
    want = helpers.decoder("rope", position={"layout": layout}, seed=3)(tokens, pos)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(got, helpers.decoder("mrope", position={"layout": layout}, seed=3)(
        tokens, _positions(3)), atol=1e-3)  # the axes matter


@pytest.mark.parametrize("kind,opts", UNITS)
def test_units_equal_their_pure_functions(kind, opts):
    model = helpers.decoder(kind, position=opts, num_kv_heads=2, perturb=0.05)
    unit = model.blocks[0].attn.encoding
    axes = model.position_axes
    pos = _positions(axes)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(B, L, 4, model.head_dim)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(B, L, 2, model.head_dim)), jnp.float32)
    got_q, got_k = unit.qk(q, k, pos, pos, seq_len=None)
    p = jnp.moveaxis(pos, -1, 0)
    d = model.head_dim
    if kind == "mrope":
        f = d // 2
        side = f * 5 // 16 if opts.get("interleaved") else f * 3 // 8
        kw = dict(sections=(f - 2 * side, side, side), interleaved=opts.get("interleaved", False))
        inv = rope.frequencies("default", d)[0]
        want = [mrope.apply(x, p, inv, **kw) for x in (q, k)]
    elif opts.get("variant") == "mixed":
        freqs = unit.freqs[...]
        want = [mrope.apply_mixed(q, p, jnp.repeat(freqs, 2, axis=1), layout="interleaved"),
                mrope.apply_mixed(k, p, freqs, layout="interleaved")]
    else:
        want = [mrope.apply(x, p, mrope.axial_frequencies(d), sections=(d // 4, d // 4), layout="interleaved")
                for x in (q, k)]
    np.testing.assert_allclose(got_q, want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_k, want[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind,opts", UNITS)
def test_each_axis_is_relative_on_its_own_and_cached_decoding_equals_the_forward(kind, opts):
    model = helpers.decoder(kind, position=opts, perturb=0.05)
    tokens, axes = helpers.tokens(B, L), model.position_axes
    pos = _positions(axes)
    base = model(tokens, pos)
    for a in range(axes):  # one axis moved, the others kept: the same logits (dense and blocked)
        moved = pos.at[..., a].add(1000 + 37 * a)
        np.testing.assert_allclose(model(tokens, moved), base, atol=2e-4)
    blocked = helpers.decoder(kind, position=opts, perturb=0.05, attention_impl="blocked", attention_block=4)
    np.testing.assert_allclose(blocked(tokens, pos), base, rtol=2e-5, atol=2e-5)
    cache = model.init_cache(B, L + 2)
    assert cache["positions"].shape == (B, L + 2, axes)
    outs = []
    for s, e in ((0, 4), (4, 5), (5, L)):  # a prefill, one step, the rest: every piece at its ids
        out, cache = model.decode(tokens[:, s:e], cache, pos[:, s:e])
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), base, rtol=1e-5, atol=2e-5)
    np.testing.assert_array_equal(cache["positions"][:, :L], pos)


def test_decoding_continues_after_the_largest_id_on_every_axis():
    """Qwen2-VL: text after an image continues at the largest id + 1, the same on every axis."""
    cache = cache_lib.init(1, B, 6, 1, 4, jnp.float32, position_axes=3)
    cache["positions"] = cache["positions"].at[:, :3].set(jnp.asarray([[2, 2, 2], [2, 2, 3], [2, 7, 3]]))
    cache["length"] = jnp.asarray(3, jnp.int32)
    np.testing.assert_array_equal(cache_lib.next_positions(cache, 2),
                                  np.broadcast_to([[8, 8, 8], [9, 9, 9]], (B, 2, 3)))
    model = helpers.decoder("mrope")
    tokens = helpers.tokens(B, L)
    ids = jnp.broadcast_to(IDS, (B, L, 3))
    head, cache = model.decode(tokens[:, :8], model.init_cache(B, L), ids[:, :8])  # text, then the grid
    tail, _ = model.decode(tokens[:, 8:], cache)  # no ids: the text continues after the grid
    np.testing.assert_allclose(jnp.concatenate([head, tail], 1), model(tokens, ids), rtol=1e-5, atol=2e-5)


def test_a_unit_reads_the_last_axes_and_one_axis_units_read_axis_0():
    tokens = helpers.tokens(B, L)
    model = helpers.decoder("rope_2d")
    np.testing.assert_array_equal(model(tokens, _positions(3)), model(tokens, _positions(2)))
    cfg = helpers.model_cfg("rope_2d", num_layers=3)
    cfg.position.layers = ({"layers": (1,), "kind": "alibi"},)
    model = Decoder(ModelSpec.from_config(cfg, train_length=16), rngs=nnx.Rngs(1))
    assert model.position_axes == 2 and model.reads_axes == (False, True, False, True)  # no input unit
    pos = _positions(2)
    logits = model(tokens, pos)
    # the ALiBi layer reads axis 0 (the row): logits equal those of its layer given axis 0 alone
    h = jax.random.normal(jax.random.key(0), (B, L, 32))
    attn = model.blocks[1].attn
    np.testing.assert_array_equal(attn.forward(h, model._unit_positions(2, pos), seq_len=None),
                                  attn.forward(h, pos[..., 0], seq_len=None))
    moved = pos.at[..., 1].add(3)  # the column moves: ALiBi's layer sees nothing, rope_2d is relative
    np.testing.assert_allclose(model(tokens, moved), logits, atol=2e-4)
    assert not np.allclose(model(tokens, pos.at[:, 4:, 0].add(3)), logits, atol=1e-3)  # ALiBi reads rows


def test_a_model_reads_one_number_of_axes_and_positions_of_too_few_fail():
    cfg = helpers.model_cfg("mrope")
    cfg.position.layers = ({"layers": (1,), "kind": "rope_2d"},)
    with pytest.raises(ValueError, match="must read the same number of position axes; got 'rope_2d': 2, 'mrope': 3"):
        ModelSpec.from_config(cfg, train_length=16)
    with pytest.raises(ValueError, match=r"reading 3 position axes must have shape .* got \(2, 9, 2\)"):
        helpers.decoder("mrope")(helpers.tokens(B, L), _positions(2))
    with pytest.raises(ValueError, match=r"mrope.sections \(2, 2, 2\) must sum to head_dim / 2 = 4"):
        helpers.spec("mrope", position={"sections": (2, 2, 2)})
    with pytest.raises(ValueError, match="interleaved sections"):
        helpers.spec("mrope", position={"sections": (1, 1, 2), "interleaved": True})
