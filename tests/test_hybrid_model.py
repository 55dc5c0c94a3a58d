"""Hybrid decoders (model.layer_types; posenc.model.mixers): position from recurrence beside attention.

check_encoding runs on hybrids (cached decoding token by token and in pieces == the full forward, so the
step form == the chunked form with scans across chunks; causality; shift invariance of a relative
attention layer's hybrid; finite gradients reaching every mixer parameter; dense == blocked; vmap). The
rest: chunk sizes do not change the logits, attention-only models are the models of before, parameter
layouts follow transformers, statistics and greedy decoding, and the one-line refusals.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc.model import ModelSpec, check_encoding, conformance, mixers
from posenc.training import decode, step

HYBRIDS = {
    # Granite 4.0-H / Nemotron-H: NoPE attention after three Mamba-2 layers, the one before it without an
    # MLP (Nemotron-H's "M*": model.layers_without_mlp)
    "mamba2 3:1 nope": ("nope", dict(num_layers=4, layer_types=("mamba2",) * 3 + ("attention",),
                                     layers_without_mlp=(2,))),
    # Qwen3-Next's mixers (one period of two here: its 3:1 at this tiny scale backpropagates gradients
    # of ~1e3 into the embeddings, which the dense == blocked tolerance cannot take)
    "gated_deltanet rope": ("rope", dict(layer_types=("gated_deltanet", "attention"),
                                         recurrent=dict(gated_deltanet=dict(projections="split")))),
    # no attention at all, and a placement other than pre
    "kda and short_conv": ("nope", dict(layer_types=("kda", "short_conv"), norm=dict(placement="sandwich"))),
    # Falcon-H1's parallel layer (its multipliers, Nemotron-H's grouped norm) and LFM2's convolution
    "parallel_mamba2 and short_conv": ("rope", dict(
        layer_types=("parallel_mamba2", "short_conv"),
        recurrent=dict(parallel_mamba2=dict(attention_in_multiplier=0.5, ssm_out_multiplier=0.7,
                                            ssm_multipliers=(1.0, 1.5, 0.5, 1.0, 0.8)),
                       mamba2=dict(norm="grouped", n_groups=2, norm_before_gate=True)))),
}


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_hybrids_pass_check_encoding(name):
    kind, model = HYBRIDS[name]
    summary = check_encoding(kind, model=model)
    assert list(summary) == list(conformance.CHECKS)
    assert all(s.startswith("passed") for s in summary.values()), summary
    assert "of the recurrent mixers get finite, non-zero gradients" in summary["finite gradients"]


def _model(layer_types, *, seed=0, kind="rope", **model):
    return helpers.decoder(kind, seed=seed, perturb=0.05, layer_types=layer_types, **model)


def _jitted(model, tokens, **kw):
    """``model(tokens, **kw)`` compiled."""
    g, state = nnx.split(model)
    return jax.jit(lambda s, t: nnx.merge(g, s)(t, **kw))(state, tokens)


def test_a_full_pass_in_segments_equals_one_call():
    """model.recurrent.<kind>.segment: a pass longer than the segment scans segments, the state carried
    (conv window and scan state); the logits equal one call's, with a segment that cuts chunks and leaves
    a shorter tail."""
    kinds = ("mamba2", "gated_deltanet", "kda", "short_conv")
    tokens = helpers.tokens(batch=2, length=23, vocab=16)
    small = {k: {"segment": 5, **({"chunk_size": 4} if k != "short_conv" else {})} for k in kinds}
    cut = _model(kinds, kind="nope", num_layers=4, recurrent=small)
    same = _model(kinds, kind="nope", num_layers=4, recurrent={k: {k2: v for k2, v in o.items() if k2 != "segment"}
                                                 for k, o in small.items()})
    got, want = _jitted(cut, tokens), _jitted(same, tokens)
    assert got.shape == (2, 23, 16) and float(jnp.abs(want).max()) > 0.1
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_recurrent_layers_have_no_position_term_and_attention_only_models_are_unchanged():
    spec = helpers.spec("rope", num_layers=4, layer_types=("gated_deltanet",) * 3 + ("attention",))
    assert spec.position.layer_kinds == ("nope",) * 3 + ("rope",)
    assert spec.recurrent.attends == (False, False, False, True)
    assert [spec.layer_type(i) for i in range(4)] == ["gated_deltanet"] * 3 + ["attention"]
    # a period repeated over the layers
    assert helpers.spec("rope", num_layers=4, layer_types=("mamba2", "attention")).recurrent.layer_types == (
        "mamba2", "attention") * 2
    plain = helpers.spec("alibi")
    assert helpers.spec("alibi", layer_types=("attention",)) == plain and plain.recurrent is None
    a, b = (nnx.state(helpers.decoder("alibi", layer_types=t), nnx.Param) for t in ((), ("attention",) * 2))
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b))


def _shapes(module):
    return {jax.tree_util.keystr(p): tuple(x.shape) for p, x in
            jax.tree_util.tree_flatten_with_path(nnx.state(module, nnx.Param))[0]}


def test_parameter_layouts_follow_transformers():
    """transformers' parameters, weight.T for linear layers: D = 32, the options' defaults."""
    model = helpers.decoder("rope", num_layers=5, layer_types=("mamba2", "gated_deltanet", "kda", "short_conv",
                                                               "parallel_mamba2"))
    m2, gdn, kda, conv, par = (model.blocks[i].attn for i in range(5))
    # Mamba-2: I = 2 * 32 = 64 = 4 heads of 16, G N = 16: in_proj [z (64) | xBC (64 + 32) | dt (4)]
    assert isinstance(m2, mixers.Mamba2Mixer) and _shapes(m2) == {
        "['A_log'].value": (4,), "['D'].value": (4,), "['conv'].value": (96, 4), "['conv_bias'].value": (96,),
        "['dt_bias'].value": (4,), "['in_proj'].value": (32, 164), "['norm'].value": (64,),
        "['out_proj'].value": (64, 32)}
    # Gated DeltaNet: Hk 2 x Dk 16, Hv 4 x Dv 16: in_proj_qkvz [2 K + 2 V], in_proj_ba [2 Hv], conv [2 K + V]
    assert _shapes(gdn) == {"['A_log'].value": (4,), "['conv'].value": (128, 4), "['dt_bias'].value": (4,),
                            "['in_proj_ba'].value": (32, 8), "['in_proj_qkvz'].value": (32, 192),
                            "['norm'].value": (16,), "['out_proj'].value": (64, 32)}
    # KDA: 4 heads of 16: q, k, v [D, 64], packed conv [3 * 64], low-rank gates through 16
    assert _shapes(kda) == {
        "['A_log'].value": (4,), "['beta_proj'].value": (32, 4), "['conv'].value": (192, 4),
        "['dt_bias'].value": (4, 16), "['forget_gate_down'].value": (32, 16), "['forget_gate_up'].value": (16, 64),
        "['k_proj'].value": (32, 64), "['o_norm'].value": (16,), "['o_proj'].value": (64, 32),
        "['output_gate_down'].value": (32, 16), "['output_gate_up'].value": (16, 64), "['q_proj'].value": (32, 64),
        "['v_proj'].value": (32, 64)}
    # LFM2: in_proj [B | C | x], conv [D, 3]
    assert _shapes(conv) == {"['conv'].value": (32, 3), "['in_proj'].value": (32, 96), "['out_proj'].value": (32, 32)}
    # Falcon-H1: the layer's attention and a Mamba-2 mixer
    assert {k.split("]")[0] + "]" for k in _shapes(par)} == {"['attention']", "['mamba']"}
    assert _shapes(par.mamba) == _shapes(m2)


def test_the_delta_rules_start_as_their_official_training_code_does():
    """fla.layers.GatedDeltaNet: A ~ U(0, 16), softplus(dt_bias) = dt ~ exp(U(log 1e-3, log 0.1)), so the
    state remembers at initialisation (a decay exp(-A dt) per token, most of it above 0.5);
    fla.layers.KimiDeltaAttention: A ~ U(1, 16), dt_bias 0."""
    heads = 256
    gdn = helpers.decoder("nope", num_layers=1, layer_types=("gated_deltanet",), recurrent=dict(
        gated_deltanet=dict(num_key_heads=heads, num_value_heads=heads, key_head_dim=2, value_head_dim=2))
                          ).blocks[0].attn
    dt = np.log1p(np.exp(np.asarray(gdn.dt_bias[...], np.float64)))
    a = np.exp(np.asarray(gdn.A_log[...], np.float64))
    assert dt.shape == a.shape == (heads,)
    assert 1e-3 <= dt.min() and dt.max() <= 0.1 + 1e-6
    np.testing.assert_allclose(np.median(np.log(dt)), np.log(1e-2), atol=0.4)  # log-uniform
    assert 0 <= a.min() and a.max() <= 16 and abs(np.median(a) - 8) < 1.5
    decay = np.exp(-a * dt)  # at a = 0: the gate's input projection adds to dt_bias
    assert np.median(decay) > 0.85 and np.mean(decay > 0.5) > 0.8
    kda = helpers.decoder("nope", num_layers=1, layer_types=("kda",), recurrent=dict(
        kda=dict(num_heads=heads, head_dim=2))).blocks[0].attn
    a = np.exp(np.asarray(kda.A_log[...], np.float64))
    assert 1 <= a.min() and a.max() <= 16 and abs(np.median(a) - 8.5) < 1.5
    np.testing.assert_array_equal(np.asarray(kda.dt_bias[...]), 0.0)


def test_the_qkvz_layout_groups_each_key_heads_queries_keys_values_and_gates():
    """Qwen3-Next's in_proj_qkvz / in_proj_ba, per key head [q | k | v (G heads) | z (G heads)] and
    [b (G) | a (G)], give the split projections' values once regrouped."""
    grouped = helpers.decoder("nope", num_layers=1, layer_types=("gated_deltanet",))
    split = helpers.decoder("nope", num_layers=1, layer_types=("gated_deltanet",),
                            recurrent=dict(gated_deltanet=dict(projections="split")))
    g, s = grouped.blocks[0].attn, split.blocks[0].attn
    qkvz = np.asarray(g.in_proj_qkvz[...]).reshape(32, 2, 2 * 16 + 2 * 2 * 16)   # [D, Hk, ...]
    q, k, v, z = np.split(qkvz, [16, 32, 64], axis=-1)
    s.in_proj_qkv[...] = jnp.asarray(np.concatenate([q.reshape(32, -1), k.reshape(32, -1), v.reshape(32, -1)], -1))
    s.in_proj_z[...] = jnp.asarray(z.reshape(32, -1))
    ba = np.asarray(g.in_proj_ba[...]).reshape(32, 2, 4)
    s.in_proj_b[...] = jnp.asarray(ba[..., :2].reshape(32, 4))
    s.in_proj_a[...] = jnp.asarray(ba[..., 2:].reshape(32, 4))
    for name in ("conv", "dt_bias", "A_log", "norm", "out_proj"):
        getattr(s, name)[...] = getattr(g, name)[...]
    x = jax.random.normal(jax.random.key(1), (2, 7, 32))
    np.testing.assert_allclose(s.forward(x, None, seq_len=7), g.forward(x, None, seq_len=7), rtol=1e-5, atol=1e-6)


