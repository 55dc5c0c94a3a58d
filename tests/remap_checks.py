"""Checks shared by the tests of the position-remapping methods (posenc.remap and the modules using it).

The official implementations compute a few sets of RoPE logits, each with its
own query / key positions, and merge them by masks. Their transcriptions in
the tests return those sets as ``parts``: a list of (query positions [Lq],
key positions [Lk], mask [Lq, Lk]) in float64, as the official code computes
them. The helpers here turn parts into dense relative positions and logits,
and check posenc's two views (``relative_positions`` and ``regions``)
against each other.
"""

import jax
import jax.numpy as jnp
import numpy as np

from posenc import remap, rope

# (key length, query offset) pairs drawn by the random tests: queries are the last rows of the keys,
# from the full prefill (offset 0) to one decoding step (offset length - 1). Few distinct shapes: each
# new shape compiles every jnp op again, while new option values do not.
SHAPES = ((1, 0), (5, 0), (5, 4), (13, 6), (24, 0), (24, 23), (40, 0), (40, 17), (40, 39))


def draw_shape(rng):
    """A (length, offset) pair from SHAPES."""
    return SHAPES[int(rng.integers(len(SHAPES)))]


def official_relative(parts, *, allow_overlap=False):
    """Dense float64 [Lq, Lk] relative positions of official parts: NaN where no part holds."""
    lq, lk = parts[0][2].shape
    out = np.full((lq, lk), np.nan)
    count = np.zeros((lq, lk), int)
    for qp, kp, mask in parts:
        out = np.where(mask, qp[:, None] - kp[None, :], out)
        count += mask
    if not allow_overlap:
        assert count.max(initial=0) <= 1, "official parts overlap"
    return out


def rope_np(x, positions, inv_freq):
    """Official (Hugging Face, rotate_half) RoPE in float64 at any real positions: x [L, D], positions [L]."""
    half = len(inv_freq)
    ang = np.asarray(positions, np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[:, :half], x[:, half:2 * half]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[:, 2 * half:]], axis=-1)


def official_logits(q, k, parts, inv_freq):
    """Dense float64 logits of the official parts (q [Lq, D], k [Lk, D]); NaN where no part holds."""
    out = np.full((q.shape[0], k.shape[0]), np.nan)
    for qp, kp, mask in parts:
        logits = rope_np(q, qp, inv_freq) @ rope_np(k, kp, inv_freq).T
        out = np.where(mask, logits, out)
    return out


@jax.jit
def _rotated(q, k, q_positions, k_positions, inv_freq):
    qr = rope.apply(q[:, None, :], q_positions, inv_freq)[:, 0]
    kr = rope.apply(k[:, None, :], k_positions, inv_freq)[:, 0]
    return qr, kr


def region_logits(q, k, regions, inv_freq):
    """Logits from posenc regions through posenc.rope.apply (queries at a, keys at b, inv_freq * scale)."""
    out = np.full((q.shape[0], k.shape[0]), np.nan)
    for r in regions:
        inv = jnp.asarray(inv_freq, jnp.float32) * jnp.float32(r.scale)
        qr, kr = _rotated(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                          jnp.broadcast_to(r.q_positions, q.shape[:1]), jnp.broadcast_to(r.k_positions, k.shape[:1]),
                          inv)
        logits = np.asarray(qr, np.float64) @ np.asarray(kr, np.float64).T
        out = np.where(np.asarray(r.mask), logits, out)
    return out


def check_logits(parts, regions, *, seed=0, dim=8, base=10000.0, atol=2e-4, skip=None):
    """Official logits (float64) == logits of posenc's regions through posenc.rope.apply, on random q, k.

    ``skip``: bool [Lq, Lk] of pairs left out (a documented difference).
    """
    rng = np.random.default_rng(seed)
    lq, lk = parts[0][2].shape
    q, k = rng.normal(size=(lq, dim)), rng.normal(size=(lk, dim))
    inv = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    want = official_logits(q, k, parts, inv)
    got = region_logits(q, k, regions, inv)
    if skip is not None:
        want, got = np.where(skip, np.nan, want), np.where(skip, np.nan, got)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)


def check_views(rel, regions, *, exact=True):
    """posenc's two views agree: dtypes, disjoint regions whose union is the visible set, equal distances."""
    rel = np.asarray(rel)
    assert rel.dtype == np.float32
    assert 1 <= len(regions) <= 3
    count = np.zeros(rel.shape, int)
    for r in regions:
        assert isinstance(r, remap.Region)
        assert r.q_positions.dtype == jnp.int32 and r.k_positions.dtype == jnp.int32
        assert r.mask.dtype == jnp.bool_
        assert isinstance(r.scale, float) and r.scale > 0
        count = count + np.broadcast_to(np.asarray(r.mask), rel.shape)
    assert count.max(initial=0) <= 1, "regions overlap"
    np.testing.assert_array_equal(count == 1, ~np.isnan(rel))
    rebuilt = np.asarray(remap.from_regions(regions))
    assert rebuilt.shape == rel.shape
    if exact:
        np.testing.assert_array_equal(rebuilt, rel)
    else:
        np.testing.assert_allclose(rebuilt, rel, rtol=1e-6, atol=1e-5)


def check_causal_and_local(rel, q_positions, k_positions, *, exact_below):
    """Future keys are NaN, and every pair at 0 <= d < exact_below keeps its plain distance d."""
    d = np.asarray(q_positions)[..., :, None] - np.asarray(k_positions)[..., None, :]
    rel = np.asarray(rel)
    assert np.isnan(rel[d < 0]).all()
    near = (d >= 0) & (d < exact_below)
    np.testing.assert_array_equal(rel[near], d[near].astype(np.float32))


def decode_rows(full_fn, length):
    """Stack the official single-query (decoding) rows t = 0..length-1 into a [length, length] matrix.

    ``full_fn(t)`` -> official parts for the query at t with t + 1 keys; entries j > t are NaN.
    """
    out = np.full((length, length), np.nan)
    for t in range(length):
        out[t, :t + 1] = official_relative(full_fn(t))[0]
    return out
