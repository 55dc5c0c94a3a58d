"""The mixture-of-experts MLP in the model (model.moe, posenc.model.moe): each family's layer is the pure
functions wired as transformers wires them, the per-layer pattern, parameter names and shapes, cached
decoding equal to the full forward, the three expert paths equal, compute that grows with the active
experts, and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import experts, routing
from posenc.model import Decoder, ModelSpec, model_config, parity
from posenc.model.moe import CorrectionBias, MoEMLP

H, I, E, V = 16, 8, 4, 13


def config(num_layers=2, **moe):
    c = model_config()
    c.update(d_model=H, num_layers=num_layers, num_heads=2, vocab_size=V, mlp="swiglu", mlp_hidden=24)
    c.moe.update(**{"num_experts": E, "moe_intermediate_size": I, **moe})
    return c


def _p(v):
    return None if v is None else np.asarray(v[...])


# family -> (model.moe fields, reference(x, layer) from the pure functions with the family's own keywords)
FAMILIES = {
    "mixtral": ({"norm_topk_prob": True}, lambda x, m: experts.routed_dense(
        x, *routing.softmax_top_k(routing.router_logits(x, _p(m.router)), k=2, normalize=True)[:2],
        _p(m.gate_up), _p(m.down))),
    "qwen3_next": ({"norm_topk_prob": True, "n_shared_experts": 1, "shared_expert_intermediate_size": 12,
                    "shared_expert_gate": True}, lambda x, m: experts.routed_dense(
        x, *routing.softmax_top_k(routing.router_logits(x, _p(m.router)), k=2, normalize=True)[:2],
        _p(m.gate_up), _p(m.down)) + experts.shared_expert(x, _p(m.shared_gate_up), _p(m.shared_down),
                                                           gate=_p(m.shared_expert_gate))),
    "deepseek_v3": ({"router": "sigmoid_top_k", "n_group": 2, "topk_group": 1, "norm_topk_prob": True,
                     "routed_scaling_factor": 2.5, "score_correction_bias": True, "router_dtype": "float32",
                     "n_shared_experts": 1}, lambda x, m: experts.routed_dense(
        x, *routing.sigmoid_top_k(routing.router_logits(x, _p(m.router), dtype=jnp.float32), k=2,
                                  bias=_p(m.e_score_correction_bias), n_group=2, topk_group=1, normalize=True,
                                  scaling=2.5)[:2], _p(m.gate_up), _p(m.down))
        + experts.shared_expert(x, _p(m.shared_gate_up), _p(m.shared_down))),
    "gpt_oss": ({"router": "top_k_softmax", "router_bias": True, "expert_bias": True, "glu": "clamped_swiglu"},
                lambda x, m: experts.routed_dense(
        x, *routing.top_k_softmax(routing.router_logits(x, _p(m.router), _p(m.router_bias)), k=2)[:2],
        _p(m.gate_up), _p(m.down), gate_up_bias=_p(m.gate_up_bias), down_bias=_p(m.down_bias),
        glu="clamped_swiglu")),
    "llama4": ({"router": "top_k_sigmoid", "num_experts_per_tok": 1, "scale": "input", "n_shared_experts": 1},
               lambda x, m: experts.routed_dense(
        x, *routing.top_k_sigmoid(routing.router_logits(x, _p(m.router)), k=1)[:2], _p(m.gate_up), _p(m.down),
        scale="input") + experts.shared_expert(x, _p(m.shared_gate_up), _p(m.shared_down))),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_familys_layer_is_the_pure_functions(family):
    fields, reference = FAMILIES[family]
    model = Decoder(config(**fields), rngs=nnx.Rngs(0))
    layer = model.blocks[0].mlp
    assert isinstance(layer, MoEMLP)
    rng = np.random.default_rng(0)
    for name in ("router_bias", "gate_up_bias", "down_bias", "e_score_correction_bias"):  # not their zeros
        if getattr(layer, name) is not None:
            v = getattr(layer, name)
            v[...] = jnp.asarray(rng.normal(size=v[...].shape) * 0.5, jnp.float32)
    x = jnp.asarray(rng.normal(size=(2, 5, H)) * (3.0 if family == "gpt_oss" else 1.0), jnp.float32)
    y, r = layer(x)
    np.testing.assert_allclose(y, reference(x, layer), rtol=1e-5, atol=1e-5)
    k = 1 if family == "llama4" else 2
    assert r.indices.shape == (2, 5, k) and r.logits.shape == (2, 5, E)


def test_which_layers_are_moe_and_the_widths():
    """Layer i is MoE iff i >= first_k_dense_replace, (i + 1) % decoder_sparse_step == 0, i not in
    mlp_only_layers; dense layers keep model.mlp_hidden, experts moe_intermediate_size."""
    c = config(num_layers=6, first_k_dense_replace=1, decoder_sparse_step=2, mlp_only_layers=(3,))
    spec = ModelSpec.from_config(c)
    assert spec.moe.layers == (False, True, False, False, False, True)
    model = Decoder(spec, rngs=nnx.Rngs(0))
    for i, b in enumerate(model.blocks):
        if spec.moe.layers[i]:
            assert (b.mlp.gate_up[...].shape, b.mlp.down[...].shape, b.mlp.router[...].shape) == (
                (E, H, 2 * I), (E, I, H), (H, E))
        else:
            assert b.mlp.w1[...].shape == (H, 24)
    qwen = ModelSpec.from_config(config(num_layers=4, moe_intermediate_size=0, decoder_sparse_step=2))
    assert qwen.moe.layers == (False, True, False, True) and qwen.moe.intermediate == 24  # 0: model.mlp_hidden


def test_parameter_names_and_shapes_and_the_correction_bias_is_not_trained():
    fields = dict(FAMILIES["deepseek_v3"][0], n_shared_experts=2)  # shared width 2 * moe_intermediate_size
    model = Decoder(config(**fields), rngs=nnx.Rngs(0))
    params = {"/".join(map(str, p[2:])): v[...].shape for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
              if p[:1] == ("blocks",) and p[1] == 0 and p[2] == "mlp"}
    assert params == {"mlp/router": (H, E), "mlp/gate_up": (E, H, 2 * I), "mlp/down": (E, I, H),
                      "mlp/shared_gate_up": (H, 4 * I), "mlp/shared_down": (2 * I, H)}
    bias = model.blocks[0].mlp.e_score_correction_bias
    assert isinstance(bias, CorrectionBias) and not isinstance(bias, nnx.Param) and bias[...].shape == (E,)
    gpt = Decoder(config(**FAMILIES["gpt_oss"][0]), rngs=nnx.Rngs(0)).blocks[1].mlp
    assert (gpt.router_bias[...].shape, gpt.gate_up_bias[...].shape, gpt.down_bias[...].shape) == ((E,), (E, 2 * I),
                                                                                                  (E, H))


def test_cached_decoding_equals_the_full_forward():
    """The MoE MLP is per token: prefill then one token at a time gives the full forward's logits (blocks of
    different sizes, a correction bias, groups and a shared expert)."""
    model = Decoder(config(num_layers=3, first_k_dense_replace=1, **FAMILIES["deepseek_v3"][0]), rngs=nnx.Rngs(1))
    for b in model.blocks[1:]:
        b.mlp.e_score_correction_bias[...] = jnp.asarray([0.3, -0.2, 0.1, 0.0])
    tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, V)
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens):  # one compile: the full forward, a prefill of 4 tokens, then one per step
        m = nnx.merge(graphdef, state)
        return m(tokens), parity.decode_stepwise(m, tokens, 4, 9)[0]

    full, cached = run(state, tokens)
    np.testing.assert_allclose(cached, full, rtol=1e-5, atol=1e-5)


def test_blocked_ragged_and_dense_paths_give_one_model():
    tokens = jax.random.randint(jax.random.key(2), (2, 11), 0, V)
    impls = ("blocked", "ragged", "dense")
    graphs = {impl: nnx.split(Decoder(config(impl=impl, **FAMILIES["gpt_oss"][0]), rngs=nnx.Rngs(3)))
              for impl in impls}
    run = jax.jit(lambda states, t: {i: nnx.merge(graphs[i][0], states[i])(t) for i in impls})
    logits = run({i: graphs[i][1] for i in impls}, tokens)
    np.testing.assert_allclose(logits["blocked"], logits["dense"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits["ragged"], logits["dense"], rtol=1e-5, atol=1e-5)


def test_evaluation_compute_grows_with_the_active_experts_not_all():
    """XLA's FLOP count of the forward at 8 and 32 experts (top-2, same widths): about equal on the
    blocked path, about 4x the experts' work on the dense one."""
    def flops(num_experts, impl):
        c = config(num_experts=num_experts, impl=impl, moe_intermediate_size=64)
        graphdef, state = nnx.split(Decoder(c, rngs=nnx.Rngs(0)))
        tokens = jnp.zeros((8, 64), jnp.int32)
        fn = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
        cost = fn.lower(state, tokens).compile().cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    blocked, dense = flops(32, "blocked") / flops(8, "blocked"), flops(32, "dense") / flops(8, "dense")
    assert blocked < 1.1 < 2.5 < dense, (blocked, dense)


