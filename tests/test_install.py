"""The design card's top level, installed: configs/ and experiments/ live at the repository root and
install into the package (posenc.configs, posenc.experiments), so that the commands run in both forms:

- a checkout: ``python -m experiments.<command> --config configs/<name>.py:ARG`` from the root;
- an install: ``python -m posenc <command> --config <name>:ARG`` (or the ``posenc`` script) from any
  directory, here a non-editable install of the wheel into a fresh virtual environment.

And a first run is quiet: on a host without an accelerator, a command's stderr holds only posenc's own
log lines, even with libtpu installed (the ``crosscompile`` extra of the test install).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

from helpers import ROOT
from posenc.training import backends

# absl's log line: severity, date, time, thread, file:line]
LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ (?P<file>[\w.]+):\d+\] ")
SHIPPED = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "posenc", "configs", "experiments")


def _own_files() -> set[str]:
    """The file names of posenc's modules and commands: the sources a log line of posenc's own names."""
    names = set()
    for top in ("posenc", "experiments"):
        for _, _, files in os.walk(os.path.join(ROOT, top)):
            names |= {f for f in files if f.endswith(".py")}
    return names


def _foreign_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are not posenc's own log lines (or their continuations)."""
    own, out = _own_files(), []
    for line in stderr.splitlines():
        m = LOG_LINE.match(line)
        if m is None or m["file"] not in own:
            out.append(line)
    return out


def _env(**extra) -> dict:
    """The environment of a command a user types: no JAX_PLATFORMS, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "PYTHONPATH")}
    return {**env, **extra}


def _tiny_run(workdir) -> list[str]:
    import jax

    cache = jax.config.jax_compilation_cache_dir or ""
    return ["--config.train.steps=2", "--config.eval.lengths=(16,)", f"--workdir={workdir}",
            f"--jax_cache_dir={cache}"]


@pytest.mark.skipif(backends.visible_accelerator() is not None, reason="this host shows an accelerator")
def test_the_checkout_form_runs_from_the_root_and_its_first_run_is_quiet(tmp_path):
    """``python -m experiments.train --config configs/default.py:tiny`` from the repository root: it
    trains and evaluates, its stderr holds posenc's log lines only (no libtpu start-up errors), and
    ``python -m experiments.compare --help`` is the same command as ``python -m posenc compare``."""
    cmd = [sys.executable, "-m", "experiments.train", "--config=configs/default.py:tiny", *_tiny_run(tmp_path / "w")]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert os.path.exists(tmp_path / "w" / "results.jsonl")
    assert _foreign_lines(p.stderr) == [], p.stderr[-3000:]
    assert any("eval length 16" in line for line in p.stderr.splitlines())
    p = subprocess.run([sys.executable, "-m", "experiments.compare", "--help"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.stdout.startswith("Run a comparison grid") and "--workdir:" in p.stdout, p.stdout[:500]


def test_foreign_lines_are_found():
    """The check above can fail: libtpu's lines and another library's log lines are foreign."""
    own = "I1206 06:37:23.518876 139995698027392 finish.py:109] eval length 16: decoded accuracy=0.0323"
    libtpu = ("Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type",
              "E0000 00:00:1796538989.063597    6233 common_lib.cc:860] INVALID_ARGUMENT: Error: unexpected",
              "I1206 06:36:41.432534 139993789700992 font_manager.py:1848] generated new fontManager")
    assert _foreign_lines("\n".join((own, *libtpu))) == list(libtpu)


def test_cpu_only_without_accelerators_respects_a_choice(monkeypatch):
    """A platform the user chose (or a forced TPU) is kept; a visible accelerator keeps every backend."""
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert backends.chosen_platforms() == "cuda" and backends.cpu_only_without_accelerators() is False
    monkeypatch.setattr(backends, "chosen_platforms", lambda: "")
    monkeypatch.setenv("JAX_FORCE_TPU_INIT", "1")
    assert backends.cpu_only_without_accelerators() is False
    monkeypatch.delenv("JAX_FORCE_TPU_INIT")
    monkeypatch.setattr(backends, "visible_accelerator", lambda: "/dev/nvidia0")
    assert backends.cpu_only_without_accelerators() is False


@pytest.mark.skipif(backends.visible_accelerator() is not None, reason="this host shows an accelerator")
def test_a_non_editable_install_carries_the_configs_and_the_commands(tmp_path):
    """The wheel built from the shipped files, installed (not editable) into a fresh venv, runs the
    commands and the packaged configs by name from an unrelated directory, from its own site-packages."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools (the test extra)")
    source = tmp_path / "source"
    for name in SHIPPED:
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(src, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source)],
                   check=True, capture_output=True, timeout=300)
    wheel = [str(tmp_path / "dist" / f) for f in os.listdir(tmp_path / "dist") if f.endswith(".whl")]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # the dependencies from this environment's site-packages (a path, not its .pth files: not its posenc)
    with open(os.path.join(site, "deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", python, "install", "--no-deps", "--no-index", *wheel], check=True,
                   capture_output=True, timeout=300)
    away = tmp_path / "elsewhere"
    away.mkdir()
    where = subprocess.run([python, "-c", "import posenc.configs.compare as c, posenc.experiments.train as t; "
                            "print(c.__file__); print(t.__file__)"], cwd=away, env=_env(), capture_output=True,
                           text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(path.startswith(site) for path in where.stdout.split()), (site, where.stdout)
    p = subprocess.run([str(venv / "bin" / "posenc"), "--help"], cwd=away, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "  train  " in p.stdout and "  compare  " in p.stdout, p.stdout + p.stderr
    p = subprocess.run([python, "-m", "posenc", "train", "--config=default:tiny", *_tiny_run(away / "w")],
                       cwd=away, env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _foreign_lines(p.stderr) == [], p.stderr[-3000:]
    assert sorted(os.listdir(away)) == ["w"]
