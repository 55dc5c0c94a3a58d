"""Self-Extend against a transcription of the official code (datamllab/LongLM, self_extend_patch/Llama.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from remap_checks import check_causal_and_local, check_logits, check_views, decode_rows, draw_shape, official_relative

from posenc import self_extend


def official_prefill(position_ids, group_size_1, group_size_2):
    """``self_extend_forward`` with q_len == kv_seq_len: its two logit sets (positions) and masks.

    group_size_1 = G, group_size_2 = W (the neighbor window), as the official names.
    """
    q_len = kv_seq_len = len(position_ids)
    query_position = key_position = np.asarray(position_ids)
    _re_group_size_2 = 0 if query_position.max() < group_size_2 else group_size_2
    group_query_position = query_position // group_size_1 + _re_group_size_2 - _re_group_size_2 / group_size_1
    group_key_position = key_position // group_size_1
    causal = np.tril(np.ones((q_len, kv_seq_len))).astype(bool)  # the HF causal attention_mask
    neighbor_attention_mask = np.tril(np.ones((q_len, kv_seq_len)))
    if q_len - group_size_2 > 0:
        group_attention_mask = np.tril(np.ones((q_len - group_size_2, kv_seq_len - group_size_2)))
        neighbor_attention_mask[group_size_2:, :-group_size_2] -= group_attention_mask
    neighbor_attention_mask = neighbor_attention_mask.astype(bool)
    return [(query_position, key_position, neighbor_attention_mask & causal),
            (group_query_position, group_key_position, ~neighbor_attention_mask & causal)]


def official_decode(t, group_size_1, group_size_2):
    """``self_extend_forward`` with q_len == 1: the query at position t, t + 1 cached keys at arange."""
    kv_seq_len = t + 1
    query_position = np.array([t])
    key_position = np.arange(kv_seq_len)
    _re_group_size_2 = 0 if query_position.max() < group_size_2 else group_size_2
    group_query_position = query_position // group_size_1 + _re_group_size_2 - _re_group_size_2 / group_size_1
    group_key_position = key_position // group_size_1
    neighbor_attention_mask = np.zeros((1, kv_seq_len))
    neighbor_attention_mask[:, -group_size_2:] = 1
    neighbor_attention_mask = neighbor_attention_mask.astype(bool)
    return [(query_position, key_position, neighbor_attention_mask),
            (group_query_position, group_key_position, ~neighbor_attention_mask)]


def official_flash_decode_relative(t, group_size_1, group_size_2):
    """``flash_self_extend_forward`` with q_len == 1: keys rotated back by these distances, query unrotated."""
    key_position = np.arange(t + 1)
    position_ids = np.array([t])
    neighbor_key_position = position_ids[-1] - key_position
    _re_group_size_2 = 0 if position_ids.max() < group_size_2 else group_size_2
    group_key_position = (position_ids[-1] // group_size_1 - key_position // group_size_1
                          + (_re_group_size_2 - _re_group_size_2 // group_size_1))
    return np.concatenate([group_key_position[:-group_size_2], neighbor_key_position[-group_size_2:]])


def _configs(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length, offset = draw_shape(rng)
        yield dict(length=length, offset=offset, group=int(rng.integers(1, 10)),
                   window=int(rng.integers(1, 21)), start=int(rng.choice([0, rng.integers(1, 60)])))


def test_matches_official_prefill_on_random_configs():
    # prefill rows offset.. of a prefill from position `start`: chunked prefill / decoding (q_offset > 0)
    for c in _configs(60, seed=0):
        pos = np.arange(c["start"], c["start"] + c["length"])
        want = official_relative(official_prefill(pos, c["group"], c["window"]))[c["offset"]:]
        got = self_extend.relative_positions(pos[c["offset"]:], pos, group=c["group"], window=c["window"])
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-5, err_msg=str(c))


@pytest.mark.parametrize("group,window", [(2, 4), (3, 4), (4, 1), (5, 7), (8, 16)])
def test_matches_official_decoding_rows(group, window):
    length = 40
    want = decode_rows(lambda t: official_decode(t, group, window), length)
    pos = jnp.arange(length)
    np.testing.assert_allclose(np.asarray(self_extend.relative_positions(pos, pos, group=group, window=window)),
                               want, rtol=1e-6, atol=1e-5)
    t = 33  # one cached step: a single query over its keys
    row = self_extend.relative_positions(jnp.array([t]), jnp.arange(t + 1), group=group, window=window)
    np.testing.assert_allclose(np.asarray(row)[0], want[t, :t + 1], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("group,window", [(3, 4), (4, 8), (5, 12), (2, 2)])
def test_official_flash_decoding_differs_by_the_fraction_of_window_over_group(group, window):
    # the official flash decoding path shifts by W - W // G, its other paths by W - W / G (posenc)
    t = 39
    got = np.asarray(self_extend.relative_positions(jnp.array([t]), jnp.arange(t + 1), group=group,
                                                    window=window))[0]
    flash = official_flash_decode_relative(t, group, window)
    grouped = t - np.arange(t + 1) >= window
    np.testing.assert_array_equal(got[~grouped], flash[~grouped])
    np.testing.assert_allclose(flash[grouped] - got[grouped], window / group - window // group, atol=1e-5)


def test_views_agree_and_logits_match_official():
    for i, c in enumerate(_configs(16, seed=1)):
        pos = np.arange(c["start"], c["start"] + c["length"])
        q = pos[c["offset"]:]
        kw = dict(group=c["group"], window=c["window"])
        regs = self_extend.regions(q, pos, **kw)
        check_views(self_extend.relative_positions(q, pos, **kw), regs, exact=c["window"] % c["group"] == 0)
        parts = [(qp[c["offset"]:], kp, m[c["offset"]:]) for qp, kp, m in official_prefill(pos, **_official(kw))]
        check_logits(parts, regs, seed=i)


def _official(kw):
    return dict(group_size_1=kw["group"], group_size_2=kw["window"])


def test_fractional_shift_uses_integer_positions_scaled_by_one_over_group():
    regs = self_extend.regions(jnp.arange(20), jnp.arange(20), group=3, window=4)
    assert [r.scale for r in regs] == [1.0, 1.0 / 3]
    np.testing.assert_array_equal(regs[1].k_positions, 3 * (np.arange(20) // 3))
    regs = self_extend.regions(jnp.arange(20), jnp.arange(20), group=4, window=8)
    assert [r.scale for r in regs] == [1.0, 1.0]
    np.testing.assert_array_equal(regs[1].q_positions, np.arange(20) // 4 + 6)


def test_properties():
    pos = np.arange(64)
    for group, window in [(1, 5), (2, 8), (3, 5), (7, 16)]:
        rel = np.asarray(self_extend.relative_positions(pos, pos, group=group, window=window))
        check_causal_and_local(rel, pos, pos, exact_below=window)
        # along a row, earlier keys are never closer; the two pieces meet at W (exactly when G | W)
        vis = np.where(np.isnan(rel), 0.0, rel)
        assert (np.diff(vis, axis=1)[np.tril(np.ones((64, 63)), -1).astype(bool)] <= 0).all()
        if window % group == 0:
            np.testing.assert_array_equal(np.diagonal(rel, -window), float(window))
        # grouped distances stay below the largest one a query at 63 can see
        assert np.nanmax(rel) <= 63 // group + window - window / group + 1e-5
    np.testing.assert_array_equal(  # G = 1 is plain RoPE
        np.asarray(self_extend.relative_positions(pos, pos, group=1, window=3)),
        np.where(pos[:, None] >= pos[None, :], (pos[:, None] - pos[None, :]).astype(np.float32), np.nan))


def test_batch_dims_and_jit():
    q = jnp.stack([jnp.arange(5, 13), jnp.arange(100, 108)])  # [2, 8]
    k = jnp.arange(13)
    f = functools.partial(self_extend.relative_positions, group=3, window=4)
    got = jax.jit(f)(q, k)
    assert got.shape == (2, 8, 13) and got.dtype == jnp.float32
    for b in range(2):
        np.testing.assert_array_equal(got[b], f(q[b], k))
    regs = jax.jit(functools.partial(self_extend.regions, group=3, window=4))(q, k)
    assert regs[1].q_positions.shape == (2, 8) and regs[1].mask.shape == (2, 8, 13)


@pytest.mark.parametrize("kw,match", [
    (dict(group=0, window=4), "group must be an integer >= 1; got 0"),
    (dict(group=2.0, window=4), "group must be an integer"),
    (dict(group=2, window=0), "window must be an integer >= 1; got 0"),
])
def test_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        self_extend.relative_positions(jnp.arange(4), jnp.arange(4), **kw)
    with pytest.raises(ValueError, match=match):
        self_extend.regions(jnp.arange(4), jnp.arange(4), **kw)


def test_float_positions_are_refused():
    with pytest.raises(ValueError, match="q_positions must be an integer array"):
        self_extend.relative_positions(jnp.arange(4.0), jnp.arange(4), group=2, window=2)
