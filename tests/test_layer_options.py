"""Per-layer encoding options (model.position.layers), the model-family presets and the layer forms
they use: QK-norm after RoPE and weight-free, the attention scale (T5), PaTH's w under GQA, the
refused double QK-norm."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc import norms, rope, t5
from posenc.config import overrides
from posenc.model import Decoder, ModelSpec, model_config, presets


def _cfg(layers, kind="rope", num_layers=4, **model):
    c = helpers.model_cfg(kind, num_layers=num_layers, **model)
    c.position.layers = layers
    return c


def test_rules_set_options_and_kinds_per_layer():
    c = _cfg(({"every": 2, "offset": 1, "rope.base": 1e6},
              {"layers": (3,), "kind": "nope"},
              {"layers": (0,), "rope.scaling": "linear", "rope.factor": 4.0}))
    spec = ModelSpec.from_config(c, train_length=16)
    assert spec.position.layer_kinds == ("rope", "rope", "rope", "nope")
    opts = spec.position.layer_options
    assert [o.get("base") for o in opts] == [1e4, 1e6, 1e4, None]
    assert (opts[0]["scaling"], opts[0]["factor"], opts[2]["scaling"]) == ("linear", 4.0, "default")
    model = Decoder(spec, rngs=nnx.Rngs(0))
    units = [b.attn.encoding for b in model.blocks]
    assert [u.base for u in units[:3]] == [1e4, 1e6, 1e4] and type(units[3]).name == "nope"
    assert units[0].factor == 4.0
    # The layout reads the per-layer kinds: QK-norm on the positional layers skips layer 3.
    c.norm.update(qk_norm="rms", qk_norm_layers="positional")
    assert Decoder(c, rngs=nnx.Rngs(0)).blocks[3].attn.qk_norm_kind == "none"


def test_per_layer_base_changes_the_logits_and_decodes_and_blocks_as_the_full_pass():
    rule = ({"every": 2, "offset": 1, "rope.base": 50.0},)
    model = Decoder(ModelSpec.from_config(_cfg(rule, num_layers=2), train_length=16),
                    rngs=nnx.Rngs(0))
    plain = Decoder(ModelSpec.from_config(_cfg((), num_layers=2), train_length=16), rngs=nnx.Rngs(0))
    tokens = helpers.tokens(2, 12)
    full, a, b, _, _ = helpers.decode_in_pieces(model, tokens, 5, 14)
    assert float(jnp.abs(full - plain(tokens)).max()) > 1e-3  # the rule reaches the unit
    np.testing.assert_allclose(np.concatenate([a, b], 1), full, rtol=2e-5, atol=2e-5)
    c = _cfg(rule, num_layers=2, attention_impl="blocked", attention_block=4)
    blocked = Decoder(ModelSpec.from_config(c, train_length=16), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(blocked(tokens)), np.asarray(full), rtol=2e-5, atol=2e-5)


def test_units_share_parameters_only_with_the_same_options():
    c = _cfg(({"layers": (2, 3), "t5.max_distance": 64},), kind="t5")
    model = Decoder(ModelSpec.from_config(c), rngs=nnx.Rngs(0))
    tables = [b.attn.encoding.table for b in model.blocks]
    assert tables[0] is tables[1] and tables[2] is tables[3] and tables[0] is not tables[2]


@pytest.mark.parametrize("layers,message", [
    ((5,), r"model.position.layers\[0\] must be a mapping"),
    (({"rope.base": 1e6},), r"model.position.layers\[0\] must select layers with exactly one of"),
    (({"every": 2, "layers": (1,)},), r"exactly one of 'every' \(with 'offset'\) or 'layers'"),
    (({"every": 0},), r"model.position.layers\[0\].every must be an integer >= 1"),
    (({"every": 2, "offset": 2},), r"model.position.layers\[0\].offset must be in \[0, every=2\)"),
    (({"every": 8, "offset": 7},), r"model.position.layers\[0\] selects no layer"),
    (({"layers": (4,)},), r"model.position.layers\[0\].layers has index 4, past the last layer"),
    (({"layers": (1,), "offset": 1},), r"offset is set, but only 'every' uses it"),
    (({"every": 2, "kind": "rop"},), r"model.position.layers\[0\].kind: unknown position kind 'rop'"),
    (({"every": 2, "kind": "sinusoidal"},), r"kind 'sinusoidal' is an input embedding"),
    (({"every": 2, "base": 1e6},), r"unknown key 'base' in model.position.layers\[0\]"),
    (({"every": 2, "rope.bse": 1e6},), r"unknown field model.position.layers\[0\].rope.bse: rope "
                                       r"has no option 'bse'"),
    (({"every": 2, "alibi.x": 1},), r"model.position.layers\[0\].alibi.x sets an option of 'alibi', "
                                    r"but layer 0 has kind 'rope'"),
    (({"every": 2, "kind": "nope"}, {"every": 2, "rope.base": 5.0}),
     r"layers\[1\].rope.base sets an option of 'rope', but layer 0 has kind 'nope'"),
    (({"every": 2, "rope.base": -1.0},), r"model.position.layers\[0\].rope.base must be"),
    (({"every": 2, "rope.factor": 2.0},), r"model.position.layers\[0\].rope.factor=2.0 is set, but "
                                          r"rope does not use it"),
    (({"every": 2, "rope.scaling": "yarn"},), r"model.position.rope \(layer 0 with "
                                              r"model.position.layers\).*original_length"),
])
def test_bad_rules_name_the_field(layers, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_config(_cfg(layers))
    from posenc.model import layer_options
    with pytest.raises(ValueError, match=r"model.position.layers must be a tuple of rules"):
        layer_options.resolve("every 6", ("rope",) * 4)


def test_rules_survive_a_json_round_trip_and_overrides():
    c = {"model": model_config()}
    import ml_collections
    c = ml_collections.ConfigDict(c)
    overrides.apply(c, {"model.num_layers": 6,
                        "model.position.layers": [{"every": 6, "offset": 5, "rope.base": 1e6}]})
    again = ml_collections.ConfigDict(__import__("json").loads(c.to_json()))
    for cfg in (c, again):
        spec = ModelSpec.from_config(cfg.model)
        assert [o["base"] for o in spec.position.layer_options] == [1e4] * 5 + [1e6]


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_every_preset_validates_and_builds(name):
    import ml_collections
    c = ml_collections.ConfigDict({"model": model_config()})
    overrides.apply(c, presets.get(name))
    c.model.update(d_model=32, num_heads=4, vocab_size=16)
    spec = ModelSpec.from_config(c.model, train_length=16)
    Decoder(spec, rngs=nnx.Rngs(0))
    if name == "gemma3":
        assert [o["base"] for o in spec.position.layer_options] == [1e4] * 5 + [1e6]
        assert spec.layout.spans == ("window",) * 5 + ("full",) and spec.layout.window == 1024
    if name == "llama4":
        assert spec.position.layer_kinds == ("rope",) * 3 + ("nope",)
        assert spec.layout.qk_norm == (True,) * 3 + (False,) and spec.norm.qk_norm == "rms_plain"
        assert spec.layout.scaled == (False,) * 3 + (True,) and spec.layout.chunk == 8192
    if name == "gemma2":
        assert (spec.norm.attn_softcap, spec.norm.final_softcap) == (50.0, 30.0)
    if name == "t5":
        assert spec.attention_scale == 1.0
    with pytest.raises(ValueError, match="unknown model preset 'gemma'"):
        presets.get("gemma")


def _attention_reference(attn, x, positions, *, scale, bias=None, qk=None):
    """numpy float64 softmax attention of one layer (no GQA): q, k projections, optional qk(q, k)
    transform, logits scale q.k + bias, softmax, out projection."""
    x = np.asarray(x, np.float64)
    H, Dh = attn.num_heads, attn.head_dim
    q, k, v = (np.einsum("bld,dhe->blhe", x, np.asarray(w[...], np.float64))
               for w in (attn.wq, attn.wk, attn.wv))
    if qk is not None:
        q, k = qk(q, k)
    s = scale * np.einsum("bqhd,bkhd->bhqk", q, k)
    if bias is not None:
        s = s + bias
    L = x.shape[1]
    s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", w, v).reshape(x.shape[0], L, H * Dh)
    return o @ np.asarray(attn.wo[...], np.float64).reshape(H * Dh, -1)


def test_t5_unscaled_logits_match_the_reference():
    """T5 does not divide q.k by sqrt(d) (its init folds the factor in): model.attention_scale 1."""
    model = helpers.decoder("t5", num_layers=1, attention_scale=1.0, perturb=0.05)
    attn = model.blocks[0].attn
    x = 0.5 * jax.random.normal(jax.random.key(1), (2, 10, 32))
    pos = jnp.arange(10)[None]
    got = jax.jit(lambda x: attn.forward(x, pos, seq_len=10))(x)
    bias = np.asarray(t5.bias(pos, pos, attn.encoding.table[...], max_distance=128), np.float64)
    want = _attention_reference(attn, x, pos, scale=1.0, bias=bias)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
    scaled = _attention_reference(attn, x, pos, scale=1 / math.sqrt(8), bias=bias)
    assert float(np.abs(want - scaled).max()) > 1e-3


@pytest.mark.parametrize("kind,after", [("rms", True), ("rms", False), ("rms_plain", True)])
def test_qk_norm_before_or_after_rope(kind, after):
    """Llama 4 normalises the rotated q, k with no gain (HF Llama4TextL2Norm after RoPE); with
    learned gains the order matters (gains do not commute with the rotation)."""
    model = helpers.decoder("rope", num_layers=1, perturb=0.1,
                            norm=dict(qk_norm=kind, qk_norm_after_rope=after))
    attn = model.blocks[0].attn
    x = jax.random.normal(jax.random.key(2), (1, 9, 32))
    pos = jnp.arange(9)[None]
    got = np.asarray(jax.jit(lambda x: attn.forward(x, pos, seq_len=9))(x))
    inv, _ = rope.frequencies("default", 8)

    def norm(y, which):
        g = (np.ones(8) if kind == "rms_plain"
             else np.asarray(attn.qk_params[f"{which}_scale"][...], np.float64))
        return y / np.sqrt(np.mean(y ** 2, -1, keepdims=True) + 1e-6) * g

    def rot(y):
        return np.asarray(rope.apply(jnp.asarray(y, jnp.float32), pos, inv), np.float64)

    def qk(q, k):
        if after:
            return norm(rot(q), "q"), norm(rot(k), "k")
        return rot(norm(q, "q")), rot(norm(k, "k"))

    want = _attention_reference(attn, x, pos, scale=1 / math.sqrt(8), qk=qk)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if kind == "rms" and after:  # the other order is another function here
        other = _attention_reference(attn, x, pos, scale=1 / math.sqrt(8),
                                     qk=lambda q, k: (rot(norm(q, "q")), rot(norm(k, "k"))))
        assert float(np.abs(want - other).max()) > 1e-3


def test_rms_plain_has_no_parameters_and_is_the_hf_formula():
    from posenc import qk_norm
    q = jax.random.normal(jax.random.key(3), (2, 5, 4, 8))
    k = jax.random.normal(jax.random.key(4), (2, 5, 2, 8))
    assert qk_norm.qk_norm_init("rms_plain", 4, 2, 8) == {}
    qn, kn = qk_norm.qk_norm("rms_plain", q, k, {}, eps=1e-5)
    x = np.asarray(q, np.float64)
    np.testing.assert_allclose(np.asarray(qn), x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(norms.l2_normalize(kn) * math.sqrt(8)), np.asarray(kn),
                               rtol=1e-4, atol=1e-5)


def test_double_qk_norm_is_refused():
    for position, field in ((dict(pro=True), "pro"), (dict(qk_norm=True), "qk_norm")):
        with pytest.raises(ValueError, match=rf"model.norm.qk_norm='rms' and "
                                             rf"model.position.fox.{field} both normalise"):
            helpers.spec("fox", position=position, norm=dict(qk_norm="rms"))
    helpers.spec("fox", position=dict(pro=True, qk_norm=False), norm=dict(qk_norm="rms"))  # one norm


def test_path_w_is_full_rank_under_gqa_and_rank_32_otherwise():
    gqa = helpers.decoder("path", num_layers=1, num_kv_heads=2).blocks[0].attn.encoding
    assert gqa.w_rank == 0 and gqa.w_up is None and gqa.w_down.shape == (32, 2 * 8)
    mha = helpers.decoder("path", num_layers=1).blocks[0].attn.encoding
    assert mha.w_rank == 32 and mha.w_down.shape == (32, 32) and mha.w_up.shape == (32, 32)
    low = helpers.decoder("path", num_layers=1, num_kv_heads=2, position=dict(w_rank=16))
    assert low.blocks[0].attn.encoding.w_up.shape == (16, 16)
