"""addition's operand_lengths="independent" against the official sampling of Cho et al. 2024.

The official ``AdditionDataset.__init__`` (HanseulJo/position-coupling,
``src/data/addition.py``) draws both operands' digit counts independently and
pads them to the longer one; its body is transcribed below with numpy's
generator in place of torch's. The task's rows are parsed back into the two
numbers: their official input and label strings must be the task's tokens, and
the joint distribution of the digit counts must be the official one.
"""

import jax
import numpy as np
import pytest

import posenc.tasks as tasks
from posenc.tasks import EOS, FIRST_SYMBOL, PAD, SEP


def official_example(rng, min_n_digits, max_n_digits, *, padding, reverse_input, reverse_output):
    """One pass of the official ``AdditionDataset.__init__`` loop: (inputs, labels, digit counts)."""
    n_digits_arr = rng.integers(min_n_digits, max_n_digits + 1, size=(2,))  # torch.randint(low, high + 1)
    numbers = []
    for i in range(2):
        n_digits = int(n_digits_arr[i])
        if n_digits == 1:
            num = int(rng.integers(0, 10))
        else:
            num_arr = [int(rng.integers(1, 10))] + rng.integers(0, 10, size=(n_digits - 1,)).tolist()
            num = int("".join(map(str, num_arr)))
        numbers.append(int(num))
    return official_strings(*numbers, padding=padding, reverse_input=reverse_input,
                            reverse_output=reverse_output) + (tuple(int(n) for n in n_digits_arr),)


def official_strings(a, b, *, padding, reverse_input, reverse_output):
    """The official input and label strings of ``a + b`` (the rest of the loop body; 'P' pads with '0')."""
    numbers = [a, b]
    result = a + b
    max_len = max(len(str(a)), len(str(b)))
    overflow = max_len + 1
    if padding:
        _inputs = [f"{'P' * (max_len - len(str(c)))}{c}" for c in numbers]
        _labels = f"{'P' * (overflow - len(str(result)))}{result}"
    else:
        _inputs = list(map(str, numbers))
        _labels = str(result)
    if reverse_input:
        _inputs = [x[::-1] for x in _inputs]
    if reverse_output:
        _labels = _labels[::-1]
    return "+".join(_inputs).replace("P", "0"), _labels.replace("P", "0")


def _rows(task, batch, n_rows):
    """(input string, label string, a, b) of each row: the official form of the task's tokens."""
    out = []
    inputs = np.asarray(batch["inputs"])
    targets = np.asarray(batch["targets"])
    for row in range(n_rows):
        seq = list(inputs[row]) + [targets[row, -1]]
        seq = [int(t) for t in seq if t != PAD]
        sep, eos = seq.index(SEP), seq.index(EOS)
        text = "".join("+" if t == FIRST_SYMBOL + 10 else str(t - FIRST_SYMBOL) for t in seq[1:sep])
        label = "".join(str(t - FIRST_SYMBOL) for t in seq[sep + 1:eos])
        a, b = (int(x[::-1]) for x in text.split("+"))  # format reversed: every number least significant first
        out.append((text, label, a, b))
    return out


def _task(**kw):
    return tasks.make("addition", format="reversed", zero_pad=True, operand_lengths="independent", **kw)


def test_rows_are_the_official_strings_of_their_numbers():
    task = _task()
    n = 6
    batch = task.batch(jax.random.key(0), 256, task.seq_len(n) - 1)
    for text, label, a, b in _rows(task, batch, 256):
        assert (text, label) == official_strings(a, b, padding=True, reverse_input=True, reverse_output=True)


def test_digit_counts_are_drawn_independently_as_the_official_loop():
    task = _task()
    n, count = 4, 4096
    batch = task.batch(jax.random.key(1), count, task.seq_len(n) - 1)
    ours = np.zeros((n, n))
    for _, _, a, b in _rows(task, batch, count):
        ours[len(str(a)) - 1, len(str(b)) - 1] += 1
    rng = np.random.default_rng(0)
    theirs = np.zeros((n, n))
    for _ in range(count):
        *_, (la, lb) = official_example(rng, 1, n, padding=True, reverse_input=True, reverse_output=True)
        theirs[la - 1, lb - 1] += 1
    # both: uniform over the n x n pairs of counts (p = 1/16 each); a cell's sd is about 0.004
    np.testing.assert_allclose(ours / count, 1 / n ** 2, atol=0.02)
    np.testing.assert_allclose(theirs / count, 1 / n ** 2, atol=0.02)
    # the longer operand's count is no longer uniform: P(max = k) = (2k - 1) / n^2, as the official loop
    longest = ours.sum(0) * 0
    for i in range(n):
        for j in range(n):
            longest[max(i, j)] += ours[i, j]
    np.testing.assert_allclose(longest / count, [(2 * k - 1) / n ** 2 for k in range(1, n + 1)], atol=0.025)


def test_exact_evaluation_sizes_give_both_operands_n_digits_and_min_size_bounds_both():
    task = _task()
    n = 7
    batch = task.batch(jax.random.key(2), 64, task.seq_len(n) - 1, split="eval")
    assert {(len(str(a)), len(str(b))) for *_, a, b in _rows(task, batch, 64)} == {(n, n)}
    batch = task.batch(jax.random.key(3), 512, task.seq_len(n) - 1, min_size=5)
    counts = {(len(str(a)), len(str(b))) for *_, a, b in _rows(task, batch, 512)}
    assert {x for pair in counts for x in pair} == {5, 6, 7}


def test_one_at_n_stays_the_default_and_bad_values_are_refused():
    assert tasks.make("addition").operand_lengths == "one_at_n"
    with pytest.raises(ValueError, match="operand_lengths 'both'; choose one of: independent, one_at_n"):
        tasks.make("addition", operand_lengths="both")
    with pytest.raises(ValueError, match="reversed_padded"):
        tasks.make("addition", format="reversed_padded", operand_lengths="independent")
