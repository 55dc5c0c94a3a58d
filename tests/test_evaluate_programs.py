"""Evaluation without waste: one compiled call per length (every batch and row chunk), equal to
chunk-by-chunk calls; a grid cell's seeds evaluated together, equal to one model at a time."""

import importlib.util
import os

import jax
import pytest
from flax import nnx

from posenc.config import overrides
from posenc.model import Decoder
from posenc.training import eval_step, evaluate, prepare, specs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(arg="tiny"):
    module = importlib.import_module("posenc.configs.default")
    return module.get_config(arg)


def chunk_by_chunk(model, r, length):
    """The sums of one ``eval_step_fn`` call per (batch, row chunk), added on the host's order."""
    c = r.config
    batch_size = int(c.eval.batch_size)
    rows = eval_step.rows_per_step(batch_size, length, int(c.eval.max_tokens_per_step))
    plan = evaluate.plan_length(r.task, c, length)  # copy: Kazemnejad et al.'s size bins
    fn = eval_step.eval_step_fn(r.task, r.train.positions, length, batch_size, rows=rows, min_size=plan.min_size)
    graphdef, state = nnx.split(model)
    root = jax.random.fold_in(jax.random.key(int(c.eval.seed)), length)
    totals = None
    for i in range(int(c.eval.num_batches)):
        for chunk in range(batch_size // rows):
            out = fn(graphdef, state, jax.random.fold_in(root, i), chunk)
            totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
    return jax.device_get(totals), rows


def test_one_call_per_length_equals_chunk_by_chunk_calls():
    c = tiny_config()
    c.eval.update(lengths=(16,), batch_size=8, num_batches=3, max_tokens_per_step=40)  # 4 chunks
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    totals, rows = chunk_by_chunk(model, r, 16)
    assert rows == 2
    row = evaluate.evaluate_length(model, r.task, r.config, r.spec, 16)
    assert row["eval_rows_per_step"] == 2 and row["eval_tokens"] == int(totals["mask_sum"]) > 0
    assert row["loss"] == float(totals["loss_sum"]) / float(totals["mask_sum"])
    assert row["accuracy"] == float(totals["correct_sum"]) / float(totals["mask_sum"])
    assert row["exact_match"] == float(totals["exact_sum"]) / float(totals["examples"])
    # decoding follows: the first errors too
    fn = eval_step.eval_length_fn(r.task, r.train.positions, 16, 8, 3, rows=2, min_size=1, errors=True)
    other = Decoder(r.spec, rngs=nnx.Rngs(1))  # another model of the graph: the same program
    assert evaluate.evaluate_length(other, r.task, r.config, r.spec, 16)["loss"] != row["loss"]
    assert fn._cache_size() == 1
    from posenc.training import step

    chunk = step.train_chunk_fn(r.train, 4)
    step.clear_cache(training_only=True)  # a fine-tune's schedule is gone; the evaluation program stays
    again = eval_step.eval_length_fn(r.task, r.train.positions, 16, 8, 3, rows=2, min_size=1, errors=True)
    assert again.program is fn.program
    assert step.train_chunk_fn(r.train, 4) is not chunk
    step.clear_cache()
    assert eval_step.eval_length_fn(r.task, r.train.positions, 16, 8, 3, rows=2, min_size=1).program is not fn.program


def seed_models(spec, n=3):
    return [Decoder(spec, rngs=nnx.Rngs(seed)) for seed in range(n)]


@pytest.mark.parametrize("arg", ["tiny", "tiny,text"])
def test_seeds_evaluated_together_equal_one_model_at_a_time(arg):
    c = tiny_config(arg)
    c.eval.update(lengths=(16, 32), batch_size=4, num_batches=2, max_tokens_per_step=40)
    if arg == "tiny":
        c.eval.variants = overrides.fields(
            {"pi2": {"model.position.rope.scaling": "linear", "model.position.rope.factor": 2}})
    else:
        c.task.options.update(max_bytes=300_000, eval_fraction=0.5)
        c.eval.lengths = (64, 128)
        c.model.position.kind = "learned"  # 64 rows: 128 is not applicable
    r = prepare.resolve(c)
    models = seed_models(r.spec)
    together = evaluate.evaluate_seeds(models, r)
    assert len(together) == 3
    for model, rows in zip(models, together):
        alone = evaluate.evaluate(model, r)
        assert [(x["eval_variant"], x["eval_length"]) for x in rows] == \
            [(x["eval_variant"], x["eval_length"]) for x in alone]
        for x, y in zip(rows, alone):
            assert sorted(x) == sorted(y)
            for k in ("loss", "accuracy", "exact_match", "perplexity", "loss_last_L", "decoded_accuracy",
                      "decoded_exact_match"):
                if y.get(k) is None:
                    assert x.get(k) is None and (k not in y or "not_applicable" in y or k not in x)
                else:
                    assert x[k] == pytest.approx(y[k], rel=2e-6, abs=1e-7), k
            assert x.get("not_applicable") == y.get("not_applicable")
            for k in ("eval_tokens", "eval_rows_per_step", "eval_windows"):
                assert x.get(k) == y.get(k), k
    losses = [rows[0]["loss"] for rows in together]
    assert len(set(losses)) == 3  # three different models


def test_seeds_decoded_together_equal_one_model_at_a_time():
    from posenc.training import decode, decode_set, decode_steps

    c = tiny_config()
    c.eval.update(batch_size=8, num_batches=2, max_tokens_per_step=64)  # 2 row chunks a batch at 32
    r = prepare.resolve(c)
    models = seed_models(r.spec)
    graphdef, params, rest = evaluate.split_params(models)
    program = decode_steps._jitted(decode_set._forced_seeds, ("end",))
    compiled = program._cache_size()
    for n in (16, 32):
        plan = evaluate.plan_length(r.task, r.config, n)
        together = decode.eval_correctness_seeds(graphdef, params, rest, r.task, r.config, n,
                                                 min_size=plan.min_size)
        for model, (correct, mask) in zip(models, together):
            alone, alone_mask = decode.eval_correctness(model, r.task, r.config, n, min_size=plan.min_size)
            assert (mask == alone_mask).all() and (correct == alone).all()
        assert mask.sum() > 0 and len({int(c.sum()) for c, _ in together}) > 1  # models that differ
    assert program._cache_size() == compiled + 2  # one program per length, every chunk and seed in it


def test_rows_carry_the_decoded_answers_scores():
    from posenc.training import decode

    c = tiny_config()
    c.eval.update(lengths=(16, 32), batch_size=8, num_batches=2)
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    rows = evaluate.evaluate(model, r)
    for row in rows:
        n = row["eval_length"]
        plan = evaluate.plan_length(r.task, r.config, n)
        root = jax.random.fold_in(jax.random.key(int(c.eval.seed)), n)
        correct, mask = decode.eval_correctness(model, r.task, r.config, n, root=root, min_size=plan.min_size)
        assert row["decoded_accuracy"] == decode.decoded_metrics(correct, mask)["decoded_accuracy"]
        assert mask.sum() == row["eval_tokens"]  # the same examples as the teacher-forced metrics
        assert (row["problem_size_min"], row["problem_size_max"]) == (plan.min_size, plan.max_size)
    assert rows[1]["problem_size_min"] == rows[0]["problem_size_max"] + 1  # copy: the next size bin
    c.eval.decode = False
    assert "decoded_accuracy" not in evaluate.evaluate(model, prepare.resolve(c))[0]


def test_a_depth_sweep_shares_one_program_with_the_rows_of_one_program_per_depth(monkeypatch):
    """passkey's depth is a traced option: the five depths of its sweep run one compiled program per
    length, with the batches and sums of a program compiled for each depth (depth a constant)."""
    c = tiny_config()
    c.task.name, c.task.train_length = "passkey", 300
    c.task.options = type(c.task)()
    c.model.vocab_size = 256
    c.eval.update(lengths=(300,), batch_size=4, num_batches=2)
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    root = jax.random.fold_in(jax.random.key(int(c.eval.seed)), 300)
    points = evaluate.sweep_points(r.config, r.task)
    shared = [eval_step.eval_length_fn(task, r.train.positions, 300, 4, 2) for _, _, task in points]
    assert len({id(fn.program) for fn in shared}) == 1
    uniform = eval_step.eval_length_fn(r.task, r.train.positions, 300, 4, 2)  # depth None: a program of its own
    assert uniform.program is not shared[0].program
    monkeypatch.setattr(specs.TaskSpec, "traced", property(lambda self: {}))  # the depth compiled in
    losses = []
    for (sweep, _, task), fn in zip(points, shared):
        together = jax.device_get(fn(graphdef, state, root))
        constant = eval_step.eval_length_fn(task, r.train.positions, 300, 4, 2)
        assert constant.program is not fn.program
        alone = jax.device_get(constant(graphdef, state, root))
        for k in ("correct_sum", "mask_sum", "exact_sum", "examples"):
            assert together[k] == alone[k], (sweep, k)
        assert together["loss_sum"] == pytest.approx(alone["loss_sum"], rel=1e-5), sweep
        for i in range(2):  # and the batches themselves
            key = jax.random.fold_in(root, i)
            a = eval_step.eval_batch(task, r.train.positions, key, 4, 300)[0]
            b = jax.jit(lambda d: eval_step.eval_batch(task.with_traced({"depth": d}), r.train.positions, key, 4,
                                                   300)[0])(
                jax.numpy.float32(sweep["depth"]))
            assert all((a[k] == b[k]).all() for k in a), sweep
        losses.append(float(together["loss_sum"]))
    assert len(set(losses)) == 5  # the depth reached the batches
    assert shared[0]._cache_size() == 1  # five depths, one compile
    with pytest.raises(ValueError, match="not traced"):
        r.task.with_traced({"seed": 1})
