"""posenc.hard_alibi against a transcription of the official Hard-ALiBi attention mask.

Reference (numpy float64): sjelassi/transformers_ssm_copy @ 1188c47,
synthetic_exps/models/hard_alibi_model.py ``GPTHardAlibiAttention._attn`` (causal mask with
``finfo.min``, then for head i < num_masked_heads a mask of ``mask_value`` with zeros on the diagonals
0 .. i, added to the scores, softmax); synthetic_exps/main.py defaults ``--heads 16
--num_masked_heads 8``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc import hard_alibi

RNG = np.random.default_rng(0)


def official_attn_weights(attn_scores, num_masked_heads):
    """GPTHardAlibiAttention._attn from the scaled scores on: attn_scores [b, H, L, L] -> weights."""
    query_length = key_length = attn_scores.shape[-1]
    causal_mask = np.tril(np.ones((key_length, key_length), bool))[key_length - query_length:key_length]
    mask_value = np.finfo(attn_scores.dtype).min
    attn_scores = np.where(causal_mask, attn_scores, mask_value)
    new_attn_scores = attn_scores.copy()
    with np.errstate(over="ignore"):  # mask_value + mask_value = -inf, as in torch
        for i in range(num_masked_heads):
            mask_head = np.ones_like(attn_scores[:, 0]) * mask_value
            for j in range(i + 1):
                mask_head[:, range(j, mask_head.shape[1]), range(0, mask_head.shape[2] - j)] = 0
            new_attn_scores[:, i] = attn_scores[:, i] + mask_head
    m = new_attn_scores.max(-1, keepdims=True)
    e = np.exp(new_attn_scores - m)
    return e / e.sum(-1, keepdims=True)


def test_default_windows_are_the_official_ones():
    np.testing.assert_array_equal(hard_alibi.windows(16), list(range(1, 9)) + [0] * 8)  # main.py defaults
    np.testing.assert_array_equal(hard_alibi.windows(5), [1, 2, 0, 0, 0])
    np.testing.assert_array_equal(hard_alibi.windows(4, num_windowed=4), [1, 2, 3, 4])
    np.testing.assert_array_equal(hard_alibi.windows(3, num_windowed=0), [0, 0, 0])
    assert hard_alibi.windows(2).dtype == jnp.int32


@pytest.mark.parametrize("num_masked", [3, 6])
def test_attention_weights_match_official(num_masked):
    B, H, L = 2, 6, 9
    scores = RNG.normal(size=(B, H, L, L)) * 2
    want = official_attn_weights(scores, num_masked)
    pos = np.arange(L)
    i, j = pos[:, None], pos[None, :]
    windows = hard_alibi.windows(H, num_windowed=num_masked)
    logits = jnp.asarray(scores, jnp.float32) + hard_alibi.bias(pos, pos, windows)
    got = jax.nn.softmax(jnp.where(j <= i, logits, -jnp.inf), axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_bias_values():
    q, k = jnp.array([3, 4]), jnp.arange(6)
    b = hard_alibi.bias(q, k, jnp.array([2, 0]))
    assert b.shape == (2, 2, 6) and b.dtype == jnp.float32
    inf = -np.inf
    np.testing.assert_array_equal(b[0], [[inf, inf, 0, 0, 0, 0], [inf, inf, inf, 0, 0, 0]])  # i - j < 2; j > i: 0
    np.testing.assert_array_equal(b[1], np.zeros((2, 6)))  # window 0: NoPE
    sym = hard_alibi.bias(q, k, jnp.array([2, 0]), causal=False)
    np.testing.assert_array_equal(sym[0], [[inf, inf, 0, 0, 0, inf], [inf, inf, inf, 0, 0, 0]])  # |i - j| < 2
    np.testing.assert_array_equal(hard_alibi.visible(q, k, jnp.array([2, 0])), np.isfinite(np.asarray(b)))


@given(shift=st.integers(-1000, 1000), causal=st.booleans())
def test_bias_depends_only_on_distance(shift, causal):
    w = jnp.array([1, 3, 0, 5])
    q, k = jnp.array([3, 7, 9]), jnp.array([0, 2, 5, 9, 11])
    np.testing.assert_array_equal(hard_alibi.bias(q + shift, k + shift, w, causal=causal),
                                  hard_alibi.bias(q, k, w, causal=causal))


def test_windows_enforced_with_the_causal_mask():
    L = 12
    w = hard_alibi.windows(8)  # 1, 2, 3, 4 and four NoPE heads
    pos = jnp.arange(L)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    seen = hard_alibi.visible(pos, pos, w) & (j <= i)  # what each head attends after the causal mask
    for h, m in enumerate(np.asarray(w)):
        want = np.minimum(np.arange(L) + 1, m) if m else np.arange(L) + 1
        np.testing.assert_array_equal(seen[h].sum(-1), want, err_msg=f"head {h}, window {m}")
        # the keys kept are the last m: i - m < j <= i
        np.testing.assert_array_equal(seen[h], (j <= i) & ((j > i - m) if m else True))
    # causal: keys after the query are the causal mask's, never the window's
    assert (np.asarray(hard_alibi.bias(pos, pos, w))[:, j > i] == 0).all()


def test_uniform_attention_inside_the_window():
    # equal scores: head h spreads its weight evenly over its last m_h keys
    L, w = 7, jnp.array([3, 0])
    pos = jnp.arange(L)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    p = jax.nn.softmax(jnp.where(j <= i, hard_alibi.bias(pos, pos, w), -jnp.inf), -1)
    np.testing.assert_allclose(p[0, 6], [0, 0, 0, 0, 1 / 3, 1 / 3, 1 / 3], rtol=1e-6)
    np.testing.assert_allclose(p[1, 6], [1 / 7] * 7, rtol=1e-6)


def test_batch_jit_vmap():
    w = hard_alibi.windows(4)
    q = jnp.array([[4, 5], [10, 11]])
    k = jnp.array([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    out = jax.jit(hard_alibi.bias)(q, k, w)
    assert out.shape == (2, 4, 2, 6)
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(jax.vmap(hard_alibi.bias, in_axes=(0, 0, None))(q, k, w), out)


def test_errors():
    p = jnp.arange(3)
    with pytest.raises(ValueError, match=r"windows must be an integer array of shape \[H\]"):
        hard_alibi.bias(p, p, jnp.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"windows must be an integer array of shape \[H\]"):
        hard_alibi.bias(p, p, jnp.ones((2, 2), jnp.int32))
    with pytest.raises(ValueError, match=r"windows must be >= 0 \(0: no window\); got \[1, -2\]"):
        hard_alibi.bias(p, p, jnp.array([1, -2]))
    with pytest.raises(ValueError, match=r"num_windowed must be an integer in \[0, 4\]; got 5"):
        hard_alibi.windows(4, num_windowed=5)
    with pytest.raises(ValueError, match="causal must be True or False"):
        hard_alibi.bias(p, p, jnp.array([1]), causal="yes")
    with pytest.raises(ValueError, match="q_positions must be an integer array"):
        hard_alibi.bias(jnp.arange(3.0), p, jnp.array([1]))
