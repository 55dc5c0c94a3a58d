"""What a new user meets at the command line: one kind of thing per workdir (a run's workdir
refuses a study and a study's refuses a run, in one line before anything is written:
posenc.workdir.lock.check_kind), refusals as one line and exit 2 (no traceback), --help that
shows the flags every entry point shares, written files readable as the umask says, and
``python -m posenc <command>`` with the packaged configs from any directory."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers import ROOT, study_command
from posenc import studies
from posenc.configs import compare as compare_config
from posenc.training import loop
from posenc.workdir import files, lock


def _snapshot(workdir):
    """Every file under ``workdir`` with its bytes."""
    out = {}
    for folder, _, names in os.walk(workdir):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, workdir)] = f.read()
    return out


def _run_workdir(tmp_path):
    w = tmp_path / "run"
    w.mkdir()
    (w / "config.json").write_text(json.dumps({"config": {}, "config_hash": "abc"}))
    (w / "results.jsonl").write_text("".join(json.dumps({"eval_length": n}) + "\n" for n in (8, 16, 32, 64)))
    return str(w)


def _study_workdir(tmp_path):
    w = tmp_path / "study"
    w.mkdir()
    (w / "study.json").write_text(json.dumps({"study": "compare", "points_hash": "abc"}))
    (w / "results.jsonl").write_text("".join(json.dumps({"eval_length": n}) + "\n" for n in (8, 16)))
    return str(w)


def test_a_study_in_a_run_s_workdir_is_refused_before_it_writes(tmp_path):
    w = _run_workdir(tmp_path)
    before = _snapshot(w)
    with pytest.raises(lock.WorkdirHoldsOther) as e:
        studies.run("compare", compare_config.get_config("smoke"), w)
    assert str(e.value) == (f"{w} holds a run (config.json, 4 result rows); a study needs a workdir of its "
                            "own: use another --workdir (or remove this one)")
    assert _snapshot(w) == before  # not even a lock file


def test_a_run_in_a_study_s_workdir_is_refused_before_it_writes(tmp_path):
    from test_steploop import config

    w = _study_workdir(tmp_path)
    before = _snapshot(w)
    with pytest.raises(lock.WorkdirHoldsOther, match=r"holds the compare study \(study.json, 2 result rows\); "
                                                     r"a run needs a workdir of its own"):
        loop.run(config(), w)
    assert _snapshot(w) == before


def test_held_kind_and_description():
    assert lock.held_kind("/nonexistent/posenc") is None
    assert lock.describe_contents("/nonexistent/posenc") == "nothing posenc wrote"
    lock.check_kind("/nonexistent/posenc", "run")  # an empty or new workdir takes either
    lock.check_kind("/nonexistent/posenc", "study")


@pytest.mark.parametrize("entry,kind", [("train", "study"), ("compare", "run")])
def test_the_command_line_refuses_in_one_line_and_exits_2(tmp_path, entry, kind):
    w = _study_workdir(tmp_path) if kind == "study" else _run_workdir(tmp_path)
    before = _snapshot(w)
    if entry == "train":
        cmd = study_command("compare", "smoke", w)
        cmd[3:5] = ["train", "--config=default:tiny"]
    else:
        cmd = study_command("compare", "smoke", w)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    what = "the compare study (study.json, 2 result rows)" if kind == "study" else \
        "a run (config.json, 4 result rows)"
    other = "run" if kind == "study" else "study"
    assert lines[0] == (f"error: {w} holds {what}; a {other} needs a workdir of its own: use another "
                        "--workdir (or remove this one)")
    assert _snapshot(w) == before


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_respect_the_umask(tmp_path, umask, mode):
    """Results, configs, tables: what open() would create (0666 less the umask), not mkstemp's 0600."""
    from posenc.workdir import files

    old = os.umask(umask)
    try:
        path = files.write_json(str(tmp_path / "x" / "results.json"), {"a": 1})
        files.atomic_write(str(tmp_path / "table.md"), "| a |")
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == mode
    assert os.stat(tmp_path / "table.md").st_mode & 0o777 == mode


