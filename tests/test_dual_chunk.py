"""Dual Chunk Attention against a transcription of the official code (HKUNLP/ChunkLlama, chunkllama_attn_replace.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from remap_checks import check_causal_and_local, check_logits, check_views, decode_rows, draw_shape, official_relative

from posenc import dual_chunk

MAX_NEW_TOKENS = 512


def official_tables(chunk_size, local_window, seq_len):
    """``ChunkLlamaRotaryEmbedding._set_cos_sin_cache``: the position tables (scaling_factor 1)."""
    chunk_len = chunk_size - local_window
    q_t = np.arange(chunk_len)
    qc_t = np.minimum(np.arange(chunk_len) + chunk_len, chunk_size)  # .clamp(max=chunk_size)
    k_t = np.arange(seq_len + MAX_NEW_TOKENS) % chunk_len
    return q_t, qc_t, k_t


def official_prefill(kv_seq_len, chunk_size, local_window):
    """``forward`` without a KV cache: the chunk loop, as (intra, successive, inter) parts over all rows."""
    chunk_len = chunk_size - local_window
    q_t, qc_t, k_t = official_tables(chunk_size, local_window, kv_seq_len)
    position_ids = np.arange(kv_seq_len)
    key_position = k_t[position_ids]
    position_ids = position_ids % chunk_len
    shape = (kv_seq_len, kv_seq_len)
    masks = {n: np.zeros(shape, bool) for n in ("intra", "succ", "inter")}
    qpos = {n: np.zeros(kv_seq_len) for n in masks}

    def attend(name, rows, cols, q_positions, causal):
        r0, r1 = rows
        c0, c1 = cols
        block = np.ones((r1 - r0, c1 - c0), bool)
        masks[name][r0:r1, c0:c1] = np.tril(block) if causal else block
        qpos[name][r0:r1] = q_positions

    first = min(chunk_len, kv_seq_len)
    attend("intra", (0, first), (0, first), q_t[position_ids[:chunk_len]], True)
    prev = (0, first)
    remain_len = kv_seq_len - chunk_len
    while remain_len > 0:
        begin = kv_seq_len - remain_len
        curr_chunk_len = min(chunk_len, remain_len)
        end = begin + curr_chunk_len
        attend("intra", (begin, end), (begin, end), q_t[position_ids[begin:end]], True)
        attend("succ", (begin, end), prev, qc_t[position_ids[begin:end]], False)
        prev_len = prev[1] - prev[0]
        if begin - prev_len > 0:
            attend("inter", (begin, end), (0, begin - prev_len),
                   qc_t[np.repeat(position_ids[chunk_len - 1], curr_chunk_len)], False)
        prev = (begin, end)
        remain_len = remain_len - chunk_len
    return [(qpos[n], key_position, masks[n]) for n in ("intra", "succ", "inter")]


def official_decode(t, chunk_size, local_window):
    """``forward`` with a KV cache and one query (position t, t + 1 keys)."""
    chunk_len = chunk_size - local_window
    kv_seq_len = t + 1
    q_t, qc_t, k_t = official_tables(chunk_size, local_window, kv_seq_len)
    key_position = k_t[np.arange(kv_seq_len)]
    position_ids = np.array([t]) % chunk_len
    chunk_num_curr = (kv_seq_len - 1) // chunk_len

    def keys(lo, hi):
        m = np.zeros((1, kv_seq_len), bool)
        m[:, lo:hi] = True
        return m

    parts = [(q_t[position_ids], key_position, keys(chunk_len * chunk_num_curr, kv_seq_len))]
    if chunk_num_curr >= 1:
        parts.append((qc_t[position_ids], key_position,
                      keys(chunk_len * (chunk_num_curr - 1), chunk_len * chunk_num_curr)))
    if chunk_num_curr >= 2:
        parts.append((qc_t[np.array([chunk_len - 1])], key_position, keys(0, chunk_len * (chunk_num_curr - 1))))
    return parts


def _configs(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length, offset = draw_shape(rng)
        chunk = int(rng.integers(2, 20))
        yield dict(length=length, offset=offset, chunk=chunk, local_window=int(rng.integers(0, chunk)))


def test_matches_official_prefill_on_random_configs():
    for c in _configs(60, seed=0):
        pos = np.arange(c["length"])
        want = official_relative(official_prefill(c["length"], c["chunk"], c["local_window"]))
        got = dual_chunk.relative_positions(pos[c["offset"]:], pos, chunk=c["chunk"],
                                            local_window=c["local_window"])
        np.testing.assert_array_equal(np.asarray(got), want[c["offset"]:].astype(np.float32), err_msg=str(c))


@pytest.mark.parametrize("chunk,local_window", [(4, 1), (6, 0), (7, 3), (12, 2), (5, 4)])
def test_matches_official_decoding_rows(chunk, local_window):
    length = 40
    want = decode_rows(lambda t: official_decode(t, chunk, local_window), length)
    pos = jnp.arange(length)
    got = dual_chunk.relative_positions(pos, pos, chunk=chunk, local_window=local_window)
    np.testing.assert_array_equal(np.asarray(got), want.astype(np.float32))
    # and the official prefill agrees with its own decoding
    np.testing.assert_array_equal(official_relative(official_prefill(length, chunk, local_window)), want)


def test_views_agree_and_logits_match_official():
    for i, c in enumerate(_configs(16, seed=1)):
        pos = np.arange(c["length"])
        q = pos[c["offset"]:]
        kw = dict(chunk=c["chunk"], local_window=c["local_window"])
        regs = dual_chunk.regions(q, pos, **kw)
        check_views(dual_chunk.relative_positions(q, pos, **kw), regs)
        parts = [(qp[c["offset"]:], kp, m[c["offset"]:])
                 for qp, kp, m in official_prefill(c["length"], c["chunk"], c["local_window"])]
        check_logits(parts, regs, seed=i)


def test_properties():
    pos = np.arange(60)
    for chunk, local_window in [(8, 2), (10, 0), (9, 8), (16, 4)]:
        c = chunk - local_window
        rel = np.asarray(dual_chunk.relative_positions(pos, pos, chunk=chunk, local_window=local_window))
        d = pos[:, None] - pos[None, :]
        check_causal_and_local(rel, pos, pos, exact_below=1)
        same_chunk = (pos[:, None] // c == pos[None, :] // c) & (d >= 0)
        np.testing.assert_array_equal(rel[same_chunk], d[same_chunk])
        # the first local_window queries of a chunk see the previous chunk at its true distance
        succ = (pos[:, None] // c - pos[None, :] // c == 1) & (pos[:, None] % c < local_window)
        np.testing.assert_array_equal(rel[succ], d[succ])
        assert np.nanmax(rel) <= chunk and np.nanmin(rel) >= 0
        # only positions within the chunk matter: shifting by whole chunks changes nothing
        shifted = dual_chunk.relative_positions(pos + 3 * c, pos + 3 * c, chunk=chunk, local_window=local_window)
        np.testing.assert_array_equal(shifted, rel)


def test_batch_dims_and_jit():
    q = jnp.stack([jnp.arange(5, 13), jnp.arange(30, 38)])
    k = jnp.arange(38)
    f = functools.partial(dual_chunk.relative_positions, chunk=6, local_window=2)
    got = jax.jit(f)(q, k)
    assert got.shape == (2, 8, 38)
    for b in range(2):
        np.testing.assert_array_equal(got[b], f(q[b], k))


@pytest.mark.parametrize("kw,match", [
    (dict(chunk=0, local_window=0), "chunk must be an integer >= 1; got 0"),
    (dict(chunk=4, local_window=-1), "local_window must be an integer >= 0; got -1"),
    (dict(chunk=4, local_window=4), "local_window must be < chunk; got local_window=4, chunk=4"),
])
def test_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        dual_chunk.relative_positions(jnp.arange(4), jnp.arange(4), **kw)
    with pytest.raises(ValueError, match=match):
        dual_chunk.regions(jnp.arange(4), jnp.arange(4), **kw)
