"""posenc.learned_sinks against a transcription of gpt-oss's attention with learned sinks.

References (numpy float64, written from the official code, openai/gpt-oss @ 7b58334):
- gpt_oss/torch/model.py ``sdpa`` (the full q, k, v -> out path: scale, causal
  and sliding-window mask, sink column concatenated, softmax, column dropped);
- gpt_oss/triton/attention.py ``_attn_fwd`` (the blocked path: running max
  started at the sink, ``z = l + exp(sink - m)`` at the end).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import learned_sinks

RNG = np.random.default_rng(0)


def np_softmax(x, axis=-1):
    m = x.max(axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis, keepdims=True)


def official_sdpa(Q, K, V, S, sm_scale, sliding_window=0):
    """gpt_oss/torch/model.py sdpa: Q [T, n_heads, q_mult, D], K, V [T, n_heads, D], S [n_heads * q_mult]."""
    n_tokens, n_heads, q_mult, d_head = Q.shape
    K = np.broadcast_to(K[:, :, None, :], (n_tokens, n_heads, q_mult, d_head))
    V = np.broadcast_to(V[:, :, None, :], (n_tokens, n_heads, q_mult, d_head))
    S = np.broadcast_to(S.reshape(n_heads, q_mult, 1, 1), (n_heads, q_mult, n_tokens, 1))
    mask = np.triu(np.full((n_tokens, n_tokens), -np.inf), k=1)
    if sliding_window > 0:
        mask = mask + np.tril(np.full((n_tokens, n_tokens), -np.inf), k=-sliding_window)
    QK = np.einsum("qhmd,khmd->hmqk", Q, K)
    QK = QK * sm_scale
    QK = QK + mask[None, None, :, :]
    QK = np.concatenate([QK, S], axis=-1)
    W = np_softmax(QK, axis=-1)
    W = W[..., :-1]
    attn = np.einsum("hmqk,khmd->qhmd", W, V)
    return attn.reshape(n_tokens, -1)


def posenc_attention(q, k, v, sinks, *, scale, window=0):
    """q [T, Hq, D] (Hq = Hkv * q_mult, KV-major), k, v [T, Hkv, D] -> [T, Hq, D] via learned_sinks.softmax."""
    t, hq, _ = q.shape
    rep = hq // k.shape[1]
    k, v = jnp.repeat(k, rep, axis=1), jnp.repeat(v, rep, axis=1)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    keep = (j <= i) & ((j > i - window) if window else True)
    logits = jnp.where(keep, jnp.einsum("qhd,khd->hqk", q, k) * scale, -jnp.inf)
    w = learned_sinks.softmax(logits, sinks)
    return jnp.einsum("hqk,khd->qhd", w, v)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_matches_gpt_oss_sdpa(window):
    T, n_kv, q_mult, D = 7, 2, 3, 8
    Q = RNG.normal(size=(T, n_kv, q_mult, D))
    K, V = RNG.normal(size=(T, n_kv, D)), RNG.normal(size=(T, n_kv, D))
    S = RNG.normal(size=n_kv * q_mult) * 2.0
    scale = 1 / np.sqrt(D)  # AttentionBlock.sm_scale
    want = official_sdpa(Q, K, V, S, scale, window)
    got = posenc_attention(jnp.asarray(Q.reshape(T, n_kv * q_mult, D), jnp.float32), jnp.asarray(K, jnp.float32),
                           jnp.asarray(V, jnp.float32), jnp.asarray(S, jnp.float32), scale=scale, window=window)
    np.testing.assert_allclose(np.asarray(got).reshape(T, -1), want, rtol=1e-5, atol=1e-5)


def test_window_keeps_window_keys_counting_the_query():
    # gpt-oss's mask tril(-inf, diagonal=-w): query i keeps keys i - w < j <= i (w keys with its own)
    T, w = 6, 3
    x = jnp.zeros((1, T, T))
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    keep = (j <= i) & (j > i - w)
    weights = learned_sinks.softmax(jnp.where(keep, x, -jnp.inf), jnp.zeros(1))
    np.testing.assert_array_equal(np.asarray(weights[0]) > 0, keep)
    np.testing.assert_allclose(weights[0].sum(-1), [n / (n + 1) for n in keep.sum(-1)], rtol=1e-6)


def test_zero_sink_is_off_by_one_softmax():
    logits = RNG.normal(size=(3, 4, 5)) * 3
    got = learned_sinks.softmax(jnp.asarray(logits, jnp.float32), jnp.zeros(3))
    e = np.exp(logits)
    np.testing.assert_allclose(got, e / (1.0 + e.sum(-1, keepdims=True)), rtol=1e-5)


def test_sink_share_and_limits():
    logits = jnp.asarray(RNG.normal(size=(2, 3, 4)), jnp.float32)
    s = jnp.array([0.7, -1.5])
    w = learned_sinks.softmax(logits, s)
    lse = jax.nn.logsumexp(logits, axis=-1)
    # the weights sum to 1 - the sink's share exp(s) / (exp(s) + sum exp(l))
    np.testing.assert_allclose(w.sum(-1), 1 - jax.nn.sigmoid(s[:, None] - lse), rtol=1e-5)
    # the ratios between keys are the plain softmax's
    np.testing.assert_allclose(w / w.sum(-1, keepdims=True), jax.nn.softmax(logits, -1), rtol=1e-5)
    # a sink of -inf is the plain softmax
    np.testing.assert_allclose(learned_sinks.softmax(logits, jnp.full(2, -jnp.inf)), jax.nn.softmax(logits, -1),
                               rtol=1e-6)


@pytest.mark.parametrize("masked", [-jnp.inf, -1e30])
def test_fully_masked_row_gives_zeros_and_finite_gradients(masked):
    logits = jnp.asarray(RNG.normal(size=(2, 3, 4)), jnp.float32).at[:, 0, :].set(masked)
    s = jnp.array([0.3, 40.0])  # a sink far above every logit
    w = learned_sinks.softmax(logits, s)
    np.testing.assert_array_equal(w[:, 0], 0.0)
    assert np.isfinite(np.asarray(w)).all()
    g_l, g_s = jax.grad(lambda x, y: (learned_sinks.softmax(x, y) * jnp.arange(4.0)).sum(), argnums=(0, 1))(logits, s)
    assert np.isfinite(np.asarray(g_l)).all() and np.isfinite(np.asarray(g_s)).all()
    assert float(jnp.abs(g_s[0])) > 0


def test_sink_gradient_matches_finite_difference():
    logits = jnp.asarray(RNG.normal(size=(2, 3, 4)), jnp.float32)
    s = jnp.array([0.2, -0.4])
    f = lambda y: (learned_sinks.softmax(logits, y) * jnp.arange(4.0)).sum()  # noqa: E731
    g = jax.grad(f)(s)
    eps = 1e-2
    fd = [(f(s.at[h].add(eps)) - f(s.at[h].add(-eps))) / (2 * eps) for h in range(2)]
    np.testing.assert_allclose(g, fd, rtol=1e-3)


def online_blocks(logits, v, block, m0):
    """The running (m, l, acc) of a blocked softmax over key blocks (flash attention), running max from m0."""
    m = jnp.broadcast_to(m0, logits.shape[:-1]).astype(jnp.float32)
    l = jnp.zeros(logits.shape[:-1])
    acc = jnp.zeros(logits.shape[:-1] + v.shape[-1:])
    for start in range(0, logits.shape[-1], block):
        x = logits[..., start:start + block]
        m_new = jnp.maximum(m, x.max(-1))
        safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # nothing seen yet: exp(-inf - 0) = 0, no nan
        p = jnp.exp(x - safe[..., None])
        alpha = jnp.exp(m - safe)
        acc = acc * alpha[..., None] + jnp.einsum("hqk,hkd->hqd", p, v[:, start:start + block])
        l, m = l * alpha + p.sum(-1), m_new
    return m, l, acc


def test_blocked_normaliser_matches_dense_and_triton():
    H, T, D = 2, 6, 4
    s = jnp.array([1.5, -2.0])
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    logits = jnp.where(j <= i, jnp.asarray(RNG.normal(size=(H, T, T)) * 2, jnp.float32), -jnp.inf)
    logits = logits.at[1, 2, :].set(-jnp.inf)  # a row with no visible key
    v = jnp.asarray(RNG.normal(size=(H, T, D)), jnp.float32)
    dense = jnp.einsum("hqk,hkd->hqd", learned_sinks.softmax(logits, s), v)
    # posenc: running max from -inf (block 1 leaves rows 0..2 of block 2 unseen), then output_scale
    m, l, acc = online_blocks(logits, v, 3, -jnp.inf)
    np.testing.assert_allclose(acc * learned_sinks.output_scale(m, l, s)[..., None], dense, rtol=1e-5, atol=1e-6)
    # and the sink-including log-sum-exp
    m2, l2 = learned_sinks.normalizer(m, l, s)
    full = jnp.concatenate([logits, jnp.broadcast_to(s[:, None, None], (H, T, 1))], -1)
    np.testing.assert_allclose(m2 + jnp.log(l2), jax.nn.logsumexp(full, -1), rtol=1e-5)
    # gpt_oss/triton/attention.py _attn_fwd: m_i starts at the sink; z = l_i + exp(sink - m_i); acc / z
    mt, lt, acct = online_blocks(logits, v, 3, s[:, None])
    triton = acct / (lt + jnp.exp(s[:, None] - mt))[..., None]
    np.testing.assert_allclose(triton, dense, rtol=1e-5, atol=1e-6)
    # both starts give the same scale
    np.testing.assert_allclose(acct * learned_sinks.output_scale(mt, lt, s)[..., None], dense, rtol=1e-5, atol=1e-6)


def test_output_scale_values_and_finite_gradients_for_a_high_sink():
    m, l = jnp.full((1, 2), -1e30), jnp.zeros((1, 2))  # no key seen, finite mask value
    assert np.asarray(learned_sinks.output_scale(m, l, jnp.array([80.0]))).tolist() == [[0.0, 0.0]]
    m, l = jnp.array([[0.0, 2.0]]), jnp.array([[1.0, 3.0]])
    want = 1 / (np.array([1.0, 3.0]) + np.exp(60.0 - np.array([0.0, 2.0])))  # 1 / (l + exp(s - m))
    np.testing.assert_allclose(learned_sinks.output_scale(m, l, jnp.array([60.0])), [want], rtol=1e-5)
    # exp(s - m) overflows float32 here; the rescaled form keeps the gradient finite
    g = jax.grad(lambda y: learned_sinks.output_scale(jnp.array([[-50.0]]), jnp.array([[1.0]]), y).sum())(
        jnp.array([50.0]))
    assert np.isfinite(np.asarray(g)).all()


def test_dtype_batch_jit_vmap():
    logits = jnp.asarray(RNG.normal(size=(2, 3, 4, 5)), jnp.bfloat16)
    s = jnp.array([0.0, 1.0, -1.0])
    w = jax.jit(learned_sinks.softmax)(logits, s)
    assert w.dtype == jnp.bfloat16 and w.shape == logits.shape
    np.testing.assert_allclose(jax.vmap(learned_sinks.softmax, in_axes=(0, None))(logits, s).astype(jnp.float32),
                               w.astype(jnp.float32))
    ref = learned_sinks.softmax(logits.astype(jnp.float32), s)
    np.testing.assert_allclose(w.astype(jnp.float32), ref, atol=1e-2)


def test_errors():
    with pytest.raises(ValueError, match=r"sinks must have shape \[H\] = \(3,\)"):
        learned_sinks.softmax(jnp.zeros((3, 2, 2)), jnp.zeros(2))
    with pytest.raises(ValueError, match=r"logits must have shape \[\.\.\., H, Lq, Lk\]"):
        learned_sinks.softmax(jnp.zeros((2, 2)), jnp.zeros(2))
    with pytest.raises(ValueError, match="m and l must have the same shape"):
        learned_sinks.normalizer(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.zeros(2))
    with pytest.raises(ValueError, match=r"sinks must have shape \[H\] = \(2,\)"):
        learned_sinks.output_scale(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros((2, 1)))
