"""Hyper-connections in the decoder (model.residual_streams): a whole model against lucidrains'
HyperConnections (the transcription of test_hyper_connections) around numpy pre-norm sublayers,
cached decoding against the full forward, a single stream adding nothing, and the refusals."""

import jax
import numpy as np
import pytest
from flax import nnx
from test_hyper_connections import _lucid_hc
from test_norm_model import _np, _np_attention, _np_mlp

import helpers

N, L = 3, 6


def _rms(x, g, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g


def _lucid_params(params, norm):
    # lucidrains' RMSNorm gain is gamma + 1 (gamma init 0): the model's rms gain minus 1
    p = {k: _np(v) for k, v in params.items()}
    return {"static_alpha": p["static_alpha"], "static_beta": p["static_beta"],
            "dynamic_alpha_fn": p["dynamic_alpha"], "dynamic_beta_fn": p["dynamic_beta"],
            "dynamic_alpha_scale": p["dynamic_alpha_scale"], "dynamic_beta_scale": p["dynamic_beta_scale"],
            "gamma": _np(norm.params["scale"]) - 1.0}


def test_the_model_matches_lucidrains_hyper_connections():
    model = helpers.decoder("nope", residual_streams=N, perturb=0.2)
    tokens = np.random.default_rng(0).integers(0, 16, (1, L))
    x = np.repeat(_np(model.embedding)[tokens[0]][:, None, :], N, axis=1)  # [L, n, D]
    for block in model.blocks:
        attn, _, _ = _np_attention(block.attn, block.attn.scale)
        mlp = _np_mlp(block.mlp)
        for j, (sub, norm) in enumerate(((attn, block.norm1), (mlp, block.norm2))):
            g = _np(norm.params["scale"])
            x = _lucid_hc(x, _lucid_params(block.hc[j], block.hc_norms[j]), lambda h, s=sub, g=g: s(_rms(h, g)))
    h = _rms(x.sum(-2), _np(model.final_norm.params["scale"]))
    ref = h @ _np(model.embedding).T
    np.testing.assert_allclose(np.asarray(model(tokens))[0], ref, rtol=1e-4, atol=1e-4)


def test_initial_parameters_are_the_papers():
    model = helpers.decoder("rope", residual_streams=N, num_layers=2)
    for layer, block in enumerate(model.blocks):
        for j in range(2):
            a = _np(block.hc[j]["static_alpha"])
            np.testing.assert_array_equal(a[:, 0], np.eye(N)[(2 * layer + j) % N])  # e_(k mod n)
            np.testing.assert_array_equal(a[:, 1:], np.eye(N))
            np.testing.assert_array_equal(_np(block.hc[j]["dynamic_alpha"]), 0.0)


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_cached_decoding_matches_the_full_forward(kind):
    model = helpers.decoder(kind, residual_streams=N, perturb=0.05)
    tokens = helpers.tokens()
    full, first, rest, _, _ = helpers.decode_in_pieces(model, tokens, 5, 12)
    np.testing.assert_allclose(np.concatenate([first, rest], 1), full, rtol=2e-5, atol=5e-5)


def test_one_stream_adds_nothing_to_the_program():
    tokens = helpers.tokens()

    def hlo(model):
        graphdef, state = nnx.split(model)
        return jax.jit(lambda s, t: nnx.merge(graphdef, s)(t)).lower(state, tokens).as_text()

    assert hlo(helpers.decoder("rope", residual_streams=1)) == hlo(helpers.decoder("rope"))
    assert helpers.decoder("rope", residual_streams=1).blocks[0].hc is None


@pytest.mark.parametrize("fields", [dict(norm=dict(placement="post")), dict(parallel_residual=True)])
def test_hyper_connections_need_pre_norm_sublayers(fields):
    with pytest.raises(ValueError, match="model.residual_streams=2 .* needs model.norm.placement 'pre'") as e:
        helpers.spec("rope", residual_streams=2, **fields)
    assert "\n" not in str(e.value)
