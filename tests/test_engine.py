"""The study engine: processes sharing a workdir, partial reports, claims, rows as data, import layers."""

import ast
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT, study_command
from posenc import studies
from posenc.config.schema import ConfigError
from posenc.configs import compare as compare_config
from posenc.studies import engine
from posenc.studies import rows as rows_lib
from posenc.workdir import files, lock


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("smoke"))
    return workdir, studies.run("compare", compare_config.get_config("smoke"), workdir)


@pytest.mark.slow
def test_two_processes_split_a_grid_and_write_the_rows_of_one(smoke, tmp_path):
    _, reference = smoke
    workdir = str(tmp_path / "shared")
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen(study_command("compare", "smoke", workdir), cwd=ROOT, env=env, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    said = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    ran = [int(re.search(r"compare: (\d+) points run here", s).group(1)) for s in said]
    assert sorted(ran) == [2, 2]  # two cells of two vmapped seeds: one cell each, none twice
    rows = studies.load_rows(workdir)
    assert rows_lib.without_volatile(rows) == rows_lib.without_volatile(reference)
    assert rows == files.read_jsonl(os.path.join(workdir, "results.jsonl"))


@pytest.mark.slow
def test_a_partial_grid_reports_what_is_missing(smoke, tmp_path):
    import shutil

    workdir = str(tmp_path / "partial")
    shutil.copytree(smoke[0], workdir)
    os.unlink(os.path.join(workdir, "runs", "copy_alibi_rms-pre_s1", engine.ROWS_FILE))
    written = studies.report(workdir)
    table = open(os.path.join(workdir, "table.md")).read()
    assert table.startswith("**Partial: 1 of 4 points have no rows yet** (copy_alibi_rms-pre_s1)")
    assert "| alibi | " in table and "; 2 seed(s)" in table  # rope has both seeds, alibi one
    assert os.path.join(workdir, "table.md") in written
    assert len(files.read_jsonl(os.path.join(workdir, "results.jsonl"))) == len(smoke[1]) - 2


@pytest.mark.slow
def test_a_workdir_of_another_study_config_is_refused(smoke):
    c = compare_config.get_config("smoke")
    c.grid.positions = ("rope", "t5")
    with pytest.raises(lock.WorkdirHoldsOther, match=r"holds the compare study of another config"):
        studies.run("compare", c, smoke[0])


@pytest.mark.slow
def test_rows_are_plain_dicts_a_dataframe_takes(smoke):
    pd = pytest.importorskip("pandas")
    rows = studies.load_rows(smoke[0])
    df = pd.DataFrame(rows)
    assert len(df) == len(rows) == 8 and {"variant", "eval_length", "accuracy", "point"} <= set(df.columns)
    means = df.groupby(["variant", "eval_length"])["accuracy"].mean()
    assert means.loc[("rope", 16)] == pytest.approx(
        sum(r["accuracy"] for r in rows if r["variant"] == "rope" and r["eval_length"] == 16) / 2)
    documented = set(rows_lib.RUN_FIELDS) | set(rows_lib.study_fields("compare"))
    assert set(df.columns) <= documented, sorted(set(df.columns) - documented)


def test_unknown_study_and_points_are_errors():
    with pytest.raises(ConfigError, match="unknown study 'compar'; choose one of: compare, extend, stability"):
        studies.study("compar")
    c = compare_config.get_config("smoke")
    c.grid.positions = ("rope", "rope")
    with pytest.raises(ConfigError, match="several points named 'copy_rope_rms-pre_s0'"):
        engine.expand(studies.study("compare"), c)
    c = compare_config.get_config("smoke")
    c.grid.typo = 1
    with pytest.raises(ConfigError, match=r"unknown config field 'grid.typo'"):
        engine.expand(studies.study("compare"), c)


def test_a_dead_writers_temporary_files_are_found_and_removed(tmp_path):
    dead = subprocess.Popen(["true"])  # a pid that no longer runs
    dead.wait()
    (tmp_path / "a").mkdir()
    stale = tmp_path / "a" / f".results.jsonl.{dead.pid}.x1y2z3.tmp"
    stale.write_text("half")
    mine = tmp_path / f".table.md.{os.getpid()}.abc.tmp"
    mine.write_text("in progress")
    assert files.stale_temps(str(tmp_path)) == [str(stale)]
    assert files.remove_stale_temps(str(tmp_path)) == [str(stale)] and not stale.exists() and mine.exists()
    files.atomic_write(str(tmp_path / "out.txt"), "done")
    assert open(tmp_path / "out.txt").read() == "done" and files.stale_temps(str(tmp_path)) == []


# ------------------------------------------------------------------ layers
# the packages of the pure layer (jax, numpy and the standard library only): the family packages
# of the public API (the recurrent mixers and the mixture-of-experts layers among them) and the
# attention kernels; posenc.hf loads checkpoints into the model, so it is not one of them
PURE_PACKAGES = ("encodings", "norms", "attention", "kernels", "recurrent", "moe")
LAYERS = ["pure", "config", "workdir", "model", "tasks", "training", "studies", "configs", "experiments"]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "posenc":
        return None
    if len(parts) == 1 or parts[1] in ("checks", *PURE_PACKAGES):
        return "pure"
    sub = parts[1]
    if sub == "__main__":  # python -m posenc <command>: the commands' dispatcher
        return "experiments"
    if sub == "hf":  # the checkpoint loader: it builds the model, so it is the model layer
        return "model"
    return sub if sub in LAYERS else None  # a module outside every layer fails the layer test


def _imports(path: str, modules) -> set[str]:
    """The posenc modules ``path`` imports (at module level or inside functions)."""
    tree = ast.parse(open(path).read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:  # `from pkg import module` depends on the module, not on pkg
                out.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module)
    return {m for m in out if m in modules}


# the folders of the installed package: posenc/, and the root folders installed into it (setup.py)
PACKAGE_FOLDERS = {"posenc": "posenc", "configs": "posenc.configs", "experiments": "posenc.experiments"}


def _modules():
    found = {}
    for folder, package in PACKAGE_FOLDERS.items():
        for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
            for n in names:
                if n.endswith(".py"):
                    path = os.path.join(dirpath, n)
                    rel = os.path.relpath(path, os.path.join(ROOT, folder))[:-3].replace(os.sep, ".")
                    found[f"{package}.{rel}".removesuffix(".__init__")] = path
    return found


def test_the_pure_modules_import_only_jax_numpy_and_the_standard_library():
    allowed = {"jax", "jaxlib", "numpy", "__future__"} | set(sys.stdlib_module_names)
    modules = _modules()
    for m, path in modules.items():
        if _layer(m) != "pure":
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                top = n.split(".")[0]
                if top == "posenc":
                    assert _layer(n) == "pure" or n in modules and _layer(n) == "pure", f"{m} imports {n}"
                else:
                    assert top in allowed, f"{m} (pure) imports {n}"


def test_no_import_cycles_and_no_import_upwards():
    modules = _modules()
    graph = {m: _imports(p, modules) - {m} for m, p in modules.items()}
    # the packaged configs and the command-line programs on top: nothing below imports them
    order = {"pure": 0, "config": 1, "workdir": 1, "model": 2, "tasks": 2, "training": 3, "studies": 4, "configs": 5,
             "experiments": 6}
    for m, deps in graph.items():
        for d in deps:
            if m == "posenc" or d == "posenc":
                continue
            assert order[_layer(d)] <= order[_layer(m)], f"{m} ({_layer(m)}) imports {d} ({_layer(d)})"
    # no cycle among the modules (imports inside functions included)
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            if d == "posenc" or d.count(".") == 0:
                continue
            if state.get(d) == "open":
                pytest.fail("import cycle: " + " -> ".join(path + [m, d]))
            if d not in state:
                visit(d, path + [m])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_importing_the_library_starts_no_jax_backend():
    # Module constants must be NumPy: a backend started at import makes the process multi-threaded,
    # and a fork afterwards (a fork server, multiprocessing) can deadlock.
    code = ("import importlib, pkgutil; import posenc\n"
            "from jax._src import xla_bridge as xb\n"
            "for m in pkgutil.walk_packages(posenc.__path__, 'posenc.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(sorted(xb._backends))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
