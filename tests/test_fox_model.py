"""The FoX unit in the model against the official ForgettingAttentionLayer, and FoX (Pro).

Reference: zhixuan-lin/forgetting-transformer @ 883f260,
src/forgetting_transformer/model/forgetting_transformer/modeling_forgetting_transformer.py,
``ForgettingAttentionLayer.forward`` (fgate_type "full", no RoPE) transcribed in numpy float64
with the official pieces of tests/test_fox.py: ``ShiftLinear`` (official_token_shift),
``GroupNorm`` q/k norm (group_norm_ref), ``FusedGroupNormGated`` (group_norm_gated_ref) and
fla's ``naive_forgetting_attn`` for ``forgetting_attention``. The registry-wide tests
(test_model, test_decode, test_attention, test_causality) cover training, cached decoding,
blocked == dense and causality through gradients.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_fox import (
    group_norm_gated_ref,
    group_norm_ref,
    logsigmoid,
    naive_forgetting_attn,
    official_bias_init,
    official_token_shift,
    sigmoid,
)

import helpers

B, L, D, H = 2, 10, 32, 4
DH = D // H


def _layer(pro, options=None, **model):
    model = helpers.decoder("fox", position=dict(pro=pro, **(options or {})), num_layers=1,
                            perturb=0.05, **model)
    return model, model.blocks[0].attn


def _np(p):
    return np.asarray(p[...], np.float64)


def official_layer(attn, x):
    """ForgettingAttentionLayer.forward on x [B, T, D] (numpy float64) -> (o_proj output, o before it)."""
    enc = attn.encoding
    x = np.asarray(x, np.float64)
    wq, wk, wv = (_np(w).reshape(D, -1) for w in (attn.wq, attn.wk, attn.wv))
    q, k, v = x @ wq, x @ wk, x @ wv
    # ShiftLinear: alpha = sigmoid(shift_proj(x)); token_shift(out_per_head, alpha, 1 - alpha)
    heads = lambda y: y.reshape(y.shape[:2] + (H, DH))  # noqa: E731
    if enc.k_shift:
        k = official_token_shift(heads(k), sigmoid(x @ _np(enc.w_k_shift))).reshape(k.shape)
    if enc.v_shift:
        v = official_token_shift(heads(v), sigmoid(x @ _np(enc.w_v_shift))).reshape(v.shape)
    if enc.qk_norm:  # q_norm / k_norm: GroupNorm over heads (qk_norm_share_param_across_head False)
        q = group_norm_ref(q, _np(enc.q_norm).reshape(-1), H, 1e-5)
        k = group_norm_ref(k, _np(enc.k_norm).reshape(-1), H, 1e-5)
    if enc.gate == "full":  # fgate_proj, logsigmoid(.float())
        log_fgate = logsigmoid(x @ _np(enc.w_f) + _np(enc.b_f))
    elif enc.gate == "none":
        log_fgate = np.zeros(x.shape[:2] + (H,))
    else:  # broadcast_to(fgate_bias, (B, T, H)); "fixed": the registered buffer of the bias init
        b = (_np(enc.b_f) if enc.gate == "bias_only"
             else official_bias_init(H, enc.decay_time_min, enc.decay_time_max))
        log_fgate = logsigmoid(np.broadcast_to(b, x.shape[:2] + (H,)))
    q, k, v = (y.reshape(y.shape[:2] + (H, DH)) for y in (q, k, v))
    o = naive_forgetting_attn(q, k, v, log_fgate, 1 / math.sqrt(DH)).reshape(x.shape[:2] + (D,))
    if enc.output_norm:  # output_norm(o[, g=ogate_proj(hidden_states)]), norm_eps 1e-6
        if enc.output_gate != "none":
            o = group_norm_gated_ref(o, x @ _np(enc.w_gate), _np(enc.out_norm).reshape(-1), H, 1e-6)
        else:
            o = group_norm_ref(o, _np(enc.out_norm).reshape(-1), H, 1e-6)
    elif enc.output_gate == "sigmoid":  # glu_linear: sigmoid(g) * o, then o_proj
        o = sigmoid(x @ _np(enc.w_gate)) * o
    elif enc.output_gate == "silu":  # swiglu_linear: g * sigmoid(g) * o, then o_proj
        g = x @ _np(enc.w_gate)
        o = g * sigmoid(g) * o
    return o @ _np(attn.wo).reshape(D, D), o


@pytest.mark.parametrize("pro", [False, True])
def test_layer_matches_the_official_forgetting_attention_layer(pro):
    model, attn = _layer(pro)
    x = jax.random.normal(jax.random.key(1), (B, L, D))
    positions = jnp.arange(L)[None]
    y = jax.jit(lambda x: attn.forward(x, positions, seq_len=L))(x)
    want, _ = official_layer(attn, x)
    np.testing.assert_allclose(np.asarray(y), want, rtol=2e-5, atol=2e-5)
    # The gate matters: the same layer with open gates (f = 1) gives other outputs.
    assert float(np.abs(want - official_layer_open_gates(attn, x)).max()) > 1e-3


VARIANTS = [
    dict(gate="bias_only"),
    dict(gate="bias_only", decay_time_min=2.0, decay_time_max=50.0),
    dict(gate="fixed", decay_time_min=1.5, decay_time_max=20.0),
    dict(gate="none", pro=True),
    dict(output_gate="sigmoid"),
    dict(output_gate="silu"),
    dict(output_norm=True),
    dict(qk_norm=True),
    dict(k_shift=True, qk_norm=True),
    dict(pro=True, output_norm=False),
]


@pytest.mark.parametrize("options", VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_official_variants_match_the_layer(options):
    """fgate_type bias_only / fixed / none with the decay-time bias init, use_output_gate with
    ogate_act sigmoid or silu without the output norm, the output norm alone, the per-head QK-norm
    outside Pro, Pro with one part off: each against the official forward (numpy float64)."""
    options = dict(options)
    pro = options.pop("pro", False)
    _, attn = _layer(pro, options)
    x = jax.random.normal(jax.random.key(3), (B, L, D))
    y = jax.jit(lambda x: attn.forward(x, jnp.arange(L)[None], seq_len=L))(x)
    want, _ = official_layer(attn, x)
    np.testing.assert_allclose(np.asarray(y), want, rtol=2e-5, atol=2e-5)
    enc = attn.encoding
    if enc.gate == "fixed":  # a constant, not a parameter
        assert not hasattr(enc, "b_f") and not hasattr(enc, "w_f")
    if enc.gate == "bias_only" and enc.decay_time_min:
        np.testing.assert_allclose(-1 / logsigmoid(official_bias_init(H, 2.0, 50.0)),
                                   np.geomspace(2.0, 50.0, H), rtol=1e-6)


def test_variant_decoding_in_pieces_equals_the_full_pass():
    model, _ = _layer(False, dict(gate="bias_only", decay_time_min=2.0, decay_time_max=50.0,
                                  v_shift=True, output_gate="silu"))
    tokens = helpers.tokens(B, L)
    full, a, b, cache, _ = helpers.decode_in_pieces(model, tokens, 4, L + 2)
    np.testing.assert_allclose(np.concatenate([a, b], 1), full, rtol=2e-5, atol=2e-5)
    assert set(cache["state"][0]) == {"c", "v_prev"}


@pytest.mark.parametrize("options,message", [
    (dict(gate="fixed"), r"gate 'fixed' needs model.position.fox.decay_time_min"),
    (dict(gate="bias_only", decay_time_min=2.0), r"decay_time_min and .*decay_time_max go together"),
    (dict(decay_time_min=2.0, decay_time_max=5.0), r"decay_time_m(in|ax)=.* is set, but fox does not use it"),
    (dict(output_gate="silu", output_norm=True), r"output_gate 'silu' cannot be combined"),
    (dict(gate="full_rank"), r"model.position.fox.gate must be one of|choose one of"),
])
def test_bad_variants_name_the_field(options, message):
    with pytest.raises(ValueError, match=message):
        helpers.spec("fox", position=options)


def official_layer_open_gates(attn, x):
    b_f = attn.encoding.b_f[...]
    attn.encoding.b_f[...] = jnp.full_like(b_f, 30.0)  # sigmoid(30 + w.x) ~ 1: no decay
    try:
        return official_layer(attn, x)[0]
    finally:
        attn.encoding.b_f[...] = b_f


def test_bf16_layer_and_prefill_in_pieces():
    """bf16 compute stays near the float64 reference; a prefill in two pieces (queries fewer than
    keys: the cached c and the running sum carry over) equals the full pass."""
    model, attn = _layer(True, dtype="bfloat16", num_kv_heads=H)
    x = jax.random.normal(jax.random.key(2), (B, L, D))
    y = jax.jit(lambda x: attn.forward(x, jnp.arange(L)[None], seq_len=L))(x.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    want, _ = official_layer(attn, x.astype(jnp.bfloat16).astype(jnp.float32))
    err = float(np.abs(np.asarray(y, np.float32) - want).max())
    assert err < 0.05 * float(np.abs(want).max()) + 0.02, err
    # Pieces through the decoder's cache, float32 model.
    model, _ = _layer(True)
    tokens = helpers.tokens(B, L)
    full, a, b, cache, shifted = helpers.decode_in_pieces(model, tokens, 4, L + 2)
    np.testing.assert_allclose(np.concatenate([a, b], 1), full, rtol=2e-5, atol=2e-5)
    assert set(cache["state"][0]) == {"c", "k_prev", "v_prev"}
    assert cache["features"][0]["c"].shape == (B, L + 2, H)


def test_logits_ignore_positions_and_the_bias_stays_blocked():
    """FoX reads no position (relative-shift invariance is exact), and the blocked path equals the
    dense one at a block that splits the sequence (no [L, L] bias is needed)."""
    model, _ = _layer(False)
    tokens = helpers.tokens(B, L)
    a = model(tokens, jnp.arange(L))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(model(tokens, 1000 + 3 * jnp.arange(L))))
    blocked = helpers.decoder("fox", num_layers=1, perturb=0.05, attention_impl="blocked",
                              attention_block=3)
    np.testing.assert_allclose(np.asarray(blocked(tokens)), np.asarray(a), rtol=2e-5, atol=2e-5)
