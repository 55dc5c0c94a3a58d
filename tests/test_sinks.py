"""StreamingLLM and LM-Infinite against transcriptions of the official code.

StreamingLLM: mit-han-lab/streaming-llm (examples/eval_long_ppl.py loop, streaming_llm/kv_cache.py
StartRecentKVCache, streaming_llm/pos_shift/modify_llama.py). LM-Infinite: Glaciohound/LM-Infinite
(models/llama.py limited_distance_forward, models/lambda_attention.py Lambda_Attention_Matrix).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from remap_checks import (
    check_causal_and_local,
    check_logits,
    check_views,
    draw_shape,
    official_relative,
    region_logits,
    rope_np,
)

from posenc import sinks

# ---------------------------------------------------------------- StreamingLLM

def official_streaming(length, start_size, recent_size):
    """The official streaming loop, one token per step: per step, the query's RoPE position and the keys
    (token index, RoPE position) it attends to.

    ``llama_pos_shift_attention_forward``: the query at position_ids = the cache length (Hugging Face's
    past_key_values_length), keys at their cache slots (arange(kv_seq_len)); after each step
    ``StartRecentKVCache.__call__`` keeps the first start_size and the last recent_size entries.
    """
    cache = []  # token index held in each slot
    steps = []
    for idx in range(length):
        position_ids = len(cache)
        keys = cache + [idx]
        key_position_ids = np.arange(len(keys))
        steps.append((position_ids, np.array(keys), key_position_ids))
        seq_len = len(keys)
        if seq_len <= start_size + recent_size:
            cache = keys
        else:
            cache = keys[:start_size] + keys[seq_len - recent_size:seq_len]
    return steps


def streaming_relative(steps, length):
    out = np.full((length, length), np.nan)
    for t, (qp, keys, kp) in enumerate(steps):
        out[t, keys] = qp - kp
    return out


def streaming_logits(steps, q, k, inv_freq):
    out = np.full((q.shape[0], k.shape[0]), np.nan)
    for t, (qp, keys, kp) in enumerate(steps):
        out[t, keys] = rope_np(q[t:t + 1], [qp], inv_freq) @ rope_np(k[keys], kp, inv_freq).T
    return out


def _streaming_configs(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length, offset = draw_shape(rng)
        yield dict(length=length, offset=offset, sinks=int(rng.integers(0, 6)), window=int(rng.integers(0, 20)))


def test_streaming_matches_official_cache_loop_on_random_configs():
    for c in _streaming_configs(60, seed=0):
        want = streaming_relative(official_streaming(c["length"], c["sinks"], c["window"]), c["length"])
        pos = np.arange(c["length"])
        got = sinks.relative_positions(pos[c["offset"]:], pos, sinks=c["sinks"], window=c["window"])
        np.testing.assert_array_equal(np.asarray(got), want[c["offset"]:].astype(np.float32), err_msg=str(c))


def test_streaming_views_agree_and_logits_match_official():
    rng = np.random.default_rng(1)
    inv = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)
    for c in _streaming_configs(12, seed=1):
        pos = np.arange(c["length"])
        q_pos = pos[c["offset"]:]
        kw = dict(sinks=c["sinks"], window=c["window"])
        regs = sinks.regions(q_pos, pos, **kw)
        check_views(sinks.relative_positions(q_pos, pos, **kw), regs)
        q, k = rng.normal(size=(c["length"], 8)), rng.normal(size=(c["length"], 8))
        want = streaming_logits(official_streaming(c["length"], c["sinks"], c["window"]), q, k, inv)[c["offset"]:]
        got = region_logits(q[c["offset"]:], k, regs, inv)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)


def test_streaming_properties():
    pos = np.arange(60)
    for n, window in [(0, 5), (4, 10), (1, 0), (4, 100)]:
        rel = np.asarray(sinks.relative_positions(pos, pos, sinks=n, window=window))
        check_causal_and_local(rel, pos, pos, exact_below=window + 1)
        d = pos[:, None] - pos[None, :]
        # the Lambda mask: sinks and the window, nothing in between; a query sees at most n + window + 1 keys
        np.testing.assert_array_equal(~np.isnan(rel), (d >= 0) & ((pos[None, :] < n) | (d <= window)))
        assert (~np.isnan(rel)).sum(axis=1).max() == min(60, n + window + 1)
        # cache slots: no distance beyond the cache size
        assert np.nanmax(rel) <= n + window
    rel = np.asarray(sinks.relative_positions(pos, pos, sinks=4, window=100))  # cache never full: plain RoPE
    d = pos[:, None] - pos[None, :]
    np.testing.assert_array_equal(rel, np.where(d >= 0, d, np.nan).astype(np.float32))


# ---------------------------------------------------------------- LM-Infinite

def official_lambda(q_len, kv_seq_len, local_branch, global_branch, limit_distance):
    """``limited_distance_forward`` with ``use_lambda_attention`` -> ``Lambda_Attention_Matrix``: the
    stationary (global branch) and rotary (local branch) logit sets as parts, for the modes
    single_query (decoding), short_seq and long_seq (prefill)."""
    position_ids = np.arange(kv_seq_len - q_len, kv_seq_len)
    key_position_ids = np.arange(kv_seq_len)
    if limit_distance is None:
        stationary = (position_ids, key_position_ids)
    else:  # stationary keys unrotated, queries rotated at the effective limit
        effective_limit_distance = min(limit_distance, kv_seq_len - 1)
        stationary = (np.full(q_len, effective_limit_distance), np.zeros(kv_seq_len))
    g = min(global_branch, kv_seq_len)  # key_stationary[..., :global_branch, :]
    rows, cols = np.arange(q_len)[:, None], np.arange(g)[None, :]
    # masked where triu(-local_branch + 1 + key_length - query_length)
    stat_keep = np.zeros((q_len, kv_seq_len), bool)
    stat_keep[:, :g] = ~(cols - rows >= -local_branch + 1 + kv_seq_len - q_len)
    rot_keep = np.zeros((q_len, kv_seq_len), bool)
    if q_len == 1:  # single_query: keys [max(0, kv - local_branch):], unmasked
        rot_keep[:, max(0, kv_seq_len - local_branch):] = True
    elif q_len < kv_seq_len:
        raise NotImplementedError("cached mode (q_len + local_branch + global_branch == kv_len) is not transcribed")
    elif q_len <= local_branch:  # short_seq: causal; global columns replaced where stationary is unmasked
        rot_keep = np.tril(np.ones((q_len, kv_seq_len), bool)) & ~stat_keep
    else:  # long_seq: blocks of local_branch queries against [previous block, own block]
        pad_to_length = ((q_len - 1) // local_branch + 1) * local_branch
        patch_size = pad_to_length - q_len
        nb = pad_to_length // local_branch
        r, c = np.arange(local_branch)[:, None], np.arange(2 * local_branch)[None, :]
        keep = np.broadcast_to((c - r >= 1) & (c - r <= local_branch), (nb, local_branch, 2 * local_branch)).copy()
        keep[0, :, :local_branch] = False
        if patch_size != 0:
            keep[-1, -patch_size:, :] = False
            keep[-1, :, -patch_size:] = False
        for b, rr, cc in zip(*np.nonzero(keep)):
            key = (b - 1) * local_branch + cc  # shift_and_pair: previous block then own block
            rot_keep[b * local_branch + rr, key] = True
    return [(*stationary, stat_keep), (position_ids, key_position_ids, rot_keep)]


def _lambda_configs(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length, offset = draw_shape(rng)
        local = int(rng.integers(1, 16))
        limit = [None, local, int(rng.integers(0, local + 1))][int(rng.integers(3))]
        yield dict(length=length, offset=offset, global_branch=int(rng.integers(0, 6)), local_branch=local,
                   limit=limit)


def _official_kw(c):
    return dict(local_branch=c["local_branch"], global_branch=c["global_branch"], limit_distance=c["limit"])


def _kw(c):
    return dict(global_branch=c["global_branch"], local_branch=c["local_branch"], limit=c["limit"])


def test_lm_infinite_matches_official_prefill_and_decoding_on_random_configs():
    for c in _lambda_configs(60, seed=2):
        n = c["length"]
        prefill = official_relative(official_lambda(n, n, **_official_kw(c)))
        pos = np.arange(n)
        got = np.asarray(sinks.lm_infinite_relative_positions(pos[c["offset"]:], pos, **_kw(c)))
        np.testing.assert_array_equal(got, prefill[c["offset"]:].astype(np.float32), err_msg=str(c))
        step = official_relative(official_lambda(1, n, **_official_kw(c)))  # the last query, decoding
        np.testing.assert_array_equal(got[-1:], step.astype(np.float32), err_msg=str(c))


def test_lm_infinite_views_agree_and_logits_match_official():
    for i, c in enumerate(_lambda_configs(12, seed=3)):
        n = c["length"]
        pos = np.arange(n)
        q = pos[c["offset"]:]
        regs = sinks.lm_infinite_regions(q, pos, **_kw(c))
        check_views(sinks.lm_infinite_relative_positions(q, pos, **_kw(c)), regs)
        parts = [(qp[c["offset"]:], kp, m[c["offset"]:]) for qp, kp, m in official_lambda(n, n, **_official_kw(c))]
        check_logits(parts, regs, seed=i)


def test_lm_infinite_official_cap_depends_on_the_length_when_limit_exceeds_the_local_branch():
    # why posenc refuses limit > local_branch: the official cap min(limit, kv_len - 1) then makes its
    # prefill and its cached decoding disagree
    kw = dict(local_branch=4, global_branch=2, limit_distance=12)
    prefill = official_relative(official_lambda(10, 10, **kw))
    step = official_relative(official_lambda(1, 7, **kw))  # decoding the query at 6
    assert prefill[6, 0] == 9 and step[0, 0] == 6
    with pytest.raises(ValueError, match=r"limit must be an integer in \[0, 4\]; got 12"):
        sinks.lm_infinite_relative_positions(jnp.arange(4), jnp.arange(4), global_branch=2, local_branch=4,
                                             limit=12)


def test_lm_infinite_properties():
    pos = np.arange(60)
    d = pos[:, None] - pos[None, :]
    for g, local, limit in [(0, 8, 8), (4, 8, 8), (10, 16, 5), (3, 5, None)]:
        rel = np.asarray(sinks.lm_infinite_relative_positions(pos, pos, global_branch=g, local_branch=local,
                                                              limit=limit))
        check_causal_and_local(rel, pos, pos, exact_below=local)
        np.testing.assert_array_equal(~np.isnan(rel), (d >= 0) & ((pos[None, :] < g) | (d < local)))
        far = (d >= local) & (pos[None, :] < g)
        np.testing.assert_array_equal(rel[far], d[far] if limit is None else limit)


# ---------------------------------------------------------------- both

def test_batch_dims_and_jit():
    q = jnp.stack([jnp.arange(5, 13), jnp.arange(30, 38)])
    k = jnp.arange(38)
    for fn, kw in [(sinks.relative_positions, dict(sinks=2, window=4)),
                   (sinks.lm_infinite_relative_positions, dict(global_branch=2, local_branch=4, limit=4))]:
        f = functools.partial(fn, **kw)
        got = jax.jit(f)(q, k)
        assert got.shape == (2, 8, 38)
        for b in range(2):
            np.testing.assert_array_equal(got[b], f(q[b], k))


@pytest.mark.parametrize("fn,kw,match", [
    (sinks.relative_positions, dict(sinks=-1, window=4), "sinks must be an integer >= 0; got -1"),
    (sinks.regions, dict(sinks=2, window=1.5), "window must be an integer >= 0; got 1.5"),
    (sinks.lm_infinite_relative_positions, dict(global_branch=2, local_branch=0, limit=None),
     "local_branch must be an integer >= 1; got 0"),
    (sinks.lm_infinite_regions, dict(global_branch=-2, local_branch=3, limit=None),
     "global_branch must be an integer >= 0; got -2"),
    (sinks.lm_infinite_regions, dict(global_branch=2, local_branch=3, limit=-1),
     r"limit must be an integer in \[0, 3\]; got -1"),
])
def test_bad_options(fn, kw, match):
    with pytest.raises(ValueError, match=match):
        fn(jnp.arange(4), jnp.arange(4), **kw)