REFUSED = [
    ({"num_experts": 0, "moe_intermediate_size": 0, "num_experts_per_tok": 3},
     r"model.moe.num_experts_per_tok=3 is set, but the MoE is off"),
    ({"num_experts_per_tok": 5}, r"num_experts_per_tok=5 must be <= model.moe.num_experts=4"),
    ({"router": "top_k_softmax", "norm_topk_prob": True},
     r"norm_topk_prob=True is set, but router 'top_k_softmax' does not read it \(it is read by: softmax_top_k, "
     r"sigmoid_top_k\)"),
    ({"n_group": 2}, r"n_group=2 is set, but router 'softmax_top_k' does not read it"),
    ({"router": "sigmoid_top_k", "n_group": 3}, r"n_group=3 must divide model.moe.num_experts=4"),
    ({"router": "sigmoid_top_k", "n_group": 2, "topk_group": 1, "num_experts_per_tok": 3},
     r"num_experts_per_tok=3 must be <= the experts of the kept groups"),
    ({"swiglu_limit": 5.0}, r"swiglu_limit=5.0 is set, but only glu 'clamped_swiglu' reads it"),
    ({"bias_update_rate": 0.01}, r"bias_update_rate=0.01 moves the score correction bias"),
    ({"shared_expert_gate": True}, r"shared_expert_gate=True is set, but there is no shared expert"),
    ({"mlp_only_layers": (0, 2)}, r"mlp_only_layers has index 2, past the last layer \(model.num_layers=2\)"),
    ({"first_k_dense_replace": 2}, r"model.moe makes no layer MoE"),
    ({"impl": "grouped"}, r"unknown model.moe.impl 'grouped'; choose one of: blocked, dense, ragged"),
]