def test_statistics_and_qk_clip_cover_the_attention_layers():
    tokens = helpers.tokens(2, 6)
    model = _model(("mamba2", "attention"))
    _, stats = _jitted(model, tokens, return_stats=True)
    per_head = np.asarray(stats["max_logit_per_head"])
    assert per_head.shape == (2, 4) and np.all(per_head[0] == -np.inf) and np.all(np.isfinite(per_head[1]))
    assert np.isfinite(stats["max_attention_logit"]) and np.isfinite(stats["attention_entropy"])
    before = nnx.state(model.blocks[0].attn, nnx.Param)
    wq = model.blocks[1].attn.wq[...]
    assert float(step._qk_clip(model, stats["max_logit_per_head"], 1e-6)) == 4  # every attention head
    assert not np.allclose(model.blocks[1].attn.wq[...], wq)
    after = nnx.state(model.blocks[0].attn, nnx.Param)
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), before, after))
    _, stats = _jitted(_model(("kda", "short_conv"), kind="nope"), tokens, return_stats=True)
    assert set(stats) == {"max_logit_per_head", "logit_mean", "log_z"} and stats["max_logit_per_head"].shape == (2, 0)


def test_greedy_decoding_of_a_hybrid_follows_its_full_forward():
    model = _model(("short_conv", "parallel_mamba2"))
    prompts = helpers.tokens(2, 5)
    answers = decode.greedy(model, prompts, 4)
    # each answer token is the full forward's argmax after the prompt and the answers before it
    logits = _jitted(model, jnp.concatenate([prompts, answers[:, :-1]], axis=1))
    np.testing.assert_array_equal(answers, jnp.argmax(logits[:, 4:], axis=-1))


