"""posenc.gated against transcriptions of Qwen3-Next's and the paper's query / gate split and output gate.

References (numpy float64, written from the official code):
- huggingface/transformers @ 01cdc60, src/transformers/models/qwen3_next/modeling_qwen3_next.py,
  ``Qwen3NextAttention.forward`` (view [..., -1, 2 Dh], chunk in two, gate reshaped to [..., H Dh],
  ``attn_output.reshape(*input_shape, -1) * torch.sigmoid(gate)``);
- qiuzh20/gated_attention @ 49645df, modeling_qwen3.py, ``Qwen3Attention.forward`` (view
  [b, L, H_kv, -1], split into [G Dh, G] (headwise) or [G Dh, G Dh] (elementwise), gate reshaped to
  [b, L, H, 1] / [b, L, H, Dh], ``attn_output * torch.sigmoid(gate_score)`` on [b, L, H, Dh]).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import gated

RNG = np.random.default_rng(0)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def qwen3_next_forward(q_proj_out, attn_output, head_dim):
    """Qwen3NextAttention.forward around attention: -> (query_states [..., L, H, Dh], gated output [..., L, H Dh])."""
    input_shape = q_proj_out.shape[:-1]
    query_states, gate = np.split(q_proj_out.reshape(*input_shape, -1, head_dim * 2), 2, axis=-1)
    gate = gate.reshape(*input_shape, -1)
    query_states = query_states.reshape(*input_shape, -1, head_dim)  # .view(hidden_shape), before .transpose(1, 2)
    attn_output = attn_output.reshape(*input_shape, -1)
    return query_states, attn_output * sigmoid(gate)


def paper_forward(q_proj_out, attn_output, num_key_value_heads, num_key_value_groups, head_dim, headwise):
    """qiuzh20/gated_attention Qwen3Attention.forward: -> (query_states [b, L, H, Dh], gated output [b, L, H Dh])."""
    bsz, q_len, _ = q_proj_out.shape
    query_states = q_proj_out.reshape(bsz, q_len, num_key_value_heads, -1)
    g = num_key_value_groups
    if headwise:
        query_states, gate_score = np.split(query_states, [head_dim * g], axis=-1)
        gate_score = gate_score.reshape(bsz, q_len, -1, 1)
    else:
        query_states, gate_score = np.split(query_states, [head_dim * g], axis=-1)
        gate_score = gate_score.reshape(bsz, q_len, -1, head_dim)
    query_states = query_states.reshape(bsz, q_len, -1, head_dim)  # before .transpose(1, 2)
    attn_output = attn_output * sigmoid(gate_score)  # attn_output [b, L, H, Dh] after .transpose(1, 2)
    return query_states, attn_output.reshape(bsz, q_len, -1)


def test_qwen3_next_split_and_gate():
    B, L, H, D = 2, 3, 4, 5
    x = RNG.normal(size=(B, L, H * 2 * D))
    o = RNG.normal(size=(B, L, H, D))
    want_q, want_out = qwen3_next_forward(x, o, D)
    q, g = gated.split_query_gate(jnp.asarray(x, jnp.float32), num_heads=H, head_dim=D)
    assert q.shape == (B, L, H, D) and g.shape == (B, L, H, D)
    np.testing.assert_array_equal(q, want_q.astype(np.float32))
    out = gated.gate(jnp.asarray(o, jnp.float32), g)
    np.testing.assert_allclose(np.asarray(out).reshape(B, L, -1), want_out, rtol=1e-6)


@pytest.mark.parametrize("mode", ["elementwise", "headwise"])
@pytest.mark.parametrize("num_kv", [4, 2, 1])
def test_paper_code_split_and_gate(mode, num_kv):
    B, L, H, D = 2, 3, 4, 6
    groups = H // num_kv
    width = D if mode == "elementwise" else 1
    x = RNG.normal(size=(B, L, H * (D + width)))
    o = RNG.normal(size=(B, L, H, D))
    want_q, want_out = paper_forward(x, o, num_kv, groups, D, mode == "headwise")
    q, g = gated.split_query_gate(jnp.asarray(x, jnp.float32), num_heads=H, head_dim=D, mode=mode, group_size=groups)
    assert g.shape == (B, L, H, width)
    np.testing.assert_array_equal(q, want_q.astype(np.float32))
    out = gated.gate(jnp.asarray(o, jnp.float32), g)
    np.testing.assert_allclose(np.asarray(out).reshape(B, L, -1), want_out, rtol=1e-6)


def test_layouts_agree_only_without_grouping():
    H, D = 4, 3
    x = jnp.asarray(RNG.normal(size=(5, H * 2 * D)), jnp.float32)
    a = gated.split_query_gate(x, num_heads=H, head_dim=D)
    b = gated.split_query_gate(x, num_heads=H, head_dim=D, group_size=2)
    assert not np.array_equal(a[0], b[0])  # a GQA checkpoint of the paper's code is not Qwen3-Next's layout
    # both cut the same numbers: every entry of the input is a query or a gate exactly once
    for q, g in (a, b):
        np.testing.assert_array_equal(np.sort(np.concatenate([np.ravel(q), np.ravel(g)])), np.sort(np.ravel(x)))


def test_gate_values_and_headwise_broadcast():
    o = jnp.asarray(RNG.normal(size=(3, 2, 4)), jnp.float32)
    np.testing.assert_allclose(gated.gate(o, jnp.zeros((3, 2, 4))), o / 2, rtol=1e-6)
    np.testing.assert_allclose(gated.gate(o, jnp.full((3, 2, 4), 30.0)), o, rtol=1e-6)
    np.testing.assert_allclose(gated.gate(o, jnp.full((3, 2, 1), -30.0)), 0.0, atol=1e-12)
    gh = jnp.asarray(RNG.normal(size=(3, 2, 1)), jnp.float32)
    np.testing.assert_allclose(gated.gate(o, gh), gated.gate(o, jnp.broadcast_to(gh, o.shape)), rtol=1e-6)


def test_dtype_jit_vmap_grad():
    x = jnp.asarray(RNG.normal(size=(2, 3, 2 * 8)), jnp.bfloat16)
    split = jax.jit(gated.split_query_gate, static_argnames=("num_heads", "head_dim", "mode", "group_size"))
    q, g = split(x, num_heads=2, head_dim=4)
    assert q.dtype == g.dtype == jnp.bfloat16
    out = jax.jit(gated.gate)(q, g)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(jax.vmap(gated.gate)(q, g).astype(jnp.float32), out.astype(jnp.float32))
    o, gl = jnp.ones((2, 1, 3)), jnp.zeros((2, 1, 3))
    np.testing.assert_allclose(jax.grad(lambda z: gated.gate(o, z).sum())(gl), 0.25)  # sigmoid'(0)


def test_errors():
    x = jnp.zeros((2, 4 * 2 * 3))
    with pytest.raises(ValueError, match="unknown gate mode 'rowwise'; choose one of: elementwise, headwise"):
        gated.split_query_gate(x, num_heads=4, head_dim=3, mode="rowwise")
    with pytest.raises(ValueError, match=r"last axis num_heads \* \(head_dim \+ gate_dim\) = 4 \* \(3 \+ 1\) = 16"):
        gated.split_query_gate(x, num_heads=4, head_dim=3, mode="headwise")
    with pytest.raises(ValueError, match="group_size must divide num_heads = 4; got 3"):
        gated.split_query_gate(x, num_heads=4, head_dim=3, group_size=3)
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1; got 0"):
        gated.split_query_gate(x, num_heads=0, head_dim=3)
    with pytest.raises(ValueError, match=r"gate_logits must have shape \[\.\.\., L, H, Dh\] or \[\.\.\., L, H, 1\]"):
        gated.gate(jnp.zeros((2, 3, 4)), jnp.zeros((2, 3, 2)))
