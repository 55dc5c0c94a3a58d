"""A sample of the failing rows decoded (eval.decode_rows, posenc.training.decode_sample): the draw is
seeded and bounded, the accuracy estimate is unbiased and equals the full metric when the sample holds
every failing row, exact match and first errors never change, "all" is the decoder as it was, and a
bad value is refused in one line before anything compiles."""

import importlib
import itertools
import re

import jax
import numpy as np
import pytest
from flax import nnx

from posenc.config.schema import ConfigError
from posenc.model import Decoder
from posenc.training import decode, decode_sample, evaluate, prepare


def resolved(**eval_fields):
    c = importlib.import_module("posenc.configs.default").get_config("tiny")
    c.eval.update(batch_size=8, num_batches=2, **eval_fields)
    return prepare.resolve(c)


def test_the_draw_is_seeded_bounded_and_the_same_for_a_model_alone_or_in_a_group():
    first = np.array([[3, 9, 1, 9, 5, 2, 9, 4, 0, 7, 6, 9],  # 9: right everywhere (length 9)
                      [9, 9, 2, 8, 9, 1, 3, 9, 9, 9, 0, 5]])
    chosen = decode_sample.draw(first, 9, seed=1234, rows=3)
    assert chosen.sum(axis=1).tolist() == [3, 3] and not chosen[first == 9].any()
    np.testing.assert_array_equal(chosen, decode_sample.draw(first, 9, seed=1234, rows=3))  # deterministic
    np.testing.assert_array_equal(chosen[1:], decode_sample.draw(first[1:], 9, seed=1234, rows=3))  # alone
    others = {decode_sample.draw(first, 9, seed=s, rows=3)[0].tobytes() for s in range(20)}
    assert len(others) > 10  # another eval.seed, another sample
    assert (decode_sample.draw(first, 9, seed=1234, rows=3) != decode_sample.draw(first, 10, seed=1234,
                                                                                   rows=3)).any()  # length
    np.testing.assert_array_equal(decode_sample.draw(first, 9, seed=0, rows=12), first < 9)  # k >= F: all
    grow = [decode_sample.draw(first, 9, seed=5, rows=k)[0] for k in range(1, 9)]
    assert all((a <= b).all() for a, b in zip(grow, grow[1:]))  # a larger sample holds the smaller one


