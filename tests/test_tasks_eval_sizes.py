"""Evaluation sizes: exact (DeepMind per length) or bins (Kazemnejad et al.), and no degenerate batch."""

import jax
import numpy as np
import pytest

from posenc import tasks
from posenc.tasks import base

NAMES = [n for n in tasks.TASKS if tasks.spec(n)["task"] == n and n != "text"]


def _answers(batch):
    targets, mask = np.asarray(batch["targets"]), np.asarray(batch["mask"]) > 0
    return [tuple(t[m]) for t, m in zip(targets, mask)]


@pytest.mark.parametrize("name", NAMES)
def test_no_evaluation_batch_has_one_constant_answer(name):
    task = tasks.make(name)
    first = max(task.min_length(), 16)
    lengths = (first, 2 * first)
    bins = base.eval_bins(task, lengths)
    for n in lengths:
        lo, hi = bins[n]
        batch = task.batch(jax.random.key(n), 16, n, min_size=lo, split="eval")
        answers = _answers(batch)
        assert len(set(answers)) > 1, (name, n, lo, hi, answers[:3])


def test_bins_and_exact_sizes():
    copy = tasks.make("copy")  # Kazemnejad et al.: test bins
    assert copy.eval_sizes == "bin" and tasks.spec("count")["eval_sizes"] == "bin"
    lengths = (16, 32, 64)
    sizes = {n: copy.max_size(n) for n in lengths}
    assert base.eval_bins(copy, lengths) == {16: (1, sizes[16]), 32: (sizes[16] + 1, sizes[32]),
                                            64: (sizes[32] + 1, sizes[64])}
    assert base.eval_bins(copy, lengths, mode="exact") == {n: (s, s) for n, s in sizes.items()}
    parity = tasks.make("parity")  # Delétang et al.: every size evaluated exactly
    assert parity.eval_sizes == "exact" and tasks.make("reverse_string").eval_sizes == "exact"
    # a bin's examples have sizes inside it: copy's answer length is its size
    lo, hi = base.eval_bins(copy, lengths)[64]
    batch = copy.batch(jax.random.key(0), 64, 64, min_size=lo, split="eval")
    answer_lengths = np.asarray(batch["mask"]).sum(1)
    assert lo <= answer_lengths.min() and answer_lengths.max() <= hi and answer_lengths.min() < hi
    with pytest.raises(ValueError, match="unknown eval.sizes 'bins'"):
        base.eval_bins(copy, lengths, mode="bins")