def test_a_recurrent_layer_refuses_to_drop_the_causal_mask():
    model = _model(("short_conv", "attention"))
    with pytest.raises(ValueError, match=r"a short_conv layer reads the tokens in order \(it is causal\)"):
        model.forward_embeddings(jnp.zeros((1, 4, 32)), causal=False)


@pytest.mark.parametrize("fields,message", [
    (dict(num_layers=3, layer_types=("mamba2", "attention")), r"model.layer_types has 2 entries .* period"),
    (dict(layer_types=("mamba3",)), r"unknown model.layer_types\[0\] 'mamba3'; choose one of: .*mamba2"),
    (dict(recurrent=dict(kda=dict(num_heads=8))), r"model.recurrent.kda.num_heads=8 is set, but no layer reads"),
    (dict(layer_types=("mamba2",), recurrent=dict(mamba2=dict(num_heads=4, expand=3))),
     r"model.recurrent.mamba2.expand=3 is set, but mamba2 does not use it"),
    (dict(layer_types=("gated_deltanet",), recurrent=dict(gated_deltanet=dict(num_value_heads=3))),
     r"num_value_heads=3 must be a multiple of"),
    (dict(layer_types=("mamba2", "attention"), position=dict(layer_kinds=("rope", "rope"))),
     r"model.position.layer_kinds\[0\]='rope': layer 0 has no attention"),
    (dict(layer_types=("mamba2", "attention"), position=dict(layers=({"layers": (0,), "rope.base": 1e6},))),
     r"model.position.layers\[0\].rope.base selects layer 0, which has no attention"),
    (dict(layer_types=("mamba2", "attention"), attention_window=4, layer_spans=("window", "full")),
     r"model.layer_spans\[0\]='window': layer 0 is a mamba2 layer"),
    (dict(layer_types=("mamba2", "attention"), norm=dict(placement="hybrid")),
     r"model.norm.placement='hybrid' normalises q, k and v inside attention"),
    (dict(layer_types=("parallel_mamba2",), mla=dict(kv_lora_rank=16)),
     r"model.mla .* cannot run in layer 0, a parallel_mamba2 layer"),
    (dict(layer_types=("kda",), attention_gate="elementwise"),
     r"model.attention_gate='elementwise' is set, but no layer has attention"),
    (dict(layer_types=("short_conv",), attention_impl="pallas"),
     r"model.attention_impl='pallas' is set, but no layer has attention"),
    (dict(layer_types=("mamba2", "attention"), layers_without_mlp=(2,)),
     r"model.layers_without_mlp=\(2,\) names layer 2; the model has layers 0..1"),
    (dict(layer_types=("mamba2", "attention"), layers_without_mlp=(0,), norm=dict(placement="lns")),
     r"model.layers_without_mlp=\(0,\) needs a placement that wraps each sublayer on its own"),
    (dict(layers_without_mlp=(1, 0)), r"model.layers_without_mlp must list each layer once, in increasing order"),
    (dict(layers_without_mlp=(0,), moe=dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)),
     r"model.layers_without_mlp=\(0,\): layer 0 is a mixture-of-experts layer"),
])
def test_combinations_that_cannot_work_are_refused_in_one_line(fields, message):
    position = fields.pop("position", None)
    cfg = helpers.model_cfg("rope", **fields)
    if position:
        cfg.position.update(position)
    with pytest.raises(ValueError, match=message) as e:
        ModelSpec.from_config(cfg)
    assert "\n" not in str(e.value)
