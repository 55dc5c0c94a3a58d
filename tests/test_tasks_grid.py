"""Grid tasks (grid_copy, grid_transpose): exact formats and answers recomputed in Python, (t, h, w) ids equal
to Qwen2-VL's get_rope_index (posenc.mrope.position_ids), the size law, and the ids reaching a multi-axis
model through training and decoded evaluation (one-axis models read 0..L-1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
import posenc.tasks as tasks
from posenc import mrope
from posenc.tasks import BOS, FIRST_SYMBOL, PAD, SEP
from posenc.training import decode, specs
from posenc.training import step as step_lib

LENGTH, BATCH = 33, 16  # max_size(33) = 4: 2 * 16 + 2 = 34 tokens


def reference(name, row):
    """Parse one row, recompute it in Python: (k, tokens, answer positions, ids [3, len])."""
    row = [int(t) for t in row]
    assert row[0] == BOS
    s = row.index(SEP)
    k = int(round((s - 1) ** 0.5))
    assert k * k == s - 1
    grid = [[row[1 + r * k + c] - FIRST_SYMBOL for c in range(k)] for r in range(k)]
    answer = grid if name == "grid_copy" else [list(col) for col in zip(*grid)]
    tokens = [BOS] + row[1:s] + [SEP] + [FIRST_SYMBOL + v for line in answer for v in line]
    ids = mrope.position_ids([1, (1, k, k), 1, (1, k, k), LENGTH + 1 - len(tokens)])  # get_rope_index
    return k, tokens, list(range(s + 1, s + 1 + k * k)), ids


@pytest.mark.parametrize("name", ["grid_copy", "grid_transpose"])
@pytest.mark.parametrize("split", ["train", "eval"])
def test_rows_answers_mask_and_ids_equal_the_python_reference(name, split):
    task = tasks.make(name, alphabet=5)
    batch = task.batch(jax.random.key(1), BATCH, LENGTH, split=split)
    inputs, targets, mask = (np.asarray(batch[k]) for k in ("inputs", "targets", "mask"))
    ids = np.asarray(batch["axis_positions"])
    assert ids.shape == (BATCH, LENGTH, 3) and ids.dtype == np.int32 and "position_ids" not in batch
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
    seq = np.concatenate([inputs[:, :1], targets], axis=1)
    sizes = []
    for b in range(BATCH):
        k, tokens, answer, want_ids = reference(name, seq[b])
        assert len(tokens) == task.seq_len(k) == 2 * k * k + 2
        np.testing.assert_array_equal(seq[b], tokens + [PAD] * (LENGTH + 1 - len(tokens)))
        expected = np.zeros(LENGTH + 1)
        expected[answer] = 1.0
        np.testing.assert_array_equal(np.concatenate([[0.0], mask[b]]), expected)
        np.testing.assert_array_equal(ids[b], want_ids.T[:LENGTH])
        sizes.append(k)
    assert set(sizes) == ({4} if split == "eval" else {1, 2, 3, 4})


def test_golden_example_and_size_law():
    task = tasks.make("grid_transpose", alphabet=4)
    assert [task.max_size(n) for n in (3, 9, 18, 19, 33, 50, 51)] == [1, 2, 2, 3, 4, 4, 5]
    assert task.law == "2 * n^2 + 2" and task.metadata()["position_axes"] == 3
    # k = 2 from fixed draws: grid a b / c d -> answer a c / b d; ids of get_rope_index
    tokens, answer, ids = task._example(jnp.asarray([0, 1, 2, 3] + [0] * 12), 2, 4, 12)
    assert task.render(tokens) == "BOS 0 1 2 3 SEP 0 2 1 3 . ."
    np.testing.assert_array_equal(answer, [0] * 6 + [1] * 4 + [0] * 2)
    np.testing.assert_array_equal(np.asarray(ids).T, [[0, 1, 1, 1, 1, 3, 4, 4, 4, 4, 6, 7],
                                                      [0, 1, 1, 2, 2, 3, 4, 4, 5, 5, 6, 7],
                                                      [0, 1, 2, 1, 2, 3, 4, 5, 4, 5, 6, 7]])
    copy = tasks.make("grid_copy", alphabet=4)
    tokens = copy._example(jnp.asarray([0, 1, 2, 3] + [0] * 12), 2, 4, 12)[0]
    assert copy.render(tokens) == "BOS 0 1 2 3 SEP 0 1 2 3 . ."


def test_training_feeds_the_ids_to_multi_axis_models_only():
    grid, copy = tasks.make("grid_copy"), tasks.make("copy")
    key = jax.random.key(0)
    batch, pos = step_lib._batch(grid, specs.Positions(axes=3), key, 4, 19, split="train")
    np.testing.assert_array_equal(pos, batch["axis_positions"])
    assert step_lib._batch(grid, specs.Positions(), key, 4, 19, split="train")[1] is None  # 0..L-1
    assert step_lib._batch(copy, specs.Positions(axes=3), key, 4, 19, split="train")[1] is None
    with pytest.raises(ValueError, match="model.position.randomized=True, but the task gives its own positions"):
        step_lib._batch(grid, specs.Positions(True, 64, axes=3), key, 4, 19, split="train")
    cfg = helpers.model_cfg("mrope")
    config = type("C", (), {"model": cfg, "task": type("T", (), {"train_length": 19})})
    assert specs.Positions.from_config(config).axes == 3
    cfg.position.kind = "rope"
    assert specs.Positions.from_config(config) == specs.Positions()  # the one-axis spec: programs unchanged


@pytest.mark.parametrize("prefill", [False, True])
def test_decoded_answers_with_multi_axis_ids_equal_greedy_full_forwards(prefill):
    """The evaluation's cached decoding (groups of rows, per-row ids [N, L, 3]) answers as a greedy loop of
    full forward passes at the same ids."""
    schedule = decode.Schedule(min_prefill=4) if prefill else decode.Schedule()  # prefill pieces, then steps
    model = helpers.decoder("mrope", vocab_size=12, perturb=0.3, seed=2)
    task = tasks.make("grid_transpose", alphabet=8)
    batch = task.batch(jax.random.key(3), 3, 19, split="train")
    ids = batch["axis_positions"]
    correct, mask = decode.answer_correctness(model, batch, positions=ids, schedule=schedule)
    forward = nnx.jit(lambda m, t, p: m(t, p))
    inputs, targets, m = (np.asarray(batch[k]) for k in ("inputs", "targets", "mask"))
    want = np.zeros_like(mask)
    for b in range(3):
        fed = inputs[b].copy()
        for t in range(19):
            pred = int(np.argmax(forward(model, jnp.asarray(fed[None]), ids[b:b + 1])[0, t]))
            want[b, t] = m[b, t] > 0 and pred == targets[b, t]
            if m[b, t] > 0 and t + 1 < 19:
                fed[t + 1] = pred  # the next input is the model's own answer
    np.testing.assert_array_equal(mask, m > 0)
    np.testing.assert_array_equal(correct, want)
    assert want[mask].any() and not want[mask].all()  # a test that can fail either way
