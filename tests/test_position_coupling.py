"""Position coupling: the tasks' coupled ids against the official code, the pure functions, the unit, training.

The official id assignment (HanseulJo/position-coupling, the ``__getitem__``
of ``src/data/addition.py`` ``AdditionDatasetWithCoupledPositions``,
``MultipleAdditionDatasetWithCoupledPositions``,
``MultipleAdditionScratchPadDatasetWithCoupledPositions``,
``src/data/multiplication.py`` ``NxMMultiplicationDatasetWithCoupledPositions``,
``MultiplicationScratchPadDatasetWithCoupledPositions`` and ``src/data/copy.py``
``CopyDatasetWithCoupledPositions``; the layout of ``tokenize_for_decoder``
in ``src/tokenization/tokenization.py``) is transcribed below, with the random
start passed in. Each task row is parsed back into the official input and
label strings, and its ids must equal the official ones for the start the
row used, which must lie in the official ``torch.randint`` range.
"""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import task_checks
from flax import nnx

import helpers
import posenc.tasks as tasks
from posenc import position_coupling as coupling
from posenc.model import Decoder, ModelSpec
from posenc.tasks import EOS, FIRST_SYMBOL, PAD, SEP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------- the official assignment


def official_addition(inputs, labels, *, reverse_input, reverse_output, start):
    """``AdditionDatasetWithCoupledPositions.__getitem__`` (vanilla=False)."""
    a, b = inputs.split('+')
    plus_position = start
    a_positions = list(range(start + 1, start + 1 + len(a)))
    b_positions = list(range(start + 1, start + 1 + len(b)))
    if not reverse_input:
        a_positions = a_positions[::-1]
        b_positions = b_positions[::-1]
    input_positions = a_positions + [plus_position] + b_positions
    ans_positions = list(range(start + 1, start + 1 + len(labels)))
    if reverse_output:
        eq_position = start
    else:
        ans_positions = ans_positions[::-1]
        eq_position = start + len(labels) + 1
    label_positions = [eq_position] + ans_positions
    return input_positions, label_positions


def official_addition_high(labels, *, max_position, reverse_output):
    """The exclusive bound of ``torch.randint(1, max_position - len(labels) + (1 if reverse_output else 0))``."""
    return max_position - len(labels) + (1 if reverse_output else 0)


def official_multiple_addition(inputs, labels, *, reverse_input, reverse_output, start):
    """``MultipleAdditionDatasetWithCoupledPositions.__getitem__`` (vanilla=False)."""
    numbers = inputs.split('+')
    input_positions = sum((list(range(start, start + len(a) + 1))[::1 if reverse_input else -1] for a in numbers),
                          start=[])
    input_positions = input_positions[1:] if reverse_input else input_positions[:-1]
    label_positions = list(range(start, start + len(labels) + 1))[::1 if reverse_output else -1]
    if not reverse_output:
        label_positions = label_positions[-1:] + label_positions[:-1]
    return input_positions, label_positions


def official_multiple_addition_scratchpad(inputs, labels, *, reverse_input, reverse_output,
                                          reverse_output_order, start, start2):
    """``MultipleAdditionScratchPadDatasetWithCoupledPositions.__getitem__`` (vanilla=False)."""
    inp_numbers = inputs.split('+')
    lab_numbers = labels.split('>')
    n_op = len(inp_numbers)
    n_step = len(lab_numbers)
    input_positions_1 = sum((list(range(start, start + len(a) + 1))[::1 if reverse_input else -1]
                             for a in inp_numbers), start=[])
    input_positions_1 = input_positions_1[1:] if reverse_input else input_positions_1[:-1]
    label_positions_1 = sum((list(range(start, start + len(b) + 1))[::1 if reverse_output else -1]
                             for b in lab_numbers), start=[])
    if not reverse_output:
        label_positions_1 = label_positions_1[-1:] + label_positions_1[:-1]
    start = start2
    input_positions_2 = sum(([i] * (len(a) + 1) for a, i in zip(inp_numbers, range(start, start + n_op))),
                            start=[])
    input_positions_2 = input_positions_2[1:] if reverse_input else input_positions_2[:-1]
    _iter = list(range(start, start + n_step))[::-1 if reverse_output_order else 1]
    label_positions_2 = sum(([j] * (len(b) + 1) for b, j in zip(lab_numbers, _iter)), start=[])
    return [input_positions_1, input_positions_2], [label_positions_1, label_positions_2]


