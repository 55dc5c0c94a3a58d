"""Evaluation sweeps (one compiled step per point) and the LM evaluation on consecutive held-out windows."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from posenc import tasks
from posenc.model import Decoder
from posenc.training import evaluate, finish, prepare
from posenc.workdir import files, results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(arg):
    module = importlib.import_module("posenc.configs.default")
    return module.get_config(arg)


@pytest.fixture(scope="module")
def text_task():
    return tasks.make("text", max_bytes=300_000, eval_fraction=0.5)


def test_sequential_windows_tile_the_eval_split_and_mask_past_its_end(text_task):
    data = np.asarray(text_task.corpus.data["eval"]).astype(np.int32)
    count = (data.size - 1) // 16  # whole windows of 16 targets
    batch = jax.jit(text_task.sequential_batch, static_argnums=(1, 2))(jnp.int32(2), 4, 16)  # traced index
    for r in range(4):
        w = 2 * 4 + r
        np.testing.assert_array_equal(batch["inputs"][r], data[16 * w:16 * w + 16])
        np.testing.assert_array_equal(batch["targets"][r], data[16 * w + 1:16 * w + 17])
    # the targets of windows 0, 1, ... are the split from its second token, no overlap, no gap
    first = text_task.sequential_batch(0, 4, 16)
    np.testing.assert_array_equal(np.concatenate([first["targets"], batch["targets"]])[:4].ravel(), data[1:65])
    assert float(first["mask"].sum()) == 64.0
    last = text_task.sequential_batch(count // 3, 3, 16)  # rows past the last whole window
    assert last["mask"].sum(axis=1).tolist() == [16.0 * (3 * (count // 3) + r < count) for r in range(3)]
    host = tasks.make("text", max_bytes=300_000, eval_fraction=0.5, device_limit=0)  # memmap path
    assert not host.on_device
    for a, b in zip(jax.tree.leaves(host.sequential_batch(count // 3, 3, 16)), jax.tree.leaves(last)):
        np.testing.assert_array_equal(a, b)


def log_softmax_ce(logits, targets):
    logits = np.asarray(logits, np.float64)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, targets[..., None], -1)[..., 0]


def test_text_rows_carry_perplexity_over_all_and_over_the_last_l_tokens(text_task):
    c = config("text,tiny")  # train length 16
    c.task.options = ml_collections.ConfigDict(dict(max_bytes=300_000, eval_fraction=0.5))
    c.eval.update(lengths=(32,), batch_size=4, tokens=256, position_buckets=4, max_tokens_per_step=0)
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    (row,) = evaluate.evaluate(model, r)
    # reference: the 8 first consecutive windows of the eval split, scored directly
    data = np.asarray(text_task.corpus.data["eval"]).astype(np.int32)
    x = np.stack([data[32 * w:32 * w + 32] for w in range(8)])
    y = np.stack([data[32 * w + 1:32 * w + 33] for w in range(8)])
    ce = log_softmax_ce(model(jnp.asarray(x)), y)
    assert row["eval_windows"] == 8 and row["eval_tokens"] == 256 and row["last_L"] == 16
    assert row["loss"] == pytest.approx(ce.mean(), rel=1e-5)
    assert row["loss_last_L"] == pytest.approx(ce[:, 16:].mean(), rel=1e-5)
    assert row["perplexity"] == pytest.approx(np.exp(ce.mean()), rel=1e-5)
    assert row["perplexity_last_L"] == pytest.approx(np.exp(ce[:, 16:].mean()), rel=1e-5)
    assert [b["loss"] for b in row["position_loss"]] == pytest.approx(
        [ce[:, i:i + 8].mean() for i in (0, 8, 16, 24)], rel=1e-5)
    assert row["text_protocol"] == "nonoverlapping" and row["eval_stride"] == 32


def test_every_length_scores_the_same_held_out_tokens_and_sliding_scores_each_once(text_task):
    c = config("text,tiny")
    c.task.options = ml_collections.ConfigDict(dict(max_bytes=300_000, eval_fraction=0.5))
    c.eval.update(lengths=(16, 32, 64), batch_size=4, tokens=192, max_tokens_per_step=0)
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    rows = evaluate.evaluate(model, r)
    assert [row["eval_tokens"] for row in rows] == [192] * 3 and [row["eval_windows"] for row in rows] == [12, 6, 3]
    # sliding windows of 32 every 8 tokens: the first window scores 32 targets, each later one its last 8
    data = np.asarray(text_task.corpus.data["eval"]).astype(np.int32)
    c.eval.update(lengths=(32,), text_protocol="sliding", stride=8, tokens=96)
    (row,) = evaluate.evaluate(model, prepare.resolve(c))
    assert row["eval_windows"] == 1 + (96 - 32) // 8 and row["eval_tokens"] == 96
    ce, scored = [], []
    for w in range(row["eval_windows"]):
        x, y = data[8 * w:8 * w + 32], data[8 * w + 1:8 * w + 33]
        out = log_softmax_ce(model(jnp.asarray(x[None])), y[None])[0]
        keep = slice(0, 32) if w == 0 else slice(24, 32)
        ce.append(out[keep])
        scored.append(np.arange(8 * w + 1, 8 * w + 33)[keep])
    scored = np.concatenate(scored)
    assert np.array_equal(scored, np.arange(1, 97))  # every one of the first 96 targets, once
    assert row["loss"] == pytest.approx(np.concatenate(ce).mean(), rel=1e-5)
    # a split too small for eval.tokens, or a length that does not tile them, fails before compiling
    c.eval.update(text_protocol="nonoverlapping", stride=0, lengths=(50,), tokens=192)
    with pytest.raises(prepare.ConfigError, match=r"eval.tokens=192 is not 50 \+ a multiple of 50"):
        prepare.resolve(c)
    c.eval.update(lengths=(32,), tokens=2**24)
    with pytest.raises(prepare.ConfigError, match="needs 16777217 held-out tokens; the held-out split holds"):
        prepare.resolve(c)


def test_each_sweep_point_is_evaluated_with_its_own_task(tmp_path):
    c = config("flip_flop,tiny")
    c.eval.update(lengths=(16,), batch_size=8, num_batches=1)
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    rows = evaluate.evaluate(model, r)
    assert [row.get("sweep") for row in rows] == [None, {"p_ignore": 0.1}, {"p_ignore": 0.8}, {"p_ignore": 0.98}]
    base, dense, same, sparse = rows
    # p_ignore = 0.8 is the task's default: the same data as the configured task
    assert same["loss"] == base["loss"] and same["eval_tokens"] == base["eval_tokens"]
    # the read instructions (the answer tokens) are fewer the more is ignored: each point has its own data
    assert dense["eval_tokens"] > base["eval_tokens"] > sparse["eval_tokens"]
    for row, p in ((dense, 0.1), (sparse, 0.98)):
        c2 = c.copy_and_resolve_references()
        c2.task.options = ml_collections.ConfigDict({"p_ignore": p})
        r2 = prepare.resolve(c2)
        alone = evaluate.evaluate_length(model, r2.task, r2.config, r2.spec, 16)
        assert row["loss"] == alone["loss"] and row["eval_tokens"] == alone["eval_tokens"]
    # rows of one run that differ only in the sweep point are all kept in results.jsonl
    ident = dict(task="flip_flop", position="rope", norm="rms", placement="pre", seed=0, train_length=16,
                 steps=20, config_hash="c" * 64)
    made = [results.make_row(**ident, **row) for row in rows]
    workdir = str(tmp_path)
    finish.write_rows(workdir, made)
    finish.write_rows(workdir, made[1:])  # a rerun replaces, never duplicates
    back = files.read_jsonl(os.path.join(workdir, "results.jsonl"))
    assert [b.get("sweep") for b in back] == [row.get("sweep") for row in rows]