def _rows(seed=0):
    """A set of 8 rows of 12 positions: answers, first errors and what decoding got right after them."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((8, 12), bool)
    for i in range(8):
        mask[i, rng.integers(1, 4):rng.integers(7, 12)] = True
    first = np.full(8, 12)
    correct = mask.copy()
    for i in (0, 2, 3, 5, 6, 7):  # failing rows: wrong at the first error, decoded tokens after it
        first[i] = np.flatnonzero(mask[i])[rng.integers(0, mask[i].sum())]
        after = np.arange(12) > first[i]
        correct[i] = mask[i] & ((np.arange(12) < first[i]) | (after & (rng.random(12) < 0.5)))
    return correct, mask, first


def test_the_estimate_is_unbiased_and_its_standard_error_too():
    correct, mask, first = _rows()
    failing = np.flatnonzero(first < 12)
    full = decode.decoded_metrics(correct, mask)["decoded_accuracy"]
    for k in (2, 3, 5):
        estimates, variances = [], []
        for sample in itertools.combinations(failing, k):  # every sample of k of the 6 failing rows
            decoded = np.isin(np.arange(8), sample)
            seen = correct.copy()
            for i in set(failing) - set(sample):  # what the decoder knows of a row not decoded
                seen[i] = mask[i] & (np.arange(12) < first[i])
            a, se = decode_sample.estimate(seen, mask, first, decoded)
            estimates.append(a)
            variances.append(se ** 2)
        assert np.mean(estimates) == pytest.approx(full, abs=1e-12)  # E[A] = the full-set accuracy
        assert np.mean(variances) == pytest.approx(np.var(estimates), rel=1e-9)  # E[SE^2] = Var(A)
        assert np.std(estimates) > 0
    every = np.isin(np.arange(8), failing)
    assert decode_sample.estimate(correct, mask, first, every) == (full, 0.0)  # the whole set: exact


def test_a_sample_keeps_exact_match_and_first_errors_and_estimates_accuracy():
    r = resolved(lengths=(32,))
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    plan = evaluate.plan_length(r.task, r.config, 32)
    everything = decode.eval_answers(model, r.task, r.config, 32, min_size=plan.min_size, decode_rows="all")
    stats = {}
    sample = decode.eval_answers(model, r.task, r.config, 32, min_size=plan.min_size, decode_rows=3, stats=stats)
    failing = everything.first < 32
    assert failing.sum() > 3 and stats["decoded_rows"] == 3 and stats["failing_rows"] == failing.sum()
    np.testing.assert_array_equal(sample.first, everything.first)
    np.testing.assert_array_equal(sample.decoded, decode_sample.draw(everything.first[None], 32,
                                                                     seed=int(r.config.eval.seed), rows=3)[0])
    np.testing.assert_array_equal(everything.decoded, failing)
    np.testing.assert_array_equal(sample.correct[sample.decoded], everything.correct[sample.decoded])
    left = failing & ~sample.decoded
    np.testing.assert_array_equal(sample.correct[left], sample.mask[left] & (np.arange(32) < sample.first[left, None]))
    full, est = everything.metrics(), sample.metrics()
    assert est["decoded_exact_match"] == full["decoded_exact_match"]  # exact, from the first errors
    assert (est["decoded_rows"], est["failing_rows"], full["decoded_rows"]) == (3, failing.sum(), failing.sum())
    assert full["decoded_accuracy_se"] == 0.0 and est["decoded_accuracy_se"] >= 0.0
    want, se = decode_sample.estimate(sample.correct, sample.mask, sample.first, sample.decoded)
    assert (est["decoded_accuracy"], est["decoded_accuracy_se"]) == (want, se)
    # a sample as large as the failing rows is the whole set: the metric exactly
    assert decode.eval_answers(model, r.task, r.config, 32, min_size=plan.min_size,
                               decode_rows=int(failing.sum())).metrics() == full


def test_all_is_the_decoder_before_and_the_rows_record_the_sample():
    """eval.decode_rows=all: the rows' decoded metrics are those of every row decoded
    (decode.eval_correctness and decode.decoded_metrics); a sample changes only the accuracy."""
    rows = {}
    for value in ("all", 2):
        r = resolved(lengths=(16, 32), decode_rows=value)
        model = Decoder(r.spec, rngs=nnx.Rngs(0))
        rows[value] = evaluate.evaluate(model, r)
    for row in rows["all"]:
        n = row["eval_length"]
        plan = evaluate.plan_length(r.task, r.config, n)
        root = jax.random.fold_in(jax.random.key(int(r.config.eval.seed)), n)
        correct, mask = decode.eval_correctness(model, r.task, r.config, n, root=root, min_size=plan.min_size)
        old = decode.decoded_metrics(correct, mask)
        failing = int((~(correct | ~mask).all(axis=1)).sum())
        assert {k: row[k] for k in old} == old
        assert (row["decoded_rows"], row["failing_rows"], row["decoded_accuracy_se"]) == (failing, failing, 0.0)
    for a, b in zip(rows["all"], rows[2]):
        changed = {k for k in a if a[k] != b[k]} - {"eval_seconds", "wall_time", "train_seconds", "finished_at"}
        assert changed <= {"decoded_accuracy", "decoded_rows", "decoded_accuracy_se"}
        assert b["decoded_rows"] == min(2, b["failing_rows"]) and b["failing_rows"] == a["failing_rows"] > 2


def test_seeds_together_draw_each_model_its_own_sample():
    r = resolved(lengths=(32,), decode_rows=2)
    models = [Decoder(r.spec, rngs=nnx.Rngs(s)) for s in (0, 1)]
    graphdef, params, rest = evaluate.split_params(models)
    plan = evaluate.plan_length(r.task, r.config, 32)
    together = decode.eval_answers_seeds(graphdef, params, rest, r.task, r.config, 32, min_size=plan.min_size)
    for model, answers in zip(models, together):
        alone = decode.eval_answers(model, r.task, r.config, 32, min_size=plan.min_size)
        np.testing.assert_array_equal(answers.decoded, alone.decoded)
        np.testing.assert_array_equal(answers.correct, alone.correct)
        assert answers.decoded.sum() == 2


@pytest.mark.parametrize("value", [0, 1, -3, 2.5, True, "some", None, "ALL"])
def test_a_bad_value_is_refused_in_one_line(value):
    with pytest.raises(ConfigError) as e:
        resolved(decode_rows=value)
    text = str(e.value)
    assert "\n" not in text and "eval.decode_rows" in text and repr(value) in text and "'all'" in text
    for good in ("all", 2, 64):
        assert resolved(decode_rows=good).config.eval.decode_rows == good


def _run_row(seed, n, acc, *, k, failing, se):
    return dict(task="copy", position="rope", norm="rms", placement="pre", seed=seed, train_length=16,
                eval_length=n, loss=0.5, accuracy=acc, exact_match=0.0, steps=10, decoded_accuracy=acc,
                decoded_exact_match=0.0, decoded_rows=k, failing_rows=failing, decoded_accuracy_se=se,
                config_hash=f"copy-rope-{seed}".ljust(64, "0"))


def test_tables_show_the_sampling_error_of_a_sampled_decoded_accuracy():
    from posenc.studies import compare_report as report
    from posenc.studies import tables

    rows = [_run_row(s, 16, 0.9, k=3, failing=3, se=0.0) for s in (0, 1)]  # every failing row decoded
    rows += [_run_row(s, 64, 0.3 + 0.1 * s, k=32, failing=100, se=0.03 + 0.01 * s) for s in (0, 1)]
    assert tables.sampled(rows[:2]) is None
    k, failing, half = tables.sampled(rows[2:])
    assert (k, failing) == (64, 200) and half == pytest.approx(1.96 * np.hypot(0.03, 0.04) / 2)
    text = report.table_markdown(rows)
    assert "[sampled 64/200 rows +-0.049]" in text and len(re.findall(r"\[sampled \d", text)) == 1  # 64 only
    assert tables.SAMPLED_NOTE in text
    teacher = text.split("teacher-forced, for comparison")[1]
    assert "sampled" not in teacher  # the teacher-forced accuracy is never sampled
    assert "[sampled]" in report.aggregate_markdown(rows)
    full = [dict(r, decoded_rows=r["failing_rows"], decoded_accuracy_se=0.0) for r in rows]
    assert "sampled" not in report.table_markdown(full) + report.aggregate_markdown(full)
    old = [{k: v for k, v in r.items() if k not in ("decoded_rows", "failing_rows", "decoded_accuracy_se")}
           for r in rows]  # rows written before the fields existed
    assert "sampled" not in report.table_markdown(old)


def test_the_run_log_line_says_when_decoded_accuracy_is_estimated():
    from posenc.training import finish

    row = dict(loss=1.0, accuracy=0.6, exact_match=0.1, decoded_accuracy=0.5, decoded_exact_match=0.1,
               decoded_rows=32, failing_rows=128, decoded_accuracy_se=0.01)
    assert "decoded accuracy=0.5000 (estimated: 32 of 128 failing rows decoded, standard error 0.0100) " \
           "exact match=0.1000;" in finish.describe(row)
    assert "estimated" not in finish.describe(dict(row, decoded_rows=128, decoded_accuracy_se=0.0))
