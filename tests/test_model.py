"""Decoder: every registry entry trains, config errors, shared parameters, dtypes, traces."""

import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import helpers
from posenc import norms
from posenc.model import ENCODINGS, Decoder, ModelSpec, validate_config

B, L, V = 2, 12, 16


def small_config(kind="rope", position=None, **model):
    return helpers.model_cfg(kind, position=position, **model)


def build(kind="rope", position=None, **model):
    return Decoder(ModelSpec.from_config(small_config(kind, position, **model), train_length=16),
                   rngs=nnx.Rngs(0))


def _tokens(seed=0):
    return jax.random.randint(jax.random.key(seed), (B, L), 0, V)


# Each encoding trains with a different model variant, so every variant runs once too.
VARIANTS = [
    dict(),
    dict(mlp="swiglu"),
    dict(tie_embeddings=False),
    dict(num_kv_heads=2),
    dict(dropout=0.1),
    dict(norm=dict(qk_norm="layer")),
    dict(norm=dict(qk_norm="rms")),
    dict(norm=dict(qk_norm="rms_full")),
    dict(norm=dict(qk_norm="l2")),
    dict(norm=dict(attn_softcap=5.0, final_softcap=3.0)),
    dict(norm=dict(embed_scale=True)),
    dict(norm=dict(placement="deepnorm")),
    dict(norm=dict(placement="rezero", kind="none")),
    dict(attention_impl="blocked", attention_block=5),
]
# Every registry entry (built-ins and the test plugin), each with a model variant in turn,
# so every variant runs too; the cycle never drops an entry.
CASES = list(zip(sorted(ENCODINGS), itertools.cycle(VARIANTS)))


def test_cases_cover_every_registry_entry_and_variant():
    assert [k for k, _ in CASES] == sorted(ENCODINGS) and len(CASES) >= len(VARIANTS)
    assert "test_scaled_alibi" in ENCODINGS  # the test plugin is in the registry


@pytest.mark.smoke
@pytest.mark.parametrize("kind,variant", CASES)
def test_one_training_step_lowers_the_loss(kind, variant):
    model = build(kind, **variant)
    g, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adam(1e-2)
    opt = tx.init(params)
    tokens = _tokens()

    @jax.jit
    def step(params, rest, opt, tokens):
        def loss_fn(params):
            # copy=True: fresh Variables in this trace, so dropout may advance its RNG count.
            m = nnx.merge(g, params, rest, copy=True)
            logits, stats = m(tokens[:, :-1], deterministic=False, return_stats=True)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
            return loss, (stats, nnx.state(m, nnx.Not(nnx.Param)))

        (loss, (stats, rest)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), rest, opt, loss, stats

    losses = []
    for _ in range(3):
        params, rest, opt, loss, stats = step(params, rest, opt, tokens)
        losses.append(float(loss))
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert set(stats) == {"max_attention_logit", "attention_entropy", "logit_mean", "log_z", "max_logit_per_head"}
    assert all(np.isfinite(np.asarray(v)).all() for v in stats.values())
    assert float(stats["max_logit_per_head"].max()) == float(stats["max_attention_logit"])


