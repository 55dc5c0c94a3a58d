"""posenc.logit_scale: key counts against a brute-force mask, SSMax, Qwen log-n and
the Llama 4 temperature against transcriptions of their official formulas."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc import irope, logit_scale

# ---------------------------------------------------------------------------
# num_keys: the count of keys a query sees, against an explicit mask.
# ---------------------------------------------------------------------------


def mask_count(q_len, *, kv_length, offset, window, chunk):
    """Visible keys per query from the mask itself (i - W < j <= i; same chunk)."""
    out = []
    for i in range(q_len):
        p = i + offset
        keys = range(kv_length) if kv_length is not None else range(p + 1)
        visible = [j for j in keys
                   if j <= p
                   and (window is None or j > p - window)
                   and (chunk is None or j // chunk == p // chunk)]
        out.append(len(visible))
    return out


@given(q_len=st.integers(1, 8), offset=st.integers(0, 12), extra=st.one_of(st.none(), st.integers(-3, 6)),
       window=st.one_of(st.none(), st.integers(1, 6)), chunk=st.one_of(st.none(), st.integers(1, 6)))
def test_num_keys_matches_the_mask(q_len, offset, extra, window, chunk):
    kv_length = None if extra is None else max(0, q_len + offset + extra)
    got = logit_scale.num_keys(jnp.arange(q_len), kv_length=kv_length, offset=offset,
                               window=window, chunk=chunk)
    assert got.dtype == jnp.int32 and got.shape == (q_len,)
    assert got.tolist() == mask_count(q_len, kv_length=kv_length, offset=offset, window=window,
                                      chunk=chunk)


def test_num_keys_golden():
    idx = jnp.arange(6)
    assert logit_scale.num_keys(idx).tolist() == [1, 2, 3, 4, 5, 6]
    assert logit_scale.num_keys(idx, window=3).tolist() == [1, 2, 3, 3, 3, 3]
    assert logit_scale.num_keys(idx, chunk=4).tolist() == [1, 2, 3, 4, 1, 2]
    # decoding one token after 99 cached keys: position 99 sees 100 keys, or its window
    one = jnp.array([0])
    assert logit_scale.num_keys(one, offset=99, kv_length=100).tolist() == [100]
    assert logit_scale.num_keys(one, offset=99, kv_length=100, window=32).tolist() == [32]
    assert logit_scale.num_keys(one, offset=99, kv_length=100, chunk=64).tolist() == [36]


def test_num_keys_traced_and_batched():
    idx = jnp.arange(4)[None, :]  # [1, Lq]
    offsets = jnp.array([[0], [10], [100]])  # [B, 1]: per-sequence cache lengths
    fn = jax.jit(lambda off: logit_scale.num_keys(idx, offset=off, kv_length=off + 4, window=8))
    out = fn(offsets)
    assert out.shape == (3, 4)
    assert out.tolist() == [[1, 2, 3, 4], [8, 8, 8, 8], [8, 8, 8, 8]]
    assert jax.jit(lambda n: logit_scale.num_keys(jnp.arange(3), kv_length=n))(2).tolist() == [1, 2, 2]


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=0), "window must be an integer >= 1; got 0"),
    (dict(chunk=2.0), "chunk must be an integer >= 1; got 2.0"),
    (dict(offset=-1), "offset must be an integer >= 0; got -1"),
    (dict(kv_length=-2), "kv_length must be an integer >= 0; got -2"),
    (dict(offset=jnp.array([1.0])), "offset must be an integer array; got dtype float32"),
])
def test_num_keys_errors(kwargs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        logit_scale.num_keys(jnp.arange(3), **kwargs)
    with pytest.raises(ValueError, match="query_index must be an integer array"):
        logit_scale.num_keys(jnp.arange(3.0))


# ---------------------------------------------------------------------------
# Scalable-Softmax (Nakanishi 2025): softmax over n^(s z_j).
# ---------------------------------------------------------------------------


def test_ssmax_golden_and_shapes():
    n = jnp.array([[1, 2, 4, 8]])  # [B=1, Lq=4]
    s = jnp.array([1.0, 0.5, 0.43])
    m = logit_scale.ssmax(n, s)
    assert m.shape == (1, 3, 4) and m.dtype == jnp.float32
    np.testing.assert_allclose(m[0], np.asarray(s)[:, None] * np.log([1, 2, 4, 8]), rtol=1e-6)
    scalar = logit_scale.ssmax(n, 0.5)  # one s for every head: no head axis
    assert scalar.shape == (1, 4)
    np.testing.assert_allclose(scalar[0], 0.5 * np.log([1, 2, 4, 8]), rtol=1e-6)
    b = jnp.array([0.1, 0.0, -0.2])
    np.testing.assert_allclose(logit_scale.ssmax(n, s, bias=b), m + b[None, :, None], rtol=1e-6)
    assert logit_scale.ssmax(n, s.astype(jnp.bfloat16)).dtype == jnp.float32
    assert float(logit_scale.ssmax(jnp.array([0]), 1.0)[0]) == 0.0  # no key: finite, no-op


@given(seed=st.integers(0, 2**16), n=st.integers(1, 4096), s=st.floats(0.05, 2.0))
def test_ssmax_is_softmax_over_n_to_the_s_z(seed, n, s):
    z = np.asarray(jax.random.normal(jax.random.key(seed), (6,)), np.float64)
    m = float(logit_scale.ssmax(jnp.array([n]), s)[0])
    got = np.asarray(jax.nn.softmax(jnp.asarray(z, jnp.float32) * m))
    want = float(n) ** (s * z) / np.sum(float(n) ** (s * z))  # the paper's definition
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)


def test_ssmax_grad_and_vmap():
    n = logit_scale.num_keys(jnp.arange(5), window=3)  # [1, 2, 3, 3, 3]
    g = jax.grad(lambda s: jnp.sum(logit_scale.ssmax(n, s)))(jnp.array([0.3, 0.7]))
    np.testing.assert_allclose(g, [np.log([1, 2, 3, 3, 3]).sum()] * 2, rtol=1e-6)
    batch = jnp.stack([n, n + 1])
    np.testing.assert_array_equal(jax.vmap(lambda k: logit_scale.ssmax(k, 0.5))(batch),
                                  logit_scale.ssmax(batch, 0.5))


def test_ssmax_errors():
    with pytest.raises(ValueError, match=re.escape("s must be a scalar or have shape [H]; got shape (2, 2)")):
        logit_scale.ssmax(jnp.array([3]), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match=re.escape("bias must have the shape of s (2,); got shape (3,)")):
        logit_scale.ssmax(jnp.array([3]), jnp.ones(2), bias=jnp.ones(3))
    with pytest.raises(ValueError, match="num_keys must be an integer array"):
        logit_scale.ssmax(jnp.array([3.0]), 1.0)


# ---------------------------------------------------------------------------
# Qwen log-n: transcription of Qwen-1 modeling_qwen.py.
# ---------------------------------------------------------------------------


def qwen_logn(seq_length, key_size, query_size):
    """Qwen/Qwen-7B modeling_qwen.py, QWenAttention: logn_list and its slice in forward()."""
    logn_list = [math.log(i, seq_length) if i > seq_length else 1 for i in range(1, 32768)]
    seq_start = key_size - query_size
    seq_end = key_size
    return logn_list[seq_start:seq_end]


@pytest.mark.parametrize("train_length", [2, 16, 2048])
@pytest.mark.parametrize("key_size, query_size", [(5, 5), (16, 16), (17, 17), (40, 40),
                                                  (40, 1), (3000, 1), (9000, 7)])
def test_logn_matches_qwen(train_length, key_size, query_size):
    n = logit_scale.num_keys(jnp.arange(query_size), offset=key_size - query_size,
                             kv_length=key_size)
    got = logit_scale.logn(n, train_length=train_length)
    assert got.dtype == jnp.float32 and got.shape == (query_size,)
    np.testing.assert_allclose(got, qwen_logn(train_length, key_size, query_size), rtol=1e-6)


def test_logn_golden_and_windows():
    got = logit_scale.logn(jnp.array([1, 8, 9, 64, 512]), train_length=8)
    np.testing.assert_allclose(got, [1.0, 1.0, math.log(9) / math.log(8), 2.0, 3.0], rtol=1e-6)
    # A window no longer than the training length keeps every query at 1.
    n = logit_scale.num_keys(jnp.arange(1000), window=8)
    assert np.all(np.asarray(logit_scale.logn(n, train_length=8)) == 1.0)
    with pytest.raises(ValueError, match=re.escape("train_length must be an integer >= 2; got 1")):
        logit_scale.logn(jnp.array([4]), train_length=1)


# ---------------------------------------------------------------------------
# Llama 4 temperature: transcriptions of HF and MaxText.
# ---------------------------------------------------------------------------


def hf_llama4_attn_scales(positions, floor_scale, attn_scale):
    """huggingface/transformers modeling_llama4.py, Llama4TextAttention.forward (NumPy for torch)."""
    positions = np.asarray(positions).astype(np.float32)
    return np.log1p(np.floor((positions + np.float32(1.0)) / np.float32(floor_scale))) * np.float32(
        attn_scale) + np.float32(1.0)


def maxtext_attn_scales(inputs_positions, temperature_tuning_floor_scale, temperature_tuning_scale):
    """AI-Hypercomputer/maxtext layers/attentions.py, Attention.__call__ (temperature_tuning)."""
    return (
        jnp.log(
            jnp.floor((inputs_positions.astype(jnp.float32) + 1.0) / temperature_tuning_floor_scale)
            + 1.0)
        * temperature_tuning_scale
        + 1.0
    )


@pytest.mark.parametrize("floor_scale, attn_scale", [(8192.0, 0.1), (4.0, 0.5), (2.0, 2.0)])
def test_temperature_matches_hf_and_maxtext(floor_scale, attn_scale):
    pos = jnp.array([[0, 1, 3, 8190, 8191, 8192], [16383, 20000, 100000, 2**20, 5, 7]])
    got = logit_scale.temperature(pos, floor_scale=floor_scale, attn_scale=attn_scale)
    assert got.dtype == jnp.float32 and got.shape == pos.shape
    np.testing.assert_allclose(got, hf_llama4_attn_scales(pos, floor_scale, attn_scale), rtol=1e-6)
    np.testing.assert_allclose(got, maxtext_attn_scales(pos, floor_scale, attn_scale), rtol=1e-6)


def test_temperature_golden_jit_vmap():
    pos = jnp.array([0, 8190, 8191, 16383, 100000])
    want = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(13)]
    np.testing.assert_allclose(logit_scale.temperature(pos), want, rtol=1e-6)
    batch = jnp.array([[0, 20000], [40000, 5]])
    np.testing.assert_array_equal(jax.jit(logit_scale.temperature)(batch),
                                  jax.vmap(logit_scale.temperature)(batch))


def test_temperature_errors_and_irope_alias():
    assert irope.nope_temperature is logit_scale.temperature
    with pytest.raises(ValueError, match=re.escape("floor_scale must be a finite number > 0; got 0.0")):
        logit_scale.temperature(jnp.array([1]), floor_scale=0.0)
    with pytest.raises(ValueError, match=re.escape("attn_scale must be a finite number; got nan")):
        logit_scale.temperature(jnp.array([1]), attn_scale=float("nan"))
    with pytest.raises(ValueError, match="positions must be an integer array"):
        logit_scale.temperature(jnp.array([1.0]))
