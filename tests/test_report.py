"""Report statistics and files: t-intervals, fitted marking, the aggregate table, sweeps, heat-map, atomic plots."""

import math
import os

import numpy as np
import pytest

from posenc.studies import compare
from posenc.studies import compare_plots as plots
from posenc.studies import compare_report as report

# Two-sided 95% Student t quantiles t_{0.975, df} (any statistics table).
T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 9: 2.2622, 29: 2.0452, 120: 1.9799}


def row(**kw):
    base = dict(task="parity", position="rope", norm="rms", placement="pre", seed=0, train_length=16,
                eval_length=16, loss=0.5, accuracy=0.9, exact_match=0.5, steps=10, config_hash="a" * 64)
    base.update(kw)
    base.setdefault("config_hash", "a" * 64)
    return base


def runs(task="parity", position="rope", accs=None, fitted=None, lengths=(16, 32, 64), **kw):
    """Rows of one run per seed: ``accs[seed][i]`` is the accuracy at ``lengths[i]``."""
    out = []
    for seed, values in enumerate(accs):
        for n, a in zip(lengths, values):
            out.append(row(task=task, position=position, seed=seed, eval_length=n, accuracy=a,
                           fitted=None if fitted is None else fitted[seed],
                           config_hash=f"{task}-{position}-{seed}".ljust(64, "0"), **kw))
    return out


def test_t_quantiles_match_the_table_and_scipy():
    for df, t in T975.items():
        assert report.t_quantile(0.975, df) == pytest.approx(t, abs=5e-5)
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 17, 60):
        for p in (0.9, 0.975, 0.995):
            assert report.t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)
    with pytest.raises(ValueError, match="df >= 1"):
        report.t_quantile(0.975, 0)


def test_interval_is_the_t_interval_over_seeds():
    values = [0.5, 0.7, 0.6, 0.9]
    mean, half, n, low, high = report.interval(values)
    s = float(np.std(values, ddof=1))  # sample std, n - 1 in the denominator
    assert (mean, n) == (pytest.approx(0.675), 4) and half == pytest.approx(3.18245 * s / 2, rel=1e-5)
    assert (low, high) == (0.5, 0.9)
    assert report.interval([0.9, 1.0, 1.0]).bounds(0.0, 1.0)[1] == 1.0  # clipped to the range
    assert report.interval(values).bounds(0.0, 1.0) == (pytest.approx(0.675 - half), pytest.approx(0.675 + half))
    assert report.interval([0.3]) == (0.3, None, 1, 0.3, 0.3)  # one seed: no interval
    assert report.interval([]) is None
    assert report.interval([0.2, 0.2])[1] == 0.0


def test_unfitted_runs_are_left_out_and_counted():
    rows = runs(accs=[(1.0, 0.6, 0.4), (0.99, 0.8, 0.6), (0.5, 0.1, 0.0)], fitted=[True, True, False])
    cell = report.summarize(rows)["parity"]["rope"][32]
    assert cell["accuracy"][:3:2] == (pytest.approx(0.7), 2) and cell["unfitted"] == 1
    everything = report.summarize(rows, include_unfitted=True)["parity"]["rope"][32]
    assert everything["accuracy"][:3:2] == (pytest.approx(0.5), 3) and everything["unfitted"] == 1
    md = report.table_markdown(rows)
    half = T975[1] * float(np.std([0.6, 0.8], ddof=1)) / math.sqrt(2)
    top = 0.995 - T975[1] * float(np.std([1.0, 0.99], ddof=1)) / math.sqrt(2)
    assert f"| rope | 0.995 [{top:.3f}, 1.000] {{0.99-1.00}} (EM 0.50) [1 unfitted]" in md  # clipped at 1
    assert f"| 0.700 [{max(0.7 - half, 0):.3f}, {min(0.7 + half, 1):.3f}] {{0.60-0.80}} (EM 0.50) [1 unfitted] |" in md
    assert "left out of the cell" in md and "included in the cell" in report.table_markdown(rows, include_unfitted=True)
    # a cell whose every run did not fit; fixed-budget runs (fitted None) have no marks
    assert "| rope | not fitted (1) | not fitted (1) | not fitted (1) |" in report.table_markdown(rows[6:])
    fixed = report.table_markdown(runs(accs=[(1.0, 0.6, 0.4)]))
    assert "unfitted" not in fixed and "| rope | 1.000 (EM 0.50) | 0.600 (EM 0.50) | 0.400 (EM 0.50) |" in fixed


