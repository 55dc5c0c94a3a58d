"""posenc.fox against transcriptions of the official Forgetting Transformer code.

References (numpy float64, written from the official code):
- zhixuan-lin/forgetting-transformer @ 883f260,
  src/forgetting_transformer/model/forgetting_transformer/
  modeling_forgetting_transformer.py (decay bias L442-L443, ShiftLinear
  L44-L95, bias init L221-L230), token_shift.py (``test_op`` reference),
  layernorm.py (``group_norm_ref``), fuse_norm_gate.py
  (``group_norm_gated_ref``), glu_linear.py (``glu_fwd``);
- fla-org/flash-linear-attention @ bc3b101, fla/ops/forgetting_attn/naive.py
  (``naive_forgetting_attn``).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import fox

RNG = np.random.default_rng(0)


def logsigmoid(x):
    x = np.asarray(x, np.float64)
    return -np.logaddexp(0.0, -x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def official_decay_bias(fgate_logit):
    """modeling_forgetting_transformer.py: fgate_logit 'b t h -> b h t', logsigmoid, then
    log_lambda = cumsum(log_fgate, -1); decay_bias = log_lambda[..., :, None] - log_lambda[..., None, :]."""
    log_fgate = logsigmoid(np.swapaxes(fgate_logit, -1, -2))
    log_lambda = np.cumsum(log_fgate, axis=-1)
    return log_lambda[..., :, None] - log_lambda[..., None, :]


def naive_forgetting_attn(q, k, v, g, scale):
    """fla/ops/forgetting_attn/naive.py naive_forgetting_attn (no window): q [B,T,HQ,D], k, v [B,T,H,D], g [B,T,HQ]."""
    _, t, hq, _ = q.shape
    groups = hq // k.shape[2]
    gc = np.cumsum(np.asarray(g, np.float64), axis=1)
    mask = np.tril(np.ones((t, t), bool))
    k = np.repeat(np.asarray(k, np.float64), groups, axis=2)  # repeat 'b t h d -> b t (h g) d'
    v = np.repeat(np.asarray(v, np.float64), groups, axis=2)
    ref = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64) * scale, k)
    ref = ref + np.swapaxes(gc, 1, 2)[..., :, None] - np.swapaxes(gc, 1, 2)[..., None, :]
    ref = np.where(mask, ref, -np.inf)
    p = np.exp(ref - ref.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def official_token_shift(x, alpha, shift_state=None):
    """token_shift.py test_op reference with prev_weight = alpha, curr_weight = 1 - alpha (ShiftLinear L73, L83):
    x_prev = roll(x, 1, dim=1); x_prev[:, 0] = 0; out = x_prev * prev_weight[..., None] + x * curr_weight[..., None].
    With T == 1 and a shift_state: weight_sum(shift_state, out, alpha) = alpha * state + (1 - alpha) * out (L85-L87)."""
    x = np.asarray(x, np.float64)
    prev_weight, curr_weight = alpha, 1.0 - alpha
    if x.shape[1] == 1 and shift_state is not None:
        return alpha[..., None] * shift_state[:, None] + (1.0 - alpha[..., None]) * x
    x_prev = np.roll(x, 1, axis=1)
    x_prev[:, 0] = 0.0
    return x_prev * prev_weight[..., None] + x * curr_weight[..., None]


def group_norm_ref(x, weight, num_groups, eps, is_rms_norm=True):
    """layernorm.py group_norm_ref (upcast, no bias, no residual); x [..., G*D]."""
    x = np.asarray(x, np.float64)
    xg = x.reshape(x.shape[:-1] + (num_groups, -1))
    wg = np.asarray(weight, np.float64).reshape(num_groups, -1)
    if not is_rms_norm:
        xg = xg - xg.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(np.square(xg).mean(-1, keepdims=True) + eps)
    return (xg * rstd * wg).reshape(x.shape)


def group_norm_gated_ref(x, g, weight, num_groups, eps):
    """fuse_norm_gate.py group_norm_gated_ref (is_rms_norm=True): group_norm_ref(x) * sigmoid(g)."""
    return group_norm_ref(x, weight, num_groups, eps) * sigmoid(g)


def official_bias_init(num_heads, decay_time_min, decay_time_max):
    """modeling_forgetting_transformer.py L226-L229."""
    log_decay_time = np.linspace(math.log(decay_time_min), math.log(decay_time_max), num_heads)
    decay_time = np.exp(log_decay_time)
    return -np.log(np.expm1(1 / decay_time))


# ----------------------------------------------------------------------------- decay bias


def test_decay_bias_golden_constant_gates():
    # f = sigmoid(0) = 1/2 everywhere: D_ij = (i - j) log(1/2) for j <= i, -inf above.
    d = np.asarray(fox.decay_bias(jnp.zeros((1, 4, 1))))[0, 0]
    lg = math.log(0.5)
    want = np.array([[0, -np.inf, -np.inf, -np.inf],
                     [lg, 0, -np.inf, -np.inf],
                     [2 * lg, lg, 0, -np.inf],
                     [3 * lg, 2 * lg, lg, 0]])
    np.testing.assert_allclose(d, want, rtol=1e-6)
    assert d.dtype == np.float32


def test_decay_bias_matches_official_with_batch_dims():
    f = RNG.normal(size=(2, 3, 9, 4)) * 3  # [..., L, H] with two leading dims
    d = np.asarray(fox.decay_bias(jnp.asarray(f, jnp.float32)))
    ref = official_decay_bias(f)
    causal = np.tril(np.ones((9, 9), bool))
    assert d.shape == (2, 3, 4, 9, 9)
    np.testing.assert_allclose(d[..., causal], ref[..., causal], rtol=1e-5, atol=1e-5)
    assert np.all(d[..., ~causal] == -np.inf)
    np.testing.assert_array_equal(np.diagonal(d, axis1=-2, axis2=-1), 0.0)


def test_decay_bias_bf16_logits_are_float32_sums():
    f = jnp.asarray(RNG.normal(size=(2, 7, 3)), jnp.bfloat16)
    d = fox.decay_bias(f)
    assert d.dtype == jnp.float32
    causal = np.tril(np.ones((7, 7), bool))
    ref = official_decay_bias(np.asarray(f.astype(jnp.float32)))
    np.testing.assert_allclose(np.asarray(d)[..., causal], ref[..., causal], rtol=1e-5, atol=1e-5)


def test_softmax_with_decay_bias_matches_fla_naive_forgetting_attention():
    b, t, hq, hkv, dh = 2, 8, 4, 2, 5
    q, k, v = (RNG.normal(size=(b, t, h, dh)) for h in (hq, hkv, hkv))
    f = RNG.normal(size=(b, t, hq)) + 2.0
    scale = dh ** -0.5
    ref = naive_forgetting_attn(q, k, v, logsigmoid(f), scale)
    kk, vv = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, kk) * scale + fox.decay_bias(jnp.asarray(f, jnp.float32))
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), vv)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_decay_bias_gradient_is_exactly_the_gates_between_key_and_query():
    # dD_ij / df_l = sigmoid(-f_l) for j < l <= i, and 0 elsewhere: causal, and no earlier token leaks in.
    f = RNG.normal(size=(1, 6, 1)).astype(np.float32)
    for i, j in [(5, 1), (3, 3), (4, 0), (2, 1)]:
        g = jax.grad(lambda x: fox.decay_bias(x)[0, 0, i, j])(jnp.asarray(f))[0, :, 0]
        want = np.where((np.arange(6) > j) & (np.arange(6) <= i), sigmoid(-f[0, :, 0]), 0.0)
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------- blocks, cumulative, decoding


def test_block_bias_of_blocks_equals_dense_bias():
    f = jnp.asarray(RNG.normal(size=(2, 12, 3)), jnp.float32)
    c = fox.cumulative(f)
    assert c.shape == (2, 3, 12) and c.dtype == jnp.float32
    dense = fox.decay_bias(f)
    for qs, ks in [(slice(4, 8), slice(0, 4)), (slice(8, 12), slice(4, 12)), (slice(0, 12), slice(0, 12))]:
        blk = fox.block_bias(c[..., qs], c[..., ks])
        want = dense[..., qs, ks]
        finite = np.isfinite(want)
        np.testing.assert_allclose(np.asarray(blk)[finite], np.asarray(want)[finite], rtol=1e-6, atol=1e-6)


def test_block_bias_above_diagonal_holds_minus_the_gates_between():
    f = RNG.normal(size=(1, 5, 1))
    c = fox.cumulative(jnp.asarray(f, jnp.float32))
    blk = np.asarray(fox.block_bias(c, c))[0, 0]
    lf = logsigmoid(f[0, :, 0])
    for i, j in [(0, 4), (1, 3), (2, 3)]:
        np.testing.assert_allclose(blk[i, j], -lf[i + 1:j + 1].sum(), rtol=1e-5)
        assert blk[i, j] > 0


def test_cumulative_with_initial_continues_the_prefix_for_decoding():
    f = jnp.asarray(RNG.normal(size=(2, 10, 3)), jnp.float32)
    full = fox.cumulative(f)
    prefix = fox.cumulative(f[:, :7])
    new = fox.cumulative(f[:, 7:], initial=prefix[..., -1])
    np.testing.assert_allclose(new, full[..., 7:], rtol=1e-6, atol=1e-6)
    # Cached decoding: three new queries against all ten keys == the last rows of the dense bias.
    c_k = jnp.concatenate([prefix, new], axis=-1)
    blk = np.asarray(fox.block_bias(new, c_k))
    dense = np.asarray(fox.decay_bias(f))[..., 7:, :]
    causal = np.isfinite(dense)
    np.testing.assert_allclose(blk[causal], dense[causal], rtol=1e-6, atol=1e-6)


def test_relative_shift_invariance():
    # D_ij depends only on the gates between j and i: tokens prepended (or an offset in c) change nothing.
    f = RNG.normal(size=(2, 6, 3))
    prefix = RNG.normal(size=(2, 5, 3)) * 2
    d = np.asarray(fox.decay_bias(jnp.asarray(f, jnp.float32)))
    d_long = np.asarray(fox.decay_bias(jnp.asarray(np.concatenate([prefix, f], 1), jnp.float32)))[..., 5:, 5:]
    finite = np.isfinite(d)
    np.testing.assert_array_equal(finite, np.isfinite(d_long))
    np.testing.assert_allclose(d_long[finite], d[finite], rtol=1e-5, atol=1e-5)
    c = fox.cumulative(jnp.asarray(f, jnp.float32))
    c_shift = fox.cumulative(jnp.asarray(f, jnp.float32), initial=jnp.full((2, 3), -37.5))
    np.testing.assert_allclose(fox.block_bias(c_shift, c_shift), fox.block_bias(c, c), atol=2e-5)


def test_jit_and_vmap():
    f = jnp.asarray(RNG.normal(size=(3, 5, 2)), jnp.float32)
    d = fox.decay_bias(f)
    np.testing.assert_array_equal(jax.jit(fox.decay_bias)(f), d)
    np.testing.assert_allclose(jax.vmap(fox.decay_bias)(f[:, None])[:, 0], d, rtol=1e-6)


# ----------------------------------------------------------------------------- FoX (Pro) pieces


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_token_shift_matches_official(dtype):
    b, t, h, dh = 2, 7, 3, 4
    x = jnp.asarray(RNG.normal(size=(b, t, h, dh)), dtype)
    logits = jnp.asarray(RNG.normal(size=(b, t, h)) * 2, jnp.float32)
    y = fox.token_shift(x, logits)
    assert y.dtype == dtype and y.shape == x.shape
    ref = official_token_shift(np.asarray(x.astype(jnp.float32)), sigmoid(logits))
    tol = 1e-6 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(y.astype(jnp.float32)), ref, rtol=tol, atol=tol)


def test_token_shift_decode_step_and_chunked_prefill_equal_the_full_pass():
    b, t, h, dh = 2, 6, 2, 3
    x = jnp.asarray(RNG.normal(size=(1, b, t, h, dh)), jnp.float32)  # a leading batch dim
    logits = jnp.asarray(RNG.normal(size=(1, b, t, h)), jnp.float32)
    full = fox.token_shift(x, logits)
    # One decoding step with the stored shift state: official weight_sum (T == 1 branch).
    step = fox.token_shift(x[..., 5:, :, :], logits[..., 5:, :], previous=x[..., 4, :, :])
    ref = official_token_shift(np.asarray(x[0, :, 5:]), sigmoid(logits[0, :, 5:]), np.asarray(x[0, :, 4]))
    np.testing.assert_allclose(step[0], ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(step, full[..., 5:, :, :], rtol=1e-6, atol=1e-7)
    # Multi-token continuation (the official layer would restart from zeros here).
    rest = fox.token_shift(x[..., 2:, :, :], logits[..., 2:, :], previous=x[..., 1, :, :])
    np.testing.assert_allclose(rest, full[..., 2:, :, :], rtol=1e-6, atol=1e-7)


def test_token_shift_is_causal_through_gradients():
    x = jnp.asarray(RNG.normal(size=(1, 6, 2, 3)), jnp.float32)
    a = jnp.asarray(RNG.normal(size=(1, 6, 2)), jnp.float32)
    for t in range(6):
        gx, ga = jax.grad(lambda x, a: fox.token_shift(x, a)[:, t].sum(), argnums=(0, 1))(x, a)
        touched = np.abs(np.asarray(gx)).sum(axis=(0, 2, 3)) > 0
        np.testing.assert_array_equal(touched, (np.arange(6) <= t) & (np.arange(6) >= t - 1))
        assert not np.any(np.asarray(ga)[:, t + 1:]) and not np.any(np.asarray(ga)[:, :t])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_head_rms_norm_and_output_gate_match_official(dtype):
    b, t, h, dh = 2, 5, 3, 4
    x = jnp.asarray(RNG.normal(size=(b, t, h, dh)) * 3, dtype)
    g = jnp.asarray(RNG.normal(size=(b, t, h, dh)), dtype)
    scale = jnp.asarray(RNG.normal(size=(h, dh)), jnp.float32)
    x64, g64 = np.asarray(x.astype(jnp.float32)), np.asarray(g.astype(jnp.float32))
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    # QK-norm: GroupNorm(num_groups=H, hidden_size=H*Dh, is_rms_norm=True), default eps 1e-5.
    y = fox.head_rms_norm(x, scale)
    ref = group_norm_ref(x64.reshape(b, t, h * dh), np.asarray(scale).reshape(-1), h, 1e-5).reshape(x.shape)
    assert y.dtype == dtype
    np.testing.assert_allclose(np.asarray(y.astype(jnp.float32)), ref, rtol=tol, atol=tol)
    # Output norm + gate (Pro): FusedGroupNormGated(eps=norm_eps=1e-6, activation="sigmoid").
    y = fox.output_gate(x, g, scale)
    ref = group_norm_gated_ref(x64.reshape(b, t, -1), g64.reshape(b, t, -1), np.asarray(scale).reshape(-1),
                               h, 1e-6).reshape(x.shape)
    np.testing.assert_allclose(np.asarray(y.astype(jnp.float32)), ref, rtol=tol, atol=tol)
    # Gate only (use_output_norm=False): glu_fwd(x=gate, y=o) = y / (1 + exp(-x)).
    y = fox.output_gate(x, g)
    np.testing.assert_allclose(np.asarray(y.astype(jnp.float32)), x64 / (1 + np.exp(-g64)), rtol=tol, atol=tol)


def test_bias_init_matches_official_and_sets_the_decay_times():
    b = fox.bias_init(6, decay_time_min=2.0, decay_time_max=500.0)
    np.testing.assert_allclose(b, official_bias_init(6, 2.0, 500.0), rtol=1e-6)
    t = -1.0 / logsigmoid(np.asarray(b))
    np.testing.assert_allclose(t, np.geomspace(2.0, 500.0, 6), rtol=1e-4)


@pytest.mark.parametrize("call, match", [
    (lambda: fox.cumulative(jnp.zeros(4)), "forget_logits"),
    (lambda: fox.cumulative(jnp.zeros((4, 2)), initial=jnp.zeros(3)), "initial"),
    (lambda: fox.bias_init(0, decay_time_min=1.0, decay_time_max=2.0), "num_heads"),
    (lambda: fox.bias_init(2, decay_time_min=-1.0, decay_time_max=2.0), "decay_time_min"),
    (lambda: fox.token_shift(jnp.zeros((4, 2, 3)), jnp.zeros((4, 3))), "shift_logits"),
    (lambda: fox.token_shift(jnp.zeros((4, 2, 3)), jnp.zeros((4, 2)), previous=jnp.zeros(3)), "previous"),
    (lambda: fox.head_rms_norm(jnp.zeros((4, 2, 3)), jnp.ones(3)), "scale"),
    (lambda: fox.head_rms_norm(jnp.zeros((4, 2, 3)), jnp.ones((2, 3)), eps=0.0), "eps"),
    (lambda: fox.output_gate(jnp.zeros((4, 2, 3)), jnp.zeros((4, 2, 2))), "gate_logits"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
