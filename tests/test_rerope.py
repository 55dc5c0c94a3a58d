"""ReRoPE / Leaky ReRoPE against a transcription of the official code (bojone/rerope)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from remap_checks import check_causal_and_local, check_logits, check_views, draw_shape, official_relative

from posenc import rerope


def official_prefill(position_ids, q_len, window, scaling_factor=None):
    """``forward_with_rerope`` / ``forward_with_leaky_rerope`` with q_len > 1 (prefill, also after a cache).

    position_ids: the positions of every key (the cached ones then the new ones); the queries are the
    last q_len. Returns the two logit sets' positions and the rectified mask |p_i - p_j| < window,
    with the causal attention_mask.
    """
    p = np.asarray(position_ids)
    pq = p[-q_len:]
    causal = pq[:, None] >= p[None, :]
    rectified_mask = np.abs(pq[:, None] - p[None, :]) < window
    if scaling_factor is None:  # q2 at position_ids * 0 + window, key_states2 unrotated
        second = (pq * 0 + window, np.zeros(len(p)))
    else:  # rotary_emb2: linear scaling (positions / k); q2 at position_ids + offset, k2 at position_ids
        offset = window * (scaling_factor - 1)
        second = ((pq + offset) / scaling_factor, p / scaling_factor)
    return [(pq, p, rectified_mask & causal), (*second, ~rectified_mask & causal)]


def official_decode(position_ids, window, scaling_factor=None):
    """The q_len == 1 path: keys rotated by minus a per-key distance, the query unrotated."""
    p = np.asarray(position_ids)
    kv_seq_len = len(p)
    if scaling_factor is None:
        distance = np.clip(p[-1:] - p, None, window)
    else:
        offset = int(window * (scaling_factor - 1))  # a slice index: the official code needs an integer
        t = np.arange(kv_seq_len)  # rotary_emb(seq_len=kv_seq_len)
        t2 = np.arange(kv_seq_len + offset) / scaling_factor  # rotary_emb2(seq_len=kv_seq_len + offset)
        table = np.concatenate([t[:window], t2[window + offset:]])
        distance = table[p[-1:] - p]
    return [(np.zeros(1), -distance, np.ones((1, kv_seq_len), bool))]


def _configs(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length, offset = draw_shape(rng)
        window = int(rng.integers(1, 25))
        leaky = [None, None, 2, 3, 16, 1.5][int(rng.integers(6))]
        if leaky == 1.5:
            window += window % 2  # window * (leaky - 1) must be an integer
        yield dict(length=length, offset=offset, window=window, leaky=leaky,
                   start=int(rng.choice([0, rng.integers(1, 5000)])))


def test_matches_official_prefill_and_decoding_on_random_configs():
    for c in _configs(60, seed=0):
        pos = np.arange(c["start"], c["start"] + c["length"])
        q = pos[c["offset"]:]
        got = np.asarray(rerope.relative_positions(q, pos, window=c["window"], leaky=c["leaky"]))
        want = official_relative(official_prefill(pos, len(q), c["window"], c["leaky"]))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5, err_msg=str(c))
        step = official_relative(official_decode(pos, c["window"], c["leaky"]))  # the last query, decoding
        np.testing.assert_allclose(got[-1:], step, rtol=1e-6, atol=1e-5, err_msg=str(c))


def test_views_agree_and_logits_match_official():
    for i, c in enumerate(_configs(16, seed=1)):
        pos = np.arange(c["start"] % 300, c["start"] % 300 + c["length"])
        q = pos[c["offset"]:]
        kw = dict(window=c["window"], leaky=c["leaky"])
        regs = rerope.regions(q, pos, **kw)
        check_views(rerope.relative_positions(q, pos, **kw), regs, exact=c["leaky"] is None)
        check_logits(official_prefill(pos, len(q), c["window"], c["leaky"]), regs, seed=i)


def test_properties():
    pos = np.arange(50)
    for window in (1, 4, 17):
        rel = np.asarray(rerope.relative_positions(pos, pos, window=window))
        check_causal_and_local(rel, pos, pos, exact_below=window)
        assert np.nanmax(rel) == window
        for leaky in (2, 16):
            lk = np.asarray(rerope.relative_positions(pos, pos, window=window, leaky=leaky))
            check_causal_and_local(lk, pos, pos, exact_below=window)
            d = pos[:, None] - pos[None, :]
            far = d >= window
            np.testing.assert_allclose(lk[far], window + (d[far] - window) / leaky, rtol=1e-6)
    # only the distance matters: shifting every position changes nothing
    a = rerope.relative_positions(pos + 12345, pos + 12345, window=5, leaky=4)
    np.testing.assert_array_equal(a, rerope.relative_positions(pos, pos, window=5, leaky=4))


def test_batch_dims_and_jit():
    q = jnp.stack([jnp.arange(5, 13), jnp.arange(100, 108)])
    k = jnp.stack([jnp.arange(13), jnp.arange(95, 108)])
    f = functools.partial(rerope.relative_positions, window=3, leaky=2)
    got = jax.jit(f)(q, k)
    assert got.shape == (2, 8, 13)
    for b in range(2):
        np.testing.assert_array_equal(got[b], f(q[b], k[b]))


@pytest.mark.parametrize("kw,match", [
    (dict(window=0), "window must be an integer >= 1; got 0"),
    (dict(window=4, leaky=1), "leaky must be a finite number > 1"),
    (dict(window=4, leaky="2"), "leaky must be a finite number > 1"),
    (dict(window=3, leaky=1.5), r"window \* \(leaky - 1\) must be an integer"),
])
def test_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        rerope.relative_positions(jnp.arange(4), jnp.arange(4), **kw)
    with pytest.raises(ValueError, match=match):
        rerope.regions(jnp.arange(4), jnp.arange(4), **kw)