def test_logits_shape_dtype_and_default_positions():
    model = build("rope")
    tokens = _tokens()
    logits = model(tokens)
    assert logits.shape == (B, L, V) and logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, model(tokens, jnp.arange(L)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(logits, model(tokens, jnp.tile(jnp.arange(L), (B, 1))),
                               rtol=1e-6, atol=1e-6)
    # RoPE is relative: shifting every position leaves the logits (almost) unchanged.
    np.testing.assert_allclose(logits, model(tokens, 100 + jnp.arange(L)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind,impl", [("alibi", "blocked"), ("t5", "dense"), ("t5", "blocked"),
                                       ("shaw", "dense"), ("fire", "blocked")])
def test_positions_shared_by_the_batch_match_per_example_positions(kind, impl):
    # Default positions stay [1, L] inside the model (biases built once per layer);
    # logits, stats and parameter gradients must equal those of explicit [B, L].
    model = build(kind, attention_impl=impl, attention_block=8)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = _tokens()

    def loss(params, positions):
        logits, stats = nnx.merge(graphdef, params, rest)(tokens, positions, return_stats=True)
        return jnp.sum(logits * jnp.cos(logits)), (logits, stats)

    grad = jax.jit(jax.grad(loss, has_aux=True))  # compiled: op by op, a blocked scan is slow
    g_shared, (logits_shared, stats_shared) = grad(params, None)
    g_tiled, (logits_tiled, stats_tiled) = grad(params, jnp.tile(jnp.arange(L), (B, 1)))
    np.testing.assert_allclose(logits_shared, logits_tiled, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(stats_shared, stats_tiled, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(g_shared, g_tiled, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_linear_matches_matmul_values_and_gradients(dtype):
    from posenc.model.layers import linear

    kx, kw, kg = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(kx, (2, 5, 6)).astype(dtype)
    w = jax.random.normal(kw, (6, 7)).astype(dtype)
    g = jax.random.normal(kg, (2, 5, 7)).astype(dtype)
    y, vjp = jax.vjp(linear, x, w)
    y_ref, vjp_ref = jax.vjp(lambda a, b: a @ b, x, w)
    assert y.dtype == y_ref.dtype == dtype
    tol = 1e-6 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.float32(y), np.float32(y_ref), rtol=tol, atol=tol)
    for a, b in zip(vjp(g), vjp_ref(g), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=tol, atol=tol)


def test_final_softcap_bounds_the_logits():
    model = build("nope", norm=dict(final_softcap=0.5))
    assert float(jnp.abs(model(_tokens())).max()) <= 0.5


def test_logits_multiplier_scales_the_logits_before_the_final_softcap():
    tokens = _tokens()
    plain = build("nope", norm=dict(final_softcap=3.0))(tokens)
    scaled = build("nope", logits_multiplier=0.25, norm=dict(final_softcap=3.0))(tokens)
    uncapped = build("nope")(tokens)  # the same parameters (seed 0): logits before the cap
    np.testing.assert_allclose(scaled, 3.0 * jnp.tanh(0.25 * uncapped / 3.0), atol=1e-5, rtol=0)
    assert float(jnp.abs(scaled - plain).max()) > 1e-2
    with pytest.raises(ValueError, match="model.logits_multiplier"):
        build("nope", logits_multiplier=0.0)


def test_deepnorm_initialises_value_output_and_mlp_with_gain_beta():
    block = build("nope", d_model=64, num_layers=6, norm=dict(placement="deepnorm")).blocks[0]
    _, beta = norms.deepnorm_constants(6)
    assert block.alpha == pytest.approx((2 * 6) ** 0.25)
    # xavier normal: std = gain * sqrt(2 / (fan_in + fan_out)); fan_in = fan_out = 64 for v/out.
    for w, gain in ((block.attn.wv, beta), (block.attn.wo, beta), (block.attn.wq, 1.0)):
        std = float(jnp.std(w[...]))
        assert std == pytest.approx(gain * math.sqrt(2 / 128), rel=0.1)


def test_bfloat16_compute_stays_close_to_float32():
    f32 = build("rope")
    bf16 = build("rope", dtype="bfloat16")
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(bf16, nnx.Param)))
    a, b = f32(_tokens()), bf16(_tokens())
    assert b.dtype == jnp.float32
    assert float(jnp.abs(a - b).max()) < 0.05 * float(jnp.abs(a).max()) + 1e-2
    assert float(jnp.abs(a - b).max()) > 0  # bf16 really ran


def test_jitted_forward_traces_once_per_shape():
    model = build("alibi")
    g, state = nnx.split(model)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def forward(state, tokens, positions):
        return nnx.merge(g, state)(tokens, positions)

    forward(state, _tokens(0), jnp.arange(L))
    forward(state, _tokens(1), 5 + jnp.arange(L))  # new values, same shapes: no retrace
    chex.clear_trace_counter()


def test_learned_table_shorter_than_the_sequence_raises_before_tracing():
    model = build("learned", position=dict(max_length=8))
    with pytest.raises(ValueError, match="sequence length 12 exceeds what the position encoding can "
                                         "represent \\(8 positions"):
        model(_tokens())
    with pytest.raises(ValueError, match="length 16 exceeds what learned can represent \\(8 positions"):
        validate_config(small_config("learned", position=dict(max_length=8)), max_length=16)


BAD = [
    (dict(position=dict(kind="rop")), "unknown position kind 'rop'; choose one of: abacus, alibi"),
    (dict(norm=dict(kind="batch")), "unknown norm kind 'batch'"),
    (dict(norm=dict(placement="middle")), "unknown norm placement 'middle'"),
    (dict(norm=dict(qk_norm="cosine")), "unknown qk_norm 'cosine'"),
    (dict(mlp="relu"), "unknown model.mlp 'relu'; choose one of: geglu, gelu, gelu_erf, relu2, swiglu"),
    (dict(dtype="float16"), "unknown model.dtype 'float16'; choose one of: auto, bfloat16, float32"),
    (dict(attention_impl="flash"), "unknown model.attention_impl 'flash'"),
    (dict(attention_causal_block=-8), r"model.attention_causal_block must be an integer >= 0; got -8"),
    (dict(d_model=30), "model.d_model 30 is not divisible by model.num_heads 4"),
    (dict(num_kv_heads=3), "model.num_heads 4 is not divisible by model.num_kv_heads 3"),
    (dict(head_dim=6, position=dict(rope=dict(rotary_fraction=0.5))),
     r"model.position.rope.rotary_fraction: rotary dim .* = 3 must be even"),
    (dict(position=dict(rope=dict(scaling="yarn", factor=2.0))),
     "model.position.rope.scaling 'yarn' needs model.position.rope.original_length"),
    (dict(position=dict(rope=dict(scaling="ntk_by_parts"))), "unknown model.position.rope.scaling 'ntk_by_parts'"),
    (dict(position=dict(rope=dict(beta_fast=2.0))),
     r"model.position.rope.beta_fast=2.0 is set, but rope does not use it"),
    (dict(position=dict(t5=dict(num_buckets=8))), r"model.position.t5.num_buckets=8 is set, but no layer uses t5"),
    (dict(position=dict(layer_kinds=("rope",))), "layer_kinds has 1 entries .* \\(model.num_layers=2\\)"),
    (dict(position=dict(layer_kinds=("rope", "learned"))), "'learned' is an input embedding"),
    (dict(position=dict(layer_kinds=("rope", "ropee"))), "unknown position kind 'ropee'"),
    (dict(norm=dict(attn_softcap=-1.0)), "model.norm.attn_softcap must be a finite number >= 0.0"),
    (dict(norm=dict(dyt_alpha=0.3)), "model.norm.dyt_alpha=0.3 is set, but only kind 'dyt' uses it"),
    (dict(dropout=1.0), "model.dropout must be a finite number >= 0.0 < 1.0; got 1.0"),
    (dict(position=dict(learned=dict(max_length=0), kind="learned")), "model.position.learned.max_length must be >= 1"),
]


@pytest.mark.parametrize("override,message", BAD)
def test_bad_config_raises_at_construction(override, message):
    c = helpers.model_cfg("rope")
    pos = dict(override.pop("position", {}) if "position" in override else {})
    override = dict(override)
    for key, value in pos.items():
        if isinstance(value, dict):
            c.position[key].update(value)
        else:
            c.position[key] = value
    if "norm" in override:
        c.norm.update(override.pop("norm"))
    c.update(override)
    with pytest.raises(ValueError, match=message):
        Decoder(c, rngs=nnx.Rngs(0))


def test_layer_kinds_give_each_layer_its_encoding():
    c = small_config("rope")
    c.position.layer_kinds = ("alibi", "nope")
    model = Decoder(c, rngs=nnx.Rngs(0))
    assert [type(b.attn.encoding).__name__ for b in model.blocks] == ["ALiBi", "NoPE"]
    irope = build("irope")
    assert [b.attn.encoding.nope for b in irope.blocks] == [False, True]  # nope_every=2


def _param_count(model):
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_t5_table_is_shared_by_every_layer_by_default():
    shared = build("t5", num_layers=3)
    per_layer = build("t5", num_layers=3, position=dict(shared=False))
    tables = [b.attn.encoding.table for b in shared.blocks]
    assert all(t is tables[0] for t in tables)  # one nnx.Param, owned by layer 0
    assert _param_count(per_layer) - _param_count(shared) == 2 * 32 * 4
    # one table gets the gradient of every layer: it equals the sum of the per-layer gradients
    g, params, rest = nnx.split(shared, nnx.Param, ...)
    tokens = _tokens()

    def loss(p):
        return jnp.sum(jnp.sin(nnx.merge(g, p, rest)(tokens)))

    grads = jax.grad(loss)(params)
    flat = [x for path, x in jax.tree.leaves_with_path(grads) if "table" in jax.tree_util.keystr(path)]
    assert len(flat) == 1 and float(jnp.abs(flat[0]).sum()) > 0


def test_rezero_has_one_gate_per_layer_shared_by_attention_and_mlp():
    model = build("nope", norm=dict(placement="rezero", kind="none"))
    names = {jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(nnx.state(model, nnx.Param))}
    assert sum("gate" in n for n in names) == 2  # two layers, one gate each
    assert not any("norm" in n for n in names)  # no norm parameters: ReZero has no norm
