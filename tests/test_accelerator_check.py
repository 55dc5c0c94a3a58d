"""benchmarks/accelerator_check.py (check_versions, check_stages, check_plan): the version gate, the stage order and
--plan (CI runs --dry_run)."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import accelerator_check as ac  # noqa: E402
import check_plan  # noqa: E402
import check_stages  # noqa: E402
import check_versions  # noqa: E402


def test_versions_compare_as_numbers_and_drop_local_suffixes():
    assert check_versions.version_tuple("0.11.2") == (0, 11, 2)
    assert check_versions.version_tuple("2.11.0+cu130") == (2, 11, 0)
    assert check_versions.version_tuple("0.12.0.1") > check_versions.version_tuple("0.12")
    assert check_versions.version_tuple("0.9.10") > check_versions.version_tuple("0.9.9")
    assert check_versions.version_tuple("1.0rc1") == (1, 0)


def test_the_minimums_are_pyproject_toml_s_and_the_oldest_jax_is_the_gpu_image_s():
    minimum = check_versions.minimum_versions()
    assert minimum["jax"] == minimum["jaxlib"] == "0.11.2"  # the H200 image ships jax 0.11.2
    assert set(minimum) >= {"flax", "optax", "chex", "orbax-checkpoint", "ml-collections", "numpy"}
    with open(os.path.join(ROOT, "constraints", "jax-oldest.txt")) as f:
        pins = dict(line.strip().split("==") for line in f if "==" in line and not line.startswith("#"))
    assert pins == {"jax": minimum["jax"], "jaxlib": minimum["jaxlib"]}  # CI's smoke run is that jax


def test_unsupported_names_each_dependency_below_its_minimum():
    ok = {name: v for name, v in check_versions.minimum_versions().items()}
    assert check_versions.unsupported(ok) == []
    old = {**ok, "jax": "0.10.2", "flax": "0.12.0"}
    del old["optax"]
    out = check_versions.unsupported(old)
    assert "jax 0.10.2 < 0.11.2" in out and any(s.startswith("optax missing") for s in out)
    assert not any(s.startswith("flax") for s in out)  # 0.12.0 meets flax>=0.12


def test_fallback_wheels_are_the_dependencies_they_stand_in_for():
    wheels = os.listdir(os.path.join(check_stages.WHEELS, "fallback"))
    names = {check_versions.distribution(w) for w in wheels}
    assert names == {"flax", "optax", "chex", "orbax-checkpoint"}
    for w in wheels:  # each meets pyproject.toml's minimum, so installing it lifts the check
        name, version = check_versions.distribution(w), os.path.basename(w).split("-")[1]
        assert check_versions.unsupported({**check_versions.minimum_versions(), name: version}) == []


def test_the_environment_stage_stops_the_check_in_one_line_below_the_supported_versions(
        tmp_path, monkeypatch, capsys):
    old = {**check_versions.minimum_versions(), "jax": "0.10.2", "jaxlib": "0.10.2"}
    monkeypatch.setattr(check_stages.Check, "_versions", lambda self, stage="install": old)
    ran = []
    monkeypatch.setattr(check_stages.Check, "tests", lambda self: ran.append("tests"))
    out = tmp_path / "rows.jsonl"
    rc = ac.main(["--stages=environment,tests", f"--out={out}", "--budget_s=60"])
    assert rc == 2 and ran == []  # nothing after the environment stage runs
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["accelerator_check: stopped: below the supported versions (pyproject.toml): "
                   "jax 0.10.2 < 0.11.2; jaxlib 0.10.2 < 0.11.2"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["environment", "stop", "summary"]


def test_unknown_stage_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        ac.main(["--stages=tests,trian"])
    assert e.value.code == 2
    assert "unknown stage 'trian'; choose from: install, environment, tests, train, addition" in (
        capsys.readouterr().err)


def test_plan_sizes_every_stage_in_the_check_s_order_against_the_budget(monkeypatch):
    monkeypatch.setattr(check_plan, "_host_flops_per_s", lambda config: 1e11)  # no measured step here
    args = types.SimpleNamespace(positions=check_stages.POSITIONS, batch=0, addition_steps=4000,
                                 budget_s=check_stages.BUDGET_S)
    rows = check_plan.stages(args)
    order = [r["stage"] for r in rows]
    assert order == sorted(order, key=check_stages.STAGES.index)  # the check runs them in this order
    assert set(order) == set(check_stages.STAGES)
    total = 0.0
    for r in rows:
        total += r["h200_s"]
        assert r["cumulative_h200_s"] == pytest.approx(total, abs=0.2)
        assert r["within_budget"] == (r["cumulative_h200_s"] <= check_stages.BUDGET_S)
        if r["flops"]:
            assert r["h200_s"] == pytest.approx(r["fixed_s"] + r["flops"] / (check_plan.H200_BF16_PEAK
                                                                           * r["assumed_mfu"]), abs=0.1)
            assert r["this_host_s"] == pytest.approx(r["flops"] / 1e11, rel=1e-3)
    addition = next(r for r in rows if r["stage"] == "addition")
    # Cho et al.'s model and batch: 3 arms x 2 seeds x 4000 steps x 1000 examples of 19 tokens,
    # about 4.2M non-embedding parameters (one layer: attention 4 d^2, GeGLU 3 d 4d) at 6 N per token
    tokens = 3 * 2 * 4000 * 1000 * 19
    assert addition["flops"] == pytest.approx(tokens * (6 * (4 + 12) * 512 ** 2 + 12 * 512 * 19), rel=0.01)
    # the check's default fits rope and alibi's comparisons and the addition run in its budget
    assert all(r["within_budget"] for r in rows if r["stage"] in ("install", "tests", "train", "addition"))
