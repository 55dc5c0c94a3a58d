"""The public API: every family module is ``posenc.<name>`` in all three import forms."""

import importlib
import os
import subprocess
import sys

import pytest

import posenc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = sorted(posenc.family_modules().items())


def test_the_family_packages_are_scanned():
    names = dict(FAMILIES)
    assert names["rope"] == "posenc.encodings.rope.rope"
    assert names["alibi"] == "posenc.encodings.alibi"
    assert names["sinks"] == "posenc.encodings.rope.sinks"
    assert names["qk_norm"] == "posenc.norms.qk_norm"
    assert names["fox"] == "posenc.attention.fox"
    for pkg in posenc.FAMILY_PACKAGES:  # every family package holds modules found here
        assert any(real.rpartition(".")[0] == f"posenc.{pkg}" for _, real in FAMILIES), pkg


@pytest.mark.parametrize("name,real", FAMILIES)
def test_three_import_forms_give_the_real_module(name, real):
    module = importlib.import_module(real)
    assert getattr(posenc, name) is module  # import posenc; posenc.<name>
    namespace: dict = {}
    exec(f"from posenc import {name} as m", namespace)  # from posenc import <name>
    assert namespace["m"] is module
    exec(f"import posenc.{name}\nm = posenc.{name}", namespace)  # import posenc.<name>
    assert namespace["m"] is module and sys.modules[f"posenc.{name}"] is module
    assert module.__name__ == real and module.__spec__.name == real  # the module keeps its own name
    public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
    if public:  # from posenc.<name> import <function>
        exec(f"from posenc.{name} import {public[0]} as f", namespace)
        assert namespace["f"] is getattr(module, public[0])


def test_a_real_package_wins_over_a_family_module_and_reexports_it():
    from posenc.norms import norms as norms_module

    assert "norms" not in posenc.family_modules()
    assert posenc.norms is importlib.import_module("posenc.norms")
    for f in ("layer_norm", "rms_norm", "deepnorm_constants", "softcap"):
        assert getattr(posenc.norms, f) is getattr(norms_module, f)


def test_the_names_of_the_design_resolve():
    from posenc.absolute import sinusoidal
    from posenc.rope import apply, frequencies

    assert callable(apply) and callable(frequencies) and callable(sinusoidal)
    for dotted in ("rope.frequencies", "rope.apply", "alibi.slopes", "alibi.bias", "t5.relative_position_bucket",
                   "absolute.sinusoidal", "norms.layer_norm", "norms.rms_norm", "norms.deepnorm_constants",
                   "norms.softcap"):
        module, _, attr = dotted.partition(".")
        assert callable(getattr(getattr(posenc, module), attr)), dotted


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError):
        posenc.no_such_module  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("posenc.no_such_module")


def test_importing_posenc_imports_neither_jax_nor_flax():
    code = ("import sys, posenc\n"
            "dir(posenc); posenc.family_modules()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax')))")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