@pytest.mark.parametrize("fields,message", REFUSED)
def test_refusals_name_the_field_and_the_allowed_values(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_config(config(**fields))


def test_refused_with_ngpt_and_an_unknown_field_is_named():
    c = config()
    c.update(mlp="swiglu")
    c.norm.placement = "ngpt"
    with pytest.raises(ValueError, match=r"model.moe cannot be combined with model.norm.placement='ngpt'"):
        ModelSpec.from_config(c)
    c = config()
    c.moe.num_expert = 8
    with pytest.raises(ValueError, match=r"did you mean 'model.moe.num_experts'"):
        ModelSpec.from_config(c)


def test_each_moe_preset_is_its_familys_router_and_layers():
    from posenc.model import presets

    want = {"mixtral": ("softmax_top_k", 2, 0, (True, True)), "qwen3_moe": ("softmax_top_k", 2, 0, (True, True)),
            "olmoe": ("softmax_top_k", 2, 0, (True, True)), "deepseek_v3_moe": ("sigmoid_top_k", 2, 64, (False, True)),
            "glm4_moe": ("sigmoid_top_k", 2, 64, (False, True)), "gpt_oss": ("top_k_softmax", 2, 0, (True, True)),
            "llama4_moe": ("top_k_sigmoid", 1, 64, (True,) * 4)}
    for name, (router, k, shared, layers) in want.items():
        c = _preset(name)
        c.mlp_hidden = 64
        m = ModelSpec.from_config(c, train_length=16).moe
        assert (m.router, m.top_k, m.shared_intermediate, m.layers) == (router, k, shared, layers), name
    olmoe = presets.get("olmoe")
    assert (olmoe["model.moe.router_aux_loss_coef"], olmoe["model.moe.router_z_loss_coef"]) == (0.01, 0.001)
    ds = ModelSpec.from_config(_preset("deepseek_v3_moe"), train_length=16)
    assert ds.moe.score_correction_bias and (ds.moe.n_group, ds.moe.topk_group) == (4, 2) and ds.mla is not None


def _preset(name):
    import ml_collections

    from posenc.config import overrides
    from posenc.model import presets

    c = ml_collections.ConfigDict({"model": model_config()})
    overrides.apply(c, presets.get(name))
    c.model.update(d_model=32, num_heads=4, vocab_size=16)
    return c.model
