"""model.mla: multi-head latent attention in the decoder (posenc.model.latent_attention).

The layer equals the transcription of DeepSeek-V3's official MLA in test_mla (YaRN rope, interleaved,
on the rotary parts; softmax scale with mscale); the cache holds the normalised latent and the rotated
rotary key; absorbed decoding equals explicit decoding and the full forward; the units MLA takes pass
the conformance checks; the config refuses what MLA cannot run, in one line.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_mla import ARGS, CQ, C, D, H, N, OfficialMLA, R, V, official_precompute_freqs_cis, ours, torch_weights

import helpers
from posenc import mla, rope
from posenc.model import Decoder, ModelSpec, check_encoding

MLA = dict(kv_lora_rank=6, q_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=3)


def mla_cfg(kind="rope", mla_fields=None, **kw):
    c = helpers.model_cfg(kind, **kw)
    c.mla.update(dict(MLA, **(mla_fields or {})))
    return c


def mla_decoder(kind="rope", mla_fields=None, seed=0, **kw):
    model = Decoder(ModelSpec.from_config(mla_cfg(kind, mla_fields, **kw), train_length=helpers.TRAIN_LENGTH),
                    rngs=nnx.Rngs(seed))
    helpers.perturb_params(model, jax.random.key(seed + 1), 0.05)
    return model


@pytest.mark.parametrize("q_lora_rank", [0, CQ])
def test_layer_matches_official_mla(q_lora_rank):
    a = ARGS
    scale = mla.softmax_scale(N + R, factor=a["factor"], mscale=1.0)
    c = mla_cfg("rope", dict(kv_lora_rank=C, q_lora_rank=q_lora_rank, qk_nope_head_dim=N, qk_rope_head_dim=R,
                             v_head_dim=V), position=dict(scaling="yarn", layout="interleaved", base=a["base"],
                                                          factor=a["factor"], original_length=a["orig"],
                                                          mscale=1.0, mscale_all_dim=1.0),
                d_model=D, num_heads=H, head_dim=N + R, attention_scale=scale, attention_impl="dense")
    layer = Decoder(c, rngs=nnx.Rngs(0)).blocks[0].attn
    w = torch_weights(q_lora_rank)
    for name, value in ours(w).items():
        if name != "q_norm" or q_lora_rank:
            getattr(layer, name)[...] = value
    ref = OfficialMLA(w, n_heads=H, q_lora_rank=q_lora_rank, kv_lora_rank=C, qk_nope_head_dim=N,
                      qk_rope_head_dim=R, v_head_dim=V, max_seq_len=a["max_seq_len"], original_seq_len=a["orig"],
                      rope_factor=a["factor"], mscale=1.0, max_batch_size=2, impl="naive")
    _, freqs = official_precompute_freqs_cis(R, a["max_seq_len"], a["base"], a["factor"], a["beta_fast"],
                                             a["beta_slow"], a["orig"])
    x = np.random.default_rng(1).normal(size=(2, 6, D))
    want = ref.forward(x, 0, freqs[:6], np.triu(np.full((6, 6), -np.inf), 1))
    got = layer.forward(jnp.asarray(x, jnp.float32), jnp.arange(6)[None], seq_len=6)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_cache_holds_the_normalised_latent_and_rotated_rotary_key():
    model = mla_decoder("rope", position=dict(layout="interleaved"))
    toks = helpers.tokens(2, 5)
    g, state = nnx.split(model)

    @jax.jit
    def prefill(state, toks):
        m = nnx.merge(g, state)
        return m.decode(toks, m.init_cache(2, 8))[1]

    cache = prefill(state, toks)
    assert cache["k"][0].shape == (2, 8, 1, 6 + 4) and cache["v"][0].shape == (2, 8, 1, 0)
    attn = model.blocks[0].attn
    h = model.blocks[0].norm1(model.embed_tokens(toks))
    _, _, c, k_pe = attn.project(h)
    pos = jnp.arange(5)[None]
    np.testing.assert_allclose(cache["k"][0][:, :5, 0, :6], c, rtol=1e-6, atol=1e-6)
    want = attn.encoding.key(k_pe, pos, seq_len=5)[:, :, 0]
    np.testing.assert_allclose(cache["k"][0][:, :5, 0, 6:], want, rtol=1e-6, atol=1e-6)
    inv, _ = rope.frequencies("default", 4)
    np.testing.assert_allclose(want, rope.apply(k_pe, pos, inv, layout="interleaved")[:, :, 0], rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("kind,position", [("rope", {}), ("rope", {"scaling": "dynamic", "factor": 4.0}),
                                           ("alibi", {})])
def test_absorbed_decoding_equals_explicit_and_the_full_forward(kind, position):
    toks = helpers.tokens(2, 9)
    out = {}
    for absorb in (True, False):
        model = mla_decoder(kind, {"absorb": absorb}, position=position)
        g, state = nnx.split(model)

        @jax.jit
        def run(state, toks):
            m = nnx.merge(g, state)
            return m(toks), helpers.decode_stepwise(m, toks, 4, 12)[0]

        full, out[absorb] = run(state, toks)
        np.testing.assert_allclose(out[absorb], full, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(out[True], out[False], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("kind,options,fields", [
    ("rope", {"layout": "interleaved"}, {}),
    ("nope", {}, {"q_lora_rank": 0}),
    ("alibi", {}, {"absorb": False}),
    ("xpos", {}, {}),  # a key transform that is not static: the cache keeps raw rotary keys
])
def test_conformance(kind, options, fields):
    model = {"num_kv_heads": 0, "mla": dict(MLA, **fields)}
    results = check_encoding(kind, model=model, **options)
    assert not any(r.startswith("fail") for r in results.values())


@pytest.mark.parametrize("fields,match", [
    ({"position": {"kind": "shaw"}}, "layer 0's position kind 'shaw' cannot run with MLA: its logit term"),
    ({"position": {"kind": "fox"}}, "'fox' cannot run with MLA"),
    ({"position": {"kind": "stickbreaking"}}, "computes its own attention weights"),
    ({"position": {"kind": "pope"}}, "'pope' cannot run with MLA: it widens q and k"),
    ({"position": {"kind": "rope", "rope": {"remap": "rerope", "window": 4}}},
     "model.position.rope.remap='rerope'"),
    ({"num_kv_heads": 2}, "model.num_kv_heads=2 and model.mla"),
    ({"bias": "qkv"}, "model.bias='qkv'"),
    ({"norm": {"qk_norm": "rms"}}, "model.norm.qk_norm='rms'"),
    ({"norm": {"placement": "hybrid"}}, "model.norm.placement='hybrid'"),
    ({"attention_gate": "headwise"}, "model.attention_gate='headwise'"),
    ({"mla": {"qk_rope_head_dim": 3}}, "qk_rope_head_dim must be even"),
    ({"mla": {"kv_lora_rank": 0}}, "model.mla.q_lora_rank=5 is set, but MLA is off"),
])
def test_config_refusals_in_one_line(fields, match):
    c = mla_cfg("rope")
    c.update(fields)
    with pytest.raises(ValueError, match=match) as e:
        ModelSpec.from_config(c, train_length=16)
    assert "\n" not in str(e.value)


def test_defaults_and_scale():
    c = helpers.model_cfg("rope", d_model=32, num_heads=4)  # head_dim 8
    c.mla.kv_lora_rank = 6
    s = ModelSpec.from_config(c, train_length=16)
    assert (s.mla.qk_nope_head_dim, s.mla.qk_rope_head_dim, s.mla.v_head_dim) == (8, 4, 8)
    assert s.attention_scale == pytest.approx(12 ** -0.5) and s.unit_head_dim == 4
    assert s.num_kv_heads == 4
    assert helpers.spec("rope").mla is None


def test_the_kinds_mla_takes_and_refuses():
    """Units acting on the rotary part token by token or adding position-only biases run; the others are
    refused in one line naming the hook that needs per-head keys (or the widening)."""
    from posenc.model import ENCODINGS

    taken, refused = set(), set()
    for kind in sorted(k for k, cls in ENCODINGS.items() if cls.__module__.startswith("posenc.")):  # built-ins
        c = mla_cfg(kind)
        try:
            ModelSpec.from_config(c, train_length=16)
            taken.add(kind)
        except ValueError as e:
            assert "cannot run with MLA" in str(e) and "\n" not in str(e), (kind, str(e))
            refused.add(kind)
    assert refused == {"cope", "fox", "path", "path_fox", "pope", "shaw", "stickbreaking", "transformer_xl"}
    assert {"rope", "nope", "alibi", "t5", "xpos", "fire", "kerple_log", "irope", "sinusoidal"} <= taken


def test_fused_kernel_forward_and_absorbed_decoding_equal_the_dense_path():
    """attention_impl="pallas" (the Pallas interpreter on CPU): the explicit form's values (V) narrower
    than q, k (N + R) and the absorbed form's one key head [c | k_pe] with values c both run in the kernel."""
    from posenc.model import fused

    toks = helpers.tokens(2, 6)
    out = {}
    for impl in ("dense", "pallas"):
        model = mla_decoder("alibi", attention_impl=impl)
        g, state = nnx.split(model)
        with fused.force_backend("cpu"):
            @jax.jit
            def run(state, toks):
                m = nnx.merge(g, state)
                return m(toks), helpers.decode_stepwise(m, toks, 3, 8)[0]

            if impl == "pallas":  # the kernel runs: both layers' forward, prefill and step
                assert str(jax.make_jaxpr(run)(state, toks)).count("pallas_call") == 6
            out[impl] = run(state, toks)
    for a, b in zip(out["dense"], out["pallas"]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(out["pallas"][1], out["pallas"][0], rtol=1e-5, atol=2e-5)
