"""train.qk_clip: the train step rescales each head's query and key weights by the rule of
posenc.qk_clip (Kimi K2 / Megatron-LM), from the largest logits of the step's own forward."""

import importlib

import jax
import numpy as np
import pytest

from posenc import qk_clip
from posenc.config.schema import ConfigError
from posenc.training import loop, prepare
from posenc.training import step as step_lib


def _config(threshold=0.0, gate="none"):
    c = importlib.import_module("posenc.configs.default").get_config("tiny")
    # grouped heads; biases scaled too; a gate in wq beside the queries is not
    c.model.update(num_layers=2, num_heads=4, num_kv_heads=2, bias="qkv", attention_gate=gate)
    c.train.update(batch_size=4, learning_rate=3e-2, warmup_steps=0, qk_clip=threshold)
    return c


def _step(r, key):
    model, _, graphdef, state = loop.init_state(r)
    batch, positions = step_lib._train_batch(r.train, key, None)
    _, stats = model(batch["inputs"], positions, return_stats=True)
    state, metrics = step_lib.train_step_fn(r.train)(graphdef, state, key)
    model, _ = __import__("flax").nnx.merge(graphdef, state)
    return model, np.asarray(stats["max_logit_per_head"]), metrics


@pytest.mark.parametrize("gate", ["none", "elementwise"])
def test_the_step_clips_exactly_the_heads_whose_logit_passed_the_threshold(gate):
    key = jax.random.key(5)
    plain, logits, _ = _step(prepare.resolve(_config(gate=gate)), key)
    assert logits.shape == (2, 4)  # [layers, heads]
    threshold = float(np.median(logits))  # some heads above it, some below
    clipped, logits_c, metrics = _step(prepare.resolve(_config(threshold, gate)), key)
    np.testing.assert_allclose(logits_c, logits, rtol=1e-5)  # the same forward
    assert float(metrics["qk_clipped_heads"]) == float((logits > threshold).sum()) > 0
    scales = [qk_clip.clip_scales(layer, num_kv_heads=2, threshold=threshold) for layer in logits]
    q_all = np.concatenate([np.asarray(q) for q, _ in scales])
    assert 0 < q_all.min() < 1 and q_all.max() == 1.0  # some groups clipped, some not
    for (a, b), (q_scale, k_scale) in zip(zip(plain.blocks, clipped.blocks), scales):
        dh = a.attn.head_dim
        np.testing.assert_allclose(b.attn.wq[..., :dh],
                                   qk_clip.scale_heads(a.attn.wq[..., :dh], q_scale, head_axis=1),
                                   rtol=5e-3, atol=1e-3)
        np.testing.assert_allclose(b.attn.wq[..., dh:], a.attn.wq[..., dh:], rtol=5e-3, atol=1e-3)  # the gate
        np.testing.assert_allclose(b.attn.wk[...], qk_clip.scale_heads(a.attn.wk[...], k_scale, head_axis=1),
                                   rtol=5e-3, atol=1e-3)
        np.testing.assert_allclose(b.attn.biases["q"][..., :dh],
                                   qk_clip.scale_heads(a.attn.biases["q"][..., :dh], q_scale, head_axis=0),
                                   rtol=5e-3, atol=1e-3)
        np.testing.assert_allclose(b.attn.wv[...], a.attn.wv[...], rtol=5e-3, atol=1e-3)  # values untouched


def test_a_negative_threshold_fails_in_one_line():
    with pytest.raises(ConfigError, match="train.qk_clip"):
        prepare.resolve(_config(-1.0))


@pytest.mark.parametrize("q_lora_rank", [0, 4])
def test_mla_clips_the_nope_parts_by_sqrt_gamma_the_rotary_query_by_gamma(q_lora_rank):
    """model.mla (posenc.qk_clip.clip_mla, Megatron-LM's MLA case): per head, the query and key "nope" parts
    times sqrt(gamma), the rotary query part times gamma; the shared rotary key and the values stay."""
    def config(threshold=0.0):
        c = _config(threshold)
        c.model.update(num_kv_heads=0, bias="none")
        c.model.mla.update(kv_lora_rank=6, q_lora_rank=q_lora_rank, qk_nope_head_dim=4, qk_rope_head_dim=4,
                           v_head_dim=3)
        return c

    key = jax.random.key(5)
    plain, logits, _ = _step(prepare.resolve(config()), key)
    threshold = float(np.median(logits))
    clipped, logits_c, metrics = _step(prepare.resolve(config(threshold)), key)
    np.testing.assert_allclose(logits_c, logits, rtol=1e-5)
    assert float(metrics["qk_clipped_heads"]) == float((logits > threshold).sum()) > 0
    tol = dict(rtol=5e-3, atol=1e-3)
    for a, b, s in zip(plain.blocks, clipped.blocks, logits):
        gamma = np.minimum(1.0, threshold / s)
        a, b = a.attn, b.attn
        name = "wq_b" if q_lora_rank else "wq"
        qa, qb = np.asarray(getattr(a, name)[...]), np.asarray(getattr(b, name)[...])
        np.testing.assert_allclose(qb[..., :4], qa[..., :4] * np.sqrt(gamma)[:, None], **tol)
        np.testing.assert_allclose(qb[..., 4:], qa[..., 4:] * gamma[:, None], **tol)
        kva, kvb = np.asarray(a.wkv_b[...]), np.asarray(b.wkv_b[...])
        np.testing.assert_allclose(kvb[..., :4], kva[..., :4] * np.sqrt(gamma)[:, None], **tol)
        np.testing.assert_allclose(kvb[..., 4:], kva[..., 4:], **tol)  # the values
        np.testing.assert_allclose(b.wkv_a[...], a.wkv_a[...], **tol)  # the shared rotary key and the latent
        if q_lora_rank:
            np.testing.assert_allclose(b.wq_a[...], a.wq_a[...], **tol)  # shared by the heads
        if gamma.min() < 1:  # the rule moved these weights by more than the tolerance
            assert np.abs(qb[..., 4:] - qa[..., 4:]).max() > 1e-2