def test_level_in_the_heading():
    md = report.table_markdown(runs(accs=[(1, 1, 1)]) + runs(task="copy", accs=[(1, 1, 1)])
                               + runs(task="bucket_sort", accs=[(1, 1, 1)]))
    assert "## parity [R: regular]" in md and "## bucket_sort [CS: context-sensitive]" in md
    assert "\n## copy\n" in md
    # the rows' metadata wins over the registry (results of another library version)
    meta = runs(task="copy", accs=[(1, 1, 1)], task_metadata={"level": "DCF"})
    assert "## copy [DCF: deterministic context-free]" in report.table_markdown(meta)


def test_aggregate_is_the_mean_over_ood_lengths_then_seeds():
    rows = (runs(accs=[(1.0, 0.6, 0.4), (1.0, 0.8, 0.2), (0.4, 0.1, 0.1)], fitted=[True, True, False])
            + runs(position="alibi", accs=[(1.0, 0.9, 0.7)])
            + runs(task="reverse_string", accs=[(1.0, 0.5, 0.3), (1.0, 0.3, 0.1)])
            + runs(task="copy", position="alibi", accs=[(1.0, None, 0.2)])
            + [row(task="text", eval_length=128, loss=1.0, accuracy=0.3)])
    agg = report.aggregate(rows)
    assert set(agg) == {"parity", "reverse_string", "copy"}  # text's measure is perplexity
    parity = agg["parity"]["rope"]
    # seed scores: mean of the lengths 32 and 64 (> 16): 0.5, 0.5; the unfitted seed is left out
    assert parity["stat"][:3] == (pytest.approx(0.5), 0.0, 2) and parity["unfitted"] == 1
    assert report.aggregate(rows, include_unfitted=True)["parity"]["rope"]["stat"][:3:2] == (pytest.approx(1.1 / 3), 3)
    assert agg["parity"]["alibi"]["stat"][:3] == (pytest.approx(0.8), None, 1)
    scores = [0.4, 0.2]
    assert agg["reverse_string"]["rope"]["stat"][0] == pytest.approx(0.3)
    assert agg["reverse_string"]["rope"]["stat"][1] == pytest.approx(T975[1] * np.std(scores, ddof=1) / math.sqrt(2))
    assert (agg["copy"]["alibi"]["lengths"], agg["copy"]["alibi"]["ood_lengths"]) == (1, 2)  # n/a skipped
    md = report.aggregate_markdown(rows)
    lines = md.splitlines()
    header = lines.index("| level | task | alibi | rope |")
    assert lines[header + 2:header + 6] == [  # grouped by level: R, DCF, then none
        "| R | parity | 0.800 | 0.500 [0.500, 0.500] {0.50-0.50} [1 unfitted] |",
        "| DCF | reverse_string |  | 0.300 [0.000, 1.000] {0.20-0.40} |",  # 0.3 -+ 1.271: clipped
        "|  | copy | 0.200 [1/2 lengths] |  |",
        "| | **mean over tasks** | 0.500 [2/3 tasks] | 0.400 [2/3 tasks] |",
    ]


def test_sweep_rows_get_their_own_table_and_plot(tmp_path):
    base = runs(task="passkey", accs=[(1.0, 0.5)], lengths=(512, 1024), train_length=512)
    sweep = [dict(r, sweep={"depth": d}, accuracy=a) for d, a in ((0.0, 0.2), (1.0, 0.8)) for r in base]
    md = report.table_markdown(base + sweep)
    assert "| rope | 1.000 (EM 0.50) | 0.500 (EM 0.50) |" in md  # the main table has the configured task only
    assert "### passkey: accuracy vs depth (evaluation sweep)" in md
    assert "| rope depth=0.0 | 0.200 (EM 0.50) | 0.200 (EM 0.50) |" in md
    assert "| rope depth=1.0 | 0.800 (EM 0.50) | 0.800 (EM 0.50) |" in md
    sweeps = report.summarize_sweeps(base + sweep)["passkey"]["depth"]["rope"]
    assert list(sweeps) == [0.0, 1.0] and sweeps[1.0][1024]["accuracy"][0] == pytest.approx(0.8)
    assert report.aggregate(base + sweep)["passkey"]["rope"]["stat"][0] == pytest.approx(0.5)  # no sweep rows
    paths = plots.write_plots(base + sweep, str(tmp_path))
    assert "passkey_sweep_depth.png" in {os.path.basename(p) for p in paths}


