"""posenc.qk_clip against Megatron-LM's QK-Clip (GQA and MLA), and the logit cap it promises."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import qk_clip

D, DH = 6, 4


# --- Megatron-LM (NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553), transcribed to numpy.
# megatron/core/transformer/attention.py SelfAttention.clip_qk / _clip_linear_qkv: the fused linear_qkv
# weight [(H + 2 Hkv) Dh, D] holds, per query group, its query heads, then its key, then its value.
def _megatron_clip_linear_qkv(weight, max_attn_logits, *, num_groups, head_dim, threshold=100.0, alpha=0.5):
    num_heads = max_attn_logits.shape[0]
    grouped_max = max_attn_logits.reshape(num_groups, -1).max(axis=1)
    if not np.any(grouped_max > threshold):
        return weight
    eta = np.minimum(threshold / grouped_max, 1.0).reshape(num_groups, 1, 1)
    query_size, kv_size = num_heads * head_dim, num_groups * head_dim
    w = weight.reshape(num_groups, (query_size + 2 * kv_size) // num_groups, -1)
    wq = w[:, : query_size // num_groups, :]
    wk = w[:, query_size // num_groups: (query_size + kv_size) // num_groups, :]
    wv = w[:, (query_size + kv_size) // num_groups:, :]
    wq = wq * np.power(np.repeat(eta, wq.shape[1], axis=1), alpha)
    wk = wk * np.power(eta, 1 - alpha)
    return np.concatenate([wq, wk, wv], axis=1).reshape(query_size + 2 * kv_size, -1)


# megatron/core/transformer/multi_latent_attention.py MLASelfAttention._clip_q_proj_weight and
# _clip_kv_proj_weight (eta computed per head as above, no grouping).
def _megatron_clip_mla(q_weight, kv_weight, max_attn_logits, *, qk_head_dim, pos_dim, v_head_dim,
                       threshold=100.0, alpha=0.5):
    n = max_attn_logits.shape[0]
    eta = np.minimum(threshold / max_attn_logits, 1.0).reshape(n, 1, 1)
    q = q_weight.reshape(n, qk_head_dim + pos_dim, -1)
    q = np.concatenate([q[:, :qk_head_dim] * np.power(eta, alpha), q[:, qk_head_dim:] * eta], axis=1)
    kv = kv_weight.reshape(n, qk_head_dim + v_head_dim, -1)
    kv = np.concatenate([kv[:, :qk_head_dim] * np.power(eta, 1 - alpha), kv[:, qk_head_dim:]], axis=1)
    return q.reshape(n * (qk_head_dim + pos_dim), -1), kv.reshape(n * (qk_head_dim + v_head_dim), -1)


@pytest.mark.parametrize("num_heads,num_groups", [(4, 4), (4, 2), (6, 1)])
def test_clip_matches_megatron_fused_qkv(num_heads, num_groups):
    rng = np.random.default_rng(num_heads * 10 + num_groups)
    rep = num_heads // num_groups
    fused = rng.normal(size=((num_heads + 2 * num_groups) * DH, D)).astype(np.float32)
    max_logits = rng.uniform(20.0, 300.0, num_heads).astype(np.float32)
    max_logits[0] = 250.0  # at least one head above tau
    ref = _megatron_clip_linear_qkv(fused, max_logits, num_groups=num_groups, head_dim=DH)
    # the same weights in posenc's layout: wq [D, H, Dh], wk [D, Hkv, Dh]
    per_group = fused.reshape(num_groups, rep + 2, DH, D)
    wq = per_group[:, :rep].reshape(num_heads, DH, D).transpose(2, 0, 1)
    wk = per_group[:, rep].transpose(2, 0, 1)
    got_q, got_k = qk_clip.clip(wq, wk, max_logits, head_axis=1)
    ref_g = ref.reshape(num_groups, rep + 2, DH, D)
    np.testing.assert_allclose(got_q, ref_g[:, :rep].reshape(num_heads, DH, D).transpose(2, 0, 1), rtol=1e-6)
    np.testing.assert_allclose(got_k, ref_g[:, rep].transpose(2, 0, 1), rtol=1e-6)
    np.testing.assert_array_equal(ref_g[:, rep + 1], per_group[:, rep + 1])  # values untouched


def test_clip_mla_matches_megatron():
    rng = np.random.default_rng(3)
    n, nope, rope, vdim, rank = 3, 4, 2, 5, 7
    q_weight = rng.normal(size=(n * (nope + rope), rank)).astype(np.float32)
    kv_weight = rng.normal(size=(n * (nope + vdim), rank)).astype(np.float32)
    max_logits = np.array([150.0, 80.0, 400.0], np.float32)
    ref_q, ref_kv = _megatron_clip_mla(q_weight, kv_weight, max_logits, qk_head_dim=nope, pos_dim=rope,
                                       v_head_dim=vdim)
    q3, kv3 = q_weight.reshape(n, nope + rope, rank), kv_weight.reshape(n, nope + vdim, rank)
    qn, qr, kn = qk_clip.clip_mla(q3[:, :nope], q3[:, nope:], kv3[:, :nope], max_logits, head_axis=0)
    ref_q3, ref_kv3 = ref_q.reshape(q3.shape), ref_kv.reshape(kv3.shape)
    np.testing.assert_allclose(qn, ref_q3[:, :nope], rtol=1e-6)
    np.testing.assert_allclose(qr, ref_q3[:, nope:], rtol=1e-6)
    np.testing.assert_allclose(kn, ref_kv3[:, :nope], rtol=1e-6)


def _logits(x, wq, wk):
    q = np.einsum("bld,dhk->blhk", x, wq)
    k = np.einsum("bld,dhk->blhk", x, wk)
    k = np.repeat(k, wq.shape[1] // wk.shape[1], axis=2)
    return np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(wq.shape[-1])


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_clip_caps_the_largest_logit_at_tau(kv_heads):
    rng = np.random.default_rng(kv_heads)
    x = rng.normal(size=(2, 5, D)).astype(np.float64)
    wq = rng.normal(0, 3.0, (D, 4, DH)).astype(np.float32) * np.array([1, 4, 0.3, 6], np.float32)[:, None]
    wk = rng.normal(0, 3.0, (D, kv_heads, DH)).astype(np.float32)
    causal = np.tril(np.ones((5, 5), bool))
    before = np.asarray(qk_clip.max_logit_per_head(_logits(x, wq, wk), causal))
    tau = float(np.median(before))
    new_q, new_k = qk_clip.clip(wq, wk, before, head_axis=1, threshold=tau)
    after = np.asarray(qk_clip.max_logit_per_head(_logits(x, np.asarray(new_q), np.asarray(new_k)), causal))
    group_before = before.reshape(kv_heads, -1).max(1)
    group_after = after.reshape(kv_heads, -1).max(1)
    np.testing.assert_allclose(group_after, np.minimum(group_before, tau), rtol=1e-4)
    assert np.all(after <= tau * (1 + 1e-4))


def test_clip_mla_scales_every_logit_by_gamma():
    rng = np.random.default_rng(5)
    h, nope, rope = 3, 4, 2
    qn, qr, kn = (rng.normal(size=(h, d, D)).astype(np.float32) for d in (nope, rope, nope))
    kr = rng.normal(size=(rope, D)).astype(np.float32)  # the rotary key shared by all heads
    x = rng.normal(size=(5, D))

    def logits(qn, qr, kn):
        qc, qrr, kc = (np.einsum("hdk,lk->hld", w, x) for w in (qn, qr, kn))
        kro = x @ kr.T
        return np.einsum("hld,hmd->hlm", qc, kc) + np.einsum("hld,md->hlm", qrr, kro)

    max_logits = np.array([10.0, 0.5, 40.0], np.float32)
    gamma = np.asarray(qk_clip.clip_factors(max_logits, threshold=5.0))
    np.testing.assert_allclose(gamma, [0.5, 1.0, 0.125])
    new = [np.asarray(w) for w in qk_clip.clip_mla(qn, qr, kn, max_logits, head_axis=0, threshold=5.0)]
    np.testing.assert_allclose(logits(*new), gamma[:, None, None] * logits(qn, qr, kn), rtol=1e-4, atol=1e-4)


def test_max_logit_per_head_masks_and_reduces_all_but_heads():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 4, 4)), jnp.float32)
    causal = jnp.tril(jnp.ones((4, 4), bool))
    got = qk_clip.max_logit_per_head(logits, causal)
    ref = np.where(np.asarray(causal), np.asarray(logits), -np.inf).max(axis=(0, 2, 3))
    np.testing.assert_array_equal(got, ref)
    assert got.dtype == jnp.float32
    none = qk_clip.max_logit_per_head(logits, jnp.zeros((4, 4), bool))
    assert np.all(np.isneginf(none))
    # -inf (nothing attended) and logits below tau keep factor 1: no NaN, no sign flip
    np.testing.assert_array_equal(qk_clip.clip_factors(jnp.array([-jnp.inf, -5.0, 0.0, 100.0, 200.0])),
                                  [1.0, 1.0, 1.0, 1.0, 0.5])


def test_clip_keeps_dtype_and_jits():
    wq = jnp.ones((D, 4, DH), jnp.bfloat16)
    wk = jnp.ones((D, 2, DH), jnp.bfloat16)
    s = jnp.array([400.0, 50.0, 100.0, 25.0])
    q, k = jax.jit(lambda a, b, m: qk_clip.clip(a, b, m, head_axis=1))(wq, wk, s)
    assert q.dtype == k.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(q[0, :, 0], np.float32), [0.5, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(np.asarray(k[0, :, 0], np.float32), [0.5, 1.0])


@pytest.mark.parametrize("kwargs,match", [
    ({"threshold": 0.0}, "threshold"), ({"alpha": 1.5}, "alpha"), ({"head_axis": 3}, "head_axis")])
def test_clip_rejects_bad_arguments(kwargs, match):
    args = {"head_axis": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        qk_clip.clip(jnp.ones((D, 4, DH)), jnp.ones((D, 2, DH)), jnp.ones(4), **args)


def test_clip_rejects_mismatched_heads():
    with pytest.raises(ValueError, match="multiple"):
        qk_clip.clip(jnp.ones((D, 4, DH)), jnp.ones((D, 3, DH)), jnp.ones(4), head_axis=1)
    with pytest.raises(ValueError, match="max_logits"):
        qk_clip.clip(jnp.ones((D, 4, DH)), jnp.ones((D, 2, DH)), jnp.ones(3), head_axis=1)
    with pytest.raises(ValueError, match="share H heads"):
        qk_clip.clip_mla(jnp.ones((3, 4)), jnp.ones((2, 4)), jnp.ones((3, 4)), jnp.ones(3), head_axis=0)
