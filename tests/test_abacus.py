"""Abacus embeddings against the official module (mcleish7/arithmetic), in pieces and in the decoder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc import abacus
from posenc.model import Decoder, ModelSpec

DIGITS = tuple(range(4, 14))  # the official tokenizer's '0': 4 ... '9': 13


def official_indices(input_ids, digits, k=0):
    """``Abacus.helper`` + ``Abacus.forward`` of mcleish7/arithmetic (abacus.py), transcribed to numpy.

    ``torch.isin`` digit mask; a run starts where the mask turns on; ``cumsum``
    of starts gives segment ids; ``scatter_add`` stores each segment's start
    index; the position in the segment is ``index - start + 1``, times the
    mask; at training ``output[output > 0] += k``.
    """
    input_ids = np.asarray(input_ids)
    mask = np.isin(input_ids, np.asarray(digits))
    B, L = mask.shape
    shifted = np.concatenate([np.zeros((B, 1), bool), mask[:, :-1]], axis=1)
    starts = (shifted != mask) & mask
    segment_ids = np.cumsum(starts, axis=1)
    index = np.tile(np.arange(L), (B, 1))
    reset_index = np.zeros((B, L), np.int64)
    second_term = index * starts
    for b in range(B):  # torch scatter_add(1, segment_ids, second_term)
        np.add.at(reset_index[b], segment_ids[b], second_term[b])
    positions = index - np.take_along_axis(reset_index, segment_ids, axis=1) + 1
    result = positions * mask
    result[result > 0] += k
    return result


def _random_tokens(seed, shape=(16, 40), vocab=20):
    # Ids 0..vocab-1: the digits 4..13 and non-digits around them, so runs of every length occur.
    return np.random.default_rng(seed).integers(0, vocab, shape)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [0, 1, 37])
def test_indices_equal_the_official_module(seed, k):
    tokens = _random_tokens(seed)
    ids, carry = abacus.indices(tokens, DIGITS, offset=k)
    expected = official_indices(tokens, DIGITS, k)
    np.testing.assert_array_equal(np.asarray(ids), expected)
    runs = np.asarray(abacus.run_lengths(tokens, DIGITS)[0])
    np.testing.assert_array_equal(np.asarray(carry), runs[:, -1])
    assert expected.max() > 3 + k  # the sequences have runs of several digits


def test_indices_with_other_digit_ids_and_golden_rows():
    # The standalone abacus.py takes any digit ids (torch.isin); here 7, 8, 9 are digits.
    tokens = np.array([[1, 7, 8, 9, 2, 9, 9, 3, 7], [7, 7, 0, 0, 8, 1, 8, 8, 8]])
    ids, carry = abacus.indices(tokens, (7, 8, 9))
    np.testing.assert_array_equal(np.asarray(ids), [[0, 1, 2, 3, 0, 1, 2, 0, 1], [1, 2, 0, 0, 1, 0, 1, 2, 3]])
    np.testing.assert_array_equal(np.asarray(ids), official_indices(tokens, (7, 8, 9)))
    np.testing.assert_array_equal(np.asarray(carry), [1, 3])
    # a per-example offset moves only the digits of its example
    ids, _ = abacus.indices(tokens, (7, 8, 9), offset=jnp.array([10, 0]))
    np.testing.assert_array_equal(np.asarray(ids)[0], [0, 11, 12, 13, 0, 11, 12, 0, 11])


@pytest.mark.parametrize("cut", [1, 5, 13, 39])
def test_indices_in_pieces_with_the_carry_equal_one_pass(cut):
    tokens = _random_tokens(7)
    whole, last = abacus.indices(tokens, DIGITS, offset=3)
    a, carry = abacus.indices(tokens[:, :cut], DIGITS, offset=3)
    b, carry2 = abacus.indices(tokens[:, cut:], DIGITS, offset=3, carry=carry)
    np.testing.assert_array_equal(np.concatenate([a, b], axis=1), np.asarray(whole))
    np.testing.assert_array_equal(np.asarray(carry2), np.asarray(last))


def test_index_of_a_token_depends_on_no_later_token():
    tokens = _random_tokens(3, shape=(1, 30))
    base = np.asarray(abacus.indices(tokens, DIGITS)[0])
    for t in range(29):
        changed = tokens.copy()
        changed[0, t + 1:] = np.random.default_rng(t).integers(0, 20, 29 - t)
        np.testing.assert_array_equal(np.asarray(abacus.indices(changed, DIGITS)[0])[0, :t + 1],
                                      base[0, :t + 1])


def test_offsets_are_uniform_on_0_to_max_k_per_batch_or_per_example():
    keys = jax.random.split(jax.random.key(0), 2000)
    ks = np.asarray(jax.vmap(lambda k: abacus.offsets(k, max_k=4))(keys))
    assert ks.shape == (2000,) and set(ks.tolist()) == {0, 1, 2, 3, 4}
    assert np.all(np.abs(np.bincount(ks) / 2000 - 0.2) < 0.04)
    per_example = np.asarray(abacus.offsets(jax.random.key(1), (64,), max_k=100, per="example"))
    assert per_example.shape == (64,) and len(set(per_example.tolist())) > 20
    assert per_example.min() >= 0 and per_example.max() <= 100
    with pytest.raises(ValueError, match="unknown per .token.; choose one of: batch, example"):
        abacus.offsets(jax.random.key(0), max_k=3, per="token")
    with pytest.raises(ValueError, match="digits must be a non-empty"):
        abacus.run_lengths(np.zeros((1, 3), int), ())


# ----------------------------------------------------------------------------- the model unit


def _model(**options):
    cfg = helpers.model_cfg("abacus", position=dict(table_size=64, max_k=20, **options))
    return Decoder(ModelSpec.from_config(cfg, train_length=16), rngs=nnx.Rngs(0))


def test_the_unit_adds_the_table_row_of_each_official_index():
    model = _model()
    tokens = jnp.asarray(_random_tokens(2, shape=(2, 12), vocab=16))
    unit = model.input_encoding
    rows, _ = unit.token_embed(tokens, jnp.arange(12)[None], 32)
    table = np.asarray(unit.table[...])
    np.testing.assert_allclose(np.asarray(rows), table[official_indices(tokens, DIGITS)], rtol=0, atol=0)
    # the key draws k (per batch by default); without a key, k = 0
    key = jax.random.key(5)
    k = int(abacus.offsets(key, max_k=20))
    rows, _ = unit.token_embed(tokens, None, 32, key=key)
    np.testing.assert_allclose(np.asarray(rows), table[official_indices(tokens, DIGITS, k)], rtol=0, atol=0)


def test_training_key_changes_the_logits_evaluation_is_deterministic():
    model = _model()
    tokens = jnp.asarray(_random_tokens(4, shape=(2, 12), vocab=16))
    plain = np.asarray(model(tokens))
    np.testing.assert_array_equal(plain, np.asarray(model(tokens)))
    trained = [np.asarray(model(tokens, key=jax.random.key(s))) for s in range(3)]
    np.testing.assert_array_equal(trained[0], np.asarray(model(tokens, key=jax.random.key(0))))
    assert all(np.abs(t - plain).max() > 1e-4 for t in trained)
    # per example: the two examples get their own offsets (k = 0 for one would leave it unchanged)
    per = _model(offset_per="example")
    a = np.asarray(per(tokens, key=jax.random.key(9)))
    ks = np.asarray(abacus.offsets(jax.random.key(9), (2,), max_k=20, per="example"))
    assert ks[0] != ks[1]
    row0 = np.asarray(per(tokens[:1], key=None))
    assert (ks[0] == 0) == np.allclose(a[:1], row0)


def test_decoding_carries_the_digit_run_across_calls():
    model = _model()
    # a run of digits that crosses the prefill / step boundary
    tokens = jnp.array([[1, 5, 6, 7, 8, 9, 2, 4, 4, 3], [6, 6, 6, 6, 6, 6, 6, 6, 6, 6]])
    g, state = nnx.split(model)

    @jax.jit
    def run(state):
        m = nnx.merge(g, state)
        return m(tokens), *helpers.decode_stepwise(m, tokens, 3, 12)

    full, cached, cache = run(state)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=1e-5, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(cache["input_state"]["run"]), [0, 10])


def test_options_are_checked():
    with pytest.raises(ValueError, match=r"model.position.abacus.table_size 10 leaves no row"):
        _model_cfg = helpers.model_cfg("abacus", position=dict(table_size=10, max_k=9))
        ModelSpec.from_config(_model_cfg)
    with pytest.raises(ValueError, match=r"model.position.abacus.digits must be a non-empty tuple"):
        ModelSpec.from_config(helpers.model_cfg("abacus", position=dict(digits=())))
    with pytest.raises(ValueError,
                       match=r"unknown model.position.abacus.offset_per .token.; choose one of: batch, example"):
        ModelSpec.from_config(helpers.model_cfg("abacus", position=dict(offset_per="token")))


def test_abacus_beside_fire_layers():
    # The paper's Abacus + FIRE: the per-layer kinds run beside the input unit.
    cfg = helpers.model_cfg("abacus", position=dict(table_size=64, max_k=20))
    cfg.position.layer_kinds = ("fire", "fire")
    spec = ModelSpec.from_config(cfg, train_length=16)
    assert spec.position.layer_kinds == ("fire", "fire") and spec.position.kinds == ("abacus", "fire")
    model = Decoder(spec, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(_random_tokens(1, shape=(2, 12), vocab=16))
    assert np.isfinite(np.asarray(model(tokens, key=jax.random.key(0)))).all()
    assert type(model.blocks[0].attn.encoding).name == "fire"
