"""Training a mixture-of-experts decoder (model.moe, posenc.training.moe_terms): the losses the step reports
are the formulas on the router logits the model produced, the correction bias moves by DeepSeek-V3's rule
after the step (and by nothing else), and a MoE arm joins a study grid."""

import os

import jax
import numpy as np
import pytest
from flax import nnx

from posenc import studies
from posenc.config import overrides
from posenc.configs import compare as compare_config
from posenc.configs import default
from posenc.configs.compare_grids import common
from posenc.training import loop, prepare, schema
from posenc.training import step as step_lib
from posenc.workdir import files

E, K = 4, 2


def run_config(**moe):
    c = default.get_config("tiny")
    fields = {"model.num_layers": 2, "model.mlp": "swiglu", "model.d_model": 16, "train.batch_size": 4,
              "model.moe.num_experts": E, "model.moe.num_experts_per_tok": K,
              "model.moe.moe_intermediate_size": 16, **{f"model.moe.{k}": v for k, v in moe.items()}}
    overrides.apply(c, fields, schema=schema.Run)
    return c


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def load_balancing(logits, top_k):
    """transformers' load_balancing_loss_func (models/mixtral) over every layer's tokens, in NumPy."""
    p = _softmax(logits.reshape(-1, logits.shape[-1]).astype(np.float64))
    chosen = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    f = np.stack([np.bincount(row, minlength=p.shape[-1]) for row in chosen]).mean(0)  # sums to top_k
    return p.shape[-1] * np.sum(f * p.mean(0))


def z_loss(logits):
    """ST-MoE eq. 5: mean over tokens of logsumexp(logits)^2."""
    x = logits.astype(np.float64)
    m = x.max(-1)
    return np.mean((m + np.log(np.exp(x - m[..., None]).sum(-1))) ** 2)


def _step_and_routing(c):
    """One train step on key 5, and the routing of the model before it on that step's batch."""
    r = prepare.resolve(c)
    _, _, graphdef, state = loop.init_state(r)
    key = jax.random.key(5)
    batch, positions = step_lib._train_batch(r.train, key, None)
    model, _ = nnx.merge(graphdef, state)
    routing = []
    model(batch["inputs"], positions, deterministic=False, key=jax.random.fold_in(key, 1), routing=routing)
    routing = [jax.tree.map(np.asarray, x) for x in routing]  # before the step donates the state
    new_state, metrics = step_lib.train_step_fn(r.train)(graphdef, state, key)
    return nnx.merge(graphdef, new_state)[0], {k: float(v) for k, v in metrics.items()}, routing


def test_the_step_reports_the_router_losses_of_the_models_logits():
    model, metrics, routing = _step_and_routing(run_config(router_aux_loss_coef=0.02, router_z_loss_coef=0.001))
    logits = np.stack([x.logits for x in routing])  # [layers, B, L, E]
    assert logits.shape[0] == 2 and logits.shape[-1] == E
    assert metrics["router_aux_loss"] == pytest.approx(0.02 * load_balancing(logits, K), rel=1e-5)
    assert metrics["router_z_loss"] == pytest.approx(0.001 * z_loss(logits), rel=1e-5)
    loads = [np.bincount(x.indices.reshape(-1), minlength=E) for x in routing]
    assert metrics["expert_load_violation"] == pytest.approx(np.mean([l.max() / l.mean() - 1 for l in loads]),
                                                             rel=1e-5)
    assert metrics["total_loss"] == pytest.approx(
        metrics["loss"] + metrics["z_loss"] + metrics["router_aux_loss"] + metrics["router_z_loss"], rel=1e-6)


def test_the_correction_bias_moves_by_deepseeks_rule_after_the_step():
    c = run_config(router="sigmoid_top_k", n_group=2, topk_group=2, norm_topk_prob=True, score_correction_bias=True,
                   router_aux_loss_coef=0.0, bias_update_rate=0.01)
    model, metrics, routing = _step_and_routing(c)
    for layer, r in zip(model.blocks, routing):
        load = np.bincount(r.indices.reshape(-1), minlength=E)
        want = 0.01 * np.sign(load.mean() - load)  # from 0: one step of the rule, no optimizer update
        np.testing.assert_allclose(layer.mlp.e_score_correction_bias[...], want, atol=1e-7)
        assert np.any(want != 0)
    assert metrics["router_aux_loss"] == metrics["router_z_loss"] == 0.0  # weights 0: the terms are off
    assert metrics["total_loss"] == pytest.approx(metrics["loss"], rel=1e-6)

def test_a_moe_arm_joins_a_compare_grid(tmp_path):
    """A model.moe.* variant in a compare grid trains and evaluates beside the dense arm (seconds)."""
    c = compare_config.get_config("smoke")
    c.base.train.steps = 4
    c.base.eval.update(lengths=(8,), decode=False)
    c.variants = default.fields({"rope_moe": {"model.mlp": "swiglu", "model.moe.num_experts": E,
                                              "model.moe.num_experts_per_tok": K}})
    c.grid = common.grid(positions=("rope", "rope_moe"), seeds=(0,))
    rows = studies.run("compare", c, str(tmp_path))
    assert [r["variant"] for r in rows] == ["rope", "rope_moe"]
    assert all(np.isfinite(r["loss"]) for r in rows) and len({r["config_hash"] for r in rows}) == 2
    run = files.read_json(os.path.join(tmp_path, "runs", rows[1]["run"], "config.json"))["config"]["model"]
    assert (run["moe"]["num_experts"], run["mlp"]) == (E, "swiglu")


def test_the_stability_studys_moe_variants_train_with_and_without_the_router_z_loss(tmp_path):
    """configs/stability.py's moe and moe_router_z_loss at methods_smoke's size (seconds)."""
    from posenc.configs import stability as stability_config

    c = stability_config.get_config("methods_smoke")
    stability_config._grid(c, {"d8_l2": stability_config._size(8, 2)}, ("moe", "moe_router_z_loss"))
    rows = studies.run("stability", c, str(tmp_path))
    assert [r["variant"] for r in rows] == ["moe", "moe_router_z_loss"]
    z = []
    for r in rows:
        assert not r["diverged"] and np.isfinite(r["loss"])
        log = files.read_jsonl(os.path.join(tmp_path, "runs", r["run"], "train_log.jsonl"))
        z.append(log[-1]["router_z_loss"])
        assert log[-1]["router_aux_loss"] > 0  # the Switch loss, 0.01 by default
    assert z[0] == 0.0 < z[1]
