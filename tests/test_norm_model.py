"""The 2025-26 norm methods inside the decoder, against the transcriptions of their official code that
test the pure functions: Derf (kind), Gemma 4's value norm (model.norm.v_norm), HybridNorm and
HybridNorm* (placements hybrid, hybrid_star), LayerNorm Scaling (placement lns), MiniCPM's and
Granite's multipliers (model.*_multiplier, model.attention_scale); and the one-line refusals of the
combinations that normalise twice. Every encoding with these trains and decodes in test_fuzz_configs."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_derf import _official_derf
from test_hybrid_norm import _gemma4_rmsnorm, _olmo_block
from test_layernorm_scaling import _official_lns_layer
from test_multipliers import _granite_forward, _minicpm_forward

import helpers
from posenc.model import ModelSpec
from posenc.model.layers import Norm

L = 6


def _np(p):
    return np.asarray(p[...], np.float64)


def _gelu(x):  # jax.nn.gelu(approximate=True), the model's default MLP
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _np_attention(attn, scale):
    """Causal softmax attention of a NoPE layer (``attn``: the model's Attention), numpy float64."""
    wq, wk, wv, wo = (_np(w) for w in (attn.wq, attn.wk, attn.wv, attn.wo))

    def f(h):  # h [L, D], already through whatever the placement puts before attention
        q, k, v = (np.einsum("ld,dhe->lhe", h, w) for w in (wq, wk, wv))
        return q, k, v

    def core(q, k, v):
        s = np.einsum("lhd,mhd->hlm", q, k) * scale
        s = np.where(np.tril(np.ones((len(q), len(q)), bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        return np.einsum("lhe,hed->ld", np.einsum("hlm,mhd->lhd", w / w.sum(-1, keepdims=True), v), wo)

    return lambda h: core(*f(h)), f, core


def _np_mlp(mlp):
    return lambda h: _gelu(h @ _np(mlp.w1)) @ _np(mlp.w2)


def _run_block(model, i, x):
    pos = jnp.arange(x.shape[1])[None]
    block = model.blocks[i]
    y, _ = block(jnp.asarray(x, jnp.float32),
                 lambda a, h: (a.forward(h, pos, seq_len=x.shape[1]), None), deterministic=True)
    return np.asarray(y, np.float64)


def _x(seed, d):
    return np.random.default_rng(seed).normal(0.0, 2.0, (1, L, d)).astype(np.float32)


# ------------------------------------------------------------------ Derf


def test_derf_kind_has_the_official_initial_values_and_formula():
    model = helpers.decoder("nope", norm=dict(kind="derf", derf_alpha=1.0), perturb=0.3)
    fresh = Norm.of(ModelSpec.from_config(helpers.model_cfg("nope", norm=dict(kind="derf"))).norm, 32)
    init = {n: np.asarray(p[...]) for n, p in fresh.params.items()}
    assert set(init) == {"alpha", "shift", "gamma", "beta"}  # Dynamic_erf: alpha, shift, weight, bias
    assert init["alpha"] == 0.5 and init["shift"] == 0.0 and init["alpha"].shape == init["shift"].shape == ()
    np.testing.assert_array_equal(init["gamma"], np.ones(32))
    np.testing.assert_array_equal(init["beta"], np.zeros(32))
    norm = model.blocks[1].norm2  # perturbed: every parameter takes part
    p = {n: np.asarray(v[...], np.float64) for n, v in norm.params.items()}
    x = _x(0, 32)
    np.testing.assert_allclose(norm(jnp.asarray(x)), _official_derf(x, p["alpha"], p["shift"], p["gamma"],
                                                                     p["beta"]), rtol=1e-5, atol=1e-5)
    assert model.final_norm.kind == "derf"  # every norm of the model is of the kind


# ------------------------------------------------------------------ value norm


def test_value_norm_is_gemma4s_on_every_value_head_in_every_path():
    model = helpers.decoder("rope", norm=dict(v_norm=True), num_kv_heads=2)
    attn = model.blocks[0].attn
    x = _x(1, 32)
    _, _, v, _ = attn.project(jnp.asarray(x))
    raw = np.einsum("bld,dhe->blhe", x.astype(np.float64), _np(attn.wv))
    np.testing.assert_allclose(v, _gemma4_rmsnorm(raw), rtol=1e-5, atol=1e-5)
    plain = helpers.decoder("rope", num_kv_heads=2)
    assert not np.allclose(plain(helpers.tokens()), model(helpers.tokens()))  # the flag changes the model


# ------------------------------------------------------------------ HybridNorm


@pytest.mark.parametrize("placement", ["hybrid", "hybrid_star"])
def test_hybridnorm_blocks_match_the_olmo_block(placement):
    # test_hybrid_norm's transcription has D 8, 2 heads of 4, OLMo's eps 1e-5
    model = helpers.decoder("nope", norm=dict(placement=placement, eps=1e-5), d_model=8, num_heads=2,
                            perturb=0.3)
    for i, block in enumerate(model.blocks):
        first = placement == "hybrid_star" and i == 0
        assert (block.norm1 is None) != first  # HybridNorm's attention reads the stream itself
        g = block.attn.qkv_params
        p = {"wq": _np(block.attn.wq).reshape(8, 8), "wk": _np(block.attn.wk).reshape(8, 8),
             "wv": _np(block.attn.wv).reshape(8, 8), "wo": _np(block.attn.wo).reshape(8, 8),
             "w1": _np(block.mlp.w1), "w2": _np(block.mlp.w2), "ff_norm": _np(block.norm2.params["scale"]),
             "q_norm": _np(g["q_scale"]), "k_norm": _np(g["k_scale"]), "v_norm": _np(g["v_scale"])}
        if first:
            p["attn_norm"] = _np(block.norm1.params["scale"])
        x = _x(i, 8)
        ref = _olmo_block(x[0].astype(np.float64), p, attn_norm=first, ffn_residual=not first, act=_gelu)
        np.testing.assert_allclose(_run_block(model, i, x)[0], ref, rtol=1e-4, atol=1e-4, err_msg=str(i))


# ------------------------------------------------------------------ LayerNorm Scaling


def test_lns_blocks_match_the_official_layer():
    model = helpers.decoder("nope", norm=dict(placement="lns"), num_layers=3, perturb=0.3)
    for i, block in enumerate(model.blocks):
        attn, _, _ = _np_attention(block.attn, 1 / math.sqrt(8))
        x = _x(i, 32)
        ref = _official_lns_layer(x[0].astype(np.float64), i, attn, _np_mlp(block.mlp),
                                  _np(block.norm1.params["scale"]), _np(block.norm2.params["scale"]))
        np.testing.assert_allclose(_run_block(model, i, x)[0], ref, rtol=1e-4, atol=1e-4, err_msg=str(i))
    assert model.final_norm is not None


# ------------------------------------------------------------------ multipliers


def _multiplied(**fields):
    # test_multipliers' toy decoder: D 8, 3 layers, vocab 13, weightless RMSNorms (gain ones at init)
    model = helpers.decoder("nope", d_model=8, num_heads=2, num_layers=3, vocab_size=13, tie_embeddings=False,
                            **fields)
    p = {"embed": _np(model.embedding), "head": _np(model.head).T}
    scale = model.blocks[0].attn.scale
    sublayers = [(_np_attention(b.attn, scale)[0], _np_mlp(b.mlp)) for b in model.blocks]
    return model, p, sublayers


def test_granite_multipliers_match_granites_forward():
    model, p, sub = _multiplied(embedding_multiplier=6.0, residual_multiplier=0.3, logits_multiplier=0.25,
                                attention_scale=0.05)
    tokens = np.array([[3, 3, 0, 12, 7, 1]])
    ref = _granite_forward(tokens, p, 6.0, 0.3, 4.0, sublayers=[(lambda h, a=a: a(h[0])[None], lambda h, m=m: m(h))
                                                                for a, m in sub])
    np.testing.assert_allclose(model(jnp.asarray(tokens)), ref, rtol=1e-4, atol=1e-4)


def test_minicpm_multipliers_match_minicpms_forward():
    scale_emb, scale_depth, dim_model_base = 12.0, 1.4, 2
    model, p, sub = _multiplied(embedding_multiplier=scale_emb, residual_multiplier=scale_depth / math.sqrt(3),
                                logits_multiplier=dim_model_base / 8)
    tokens = np.array([[1, 5, 7, 2, 2, 9]])
    ref = _minicpm_forward(tokens, p, scale_emb, scale_depth, dim_model_base,
                           sublayers=[(lambda h, a=a: a(h[0])[None], lambda h, m=m: m(h)) for a, m in sub])
    np.testing.assert_allclose(model(jnp.asarray(tokens)), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("placement", ["sandwich", "reordered", "post", "rezero"])
def test_the_residual_multiplier_scales_what_the_placement_adds(placement):
    """x + m * branch: the branch ends in N_out (sandwich) or N (reordered); post norms x + m F(x)."""
    base = helpers.decoder("nope", norm=dict(placement=placement), perturb=0.3)
    scaled = helpers.decoder("nope", norm=dict(placement=placement), perturb=0.3, residual_multiplier=0.5)
    x = _x(3, 32)
    pos = jnp.arange(L)[None]
    attend = lambda a, h: (a.forward(h, pos, seq_len=L), None)  # noqa: E731
    block, ref_block = scaled.blocks[0], base.blocks[0]
    xj = jnp.asarray(x)
    if placement in ("sandwich", "reordered"):  # the attention half alone: x + m * branch(x)
        branch = np.asarray(ref_block._residual(xj, lambda h: attend(ref_block.attn, h)[0], ref_block.norm1,
                                                ref_block.norm1_out)) - x
        got = np.asarray(block._residual(xj, lambda h: attend(block.attn, h)[0], block.norm1, block.norm1_out))
        np.testing.assert_allclose(got, x + 0.5 * branch, rtol=1e-5, atol=1e-5)
    else:
        f = np.asarray(attend(ref_block.attn, xj)[0])
        got = np.asarray(block._residual(xj, lambda h: attend(block.attn, h)[0], block.norm1, None))
        if placement == "rezero":
            g = float(block.gate[...])
            np.testing.assert_allclose(got, x + g * 0.5 * f, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_allclose(got, np.asarray(block.norm1(xj + 0.5 * f)), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("norm, message", [
    (dict(placement="hybrid", qk_norm="rms"), "model.norm.qk_norm='rms' and model.norm.placement='hybrid' both"),
    (dict(placement="hybrid_star", v_norm=True), "model.norm.v_norm=True and model.norm.placement='hybrid_star'"),
    (dict(derf_alpha=1.0), "model.norm.derf_alpha=1.0 is set, but only kind 'derf' uses it"),
])
def test_combinations_that_normalise_twice_are_refused_in_one_line(norm, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as e:
        helpers.spec("rope", norm=norm)
    assert "\n" not in str(e.value)


def test_a_unit_with_its_own_qk_norm_refuses_hybridnorm():
    with pytest.raises(ValueError, match=r"model.norm.placement='hybrid' and model.position.fox.qk_norm"):
        helpers.spec("fox", norm=dict(placement="hybrid"), position=dict(qk_norm=True))


@pytest.mark.parametrize("field", ["embedding_multiplier", "residual_multiplier", "logits_multiplier"])
def test_multipliers_must_be_positive(field):
    with pytest.raises(ValueError, match=f"model.{field}"):
        helpers.spec("rope", **{field: 0.0})


def test_options_that_are_off_add_nothing_to_the_program():
    """Defaults (multipliers 1, no value norm) compile to the program of a model without the fields."""
    tokens = helpers.tokens()

    def hlo(model):
        graphdef, state = nnx.split(model)
        return jax.jit(lambda s, t: nnx.merge(graphdef, s)(t)).lower(state, tokens).as_text()

    base = hlo(helpers.decoder("rope"))
    assert hlo(helpers.decoder("rope", embedding_multiplier=1.0, residual_multiplier=1.0)) == base
    assert hlo(helpers.decoder("rope", residual_multiplier=2.0)) != base
    assert hlo(helpers.decoder("rope", norm=dict(v_norm=True))) != base
