"""nGPT in the decoder (model.norm.placement 'ngpt'): a whole model against a numpy transcription of
NVIDIA/ngpt's GPT.forward (the Block.forward of test_ngpt), the renormalisation after a real train
step, cached decoding against the full forward, and the one-line refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_ngpt import B, D, H, T, V, _official_block

import helpers
from posenc.config import overrides
from posenc.training import loop, prepare
from posenc.training import step as step_lib

NGPT = dict(norm=dict(placement="ngpt"), mlp="swiglu")


def _np(p):
    return np.asarray(p[...], np.float64)


def _official_forward(model, tokens):
    """model.py GPT.forward with use_nGPT == 1 (no final norm): the model's weights in torch's layout."""
    h = _np(model.embedding)[tokens]  # wte
    for block in model.blocks:
        a, m = block.attn, block.mlp
        p = {"query": _np(a.wq).reshape(D, D).T, "key": _np(a.wk).reshape(D, D).T,
             "value": _np(a.wv).reshape(D, D).T, "att_c_proj": _np(a.wo).reshape(D, D).T,
             "c_fc": np.concatenate([_np(m.w3), _np(m.w1)], axis=1).T,  # [u | v]: h_mlp = u silu(v)
             "mlp_c_proj": _np(m.w2).T, "sqk": _np(a.sqk), "suv": _np(m.suv),
             "attn_alpha": _np(block.steps["attn"]), "mlp_alpha": _np(block.steps["mlp"]),
             "base_scale": 1.0 / D ** 0.5}
        h = _official_block(h, p)
    sz = _np(model.sz) * (1.0 / (1.0 / D ** 0.5))
    return sz * (h @ _np(model.head))  # lm_head [V, D] is the head [D, V] transposed


def test_the_model_matches_ngpts_gpt_forward():
    # NoPE: the transcription leaves the rotation out; perturbed so that every scale's factor shows
    model = helpers.decoder("nope", d_model=D, num_heads=H, vocab_size=V, tie_embeddings=False, perturb=0.1,
                            **NGPT)
    tokens = np.random.default_rng(0).integers(0, V, (B, T))
    got = np.asarray(model(jnp.asarray(tokens)), np.float64)
    np.testing.assert_allclose(got, _official_forward(model, tokens), rtol=2e-4, atol=2e-5)


def test_initial_parameters_are_the_official_ones():
    model = helpers.decoder("rope", tie_embeddings=False, **NGPT)
    d = 32
    np.testing.assert_allclose(_np(model.blocks[0].steps["attn"]), np.full(d, d ** -0.5), rtol=1e-6)
    np.testing.assert_allclose(_np(model.blocks[1].attn.sqk), np.full(d, d ** -0.5), rtol=1e-6)
    np.testing.assert_array_equal(_np(model.blocks[0].mlp.suv), np.ones(2 * 4 * d))
    np.testing.assert_allclose(_np(model.sz), np.full(16, d ** -0.5), rtol=1e-6)
    assert model.final_norm is None and model.blocks[0].norm1 is None and model.blocks[0].norm2 is None
    _assert_on_sphere(model)


def _matrices(model):
    found = [(model.embedding, -1), (model.head, 0)] if model.head is not None else [(model.embedding, -1)]
    for b in model.blocks:
        found += b.attn.sphere_matrices() + b.mlp.sphere_matrices()
    assert len(found) == 1 + (model.head is not None) + 7 * len(model.blocks)
    return found


def _assert_on_sphere(model):
    for w, axis in _matrices(model):
        np.testing.assert_allclose(np.linalg.norm(_np(w), axis=axis), 1.0, rtol=1e-5)


def _base():
    from posenc.configs import default

    c = default.get_config("tiny")
    c.task.train_length = 8
    c.train.batch_size = 2
    c.train.warmup_steps = 0  # the first step moves the parameters
    return c


@pytest.mark.parametrize("kind, tie", [("rope", True), ("alibi", False), ("nope", False)])
def test_a_train_step_keeps_every_matrix_on_the_sphere_and_decoding_matches(kind, tie):
    config = prepare.plain_copy(_base())
    overrides.apply(config, {"model.position.kind": kind, "model.norm.placement": "ngpt", "model.mlp": "swiglu",
                             "model.d_model": 16, "model.num_heads": 4, "model.num_layers": 2,
                             "model.tie_embeddings": tie})
    resolved = prepare.resolve(config)
    model, optimizer, _, _ = loop.init_state(resolved)
    before = {n: np.asarray(v) for n, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    graphdef, state = nnx.split((model, optimizer))
    train_step = step_lib._train_step(resolved.train)
    tokens = jax.random.randint(jax.random.key(1), (2, 5), 0, resolved.spec.vocab_size)

    @jax.jit
    def check(state):
        state, metrics = train_step(graphdef, state, jax.random.key(0))
        m, _ = nnx.merge(graphdef, state)
        return state, metrics, m(tokens), helpers.decode_stepwise(m, tokens, 3, 5, None)[0]

    state, metrics, full, cached = check(state)
    model, _ = nnx.merge(graphdef, state)
    assert np.isfinite(float(metrics["loss"]))
    after = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    moved = [n for n, v in before.items() if not np.allclose(v, np.asarray(after[n]))]
    assert any("sqk" in str(n) for n in moved) and any("wq" in str(n) for n in moved)
    _assert_on_sphere(model)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=2e-5, atol=5e-5)


@pytest.mark.parametrize("fields, message", [
    (dict(mlp="gelu"), "model.norm.placement='ngpt' cannot be combined with model.mlp='gelu'"),
    (dict(mlp="swiglu", residual_multiplier=2.0), "model.residual_multiplier=2.0"),
    (dict(mlp="swiglu", norm=dict(placement="ngpt", qk_norm="rms")), "model.norm.qk_norm='rms'"),
    (dict(mlp="swiglu", attention_scale=0.5), "model.attention_scale=0.5"),
    (dict(mlp="swiglu", num_kv_heads=2), "needs as many key heads as query heads"),
    (dict(mlp="swiglu", head_dim=4), r"num_heads \* head_dim == d_model"),
])
def test_what_ngpt_cannot_combine_with_is_refused_in_one_line(fields, message):
    kw = {"norm": dict(placement="ngpt"), **fields}
    with pytest.raises(ValueError, match=message) as e:
        helpers.spec("rope", **kw)
    assert "\n" not in str(e.value)


def test_a_unit_that_widens_or_normalises_q_and_k_is_refused():
    with pytest.raises(ValueError, match="model.norm.placement='ngpt' scales the rotated queries and keys"):
        helpers.spec("fox", position=dict(qk_norm=True), **NGPT)


def test_the_attention_scale_is_sqrt_head_dim():
    assert helpers.spec("rope", **NGPT).attention_scale == pytest.approx(8 ** 0.5)


def test_the_norms_grid_and_the_config_word_select_ngpt_with_its_mlp():
    from posenc.configs import compare, default

    c = compare.get_config("norms")
    c.grid.update(tasks=("copy",), seeds=(0,))
    assert len(helpers.grid_points(c)) == len(c.grid.placements)  # every point valid, ngpt included
    assert c.variants.ngpt.to_dict() == {"model.norm.placement": "ngpt", "model.mlp": "swiglu",
                                         "model.num_kv_heads": 0}
    d = default.get_config("tiny,ngpt")
    assert (d.model.norm.placement, d.model.mlp, d.model.num_kv_heads) == ("ngpt", "swiglu", 0)
