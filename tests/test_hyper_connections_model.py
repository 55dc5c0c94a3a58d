"""Hyper-connections in the decoder (model.residual_streams, model.hyper_connections): whole models
against lucidrains' HyperConnections (dynamic and static) and DeepSeek-V4's mHC layer step and
HyperHead (the transcriptions of test_hyper_connections) around numpy pre-norm sublayers, cached
decoding against the full forward, every encoding through the conformance checks with each kind, a
single stream adding nothing, and the refusals."""

import itertools
import os

import jax
import numpy as np
import pytest
from flax import nnx
from test_hyper_connections import _lucid_hc, _v4_head, _v4_layer_step
from test_norm_model import _np, _np_attention, _np_mlp

import helpers
from posenc.model import ENCODINGS, check_encoding
from posenc.norms import hyper_connections

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


def _sublayers(block):
    attn, _, _ = _np_attention(block.attn, block.attn.scale)
    return ((attn, block.norm1), (_np_mlp(block.mlp), block.norm2))


def test_static_hyper_connections_match_lucidrains_without_dynamic_terms():
    # lucidrains has no static switch: its static HC is HyperConnections with dynamic_*_fn = 0 (tanh(0) = 0)
    model = helpers.decoder("nope", residual_streams=N, hyper_connections="static", perturb=0.2)
    tokens = np.random.default_rng(1).integers(0, 16, (1, L))
    x = np.repeat(_np(model.embedding)[tokens[0]][:, None, :], N, axis=1)  # [L, n, D]
    d = x.shape[-1]
    for block in model.blocks:
        assert block.hc_norms is None
        for j, (sub, norm) in enumerate(_sublayers(block)):
            assert set(block.hc[j]) == {"static_alpha", "static_beta"}
            p = {"static_alpha": _np(block.hc[j]["static_alpha"]), "static_beta": _np(block.hc[j]["static_beta"]),
                 "dynamic_alpha_fn": np.zeros((d, 1 + N)), "dynamic_beta_fn": np.zeros(d),
                 "dynamic_alpha_scale": 0.5, "dynamic_beta_scale": 0.5, "gamma": np.zeros(d)}
            g = _np(norm.params["scale"])
            x = _lucid_hc(x, p, lambda h, s=sub, g=g: s(_rms(h, g)))
    ref = _rms(x.sum(-2), _np(model.final_norm.params["scale"])) @ _np(model.embedding).T
    np.testing.assert_allclose(np.asarray(model(tokens))[0], ref, rtol=1e-4, atol=1e-4)


def test_mhc_matches_deepseek_v4():
    """DeepseekV4Model.forward: embeddings expanded to hc_mult streams, each DeepseekV4DecoderLayer's
    attn_hc / ffn_hc step around input_layernorm / post_attention_layernorm, norm(hc_head(streams))."""
    model = helpers.decoder("nope", residual_streams=N, hyper_connections="mhc", perturb=0.2)
    tokens = np.random.default_rng(2).integers(0, 16, (1, L))
    x = np.repeat(_np(model.embedding)[tokens][:, :, None, :], N, axis=2)  # [B, S, hc_mult, D]
    for block in model.blocks:
        assert block.hc_norms is None
        for j, (sub, norm) in enumerate(_sublayers(block)):
            p = {k: _np(v) for k, v in block.hc[j].items()}
            g = _np(norm.params["scale"])
            x = _v4_layer_step(x, p, lambda h, s=sub, g=g: s(_rms(h[0], g))[None], N)
    head = {k: _np(v) for k, v in model.hc_head.items()}
    h = _rms(_v4_head(x, head["fn"], head["base"], head["scale"]), _np(model.final_norm.params["scale"]))
    ref = h @ _np(model.embedding).T
    np.testing.assert_allclose(np.asarray(model(tokens)), ref, rtol=1e-4, atol=1e-4)


def test_mhc_initial_parameters_are_deepseek_v4s():
    model = helpers.decoder("rope", residual_streams=N, hyper_connections="mhc", num_layers=1)
    d = model.d_model
    for p in model.blocks[0].hc:
        assert p["fn"].shape == ((2 + N) * N, N * d) and 0.015 < float(np.std(_np(p["fn"]))) < 0.025
        np.testing.assert_array_equal(_np(p["base"]), 0.0)
        np.testing.assert_array_equal(_np(p["scale"]), 1.0)
    head = model.hc_head
    assert head["fn"].shape == (N, N * d) and float(np.std(_np(head["fn"]))) > 0.01
    np.testing.assert_array_equal(_np(head["base"]), 0.0)
    np.testing.assert_array_equal(_np(head["scale"]), 1.0)
    assert helpers.decoder("rope", residual_streams=N).hc_head is None  # HC sums the streams


def test_initial_parameters_are_the_papers():
    model = helpers.decoder("rope", residual_streams=N, num_layers=2)
    for layer, block in enumerate(model.blocks):
        for j in range(2):
            a = _np(block.hc[j]["static_alpha"])
            np.testing.assert_array_equal(a[:, 0], np.eye(N)[(2 * layer + j) % N])  # e_(k mod n)
            np.testing.assert_array_equal(a[:, 1:], np.eye(N))
            np.testing.assert_array_equal(_np(block.hc[j]["dynamic_alpha"]), 0.0)


@pytest.mark.parametrize("kind,hc", [("rope", "dynamic")])  # the other kinds: the conformance cases below
def test_cached_decoding_matches_the_full_forward(kind, hc):
    model = helpers.decoder(kind, residual_streams=N, hyper_connections=hc, perturb=0.05)
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


def test_a_bad_kind_or_a_kind_without_streams_is_refused():
    with pytest.raises(ValueError, match="model.hyper_connections.*'mch'.*dynamic, mhc, static") as e:
        helpers.spec("rope", residual_streams=2, hyper_connections="mch")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="model.hyper_connections='mhc' .* needs model.residual_streams > 1; "
                                         "got 1") as e:
        helpers.spec("rope", hyper_connections="mhc")
    assert "\n" not in str(e.value)


# Encodings with a kind of hyper-connections each, in turn: dense == blocked, cached == full (token by token
# and in pieces), causality, gradients, jit and vmap (posenc.model.check_encoding) on 2 streams. Default: one
# encoding per point where it reaches the model (logits, values, input embeddings) with each kind, about 20 s
# a case; POSENC_SLOW=1: every encoding.
_KINDS = itertools.cycle(hyper_connections.KINDS)
ALL_HC_CASES = [(kind, next(_KINDS)) for kind in sorted(ENCODINGS)]
HC_CASES = ALL_HC_CASES if os.environ.get("POSENC_SLOW") else [("alibi", "mhc"), ("shaw", "dynamic"),
                                                                ("sinusoidal", "static")]


def test_cases_cover_every_encoding_and_kind():
    assert [c[0] for c in ALL_HC_CASES] == sorted(ENCODINGS)
    assert {c[1] for c in ALL_HC_CASES} == {c[1] for c in HC_CASES} == set(hyper_connections.KINDS)


@pytest.mark.parametrize("kind,hc", HC_CASES)
def test_every_encoding_conforms_with_hyper_connections(kind, hc):
    summary = check_encoding(kind, model=dict(residual_streams=2, hyper_connections=hc),
                             **({"nope_every": 2} if kind == "irope" else {}))
    assert all(s.startswith(("passed", "skipped")) for s in summary.values()), summary
    assert not any(s.startswith("skipped") for c, s in summary.items() if c != "shift invariance"), summary