@pytest.mark.parametrize("entry", ["train", "compare"])
def test_help_shows_the_shared_flags(entry):
    import sys

    p = subprocess.run([sys.executable, "-m", "posenc", entry, "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr[-2000:]  # absl's --help exits 1
    for flag in ("--config:", "--workdir:", "--plugins:", "--jax_cache_dir:"):
        assert flag in p.stdout, (flag, p.stdout[-3000:])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished run of tests/test_steploop.py's tiny config (copy it before changing it)."""
    from test_steploop import config

    w = str(tmp_path_factory.mktemp("trained") / "run")
    return w, loop.run(config(per_call=1), w)


def _copy(trained, tmp_path, name="run"):
    import shutil

    w = str(tmp_path / name)
    shutil.copytree(trained[0], w)
    return w


def test_a_trained_run_is_evaluated_again_at_new_lengths_without_training(trained, tmp_path):
    """The same run with other eval.lengths: no step trained, the new length's rows added, the old
    ones kept (eval.* is not the trained model's identity)."""
    from test_steploop import config


    w, first = _copy(trained, tmp_path), trained[1]
    log = open(os.path.join(w, "train_log.jsonl")).read()
    c = config(per_call=1)
    c.eval.lengths = (16, 32)
    again = loop.run(c, w)
    assert open(os.path.join(w, "train_log.jsonl")).read() == log  # nothing trained
    assert sorted(r["eval_length"] for r in again) == [16, 32]
    rows = files.read_jsonl(os.path.join(w, "results.jsonl"))
    assert sorted(r["eval_length"] for r in rows) == [16, 32]  # one row per length
    old, new = next(r for r in first if r["eval_length"] == 16), next(r for r in again if r["eval_length"] == 16)
    assert (old["loss"], old["accuracy"], old["steps_trained"]) == (new["loss"], new["accuracy"],
                                                                    new["steps_trained"])
    assert loop.run(c, w) is not None  # complete now: the rows, nothing run


@pytest.mark.slow
def test_a_study_is_evaluated_again_at_new_lengths_without_training(tmp_path):
    c = compare_config.get_config("smoke")
    w = str(tmp_path / "study")
    rows = studies.run("compare", c, w)
    logs = {p: open(os.path.join(w, "runs", p, "train_log.jsonl")).read() for p in os.listdir(os.path.join(w, "runs"))}
    c.base.eval.lengths = (8, 16, 24)
    more = studies.run("compare", c, w)
    assert {p: open(os.path.join(w, "runs", p, "train_log.jsonl")).read() for p in logs} == logs
    assert len(more) == len(rows) // 2 * 3 and {r["eval_length"] for r in more} == {8, 16, 24}
    key = lambda r: (r["run"], r["eval_length"])  # noqa: E731
    before = {key(r): r["loss"] for r in rows}
    assert {key(r): r["loss"] for r in more if key(r) in before} == before  # the same models
    assert "| encoding | 8* | 16 | 24 |" in open(os.path.join(w, "table.md")).read()


def test_a_run_is_a_study_of_one_for_rows_and_report(trained, tmp_path):
    """load_rows and report take a run's workdir: its rows as a comparison of one point, its
    table.md and plots; a workdir holding neither is refused in one line (exit 2 at the command line)."""
    w = _copy(trained, tmp_path, "myrun")
    rows = studies.load_rows(w)
    assert len(rows) == 1 and (rows[0]["variant"], rows[0]["task_variant"], rows[0]["run"]) == \
        (rows[0]["position"], rows[0]["task"], "myrun")
    written = studies.report(w)
    assert os.path.join(w, "table.md") in written and any(p.endswith(".png") for p in written)
    assert "| encoding |" in open(os.path.join(w, "table.md")).read()
    with pytest.raises(lock.WorkdirHoldsOther, match="holds no run or study"):
        studies.report(str(tmp_path / "missing"))
    import sys

    p = subprocess.run([sys.executable, "-m", "posenc", "report", f"--workdir={tmp_path / 'missing'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert [line for line in p.stderr.splitlines() if line.startswith("error:")] == [
        f"error: {tmp_path / 'missing'} holds no run or study (config.json or study.json): give the "
        "--workdir of a run (python -m posenc train) or a study (python -m posenc compare, extend, stability)"]


# ------------------------------------------------------------------ the installed commands
def _posenc(args, cwd):
    """``python -m posenc *args`` in ``cwd``, importing this checkout (PYTHONPATH) and nothing from ``cwd``."""
    import sys

    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "posenc", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_commands_and_packaged_configs_work_from_any_directory(tmp_path):
    """``python -m posenc <command>`` from a directory that is not the repository: the command's --help
    (its docstring and the shared flags), and ``--config default:tiny`` loaded by name."""
    p = _posenc(["train", "--help"], tmp_path)
    assert "Traceback" not in p.stderr, p.stderr[-2000:]  # absl's --help exits 1
    assert p.stdout.startswith("Train one config"), p.stdout[:500]
    for flag in ("--config:", "--workdir:", "--plugins:", "--jax_cache_dir:", "--max_steps_this_run:"):
        assert flag in p.stdout, (flag, p.stdout[-3000:])
    # the packaged config by name, up to the validation of a field (nothing compiles, nothing is claimed)
    p = _posenc(["train", "--config", "default:tiny", f"--workdir={tmp_path / 'w'}", "--config.train.stepz=3",
                 "--jax_cache_dir="], tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith("error: --config.train.stepz: unknown config field 'train.stepz'; did you mean "
                               "'train.steps'?"), lines
    code = ("from posenc.config import cli\n"
            "c = cli.load('default:tiny', [('train.steps', '3')])\n"
            "print(c.model.num_layers, c.train.steps)")
    import sys

    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["1", "3"], out.stderr[-2000:]
    assert os.listdir(tmp_path) == []  # nothing written where they ran


def test_python_m_posenc_lists_its_commands_and_refuses_others_in_one_line(tmp_path):
    import pkgutil

    from posenc import experiments

    modules = sorted(m.name for m in pkgutil.iter_modules(experiments.__path__) if m.name != "runtime")
    assert modules == ["analyze", "compare", "extend", "findings", "report", "stability", "train"]
    p = _posenc(["--help"], tmp_path)
    assert p.returncode == 0 and p.stderr == ""
    listed = [line.split()[0] for line in p.stdout.split("commands:\n", 1)[1].split("\n\n")[0].splitlines()]
    assert listed == modules, p.stdout
    one_of = "; usage: python -m posenc <command> [flags], <command> one of: " + ", ".join(modules)
    for args, first in (([], "error: no command"),
                        (["trian", "--config=default"], "error: unknown command 'trian' (did you mean 'train'?)"),
                        (["runtime"], "error: unknown command 'runtime'")):
        p = _posenc(args, tmp_path)
        assert p.returncode == 2 and p.stdout == "", p.stderr[-2000:]
        assert p.stderr.splitlines() == [first + one_of], p.stderr