def test_report_files_heatmap_and_atomic_plot_writes(tmp_path, monkeypatch):
    rows = (runs(accs=[(1.0, 0.6, 0.4), (1.0, 0.8, 0.2)], fitted=[True, False])
            + runs(task="duplicate_string", position="alibi", accs=[(1.0, 0.9, 0.7)]))
    paths = compare.write_report(rows, str(tmp_path))
    names = {os.path.relpath(p, tmp_path) for p in paths}
    assert {"table.md", "aggregate.md", "plots/aggregate_heatmap.png", "plots/parity_accuracy.png"} <= names
    for p in paths:
        assert os.path.getsize(p) > 0
        if p.endswith(".png"):
            assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert open(tmp_path / "aggregate.md").read() == report.aggregate_markdown(rows)
    assert sorted(os.listdir(tmp_path / "plots")) == sorted(os.path.basename(p) for p in paths if "plots" in p)
    # a write killed before the rename leaves the old figure, and no temporary file
    heat = str(tmp_path / "plots" / "aggregate_heatmap.png")
    before = open(heat, "rb").read()

    def killed(*args):
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        plots.write_heatmap(rows, heat)
    assert open(heat, "rb").read() == before
    assert not [f for f in os.listdir(tmp_path / "plots") if f.startswith(".")]
    # no task with accuracy beyond its training length: no aggregate file, no heat-map
    assert report.write_aggregate(runs(accs=[(1.0,)], lengths=(16,)), str(tmp_path / "none.md")) is False
    assert plots.write_heatmap(runs(accs=[(1.0,)], lengths=(16,)), str(tmp_path / "none.png")) is None
    assert not os.path.exists(tmp_path / "none.md") and not os.path.exists(tmp_path / "none.png")


def test_task_suite_grids_expand_and_validate():
    import importlib.util

    from helpers import grid_points
    from posenc import tasks

    configs = importlib.import_module("posenc.configs.compare")
    # Delétang et al. 2023, Table 2: the 15 tasks (parity_check is posenc's parity)
    deletang = {"even_pairs", "modular_arithmetic", "parity", "cycle_navigation", "stack_manipulation",
                "reverse_string", "modular_arithmetic_brackets", "solve_equation", "duplicate_string",
                "missing_duplicate_string", "odds_first", "binary_addition", "binary_multiplication",
                "compute_sqrt", "bucket_sort"}
    common = importlib.import_module("posenc.configs.compare_grids.common")
    assert set(common.chomsky_tasks()) == deletang and tasks.make("parity_check").name == "parity_check"
    assert {tasks.spec(n)["level"] for n in ("reverse", "sort")} == {"DCF", "CS"}  # levelled, not in the suite
    grids = {}
    for arg in ("chomsky", "chomsky_quick", "suite", "suite_quick"):
        c = configs.get_config(arg)
        seeds = len(c.grid.seeds)
        c.grid.seeds = c.grid.seeds[:1]  # every point validated; the other seeds differ only in train.seed
        points = grid_points(c)
        assert len(points) == len(c.grid.tasks) * len(c.grid.positions)
        grids[arg] = {(p.run.config.task.name, p.fields["variant"]): p.run for p in points}
        assert seeds >= 3 and c.grid.vmap_seeds
        for r in grids[arg].values():
            assert r.config.train.fit_accuracy == (0.95 if arg.endswith("quick") else 0.99)
            assert max(r.config.eval.lengths) <= r.config.model.position.randomized_max_position or not \
                r.config.model.position.randomized
    assert {t for t, _ in grids["chomsky"]} == deletang
    # problem sizes: trained up to 40, evaluated at 40, 80, 160, 320 and 500 (Ruoss et al. 2023)
    for (_name, _), r in grids["chomsky"].items():
        assert r.task.max_size(r.config.task.train_length) == 40
        assert [r.task.max_size(n) for n in r.config.eval.lengths] == [40, 80, 160, 320, 500]
    rand = grids["chomsky"][("duplicate_string", "rope_randomized")]
    assert rand.spec.position.randomized and rand.config.model.position.randomized_max_position == 2048
    assert {t for t, _ in grids["suite"]} == {"mqar", "flip_flop", "passkey", "induction", "polynomial",
                                                 "summation", "lego", "count"}
    assert grids["suite"][("passkey", "rope")].config.eval.lengths == (512, 1024, 2048, 4096)
    assert {t for t, _ in grids["chomsky_quick"]} == {"parity", "reverse_string", "duplicate_string"}