def official_nxm_multiplication(inputs, labels, *, reverse_output, start):
    """``NxMMultiplicationDatasetWithCoupledPositions.__getitem__`` (vanilla=False)."""
    a, b = inputs.split('*')
    max_len = len(a)
    end = start + max_len + len(b)
    input_positions = list(range(end - len(a), end + 1)) + list(range(end - len(b), end + 1))
    label_positions = list(range(end - len(labels), end))
    if reverse_output:
        label_positions = label_positions[::-1]
    return input_positions, label_positions


def official_multiplication_scratchpad(inputs, labels, *, reverse_input, reverse_output, starts):
    """``MultiplicationScratchPadDatasetWithCoupledPositions.__getitem__`` (three levels)."""
    A, B = inputs.split('*')
    lab_numbers_1, lab_numbers_2 = labels.split('=')
    lab_numbers_1 = lab_numbers_1.split('+')
    lab_numbers_2 = lab_numbers_2.split('>')
    start = starts[0]
    o = 1 if reverse_output else 0
    input_positions_1 = list(range(start + o, start + len(A) + o))[::1 if reverse_input else -1] + [0] * (len(B) + 1)
    label_positions_1 = sum((list(range(start, start + len(a) + 1))[::1 if reverse_output else -1]
                             for a in lab_numbers_1), start=[])
    label_positions_1 += [0] * (sum(map(len, lab_numbers_2)) + len(lab_numbers_2))
    start = starts[1]
    input_positions_2 = [0] * (len(A) + 1) + list(range(start, start + len(B)))[::1 if reverse_input else -1]
    label_positions_2 = sum(([i] * (len(a) + 1)
                             for a, i in zip(lab_numbers_1, range(start, start + len(lab_numbers_1)))),
                            start=[])
    label_positions_2 += sum(([j] * (len(b) + 1)
                              for b, j in zip(lab_numbers_2, range(start, start + len(lab_numbers_2)))),
                             start=[])
    start = starts[2]
    input_positions_3 = [0] * (len(A) + 1 + len(B))
    label_positions_3 = sum((list(range(start + i, start + i + len(a) + 1))[::1 if reverse_output else -1]
                             for i, a in enumerate(lab_numbers_1)), start=[])
    label_positions_3 += sum((list(range(start, start + len(b) + 1))[::1 if reverse_output else -1]
                              for b in lab_numbers_2), start=[])
    return ([input_positions_1, input_positions_2, input_positions_3],
            [label_positions_1, label_positions_2, label_positions_3])


def official_copy(inputs, *, reverse_output, start):
    """``CopyDatasetWithCoupledPositions.__getitem__`` (vanilla=False)."""
    if reverse_output:
        input_positions = list(range(start, start + len(inputs) + 1))
        label_positions = list(range(start, start + len(inputs)))
    else:
        input_positions = list(range(start + 1, start + len(inputs) + 1))
        label_positions = list(range(start, start + len(inputs) + 1))
    if reverse_output:
        label_positions = label_positions[::-1]
    return input_positions, label_positions


def sequence_ids(input_positions, label_positions, total):
    """``tokenize_for_decoder``: ``position_ids[1:1 + len(pos)] = pos``, 0 elsewhere (BOS, EOS, PAD)."""
    if np.ndim(input_positions[0]) == 0:
        pos = input_positions + label_positions
        ids = np.zeros(total, int)
        ids[1:1 + len(pos)] = pos
        return ids
    return np.stack([sequence_ids(i, lab, total) for i, lab in zip(input_positions, label_positions)])


# ---------------------------------------------------------------------- the rows


def _text(task, ids):
    return "".join("=" if t == SEP else task.symbols[t - FIRST_SYMBOL] for t in ids)


def _rows(task, length, split, key=0, batch_size=24):
    batch = task.batch(jax.random.key(key), batch_size, length, split=split)
    seq, _ = task_checks.sequences(batch)
    ids = np.asarray(batch["position_ids"])
    if task.position_levels > 1:
        ids = np.asarray(coupling.unpack(ids, task.position_levels)).transpose(1, 0, 2)  # [B, D, L]
    return [([int(t) for t in row], i) for row, i in zip(seq, ids)]


