"""posenc.qk_norm (every kind), posenc.z_loss, posenc.norms.embed_scale and posenc.diagnostics (LR sensitivity
included)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import diagnostics, norm_names, norms, qk_norm, z_loss

B, L, H, HKV, DH = 2, 3, 4, 2, 8


def _qk(seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.normal(1.0, 2.0, (B, L, H, DH)).astype(dtype)
    k = rng.normal(-0.5, 3.0, (B, L, HKV, DH)).astype(dtype)
    return jnp.asarray(q), jnp.asarray(k)


def _np_rms(x, axis_size):
    x = np.asarray(x, np.float64)
    flat = x.reshape(*x.shape[:-2], -1) if axis_size == "full" else x
    y = flat / np.sqrt((flat**2).mean(-1, keepdims=True) + 1e-6)
    return y.reshape(x.shape)


# ------------------------------------------------------------------- QK-norm


@pytest.mark.parametrize("kind", sorted(norm_names.QK_NORMS))
def test_qk_norm_shapes_dtypes_and_jit(kind):
    q, k = _qk()
    params = qk_norm.qk_norm_init(kind, H, HKV, DH)
    qn, kn = jax.jit(lambda a, b, p: qk_norm.qk_norm(kind, a, b, p))(q, k, params)
    assert qn.shape == q.shape and kn.shape == k.shape
    qb, kb = qk_norm.qk_norm(kind, q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), params)
    assert qb.dtype == jnp.bfloat16 and kb.dtype == jnp.bfloat16


def test_qk_norm_none_is_identity():
    q, k = _qk()
    qn, kn = qk_norm.qk_norm("none", q, k, {})
    np.testing.assert_array_equal(qn, q)
    np.testing.assert_array_equal(kn, k)


def test_qk_norm_rms_per_head_golden():
    q, k = _qk(1)
    qn, kn = qk_norm.qk_norm("rms", q, k, qk_norm.qk_norm_init("rms", H, HKV, DH))
    np.testing.assert_allclose(qn, _np_rms(q, "head"), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kn, _np_rms(k, "head"), rtol=1e-5, atol=1e-6)


def test_qk_norm_rms_full_golden_differs_from_per_head():
    q, k = _qk(2)
    # scale heads differently so per-head and full-projection RMS disagree
    q = q * jnp.arange(1.0, H + 1.0)[:, None]
    params = qk_norm.qk_norm_init("rms_full", H, HKV, DH)
    assert params["q_scale"].shape == (H * DH,) and params["k_scale"].shape == (HKV * DH,)
    qn, kn = qk_norm.qk_norm("rms_full", q, k, params)
    np.testing.assert_allclose(qn, _np_rms(q, "full"), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kn, _np_rms(k, "full"), rtol=1e-5, atol=1e-6)
    assert not np.allclose(qn, _np_rms(q, "head"), atol=1e-2)


def test_qk_norm_layer_zero_mean_unit_variance_per_head():
    q, k = _qk(3)
    params = qk_norm.qk_norm_init("layer", H, HKV, DH)
    params = {"q_scale": params["q_scale"] * 2.0, "k_scale": params["k_scale"]}
    qn, kn = qk_norm.qk_norm("layer", q, k, params)
    np.testing.assert_allclose(np.mean(np.asarray(qn), -1), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.var(np.asarray(qn), -1), 4.0, rtol=1e-4)  # gain 2
    np.testing.assert_allclose(np.var(np.asarray(kn), -1), 1.0, rtol=1e-4)


def test_qk_norm_l2_unit_keys_and_temperature_on_queries():
    q, k = _qk(4)
    params = qk_norm.qk_norm_init("l2", H, HKV, DH)
    assert float(params["temperature"]) == DH
    qn, kn = qk_norm.qk_norm("l2", q, k, {"temperature": jnp.float32(3.0)})
    np.testing.assert_allclose(np.linalg.norm(np.asarray(kn), axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(qn), axis=-1), 3.0, rtol=1e-5)
    # direction preserved
    cos = np.sum(np.asarray(qn) * np.asarray(q), -1) / (3.0 * np.linalg.norm(np.asarray(q), axis=-1))
    np.testing.assert_allclose(cos, 1.0, rtol=1e-5)


def test_qk_norm_gradients_finite_at_zero():
    z_q, z_k = jnp.zeros((1, 2, H, DH)), jnp.zeros((1, 2, HKV, DH))
    for kind in norm_names.QK_NORMS:
        params = qk_norm.qk_norm_init(kind, H, HKV, DH)

        def loss(a, b):
            qn, kn = qk_norm.qk_norm(kind, a, b, params)
            return jnp.sum(qn * jnp.arange(DH)) + jnp.sum(kn * jnp.arange(DH))

        ga, gb = jax.grad(loss, argnums=(0, 1))(z_q, z_k)
        assert np.all(np.isfinite(np.asarray(ga))) and np.all(np.isfinite(np.asarray(gb))), kind


def test_qk_norm_errors():
    q, k = _qk()
    with pytest.raises(ValueError, match="unknown qk_norm 'rsm'") as e:
        qk_norm.qk_norm("rsm", q, k, {})
    for kind in norm_names.QK_NORMS:
        assert kind in str(e.value)
    with pytest.raises(ValueError, match="head_dim differ"):
        qk_norm.qk_norm("rms", q, k[..., :4], qk_norm.qk_norm_init("rms", H, HKV, DH))
    with pytest.raises(ValueError, match="multiple of k heads"):
        qk_norm.qk_norm("none", q, jnp.zeros((B, L, 3, DH)), {})
    with pytest.raises(ValueError, match=r"expects params with keys \(k_scale, q_scale\)"):
        qk_norm.qk_norm("rms", q, k, {})
    # rms_full scales sized for the wrong head count: the shapes are named
    wrong = qk_norm.qk_norm_init("rms_full", H, H, DH)
    with pytest.raises(ValueError, match=r"scale shape \(32,\).*\(2, 3, 16\)"):
        qk_norm.qk_norm("rms_full", q, k, wrong)
    with pytest.raises(ValueError, match="num_kv_heads"):
        qk_norm.qk_norm_init("rms", 4, 3, DH)


# ------------------------------------------------------------------- z-loss


def test_z_loss_value_and_mask():
    logits = jnp.asarray([[0.0, 0.0], [math.log(3.0), 0.0]])  # log Z = log 2, log 4
    expected = 1e-4 * 0.5 * (math.log(2.0) ** 2 + math.log(4.0) ** 2)
    assert float(z_loss.z_loss(logits)) == pytest.approx(expected, rel=1e-5)
    masked = z_loss.z_loss(logits, weight=1e-5, mask=jnp.asarray([True, False]))
    assert float(masked) == pytest.approx(1e-5 * math.log(2.0) ** 2, rel=1e-5)
    assert float(z_loss.z_loss(logits, mask=jnp.zeros(2))) == 0.0
    # shift invariance of softmax does not hold for z-loss: it sees log Z
    assert float(z_loss.z_loss(logits - 10.0)) > float(z_loss.z_loss(logits))


def test_z_loss_large_logits_stable_in_bf16():
    logits = jnp.full((3, 5), 200.0, jnp.bfloat16)
    z = z_loss.z_loss(logits, weight=1.0)
    assert z.dtype == jnp.float32
    assert float(z) == pytest.approx((200.0 + math.log(5.0)) ** 2, rel=1e-5)


def test_embed_scale():
    assert float(norms.embed_scale(3072, jnp.bfloat16)) == 55.5
    assert norms.embed_scale(3072, jnp.bfloat16).dtype == jnp.bfloat16
    assert float(norms.embed_scale(3072, jnp.float32)) == pytest.approx(math.sqrt(3072), rel=1e-7)
    with pytest.raises(ValueError, match="dim"):
        norms.embed_scale(0, jnp.float32)


# -------------------------------------------------------------- diagnostics


def test_max_attention_logit_respects_mask():
    logits = jnp.asarray([[[1.0, 9.0], [2.0, 3.0]]])  # [H=1, Lq=2, Lk=2]
    causal = jnp.tril(jnp.ones((2, 2), bool))
    assert float(diagnostics.max_attention_logit(logits)) == 9.0
    assert float(diagnostics.max_attention_logit(logits, causal)) == 3.0


def test_attention_entropy_uniform_and_causal():
    lk = 5
    uniform = jnp.full((2, 3, 4, lk), 1.0 / lk)
    assert float(diagnostics.attention_entropy(uniform)) == pytest.approx(math.log(lk), rel=1e-6)
    # causal uniform: query i spreads over i + 1 keys, entropy log(i + 1)
    n = 4
    causal = jnp.tril(jnp.ones((n, n), bool))
    w = causal / jnp.sum(causal, -1, keepdims=True)
    expected = np.mean([math.log(i + 1) for i in range(n)])
    assert float(diagnostics.attention_entropy(w[None], causal)) == pytest.approx(expected, rel=1e-6)
    # a fully masked (padded) query is left out of the mean
    mask = causal.at[-1].set(False)
    expected3 = np.mean([math.log(i + 1) for i in range(n - 1)])
    assert float(diagnostics.attention_entropy(w[None], mask)) == pytest.approx(expected3, rel=1e-6)


def test_attention_entropy_one_hot_is_zero_with_finite_gradient():
    w = jax.nn.one_hot(jnp.asarray([[0, 2, 1]]), 3)  # [H=1, Lq=3, Lk=3]
    assert float(diagnostics.attention_entropy(w)) == 0.0
    g = jax.grad(diagnostics.attention_entropy)(w)
    assert np.all(np.isfinite(np.asarray(g)))


def test_logit_stats():
    logits = jnp.asarray([[0.0, 0.0], [math.log(3.0), 0.0]])
    s = diagnostics.logit_stats(logits)
    assert set(s) == {"mean", "log_z"}
    assert float(s["mean"]) == pytest.approx(math.log(3.0) / 4, rel=1e-6)
    assert float(s["log_z"]) == pytest.approx(0.5 * (math.log(2.0) + math.log(4.0)), rel=1e-6)


def test_lr_sensitivity_hand_computed():
    # clipped at L0 = 3.5: [3.0, 2.5, 3.5 (nan), 3.5 (4.0), 3.5 (inf)]; L* = 2.5
    finals = [3.0, 2.5, float("nan"), 4.0, float("inf")]
    assert diagnostics.lr_sensitivity(finals, 3.5) == pytest.approx((0.5 + 0 + 1 + 1 + 1) / 5)
    as_dict = dict(zip([3e-4, 1e-3, 3e-3, 1e-2, 3e-2], finals))
    assert diagnostics.lr_sensitivity(as_dict, 3.5) == pytest.approx(0.7)
    assert diagnostics.lr_sensitivity([2.0, 2.0, 2.0], 3.5) == 0.0  # flat: insensitive
    with pytest.raises(ValueError, match="empty"):
        diagnostics.lr_sensitivity([], 3.5)
    with pytest.raises(ValueError, match="initial_loss"):
        diagnostics.lr_sensitivity([1.0], float("nan"))
