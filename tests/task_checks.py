"""Shared checks of the task test files: rows against an independent solver, sizes, determinism.

A solver is ``solve(task, row) -> (n, tokens, answer_positions)``: it parses
one example (a list of ints, the whole sequence with its PAD tail) by the
documented format, recomputes it in plain Python from the parsed problem
and returns the size, the expected tokens (without padding) and the
positions (in the sequence) of the answer tokens.
"""

import jax
import numpy as np

from posenc.tasks import PAD

BATCH = 12


def sequences(batch):
    """The whole sequences [B, L+1] and the mask aligned with them (0 at position 0)."""
    inputs, targets, mask = (np.asarray(batch[k]) for k in ("inputs", "targets", "mask"))
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])  # targets are the next tokens
    seq = np.concatenate([inputs[:, :1], targets], axis=1)
    return seq, np.concatenate([np.zeros((len(seq), 1)), mask], axis=1)


def check_batch(task, batch, length, solve, pad=PAD):
    """Every row equals its solver's tokens, then padding; mask exactly on the answer. Returns sizes."""
    assert batch["inputs"].dtype == np.int32 and batch["targets"].dtype == np.int32
    assert batch["mask"].dtype == np.float32
    seq, mask = sequences(batch)
    assert seq.shape == (len(seq), length + 1) and seq.min() >= 0 and seq.max() < task.vocab_size
    sizes = []
    for row, m in zip(seq, mask):
        n, tokens, answer = solve(task, [int(t) for t in row])
        assert task.smallest <= n and len(tokens) <= task.seq_len(n) <= length + 1, (n, len(tokens))
        np.testing.assert_array_equal(row, list(tokens) + [pad] * (length + 1 - len(tokens)), err_msg=task.render(row))
        expected = np.zeros(length + 1)
        expected[list(answer)] = 1.0
        np.testing.assert_array_equal(m, expected, err_msg=task.render(row))
        sizes.append(n)
    return np.array(sizes)


def check_task(task, solve, length, *, factor=4, batch_size=BATCH, varied=True, observed=None):
    """Train batch at ``length`` and eval batch at ``factor * length``: format, answers, sizes, determinism.

    ``observed(n)``: the size a solver reads off a size-``n`` row, where it is not n itself.
    """
    observed = observed or (lambda n: n)
    jitted = jax.jit(task.batch, static_argnums=(1, 2), static_argnames=("min_size", "split"))
    train = jitted(jax.random.key(0), batch_size, length)
    sizes = check_batch(task, train, length, solve)
    assert sizes.min() >= task.smallest and sizes.max() <= task.max_size(length)
    if varied:
        assert len(set(sizes.tolist())) > 1  # sizes are drawn, not fixed
    again = jitted(jax.random.key(0), batch_size, length)
    other = jitted(jax.random.key(1), batch_size, length)
    for k in train:
        np.testing.assert_array_equal(train[k], again[k])  # deterministic from the key
    assert not np.array_equal(train["inputs"], other["inputs"])
    long = factor * length
    evaluation = jitted(jax.random.key(2), batch_size, long, split="eval")
    eval_sizes = check_batch(task, evaluation, long, solve)
    assert set(eval_sizes.tolist()) == {observed(task.max_size(long))}
    if task.size_cap is None or task.max_size(long) < task.size_cap:
        assert task.max_size(long) >= factor * task.max_size(length)  # 4x the length: 4x larger problems
    return train, evaluation