def _problem_and_answer(task, row):
    """The official input and label strings of a row (the problem between BOS and the first SEP)."""
    s, e = row.index(SEP), row.index(EOS)
    return _text(task, row[1:s]), _text(task, row[s + 1:e])


ADDITION_FORMATS = [("msd", False), ("reversed_output", False), ("reversed", False),
                    ("reversed_output", True), ("msd", True), ("reversed", True), ("reversed_padded", False)]


@pytest.mark.parametrize("fmt,zero_pad", ADDITION_FORMATS)
def test_addition_ids_equal_the_official_assignment(fmt, zero_pad):
    task = tasks.make("addition", format=fmt, zero_pad=zero_pad, coupled=True, max_position=40)
    length = 30
    starts = []
    for split in ("eval", "train"):
        for row, ids in _rows(task, length, split):
            inputs, labels = _problem_and_answer(task, row)
            start = 1 if split == "eval" else ids[row.index(FIRST_SYMBOL + 10)]  # '+' gets the start
            high = official_addition_high(labels, max_position=40, reverse_output=fmt != "msd")
            assert 1 <= start < high
            expected = sequence_ids(*official_addition(inputs, labels, reverse_input=fmt == "reversed",
                                                       reverse_output=fmt != "msd", start=start),
                                    length + 1)
            np.testing.assert_array_equal(ids, expected[:length], err_msg=task.render(row))
            starts.append(start)
    assert len(set(starts)) > 5  # the training start is random


def test_the_training_start_covers_the_official_range():
    # one size (n = 1, reversed c of 2 digits): starts uniform over [1, max_position - 2]
    task = tasks.make("addition", format="reversed_output", zero_pad=True, coupled=True, max_position=9)
    batch = task.batch(jax.random.key(0), 512, 8, min_size=1)
    starts = np.asarray(batch["position_ids"])[:, 2]  # BOS d '+' ...: '+' gets the start
    assert set(starts.tolist()) == set(range(1, 8))
    np.testing.assert_array_equal(np.asarray(task.batch(jax.random.key(0), 8, 8, split="eval")
                                             ["position_ids"])[:, 2], 1)


@pytest.mark.parametrize("scratchpad", [False, True])
def test_multi_addition_ids_equal_the_official_assignment(scratchpad):
    options = dict(max_position_operands=6) if scratchpad else {}
    task = tasks.make("multi_addition", operands=4, scratchpad=scratchpad, coupled=True, max_position=30,
                      **options)
    length = task.seq_len(3) - 1
    for split in ("eval", "train"):
        for row, ids in _rows(task, length, split):
            inputs, labels = _problem_and_answer(task, row)
            numbers = inputs.split("+")
            plus = row.index(FIRST_SYMBOL + 10)
            if not scratchpad:
                start = 1 if split == "eval" else ids[plus]
                max_len = max(map(len, numbers + [labels]))
                assert 1 <= start < 30 - max_len + 1
                expected = sequence_ids(*official_multiple_addition(
                    inputs, labels, reverse_input=False, reverse_output=True, start=start), length + 1)
            else:
                start, start2 = (1, 1) if split == "eval" else (ids[0][plus], ids[1][1])
                lab_numbers = labels.split(">")
                assert 1 <= start < 30 - max(map(len, numbers + lab_numbers)) + 1
                assert 1 <= start2 < 6 - len(lab_numbers) + 2
                expected = sequence_ids(*official_multiple_addition_scratchpad(
                    inputs, labels, reverse_input=False, reverse_output=True, reverse_output_order=False,
                    start=start, start2=start2), length + 1)
            np.testing.assert_array_equal(ids, expected[..., :length], err_msg=task.render(row))


def test_multiplication_ids_equal_the_official_assignment():
    task = tasks.make("multiplication", second=2, coupled=True, max_position=30)
    length = 30
    for split in ("eval", "train"):
        for row, ids in _rows(task, length, split):
            inputs, labels = _problem_and_answer(task, row)
            a, b = inputs.split("*")
            start = 1 if split == "eval" else ids[row.index(FIRST_SYMBOL + 10)] - len(a) - len(b)  # '*': end
            assert 1 <= start < 30 - len(a)
            expected = sequence_ids(*official_nxm_multiplication(inputs, labels, reverse_output=True,
                                                                 start=start), length + 1)
            np.testing.assert_array_equal(ids, expected[:length], err_msg=task.render(row))


