"""Optimizer schedule, masked metrics, and the jitted train step (loss decreases, deterministic)."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc.config import overrides
from posenc.model import Decoder
from posenc.training import eval_step, evaluate, loop, optim, prepare, specs
from posenc.training import step as step_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(arg="tiny"):
    module = importlib.import_module("posenc.configs.default")
    return module.get_config(arg)


def test_schedule_warmup_cosine():
    c = tiny_config().train
    c.update(steps=100, warmup_steps=10, learning_rate=1e-2, min_lr_ratio=0.1)
    s = optim.learning_rate_schedule(specs.OptimizerSpec.from_train(c))
    np.testing.assert_allclose([s(0), s(5), s(10), s(55), s(100)],
                               [0.0, 5e-3, 1e-2, 5.5e-3, 1e-3], rtol=1e-5, atol=1e-9)


def test_optimizer_clips_and_decays_matrices_only():
    c = tiny_config().train
    c.update(steps=10, warmup_steps=0, learning_rate=0.1, weight_decay=0.5, clip_norm=1.0)
    tx = optim.make_optimizer(specs.OptimizerSpec.from_train(c))
    assert optim.make_optimizer(specs.OptimizerSpec.from_train(c)) is tx  # equal specs, one object: one compile
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones((2,))}
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, tx.init(params), params)
    # zero gradient: only weight decay moves parameters, and only the matrix
    np.testing.assert_allclose(updates["w"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
    np.testing.assert_allclose(updates["b"], 0.0)


def test_masked_metrics_values():
    # two examples, vocab 3; example 0 fully right, example 1 wrong on one answer token
    logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]],
                                [[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.6, 0.2, 0.2]]]))
    targets = jnp.array([[0, 1, 2], [1, 1, 2]])
    mask = jnp.array([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])  # position 0 is not an answer
    m = step_lib.masked_metrics(logits, targets, mask)
    expected_loss = -(np.log(0.8) + np.log(0.6) + np.log(0.8) + np.log(0.2)) / 4
    np.testing.assert_allclose(m["loss"], expected_loss, rtol=1e-5)
    np.testing.assert_allclose(m["accuracy"], 3 / 4, rtol=1e-6)
    np.testing.assert_allclose(m["exact_match"], 1 / 2, rtol=1e-6)


def raw(x):
    return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def train(config, steps, stats=False):
    r = prepare.resolve(config)
    _, _, graphdef, state = loop.init_state(r)
    fn = step_lib.train_step_fn(r.train)
    stats_fn = step_lib.stats_fn(r.train)
    root = loop.data_root(r.config)
    history = []
    for t in range(steps):
        key = jax.random.fold_in(root, t)
        extra = stats_fn(graphdef, state, key) if stats else {}
        state, metrics = fn(graphdef, state, key)
        history.append(jax.device_get({**metrics, **extra}))
    return state, history


@pytest.fixture(scope="module")
def tiny():
    c = tiny_config()
    c.train.update(steps=40, warmup_steps=4, learning_rate=3e-3)
    return c


@pytest.mark.smoke
def test_train_step_decreases_loss_and_reports_metrics(tiny):
    _, h = train(tiny, 40, stats=True)
    first = np.mean([m["loss"] for m in h[:5]])
    last = np.mean([m["loss"] for m in h[-5:]])
    assert last < first - 0.1, (first, last)
    for key in ("loss", "accuracy", "exact_match", "grad_norm", "lr", "max_attention_logit",
                "attention_entropy", "log_z"):
        assert np.isfinite(h[-1][key]), key
    assert h[0]["lr"] == 0.0 and h[4]["lr"] == pytest.approx(3e-3, rel=1e-5)


def test_stats_pass_sees_the_step_batch_and_parameters(tiny):
    """stats_fn on step t's key gives the diagnostics of the forward the step trains on:
    log Z of that batch under the pre-update parameters, from the model itself."""
    r = prepare.resolve(tiny)
    model, _, graphdef, state = loop.init_state(r)
    key = jax.random.fold_in(loop.data_root(r.config), 0)
    stats = step_lib.stats_fn(r.train)(graphdef, state, key)
    batch, positions = step_lib._batch(r.task, r.train.positions, key, int(r.config.train.batch_size),
                                       int(r.config.task.train_length), split="train")
    _, ref = model(batch["inputs"], positions, return_stats=True)
    for k in ("max_attention_logit", "attention_entropy", "logit_mean", "log_z"):
        np.testing.assert_allclose(stats[k], ref[k], rtol=1e-5, err_msg=k)
    # the train step itself returns no diagnostics: they cost a forward on logging steps only
    _, metrics = step_lib.train_step_fn(r.train)(graphdef, state, key)
    assert "max_attention_logit" not in metrics


def test_deterministic_from_seed(tiny):
    s1, h1 = train(tiny, 6)
    s2, h2 = train(tiny, 6)
    assert [m["loss"] for m in h1] == [m["loss"] for m in h2]
    for a, b in zip(jax.tree.leaves(s1), jax.tree.leaves(s2)):
        np.testing.assert_array_equal(raw(a), raw(b))
    other = tiny.copy_and_resolve_references()
    other.train.seed = 1
    _, h3 = train(other, 6)
    assert [m["loss"] for m in h3] != [m["loss"] for m in h1]
    # three models of one shape (two seeds), each its own graphdef object: one jitted step
    r = prepare.resolve(tiny)
    assert step_lib.train_step_fn(r.train)._cache_size() == 1


def test_z_loss_is_added(tiny):
    c = tiny.copy_and_resolve_references()
    c.train.z_loss = 1e-2
    _, h = train(c, 1, stats=True)
    assert h[0]["z_loss"] > 0
    np.testing.assert_allclose(h[0]["total_loss"], h[0]["loss"] + h[0]["z_loss"], rtol=1e-6)
    np.testing.assert_allclose(h[0]["z_loss"], 1e-2 * h[0]["log_z"] ** 2, rtol=0.2)  # mean of squares vs square of mean


@pytest.mark.parametrize("per", ["batch", "example"])
def test_randomized_positions_train(tiny, per):
    c = tiny.copy_and_resolve_references()
    c.model.position.update(kind="sinusoidal", randomized=True, randomized_max_position=64,
                            randomized_per=per)
    _, h = train(c, 2)
    assert np.isfinite(h[-1]["loss"])
    positions = step_lib.positions_for(specs.Positions.from_config(c), jax.random.key(0), 4, 8)
    if per == "batch":  # the reference: one sorted draw shared by the batch
        assert positions.shape == (8,)
    else:
        assert positions.shape == (4, 8) and len({tuple(p) for p in np.asarray(positions)}) > 1
    assert np.all(np.diff(np.asarray(positions), axis=-1) > 0) and int(positions.max()) < 64


def test_position_buckets():
    from posenc.training.evaluate import _buckets

    loss = np.arange(8, dtype=np.float32)
    mask = np.ones(8, np.float32)
    mask[1] = 0.0
    b = _buckets(loss * mask, mask, 4)  # inputs are masked sums over the batch
    assert [(x["start"], x["end"]) for x in b] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    np.testing.assert_allclose([x["loss"] for x in b], [0.0, 2.5, 4.5, 6.5])


def test_text_evaluation_has_position_loss_and_learned_past_table_is_na():
    c = tiny_config("tiny,text")
    c.task.options.max_bytes = 300_000
    c.task.options.eval_fraction = 0.5  # a small corpus still has eval files
    c.eval.update(lengths=(16,), position_buckets=4)
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    (row,) = evaluate.evaluate(model, r)
    assert [(b["start"], b["end"]) for b in row["position_loss"]] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    # an untrained byte model is near-uniform over 256 bytes everywhere
    for b in row["position_loss"]:
        assert abs(b["loss"] - np.log(256)) < 0.5
    np.testing.assert_allclose(np.mean([b["loss"] for b in row["position_loss"]]), row["loss"], rtol=1e-5)
    c.model.position.kind = "learned"
    r = prepare.resolve(c)
    assert r.config.task.train_length == 64  # "text" after "tiny": the table has 64 rows
    na = evaluate.evaluate_length(Decoder(r.spec, rngs=nnx.Rngs(0)), r.task, r.config, r.spec, 128)
    assert na["loss"] is None and "learned encodes 64 positions" in na["not_applicable"]


def test_evaluation_in_row_chunks_equals_one_batch():
    c = tiny_config("tiny")
    c.eval.update(lengths=(16,), batch_size=8, num_batches=2, max_tokens_per_step=0)
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    (whole,) = evaluate.evaluate(model, r)
    c.eval.max_tokens_per_step = 40  # 2 rows of 16 tokens per forward: 4 chunks per batch
    r2 = prepare.resolve(c)
    (chunked,) = evaluate.evaluate(model, r2)
    assert whole["eval_rows_per_step"] == 8 and chunked["eval_rows_per_step"] == 2
    for k in ("loss", "accuracy", "exact_match", "eval_tokens"):
        assert chunked[k] == pytest.approx(whole[k], rel=1e-6), k
    assert eval_step.rows_per_step(32, 100, 1000) == 8  # the largest divisor within the budget
    assert eval_step.rows_per_step(32, 5000, 1000) == 1  # one row even past the budget


def test_zero_shot_evaluation_variants():
    c = tiny_config("tiny")
    c.eval.lengths = (32,)
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    (plain,) = evaluate.evaluate(model, r)
    c.eval.variants = overrides.fields(
        {"pi4": {"model.position.rope.scaling": "linear", "model.position.rope.factor": 4}})
    r = prepare.resolve(c)
    (vc, vspec), = r.eval_variants.values()
    assert vspec.position.options["rope"]["scaling"] == "linear"
    assert vspec.position.options["rope"]["factor"] == 4.0
    extended = evaluate.variant_model(model, vspec)
    for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(nnx.state(extended, nnx.Param))):
        np.testing.assert_array_equal(a, b)  # same trained parameters
    base, scaled = evaluate.evaluate(model, r)
    assert (base["eval_variant"], scaled["eval_variant"]) == (None, "pi4")
    assert base["loss"] == plain["loss"] and scaled["loss"] != plain["loss"]  # positions interpolated 4x
    c.eval.variants = overrides.fields({"other": {"model.position.kind": "alibi"}})
    with pytest.raises(prepare.ConfigError, match="cannot change the position kinds"):
        prepare.resolve(c)
    c.eval.variants = overrides.fields({"lr": {"train.learning_rate": 1.0}})
    with pytest.raises(prepare.ConfigError, match="changes model.\\* fields"):
        prepare.resolve(c)


def test_independent_weight_decay_does_not_scale_with_the_peak_learning_rate():
    import jax.numpy as jnp
    import ml_collections

    from posenc.training import optim

    def decayed(lr, mode):
        train = ml_collections.ConfigDict(dict(steps=10, warmup_steps=0, learning_rate=lr, min_lr_ratio=1.0,
                                               weight_decay=1e-2, weight_decay_mode=mode, clip_norm=0.0,
                                               b1=0.9, b2=0.98, eps=1e-9))
        tx = optim.make_optimizer(specs.OptimizerSpec.from_train(train))
        params = {"w": jnp.ones((2, 2))}
        updates, _ = tx.update({"w": jnp.zeros((2, 2))}, tx.init(params), params)  # zero gradient: decay only
        return float(-updates["w"][0, 0])

    # coupled (AdamW): lr * wd per step; independent: wd * lr_t / lr = wd at a constant schedule
    assert decayed(1e-3, "coupled") == pytest.approx(1e-5) and decayed(1e-1, "coupled") == pytest.approx(1e-3)
    assert decayed(1e-3, "independent") == pytest.approx(1e-2) == decayed(1e-1, "independent")
