"""posenc.hyper_connections against lucidrains/hyper-connections (HC, Sinkhorn) and DeepSeek-V4's mHC."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import hyper_connections as hc

N, D = 3, 8


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# lucidrains/hyper-connections at 47751035f6e92f73121f1da56603f0d410115799, hyper_connections/hyper_connections.py,
# HyperConnections.width_connection / depth_connection with num_fracs = 1, num_input_views = 1, tanh = True,
# residuals already split into streams as [..., s, d]; RMSNorm: F.normalize(x, dim=-1) * sqrt(d) * (gamma + 1).
def _lucid_rmsnorm(x, gamma):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12) * np.sqrt(x.shape[-1]) * (gamma + 1)


def _lucid_hc(residuals, p, branch):
    normed = _lucid_rmsnorm(residuals, p["gamma"])
    dynamic_alpha = np.tanh(normed @ p["dynamic_alpha_fn"]) * p["dynamic_alpha_scale"]
    alpha = dynamic_alpha + p["static_alpha"]
    dc_weight = np.tanh(normed @ p["dynamic_beta_fn"])[..., None]
    beta = dc_weight * p["dynamic_beta_scale"] + p["static_beta"][:, None]        # [..., s, 1]
    mix_h = np.einsum("...st,...sd->...td", alpha, residuals)
    branch_input, residuals = mix_h[..., 0, :], mix_h[..., 1:, :]
    output = np.einsum("...d,...sf->...sd", branch(branch_input), beta)
    return output + residuals


def test_hc_block_matches_lucidrains():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 4, N, D))
    w = rng.normal(size=(D, D)) / np.sqrt(D)
    p = {"static_alpha": rng.normal(size=(N, 1 + N)), "static_beta": rng.normal(size=N),
         "dynamic_alpha_fn": rng.normal(size=(D, 1 + N)), "dynamic_beta_fn": rng.normal(size=D),
         "dynamic_alpha_scale": 0.3, "dynamic_beta_scale": 0.2, "gamma": rng.normal(0, 0.1, D)}
    ref = _lucid_hc(x, p, lambda h: np.tanh(h @ w))
    params = {"static_alpha": p["static_alpha"], "static_beta": p["static_beta"],
              "dynamic_alpha": p["dynamic_alpha_fn"], "dynamic_beta": p["dynamic_beta_fn"],
              "dynamic_alpha_scale": jnp.float32(0.3), "dynamic_beta_scale": jnp.float32(0.2)}
    params = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    gamma = jnp.asarray(p["gamma"], jnp.float32)

    def norm(s):
        return s / jnp.linalg.norm(s, axis=-1, keepdims=True) * np.sqrt(D) * (gamma + 1)

    got = hc.hc_block(jnp.asarray(x, jnp.float32), params, lambda h: jnp.tanh(h @ w), norm=norm)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


def test_hc_init_is_the_papers_and_a_residual_per_stream():
    p = hc.hc_init(N, D, layer_index=4)
    np.testing.assert_array_equal(p["static_alpha"], [[0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]])
    np.testing.assert_array_equal(p["static_beta"], np.ones(N))
    assert float(p["dynamic_alpha_scale"]) == pytest.approx(0.01) and not np.any(p["dynamic_alpha"])
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, N, D)), jnp.float32)
    seen = []
    out = hc.hc_block(x, p, lambda h: seen.append(h) or 2.0 * h, norm=lambda s: s)
    np.testing.assert_allclose(seen[0], x[:, 4 % N])  # layer 4 reads stream 1
    np.testing.assert_allclose(out, x + 2.0 * x[:, None, 4 % N], rtol=1e-6)
    static = hc.hc_init(N, D, layer_index=0, dynamic=False)
    np.testing.assert_allclose(hc.hc_block(x, static, jnp.sin), x + jnp.sin(x[:, None, 0]), rtol=1e-6)


def test_expand_then_reduce_and_dtypes():
    x = jnp.asarray(np.random.default_rng(2).normal(size=(2, D)), jnp.bfloat16)
    s = hc.expand(x, N)
    assert s.shape == (2, N, D) and s.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(hc.reduce(s), np.float32), N * np.asarray(x, np.float32), rtol=1e-2)
    out = hc.hc_block(s, hc.hc_init(N, D, layer_index=0), lambda h: h, norm=lambda t: t)
    assert out.dtype == jnp.bfloat16


# lucidrains manifold_constrained_hyper_connections.py sinkhorn_knopps: exp(x - colmax), then `iters` rounds of
# l1-normalising dim -2 (columns) and dim -1 (rows). It starts with the columns, posenc (DeepSeek-V4) with the
# rows: the two agree on the transpose.
def _lucid_sinkhorn(log_alpha, iters=20):
    alpha = np.exp(log_alpha - log_alpha.max(-2, keepdims=True))
    for _ in range(iters):
        alpha = alpha / np.abs(alpha).sum(-2, keepdims=True)
        alpha = alpha / np.abs(alpha).sum(-1, keepdims=True)
    return alpha


@pytest.mark.parametrize("iters", [1, 5, 20])
def test_sinkhorn_matches_lucidrains_on_the_transpose(iters):
    x = np.random.default_rng(iters).normal(0, 2.0, (2, N + 1, N + 1))
    got = hc.sinkhorn(jnp.asarray(np.swapaxes(x, -1, -2), jnp.float32), iters=iters)
    np.testing.assert_allclose(np.swapaxes(np.asarray(got), -1, -2), _lucid_sinkhorn(x, iters), rtol=1e-5,
                               atol=1e-6)


def test_sinkhorn_is_doubly_stochastic():
    m = np.asarray(hc.sinkhorn(jnp.asarray(np.random.default_rng(3).normal(size=(4, 4))), iters=60, eps=1e-6))
    np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-4)
    np.testing.assert_allclose(m.sum(-2), 1.0, atol=1e-4)
    assert np.all(m > 0)


# transformers models/deepseek_v4/modeling_deepseek_v4.py (commit 361455895daf94ca66f78cf6792b09af397b4b30):
# DeepseekV4HyperConnection.forward, the residual step of DeepseekV4DecoderLayer.forward and
# DeepseekV4HyperHead.forward, in float64 numpy; DeepseekV4UnweightedRMSNorm: x * rsqrt(mean(x^2) + eps).
def _v4_rms(x, eps=1e-6):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


def _v4_hyper_connection(hidden_streams, fn, base, scale, hc, iters=20, eps=1e-6):
    flat = _v4_rms(hidden_streams.reshape(*hidden_streams.shape[:2], -1))
    mixes = flat @ fn.T
    pre_w, post_w, comb_w = mixes[..., :hc], mixes[..., hc:2 * hc], mixes[..., 2 * hc:]
    pre_b, post_b, comb_b = base[:hc], base[hc:2 * hc], base[2 * hc:]
    pre = _sigmoid(pre_w * scale[0] + pre_b) + eps
    post = 2 * _sigmoid(post_w * scale[1] + post_b)
    comb_logits = comb_w.reshape(*comb_w.shape[:-1], hc, hc) * scale[2] + comb_b.reshape(hc, hc)
    comb = _softmax(comb_logits, -1) + eps
    comb = comb / (comb.sum(-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdims=True) + eps)
        comb = comb / (comb.sum(-2, keepdims=True) + eps)
    collapsed = (pre[..., None] * hidden_streams).sum(2)
    return post, comb, collapsed


def _v4_layer_step(hidden_states, p, sublayer, hc):
    post, comb, collapsed = _v4_hyper_connection(hidden_states, p["fn"], p["base"], p["scale"], hc)
    out = sublayer(collapsed)
    return post[..., None] * out[..., None, :] + np.matmul(np.swapaxes(comb, -1, -2), hidden_states)


def _v4_head(x, hc_fn, hc_base, hc_scale, eps=1e-6):
    flat = _v4_rms(x.reshape(*x.shape[:2], -1))
    pre = _sigmoid((flat @ hc_fn.T) * hc_scale + hc_base) + eps
    return (pre[..., None] * x).sum(2)


def test_mhc_block_and_head_match_deepseek_v4():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 5, N, D))  # [B, S, hc_mult, D]
    mix = (2 + N) * N
    p = {"fn": rng.normal(0, 0.3, (mix, N * D)), "base": rng.normal(0, 0.5, mix), "scale": rng.uniform(0.5, 2, 3)}
    w = rng.normal(size=(D, D)) / np.sqrt(D)
    ref = _v4_layer_step(x, p, lambda h: np.tanh(h @ w), N)
    p32 = {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}
    got = hc.mhc_block(jnp.asarray(x, jnp.float32), p32, lambda h: jnp.tanh(h @ w))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    head = {"fn": rng.normal(0, 0.3, (N, N * D)), "base": rng.normal(size=N), "scale": rng.uniform(0.5, 2, 1)}
    ref_head = _v4_head(x, head["fn"], head["base"], head["scale"])
    got_head = hc.mhc_head(jnp.asarray(x, jnp.float32), {k: jnp.asarray(v, jnp.float32) for k, v in head.items()})
    np.testing.assert_allclose(got_head, ref_head, rtol=1e-4, atol=1e-5)


def test_mhc_coefficients_ranges_and_jit():
    p = hc.mhc_init(jax.random.key(0), N, D)
    assert p["fn"].shape == ((2 + N) * N, N * D) and float(jnp.std(p["fn"])) == pytest.approx(0.02, rel=0.2)
    x = jnp.asarray(np.random.default_rng(5).normal(size=(4, N, D)), jnp.bfloat16)
    pre, post, res = jax.jit(hc.mhc_coefficients)(x, p)
    assert pre.shape == post.shape == (4, N) and res.shape == (4, N, N)
    assert np.all((np.asarray(pre) > 0) & (np.asarray(pre) < 1 + 1e-5))
    assert np.all((np.asarray(post) > 0) & (np.asarray(post) < 2))
    np.testing.assert_allclose(np.asarray(res).sum(-1), 1.0, atol=1e-3)  # rows of res: V4's comb columns
    assert hc.mhc_block(x, p, lambda h: h).dtype == jnp.bfloat16
    head = hc.mhc_head_init(jax.random.key(1), N, D)
    assert head["fn"].shape == (N, N * D) and float(jnp.std(head["fn"])) == pytest.approx(0.02, rel=0.3)
    np.testing.assert_array_equal(head["base"], np.zeros(N))
    np.testing.assert_array_equal(head["scale"], np.ones(1))
    x32 = x.astype(jnp.float32)  # fn = 0: every stream weighted sigmoid(0) + eps
    got = hc.mhc_head(x32, dict(head, fn=jnp.zeros_like(head["fn"])))
    np.testing.assert_allclose(got, (0.5 + hc.HC_EPS) * np.asarray(x32).sum(-2), rtol=1e-6)


def test_bad_inputs():
    x = jnp.ones((2, N, D))
    with pytest.raises(ValueError, match="needs norm"):
        hc.hc_block(x, hc.hc_init(N, D, layer_index=0), lambda h: h)
    with pytest.raises(ValueError, match="static_alpha"):
        hc.hc_block(x, hc.hc_init(N + 1, D, layer_index=0, dynamic=False), lambda h: h)
    with pytest.raises(ValueError, match="keys"):
        hc.hc_coefficients(x, {"static_alpha": jnp.ones((N, N + 1))})
    with pytest.raises(ValueError, match="n, n"):
        hc.sinkhorn(jnp.ones((3, 4)))
    with pytest.raises(ValueError, match="iters"):
        hc.sinkhorn(jnp.ones((3, 3)), iters=0)
    with pytest.raises(ValueError, match="mHC params"):
        hc.mhc_coefficients(x, hc.mhc_init(jax.random.key(0), N, D + 1))