def test_multiplication_scratchpad_ids_equal_the_official_assignment():
    task = tasks.make("multiplication", second=3, scratchpad=True, coupled=True, max_position=30,
                      max_position_operands=5)
    length = task.seq_len(4) - 1
    for split in ("eval", "train"):
        for row, ids in _rows(task, length, split):
            inputs, labels = _problem_and_answer(task, row)
            A, B = inputs.split("*")
            first, second = labels.split("=")
            eq = row.index(SEP)
            starts = (1, 1, 1) if split == "eval" else tuple(ids[d][eq] for d in range(3))
            assert 1 <= starts[0] < 30 - max(map(len, [A, B] + first.split("+"))) + 1
            assert 1 <= starts[1] < 5 - len(B) + 2
            assert 1 <= starts[2] < 30 - max(map(len, [A, B] + second.split(">"))) + 1
            expected = sequence_ids(*official_multiplication_scratchpad(
                inputs, labels, reverse_input=False, reverse_output=True, starts=starts), length + 1)
            np.testing.assert_array_equal(ids, expected[..., :length], err_msg=task.render(row))


@pytest.mark.parametrize("name", ["copy", "reverse"])
def test_copy_and_reverse_ids_equal_the_official_assignment(name):
    task = tasks.make(name, coupled=True, max_position=20)
    length = 16
    for split in ("eval", "train"):
        for row, ids in _rows(task, length, split):
            s = row.index(SEP)
            inputs = "".join("x" for _ in row[1:s])  # only the length matters to the assignment
            start = 1 if split == "eval" else (ids[s] if name == "copy" else ids[1])
            assert 1 <= start < 20 - len(inputs) + 1
            expected = sequence_ids(*official_copy(inputs, reverse_output=name == "reverse", start=start),
                                    length + 1)
            np.testing.assert_array_equal(ids, expected[:length], err_msg=task.render(row))


def test_plain_tasks_have_no_ids_and_metadata_names_the_levels():
    for name, options in (("copy", {}), ("reverse", {"alphabet": 4})):
        plain = tasks.make(name, **options).batch(jax.random.key(0), 8, 20)
        assert "position_ids" not in plain
    assert tasks.make("addition", coupled=True).metadata()["position_levels"] == 1
    assert tasks.make("multiplication", scratchpad=True, coupled=True).metadata()["position_levels"] == 3


# ------------------------------------------------------------------- pure functions


def test_pack_and_unpack_round_trip_and_one_level_is_the_identity():
    rng = np.random.default_rng(0)
    levels = [rng.integers(0, coupling.STRIDE, (3, 7)) for _ in range(3)]
    packed = coupling.pack(levels)
    assert packed.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(coupling.unpack(packed, 3)), np.stack(levels))
    np.testing.assert_array_equal(np.asarray(packed), levels[0] + 1024 * levels[1] + 1024 ** 2 * levels[2])
    big = np.array([[0, 5, 4097, 10 ** 6]])
    np.testing.assert_array_equal(np.asarray(coupling.unpack(big, 1))[0], big)
    with pytest.raises(ValueError, match="levels must be an integer in \\[1, 3\\]; got 4"):
        coupling.unpack(big, 4)


def test_embed_sums_each_levels_row():
    tables = jax.random.normal(jax.random.key(0), (2, 9, 4))
    ids = np.array([[[1, 2, 8], [0, 3, 3]]])  # [B, D, L]
    packed = coupling.pack([ids[:, 0], ids[:, 1]])
    out = np.asarray(coupling.embed(tables, packed))
    expected = np.asarray(tables)[0][ids[:, 0]] + np.asarray(tables)[1][ids[:, 1]]
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="position 9 is out of range for a learned table of 9 rows"):
        coupling.embed(tables, np.array([[9]]))


# ---------------------------------------------------------------------- the unit


