"""Findings ladder: exact match at 2x against the training examples, its logistic trend and where it reaches 0.9."""

import math

import numpy as np
import pytest

from posenc.studies import findings, ladder

BUDGETS = (1e5, 3e5, 1e6, 3e6)


def _rows(em_of, seeds=(0, 1, 2)):
    """Rows of a two-arm ladder: training size 8 (length 28), 2x = size 16 (length 52)."""
    rows = []
    for label in ("abacus", "position_coupling"):
        for n in BUDGETS:
            for s in seeds:
                for size, length in ((8, 28), (16, 52)):
                    em = 1.0 if size == 8 else em_of(label, n, s)
                    rows.append(dict(task="addition", position=label, variant=label, norm="rms", placement="pre",
                                     seed=s, train_length=28, eval_length=length, problem_size=size, loss=1.0,
                                     accuracy=em, exact_match=em, decoded_accuracy=em, decoded_exact_match=em,
                                     steps=int(n // 64), config_hash="a" * 64, train_examples=int(n),
                                     task_variant=f"examples_{int(n)}"))
    return rows


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_the_logistic_fit_recovers_a_known_trend_and_its_budget_at_0_9():
    a, b = -14.0, 2.5  # reaches 0.9 at log10 N = (logit(0.9) + 14) / 2.5 = 6.48
    x = np.repeat(np.log10(BUDGETS), 3)
    noise = np.tile([-0.02, 0.0, 0.02], len(BUDGETS))
    y = np.array([_sigmoid(a + b * v) for v in x]) + noise
    fit = ladder.fit_logistic(x, np.clip(y, 0, 1))
    assert fit["ok"] and fit["a"] == pytest.approx(a, abs=0.8) and fit["b"] == pytest.approx(b, abs=0.15)
    expected = (math.log(9) - a) / b
    assert fit["x_target"] == pytest.approx(expected, abs=0.05)
    assert fit["x_low"] < expected < fit["x_high"]
    line = ladder.fit_linear(x, y)
    assert line["ok"] and line["d"] > 0


def test_degenerate_ladders_say_why_no_trend_is_given():
    x = np.repeat(np.log10(BUDGETS), 3)
    assert "every value is 0" in ladder.fit_logistic(x, np.zeros_like(x))["why"]
    assert "does not rise" in ladder.fit_logistic(x, np.linspace(0.6, 0.1, x.size))["why"]
    assert "fewer than 3" in ladder.fit_logistic(x[:2], [0.1, 0.2])["why"]
    assert "separate completely" in ladder.fit_logistic(x, (x > 5.7).astype(float))["why"]


def test_points_carry_every_seed_at_twice_the_training_size(tmp_path):
    def em(label, n, s):
        return 0.0 if label == "abacus" else min(1.0, _sigmoid(-14 + 2.5 * math.log10(n)) + 0.01 * s)

    rows = _rows(em)
    points = ladder.ladder_points(rows)
    assert points["size"] == 16 and points["metric"] == "decoded_exact_match"
    assert sorted(points["labels"]) == ["abacus", "position_coupling"]
    assert points["labels"]["position_coupling"][1_000_000] == {s: pytest.approx(em("position_coupling", 1e6, s))
                                                              for s in (0, 1, 2)}
    md = ladder.ladder_markdown(rows)
    assert "## Exact match at problem size 16 against training examples" in md
    assert "| abacus |" in md and "every value is 0" in md
    paths = findings.write("ladder", rows, str(tmp_path))
    assert [p.split("/")[-1] for p in paths] == ["findings.md", "findings_ladder.png"]
    assert (tmp_path / "plots" / "findings_ladder.png").stat().st_size > 1000


def test_a_weak_trend_s_far_budget_is_written_as_a_power_of_ten(tmp_path):
    """Seeds near 0 at every budget with a slight rise: the straight line reaches 0.9 only at a budget
    past any float (10 ** 2249 overflows); the table writes such budgets as powers of ten, and the plot
    draws the trends at most 3 decades past the ladder."""
    ems = {1e5: (0.0, 0.0, 0.0), 3e5: (0.001, 0.0, 0.0), 1e6: (0.0, 0.0, 0.001), 3e6: (0.002, 0.0, 0.0)}
    rows = _rows(lambda label, n, s: ems[n][s])
    line = ladder.fit_linear(*ladder._xy(ladder.ladder_points(rows)["labels"]["abacus"]))
    assert line["ok"] and line["x_target"] > 308 and line["x_low"] < -308
    md = ladder.ladder_markdown(rows)
    assert f"10^{line['x_target']:.0f} [10^{line['x_low']:.0f}, 10^{line['x_high']:.0f}]" in md
    assert ladder._budget(6.48) == "3.02e+06" and ladder._budget(None) == "n/a"
    assert findings.write("ladder", rows, str(tmp_path))[1].endswith("findings_ladder.png")


def test_rows_without_a_budget_are_refused():
    rows = [{k: v for k, v in r.items() if k != "train_examples"} for r in _rows(lambda *a: 0.5)]
    with pytest.raises(ValueError, match="no row carries train_examples"):
        ladder.ladder_points(rows)
