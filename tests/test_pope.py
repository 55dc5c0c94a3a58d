"""posenc.pope against a transcription of lucidrains' PoPE and the paper's score formula.

References (numpy float64):
- lucidrains/PoPE-pytorch @ ee11cab, PoPE_pytorch/pope.py: ``PoPE.__init__`` (inv_freqs = theta **
  -(arange(dim) / dim)), ``PoPE.forward`` (freqs = pos x inv_freqs, bias clamped to [-2 pi, 0]),
  ``apply_pope_to_qk`` (softplus magnitudes, query phases sliced to the last q_len positions, key
  phases + bias, ``rearrange([x cos, x sin], 'two ... d -> ... (d two)')``, partial PoPE passing the
  rest through); torch_einops_utils ``slice_right_at_dim`` (``slice(-length, None)``);
- Gopalakrishnan et al. 2025 (arXiv 2509.10534), the score
  ``a_ts = sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_c)``, theta_c = base^(-(c-1)/d).
  The two agree on every formula; the code's extensions (partial PoPE, implicit query positions, a
  bias row per module head) are in the module docstring and tested below.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import pope

RNG = np.random.default_rng(0)


def softplus(x):
    return np.logaddexp(0.0, x)


def lucidrains_pope(seq_len, inv_freqs, bias_param, offset=0):
    """PoPE.forward: -> (freqs [n, d], clamped bias [h, d])."""
    pos = np.arange(seq_len, dtype=np.float64) + offset
    freqs = np.einsum("i,j->ij", pos, inv_freqs)
    return freqs, np.clip(bias_param, -2.0 * np.pi, 0.0)


def lucidrains_apply_pope_to_qk(freqs, bias, q, k):
    """apply_pope_to_qk(to_magnitude=softplus, return_complex=False): q [b, h, i, D], k [b, h, j, D]."""
    q_len, rotate_dim = q.shape[-2], freqs.shape[-1]
    q, q_rest = q[..., :rotate_dim], q[..., rotate_dim:]
    k, k_rest = k[..., :rotate_dim], k[..., rotate_dim:]
    freqs_with_bias = freqs + bias[:, None, :]  # rearrange(bias, 'h d -> h 1 d')
    q, k = softplus(q), softplus(k)
    freqs = freqs[-q_len:]  # slice_right_at_dim(freqs, q_len, dim=-2)

    def two(x, f):  # rearrange([x * cos, x * sin], 'two ... d -> ... (d two)')
        return np.stack([x * np.cos(f), x * np.sin(f)], axis=-1).reshape(*x.shape[:-1], -1)

    return np.concatenate([two(q, freqs), q_rest], -1), np.concatenate([two(k, freqs_with_bias), k_rest], -1)


def paper_scores(q, k, tq, tk, theta, delta):
    """sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_c); q [Lq, H, d], k [Lk, H, d] -> [H, Lq, Lk]."""
    ang = (tk[None, :, None, None] - tq[:, None, None, None]) * theta + delta  # [Lq, Lk, H, d]
    return np.einsum("qhc,khc,qkhc->hqk", softplus(q), softplus(k), np.cos(ang))


def bhld(x):  # posenc [b, L, H, D] <-> lucidrains [b, H, L, D]
    return np.swapaxes(np.asarray(x), 1, 2)


def test_frequencies_match_lucidrains():
    np.testing.assert_allclose(pope.frequencies(8), 10000.0 ** -(np.arange(8) / 8), rtol=1e-6)
    np.testing.assert_allclose(pope.frequencies(6, base=500.0), 500.0 ** -(np.arange(6) / 6), rtol=1e-6)


@pytest.mark.parametrize("rotate_dim", [8, 5])
def test_query_key_match_lucidrains(rotate_dim):
    B, H, Lk, Lq, D = 2, 3, 7, 3, 8
    inv = 10000.0 ** -(np.arange(rotate_dim) / rotate_dim)
    raw_bias = RNG.uniform(-8.0, 2.0, size=(H, rotate_dim))  # outside [-2 pi, 0] too: the clamp matters
    q, k = RNG.normal(size=(B, H, Lq, D)) * 2, RNG.normal(size=(B, H, Lk, D)) * 2
    freqs, bias = lucidrains_pope(Lk, inv, raw_bias, offset=4)
    want_q, want_k = lucidrains_apply_pope_to_qk(freqs, bias, q, k)
    kpos = np.arange(Lk) + 4
    inv32 = jnp.asarray(inv, jnp.float32)
    got_q = pope.query(jnp.asarray(bhld(q), jnp.float32), kpos[-Lq:], inv32)  # the queries are the last positions
    got_k = pope.key(jnp.asarray(bhld(k), jnp.float32), kpos, inv32, bias=jnp.asarray(raw_bias, jnp.float32))
    assert got_q.shape == (B, Lq, H, D + rotate_dim) and got_k.shape == (B, Lk, H, D + rotate_dim)
    np.testing.assert_allclose(bhld(got_q), want_q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bhld(got_k), want_k, rtol=1e-5, atol=1e-5)


def test_dot_product_is_the_paper_score_and_logits():
    Lq, Lk, H, d = 4, 6, 2, 6
    q, k = RNG.normal(size=(Lq, H, d)), RNG.normal(size=(Lk, H, d))
    tq, tk = np.array([3, 5, 9, 10]), np.array([0, 1, 2, 6, 9, 10])
    theta = 10000.0 ** -(np.arange(d) / d)
    delta = RNG.uniform(-2 * np.pi, 0, size=(H, d))
    want = paper_scores(q, k, tq, tk, theta, delta)
    inv = pope.frequencies(d)
    args = (jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32))
    got = jnp.einsum("qhc,khc->hqk", pope.query(args[0], tq, inv), pope.key(args[1], tk, inv, bias=delta))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pope.logits(*args, tq, tk, inv, bias=delta), want, rtol=1e-5, atol=1e-5)


def test_partial_logits_add_the_plain_dot_product():
    q, k = RNG.normal(size=(1, 3, 2, 6)), RNG.normal(size=(1, 4, 2, 6))
    inv = pope.frequencies(4)
    tq, tk = np.array([[2, 3, 4]]), np.arange(4)[None]
    qf, kf = jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32)
    via_vectors = jnp.einsum("bqhc,bkhc->bhqk", pope.query(qf, tq, inv), pope.key(kf, tk, inv))
    np.testing.assert_allclose(pope.logits(qf, kf, tq, tk, inv), via_vectors, rtol=1e-5, atol=1e-5)
    rest = np.einsum("bqhc,bkhc->bhqk", q[..., 4:], k[..., 4:])
    full = paper_scores(q[0, ..., :4], k[0, ..., :4], tq[0], tk[0], np.asarray(inv, np.float64), 0.0)
    np.testing.assert_allclose(via_vectors[0], full + rest[0], rtol=1e-5, atol=1e-5)


@settings(max_examples=10)
@given(shift=st.integers(-500, 500))
def test_scores_depend_on_positions_only_through_the_distance(shift):
    q = jnp.asarray(RNG.normal(size=(3, 2, 4)), jnp.float32)
    k = jnp.asarray(RNG.normal(size=(5, 2, 4)), jnp.float32)
    inv, delta = pope.frequencies(4, base=100.0), jnp.full((2, 4), -0.5)
    tq, tk = jnp.array([4, 6, 7]), jnp.array([0, 2, 3, 6, 7])
    base = pope.logits(q, k, tq, tk, inv, bias=delta)
    np.testing.assert_allclose(pope.logits(q, k, tq + 1000 + shift, tk + 1000 + shift, inv, bias=delta), base,
                               atol=2e-4)


def test_content_sets_magnitude_only():
    x = jnp.asarray(RNG.normal(size=(2, 5, 3, 4)), jnp.float32)
    inv = pope.frequencies(4)
    out = pope.key(x, jnp.array([[0, 7, 100, 3, 5], [1, 1, 1, 1, 1]]), inv, bias=jnp.full((3, 4), -1.0))
    pairs = out.reshape(2, 5, 3, 4, 2)
    # the (cos, sin) pair of component c has length softplus(x_c) whatever the position and bias
    np.testing.assert_allclose(jnp.linalg.norm(pairs, axis=-1), jax.nn.softplus(x), rtol=1e-5)
    # at position 0 with no bias the phase is 0: [mu, 0]
    q0 = pope.query(x, jnp.zeros((2, 5), jnp.int32), inv).reshape(2, 5, 3, 4, 2)
    np.testing.assert_allclose(q0[..., 0], jax.nn.softplus(x), rtol=1e-6)
    np.testing.assert_allclose(q0[..., 1], 0.0, atol=1e-7)


def test_bias_is_clamped():
    x = jnp.asarray(RNG.normal(size=(1, 2, 1, 3)), jnp.float32)
    inv, pos = pope.frequencies(3), jnp.array([[4, 9]])
    low = pope.key(x, pos, inv, bias=jnp.full((1, 3), -2 * math.pi))
    np.testing.assert_allclose(pope.key(x, pos, inv, bias=jnp.full((1, 3), -50.0)), low, rtol=1e-6)
    np.testing.assert_allclose(pope.key(x, pos, inv, bias=jnp.full((1, 3), 3.0)), pope.key(x, pos, inv), rtol=1e-6)
    g = jax.grad(lambda b: pope.key(x, pos, inv, bias=b).sum())(jnp.array([[-1.0, -50.0, 3.0]]))
    assert float(g[0, 0]) != 0.0 and float(g[0, 1]) == 0.0 and float(g[0, 2]) == 0.0


def test_dtype_batch_jit_vmap_grad():
    x = jnp.asarray(RNG.normal(size=(2, 4, 3, 8)), jnp.bfloat16)
    pos = jnp.arange(8).reshape(2, 4)
    inv = pope.frequencies(8)
    out = jax.jit(pope.query)(x, pos, inv)
    assert out.dtype == jnp.bfloat16 and out.shape == (2, 4, 3, 16)
    np.testing.assert_allclose(jax.vmap(pope.query, in_axes=(0, 0, None))(x, pos, inv).astype(jnp.float32),
                               out.astype(jnp.float32))
    xf = x.astype(jnp.float32)
    g = jax.grad(lambda a: pope.logits(a, xf, pos, pos, inv).sum())(xf)
    assert np.isfinite(np.asarray(g)).all() and float(jnp.abs(g).sum()) > 0


def test_errors():
    x = jnp.zeros((3, 2, 4))
    with pytest.raises(ValueError, match=r"must have shape \[\.\.\., L, H, Dh\] with Dh >= len\(inv_freq\) = 5"):
        pope.query(x, jnp.arange(3), jnp.ones(5))
    with pytest.raises(ValueError, match=r"bias must have shape \[H, r\] = \(2, 4\)"):
        pope.key(x, jnp.arange(3), jnp.ones(4), bias=jnp.zeros(4))
    with pytest.raises(ValueError, match=r"positions must have shape \[\.\.\., L\] with L = 3"):
        pope.key(x, jnp.arange(4), jnp.ones(4))
    with pytest.raises(ValueError, match="positions must be an integer array"):
        pope.query(x, jnp.arange(3.0), jnp.ones(4))
    with pytest.raises(ValueError, match="dim must be an integer >= 1; got 0"):
        pope.frequencies(0)
    with pytest.raises(ValueError, match="q and k must have shape"):
        pope.logits(x, jnp.zeros((3, 3, 4)), jnp.arange(3), jnp.arange(3), jnp.ones(4))


def test_exact_phases_hold_the_scores_at_a_million_canonical_ones_drift():
    q = jnp.asarray(RNG.normal(size=(3, 2, 8)) * 2, jnp.float32)
    k = jnp.asarray(RNG.normal(size=(5, 2, 8)) * 2, jnp.float32)
    inv, delta = pope.frequencies(8), jnp.full((2, 8), -0.5)
    tq, tk = jnp.array([4, 6, 7]), jnp.array([0, 2, 3, 6, 7])
    base = pope.logits(q, k, tq, tk, inv, bias=delta)
    via_vectors = jnp.einsum("qhc,khc->hqk", pope.query(q, tq + 10**6, inv),
                             pope.key(k, tk + 10**6, inv, bias=delta))
    np.testing.assert_allclose(pope.logits(q, k, tq + 10**6, tk + 10**6, inv, bias=delta), base, atol=5e-5)
    np.testing.assert_allclose(via_vectors, base, atol=5e-5)
    # the float32 product t * theta (lucidrains): exact at small positions, off by ~2^-24 t rad far away
    canonical = pope.logits(q, k, tq, tk, inv, bias=delta, angles="canonical")
    np.testing.assert_allclose(canonical, base, atol=5e-6)
    far = pope.logits(q, k, tq + 10**6, tk + 10**6, inv, bias=delta, angles="canonical")
    assert float(jnp.abs(far - base).max()) > 1e-3
    with pytest.raises(ValueError, match="angles"):
        pope.query(q, tq, inv, angles="rounded")