def _model(levels=1, max_position=40):
    cfg = helpers.model_cfg("position_coupling", position=dict(levels=levels, max_position=max_position),
                            vocab_size=24)
    return Decoder(ModelSpec.from_config(cfg), rngs=nnx.Rngs(0))


def test_the_unit_embeds_the_multi_level_ids_of_a_task():
    task = tasks.make("multi_addition", scratchpad=True, coupled=True, max_position=30, max_position_operands=6)
    batch = task.batch(jax.random.key(0), 4, 40)
    model = _model(levels=2)
    tables = np.asarray(model.input_encoding.tables[...])
    assert tables.shape == (2, 41, 32)
    ids = np.asarray(coupling.unpack(batch["position_ids"], 2))
    rows = np.asarray(model.input_encoding.embed(batch["position_ids"], 32))
    np.testing.assert_allclose(rows, tables[0][ids[0]] + tables[1][ids[1]], rtol=1e-6)
    logits = model(batch["inputs"], batch["position_ids"])
    assert np.isfinite(np.asarray(logits)).all()
    # the ids are what the model sees: other ids, other logits
    other = model(batch["inputs"], batch["position_ids"] + 1)
    assert np.abs(np.asarray(other) - np.asarray(logits)).max() > 1e-4


def test_decoding_with_the_tasks_ids_equals_the_full_forward():
    task = tasks.make("addition", format="reversed_output", zero_pad=True, coupled=True, max_position=40)
    batch = task.batch(jax.random.key(1), 2, 20)
    model = _model()
    g, state = nnx.split(model)
    tokens, ids = batch["inputs"], batch["position_ids"]

    @jax.jit
    def run(state):
        m = nnx.merge(g, state)
        cache = m.init_cache(2, 20)
        out, cache = m.decode(tokens[:, :6], cache, ids[:, :6])
        outs = [out]
        for t in range(6, 20):  # each generated token at the id the task gives it
            out, cache = m.decode(tokens[:, t:t + 1], cache, ids[:, t:t + 1])
            outs.append(out)
        return m(tokens, ids), jnp.concatenate(outs, axis=1)

    full, cached = run(state)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=1e-5, atol=2e-5)


def test_options_are_checked():
    with pytest.raises(ValueError, match="model.position.position_coupling.levels must be an integer in \\[1, 3\\]"):
        ModelSpec.from_config(helpers.model_cfg("position_coupling", position=dict(levels=4, max_position=8)))
    with pytest.raises(ValueError, match="max_position must be >= 1 \\(0 means the task's training length"):
        ModelSpec.from_config(helpers.model_cfg("position_coupling"))
    with pytest.raises(ValueError, match="max_position 1024 does not fit a level"):
        ModelSpec.from_config(helpers.model_cfg("position_coupling", position=dict(levels=2, max_position=1024)))


# ----------------------------------------------------------------- through training


def _tiny_config():
    module = importlib.import_module("posenc.configs.default")
    return module.get_config("tiny")


def test_training_and_evaluation_feed_the_tasks_ids_as_positions():
    from posenc.training import specs
    from posenc.training import step as step_lib

    c = _tiny_config()
    c.task.name = "addition"
    c.task.train_length = 20
    c.task.options.update(format="reversed_output", zero_pad=True, coupled=True, max_position=30)
    c.model.position.kind = "rope"
    task = tasks.make("addition", **c.task.options.to_dict())
    for split in ("train", "eval"):
        batch, positions = step_lib._batch(task, specs.Positions.from_config(c), jax.random.key(0), 4, 20,
                                           split=split)
        np.testing.assert_array_equal(np.asarray(positions), np.asarray(batch["position_ids"]))
    c.model.position.randomized = True
    with pytest.raises(ValueError, match="model.position.randomized=True, but the task gives its own positions"):
        step_lib._batch(task, specs.Positions.from_config(c), jax.random.key(0), 4, 20, split="train")


def test_padding_after_the_answer_has_id_zero():
    # as the official zero-filled position_ids
    task = tasks.make("addition", coupled=True, max_position=40)
    batch = task.batch(jax.random.key(2), 16, 40, split="eval")
    pad = np.asarray(batch["inputs"]) == PAD
    assert pad.any() and np.all(np.asarray(batch["position_ids"])[pad] == 0)
