"""The README runs as written: its Python blocks run, its commands name real configs and fields,
its field table is the generated one and every field in it can be set from the command line."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from helpers import ROOT
from posenc.config import cli
from posenc.studies import fields as fields_doc
from posenc.training.schema import Run

README = os.path.join(ROOT, "README.md")


RUNNABLE = [README, os.path.join(ROOT, "docs", "results.md"), os.path.join(ROOT, "docs", "studies.md")]


def _blocks(kind, paths=(README,)):
    return [b for p in paths for b in re.findall(rf"```{kind}\n(.*?)```", open(p).read(), re.S)]


def test_the_field_tables_are_the_generated_ones():
    text = open(README).read()
    block = text.split(fields_doc.BEGIN, 1)[1].split(fields_doc.END, 1)[0]
    assert block.strip() == fields_doc.run_table().strip(), "run `python -m posenc.studies.fields --write .`"
    assert open(os.path.join(ROOT, "docs", "config.md")).read() == fields_doc.config_doc()


def _as_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) if value else "()"
    if value is None:
        return "None"
    return str(value)


def _table_fields(markdown):
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^\| `([\w.]+)` \| `(.*?)` \|", markdown, re.M)]


def test_every_documented_field_is_settable_from_the_command_line(tmp_path):
    spec = "default:tiny"
    base = cli.load(spec)
    for field, _ in _table_fields(fields_doc.run_table()):
        node = base
        for part in field.split("."):
            node = node[part]
        if isinstance(node, dict) or hasattr(node, "to_dict"):
            continue  # mappings: below
        c = cli.load(spec, [(field, _as_text(node))], schema=Run)
        got = c
        for part in field.split("."):
            got = got[part]
        assert got == node, (field, got, node)
    for _name, rows in fields_doc.encoding_rows().items():
        for field, _, _ in rows:
            cli.load(spec, [(field, repr(eval_default(rows, field)))], schema=Run)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world, " * 2000)
    c = cli.load(spec, [("task.name", "text"), ("task.options.path", str(corpus)), ("eval.tokens", "1024"),
                        ("task.options.eval_fraction", "0.2"),
                        ("eval.variants", '{"yarn4": {"model.position.rope.scaling": "yarn", '
                                          '"model.position.rope.factor": 4}}'),
                        ("eval.variants.yarn4.model.position.rope.factor", "8")], schema=Run)
    from posenc.training import resolve

    r = resolve(c)
    assert r.task.path == str(corpus) and r.task.eval_fraction == 0.2
    assert r.eval_variants["yarn4"][1].position.options["rope"]["factor"] == 8.0
    tokens = tmp_path / "tokens.bin"
    import numpy as np

    np.arange(4000, dtype=np.uint16).tofile(tokens)
    c = cli.load(spec, [("task.name", "text"), ("task.options.tokens", str(tokens)), ("eval.tokens", "256")],
                 schema=Run)
    assert resolve(c).task.tokens == str(tokens)


def eval_default(rows, field):
    import ast

    return ast.literal_eval(next(d for f, d, _ in rows if f == field))


@pytest.mark.parametrize("study", ["compare", "extend", "stability"])
def test_every_study_field_is_settable(study):
    from posenc import studies

    spec = f"{study}:smoke"
    base = studies.engine.validate(studies.study(study), cli.load(spec))  # every field, defaults too
    for field, _, _ in fields_doc.study_rows()[study]:
        value = base
        for part in field.split("."):
            value = value[part]
        if hasattr(value, "to_dict"):
            text = __import__("json").dumps(value.to_dict())
        else:
            text = _as_text(value)
        c = cli.load(spec, [(field, text)], schema=studies.study(study).schema)
        studies.engine.validate(studies.study(study), c)


def test_a_misspelled_argument_or_field_is_one_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    for args, message in (
            (["--config=compare:quik"],
             "error: --config=compare:quik: unknown compare config argument 'quik' (did you mean 'quick'?)"),
            (["--config=defualt:tiny"],
             "error: --config=defualt:tiny: no packaged config 'defualt' (did you mean 'default'?); choose one "
             "of: compare, default, extend, stability, or a file: path/to/config.py[:ARG]"),
            (["--config=compare:smoke", "--config.grid.sedes=0,1"],
             "error: --config.grid.sedes: unknown config field 'grid.sedes'; did you mean 'grid.seeds'?"),
            (["--config=compare:smoke", "--config.base.train.stepz=3"],
             "error: --config.base.train.stepz: unknown config field 'base.train.stepz'; did you mean "
             "'base.train.steps'?")):
        out = subprocess.run([sys.executable, "-m", "posenc", "compare", *args, f"--workdir={tmp_path}/w",
                              "--jax_cache_dir="], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert lines[0].startswith(message), lines[0]
        assert "Traceback" not in out.stderr and not os.path.exists(tmp_path / "w")


def _commands():
    """Every ``python -m posenc <command> ...`` command of the shell blocks of the README, docs/results.md
    and docs/studies.md (continuations joined), from ``posenc`` on; the checkout form
    ``python -m experiments.<command> ...`` as ``posenc <command> ...``."""
    out = []
    for block in _blocks("bash", RUNNABLE):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            for part in re.split(r"&&|;|\|", line):
                words = shlex.split(part.replace("& done", ""))
                if "-m" not in words or words.index("-m") + 1 >= len(words):
                    continue
                i = words.index("-m") + 1
                if words[i] == "posenc":
                    out.append(words[i:])
                elif words[i].startswith("experiments."):
                    out.append(["posenc", words[i].split(".", 1)[1], *words[i + 1:]])
    return out


def test_the_readmes_commands_name_real_configs_and_fields():
    from posenc import studies

    commands = _commands()
    assert len(commands) >= 10
    for words in commands:
        module = words[1]
        assert os.path.exists(os.path.join(ROOT, "experiments", f"{module}.py")), words
        config = next((w.split("=", 1)[1] if "=" in w else words[words.index(w) + 1]
                       for w in words if w.split("=")[0] == "--config"), None)
        if config is None:
            continue
        overrides = [tuple(w[len("--config."):].split("=", 1)) for w in words if w.startswith("--config.")]
        s = studies.study(module).schema if module in ("compare", "extend", "stability") else (
            Run if module == "train" else None)  # other entry points: their config's own fields
        plugins = [w for w in words if w.startswith("--plugins")]
        if plugins:  # the plugin's own encoding: checked by the plugin test below
            overrides = [o for o in overrides if "half_alibi" not in o[1]]
        if "/" in config:  # the checkout form: a file of the root folder configs/, from the root
            assert config.startswith("configs/") and module == words[1], words
            config = os.path.join(ROOT, config)
        cli.load(config, overrides, schema=s)


def _with_test_checkpoint(script, tmp_path):
    """The README's Hugging Face example on tests/data/hf_models/llama (96 ids) with a word-level
    tokenizer of its own and 32-token windows instead of a downloaded SmolLM2 and 4 x 8192."""
    import shutil

    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("safetensors")
    model = tmp_path / "models" / "SmolLM2-135M"
    shutil.copytree(os.path.join(ROOT, "tests", "data", "hf_models", "llama"), model)
    words = "the quick brown fox jumps over a lazy dog and rotary embeddings extend context".split()
    vocab = {w: i for i, w in enumerate(["[UNK]", *words])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(model / "tokenizer.json"))
    (tmp_path / "corpus.txt").write_text(" ".join(words * 4) + "\n")
    line = "L = 4 * 8192"
    assert line in script
    return script.replace(line, "L = 32")


@pytest.mark.slow
def test_the_readmes_python_blocks_run_as_written(tmp_path):
    files, scripts = {}, []
    for block in _blocks("python"):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w]+\.py", first):
            files[first[2:]] = block
        else:
            scripts.append(block.replace("/tmp/", f"{tmp_path}/"))
    assert "my_encodings.py" in files and len(scripts) >= 2
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", JAX_PLATFORMS="cpu")
    for i, script in enumerate(scripts):
        if "models/SmolLM2-135M" in script:  # the Hugging Face example, on the test checkpoint
            scripts[i] = _with_test_checkpoint(script, tmp_path)
    for script in scripts:
        out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, script + out.stderr[-3000:]
    # the plugin example: the README's command with its file, in the directory that holds the file
    (cmd,) = [c for c in _commands() if any(w.startswith("--plugins") for w in c)]
    cmd = [w.replace("/tmp/", f"{tmp_path}/") for w in cmd]
    out = subprocess.run([sys.executable, "-m", *cmd, "--jax_cache_dir="], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| half_alibi |" in out.stdout


def test_the_fields_tool_prints_and_writes_only_when_asked(tmp_path, capsys, monkeypatch):
    """``python -m posenc.studies.fields`` prints every field; ``--write ROOT`` rewrites a checkout's
    README table and docs/config.md, and refuses a directory that is not one, in one line."""
    monkeypatch.chdir(tmp_path)
    assert fields_doc.main([]) == 0
    assert capsys.readouterr().out == fields_doc.config_doc()
    assert os.listdir(tmp_path) == []  # nothing written where it ran
    assert fields_doc.main(["--write", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path} is not a posenc checkout (no README.md); --write takes the "
                   "repository's root"]
    assert os.listdir(tmp_path) == []
