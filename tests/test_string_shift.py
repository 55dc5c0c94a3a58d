"""STRING against a transcription of the official code (HKUNLP/STRING, string_for_llama.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from remap_checks import check_causal_and_local, check_logits, check_views, draw_shape, official_relative

from posenc import string_shift


def official_prefill(kv_seq_len, diag_size, local_window):
    """``forward`` without a cache -> ``string_flash_forward``: the diagonal and the shifted triangle.

    Diagonal: flash attention, causal, ``window_size=[diag_size, 0]`` (keys i - diag_size .. i), queries
    at their positions. Triangle: the last kv_seq_len - diag_size queries (rotated at position -
    diag_size + local_window) against the first kv_seq_len - diag_size keys, causal.
    """
    position_ids = np.arange(kv_seq_len)
    rows, cols = np.arange(kv_seq_len)[:, None], np.arange(kv_seq_len)[None, :]
    diag = (cols <= rows) & (cols >= rows - diag_size)
    parts = [(position_ids, position_ids, diag)]
    triangle_len = kv_seq_len - diag_size
    if triangle_len > 0:
        shifted = np.zeros((kv_seq_len, kv_seq_len), bool)
        shifted[-triangle_len:, :triangle_len] = np.tril(np.ones((triangle_len, triangle_len), bool))
        parts.append((position_ids - diag_size + local_window, position_ids, shifted))
    return parts


def official_decode(t, diag_size, local_window):
    """``forward`` with a cache, one query at t (t + 1 >= diag_size keys): the last diag_size keys on the
    diagonal, the first t + 1 - diag_size keys shifted."""
    kv_seq_len = t + 1
    shifted_size = kv_seq_len - diag_size
    assert shifted_size >= 0, "the official decoding path slices key_cache[:, shifted_size:] (needs t + 1 >= S)"
    position_ids = np.array([t])
    k = np.arange(kv_seq_len)
    diag = np.zeros((1, kv_seq_len), bool)
    diag[:, shifted_size:kv_seq_len] = True
    return [(position_ids, k, diag), (position_ids - diag_size + local_window, k, ~diag)]


def _configs(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length, offset = draw_shape(rng)
        shift = int(rng.integers(1, 30))
        yield dict(length=length, offset=offset, shift=shift, local_window=int(rng.integers(0, shift + 1)))


def test_matches_official_prefill_on_random_configs():
    for c in _configs(60, seed=0):
        pos = np.arange(c["length"])
        parts = official_prefill(c["length"], c["shift"], c["local_window"])
        # the official prefill attends to the key at exactly d = S twice, on the diagonal (at S) and shifted
        # (at W); posenc keeps the shifted one, as the official decoding path does
        overlap = parts[0][2] & parts[1][2] if len(parts) == 2 else np.zeros_like(parts[0][2])
        d = pos[:, None] - pos[None, :]
        np.testing.assert_array_equal(overlap, d == c["shift"])
        want = official_relative(parts, allow_overlap=True)  # later parts win: the shifted one at d = S
        got = string_shift.relative_positions(pos[c["offset"]:], pos, shift=c["shift"],
                                              local_window=c["local_window"])
        np.testing.assert_array_equal(np.asarray(got), want[c["offset"]:].astype(np.float32), err_msg=str(c))


@pytest.mark.parametrize("shift,local_window", [(1, 0), (4, 1), (7, 3), (12, 12), (20, 5)])
def test_matches_official_decoding_rows(shift, local_window):
    length = 40
    pos = jnp.arange(length)
    got = np.asarray(string_shift.relative_positions(pos, pos, shift=shift, local_window=local_window))
    for t in range(shift - 1, length):  # official decoding steps (it needs t + 1 >= S keys)
        want = official_relative(official_decode(t, shift, local_window))[0]
        np.testing.assert_array_equal(got[t, :t + 1], want.astype(np.float32))
    # earlier rows (before the diagonal is full) are all diagonal
    d = (pos[:, None] - pos[None, :])[: shift - 1]
    np.testing.assert_array_equal(got[: shift - 1], np.where(d >= 0, d, np.nan).astype(np.float32))


def test_views_agree_and_logits_match_official():
    for i, c in enumerate(_configs(16, seed=1)):
        pos = np.arange(c["length"])
        q = pos[c["offset"]:]
        kw = dict(shift=c["shift"], local_window=c["local_window"])
        regs = string_shift.regions(q, pos, **kw)
        check_views(string_shift.relative_positions(q, pos, **kw), regs)
        parts = [(qp[c["offset"]:], kp, m[c["offset"]:])
                 for qp, kp, m in official_prefill(c["length"], c["shift"], c["local_window"])]
        if len(parts) == 2:  # the duplicate at d = S: posenc keeps the shifted logit only
            parts[0] = (parts[0][0], parts[0][1], parts[0][2] & ~parts[1][2])
        check_logits(parts, regs, seed=i)


def test_properties():
    pos = np.arange(50)
    for shift, local_window in [(5, 2), (16, 4), (9, 9), (30, 0)]:
        rel = np.asarray(string_shift.relative_positions(pos, pos, shift=shift, local_window=local_window))
        check_causal_and_local(rel, pos, pos, exact_below=shift)
        d = pos[:, None] - pos[None, :]
        # the largest distances are gone: every distance is below L - S + W, and distances >= S are W on
        assert np.nanmax(rel) == max(shift - 1, 49 - shift + local_window)
        np.testing.assert_array_equal(rel[d >= shift], (d - shift + local_window)[d >= shift])
        shifted = string_shift.relative_positions(pos + 777, pos + 777, shift=shift, local_window=local_window)
        np.testing.assert_array_equal(shifted, rel)  # only the distance matters
    plain = string_shift.relative_positions(pos, pos, shift=7, local_window=7)  # W = S: plain RoPE
    d = pos[:, None] - pos[None, :]
    np.testing.assert_array_equal(plain, np.where(d >= 0, d, np.nan).astype(np.float32))


def test_batch_dims_and_jit():
    q = jnp.stack([jnp.arange(5, 13), jnp.arange(30, 38)])
    k = jnp.arange(38)
    f = functools.partial(string_shift.relative_positions, shift=9, local_window=2)
    got = jax.jit(f)(q, k)
    assert got.shape == (2, 8, 38)
    for b in range(2):
        np.testing.assert_array_equal(got[b], f(q[b], k))


@pytest.mark.parametrize("kw,match", [
    (dict(shift=0, local_window=0), "shift must be an integer >= 1; got 0"),
    (dict(shift=4, local_window=5), r"local_window must be an integer in \[0, 4\]; got 5"),
    (dict(shift=4, local_window=-1), r"local_window must be an integer in \[0, 4\]; got -1"),
])
def test_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        string_shift.relative_positions(jnp.arange(4), jnp.arange(4), **kw)
    with pytest.raises(ValueError, match=match):
        string_shift.regions(jnp.arange(4), jnp.arange(4), **kw)
