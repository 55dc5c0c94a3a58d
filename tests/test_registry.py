"""Registries: names are read off the units and tables that implement them; errors list them;
the README and API tables agree with the registry."""

import importlib
import os
import re

import pytest

import posenc
from posenc import norm_names, norms, placements, qk_norm
from posenc.model import ENCODINGS, Encoding, register_encoding, registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECKS = [
    (norm_names.check_norm_kind, norms.NORMS, "norm kind"),
    (norm_names.check_placement, placements.PLACEMENTS, "norm placement"),
    (norm_names.check_qk_norm, qk_norm.QK_NORMS, "qk_norm"),
    (registry.get, ENCODINGS, "position kind"),
]


@pytest.mark.parametrize("check, table, label", CHECKS)
@pytest.mark.parametrize("bad", ["rop", "", "ROPE", None, 3])
def test_errors_list_every_choice(check, table, label, bad):
    with pytest.raises(ValueError) as info:
        check(bad)
    msg = str(info.value)
    assert msg.startswith(f"unknown {label} {bad!r}; choose one of: ")
    listed = msg.split("choose one of: ", 1)[1].split(" (", 1)[0].split(", ")  # before a hint
    assert listed == sorted(table)


BUILTINS = sorted(n for n, c in ENCODINGS.items() if c.__module__.startswith("posenc.model.encodings."))


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_unit_is_self_describing(name):
    cls = ENCODINGS[name]
    assert cls.name == name and cls.__doc__ and cls.paper, name
    if name != "nope":  # NoPE needs no function
        module = importlib.import_module(cls.pure)
        short = module.__name__.rpartition(".")[2]  # a family module, public as posenc.<short>
        assert posenc.family_modules().get(short) == module.__name__, f"{cls.pure} is not a pure family module"
        assert getattr(posenc, short) is module


def test_attach_points_are_read_off_the_protocol_methods():
    class Bias(Encoding):
        def bias(self, q_positions, k_positions):
            return None

    class Both(Bias):
        def values(self, weights, q_positions, k_positions):
            return None

    assert Encoding.attach_points() == ()
    assert Bias.attach_points() == ("logits",)
    assert Both.attach_points() == ("logits", "values")
    assert ENCODINGS["sinusoidal"].acts_at_input() and not ENCODINGS["rope"].acts_at_input()
    assert ENCODINGS["rope"].attach_points() == ("queries, keys",)
    assert ENCODINGS["shaw"].attach_points() == ("logits", "values")


def test_register_refuses_bad_and_duplicate_names():
    with pytest.raises(ValueError, match="lower_snake_case"):
        register_encoding("Half-ALiBi")
    with pytest.raises(ValueError, match="'alibi' is already registered by posenc.model.encodings.alibi.ALiBi"):
        @register_encoding("alibi")
        class Other(Encoding):
            pass
    with pytest.raises(TypeError, match="decorates Encoding subclasses"):
        register_encoding("not_a_unit")(dict)
    assert ENCODINGS["alibi"].__module__ == "posenc.model.encodings.alibi"


def _readme_kinds() -> set[str]:
    """The config names in the README table whose header names `model.position.kind`."""
    text = open(os.path.join(ROOT, "README.md")).read()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| config name (`model.position.kind`)"))
    names = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1].strip()
        if first.startswith("`"):  # rows such as "(scaling of `rope`)" describe options, not kinds
            names |= set(re.findall(r"`([a-z0-9_]+)`", first))
    return names


def test_readme_encoding_table_equals_the_registry():
    assert _readme_kinds() == set(BUILTINS)  # built-ins only: plugins are not in the README


def test_api_docs_name_every_pure_module_of_a_unit():
    api = open(os.path.join(ROOT, "docs", "api.md")).read()
    for name, cls in ENCODINGS.items():
        if cls.pure and cls.__module__.startswith("posenc.model.encodings."):
            assert f"# {cls.pure.replace('.', '/')}.py" in api, (name, cls.pure)


def test_every_listed_norm_and_qk_norm_runs():
    import jax.numpy as jnp

    x = jnp.ones((2, 4))
    for kind in norm_names.NORM_KINDS:
        assert norms.normalize(kind, x, norms.init_params(kind, 4)).shape == x.shape
    q = jnp.ones((1, 3, 2, 4))
    for kind in norm_names.QK_NORMS:
        qn, kn = qk_norm.qk_norm(kind, q, q, qk_norm.qk_norm_init(kind, 2, 2, 4))
        assert qn.shape == q.shape and kn.shape == q.shape


def test_a_bias_without_kernel_terms_is_told_once_per_class_when_built_for_an_accelerator():
    """Registering says nothing (on CPU every unit runs the XLA path); a model built for a GPU / TPU
    with attention_impl "auto" tells each class without an in-kernel form once."""
    import warnings

    import helpers
    from posenc.model import ModelSpec, fused
    from posenc.model.fused import NoKernelFormWarning

    class Base(Encoding):
        def bias(self, q_positions, k_positions):
            return None

    class WithTerms(Base):
        def kernel_terms(self, q_positions, k_positions):
            return ()

    class WithValues(Base):
        def values(self, weights, q_positions, k_positions):
            return None

    def build(kinds):
        cfg = helpers.model_cfg(kinds[0], num_layers=len(kinds))
        cfg.position.layer_kinds = tuple(kinds)
        return ModelSpec.from_config(cfg, train_length=16)

    kinds = ["test_told_bias", "test_told_terms", "test_told_values"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name, cls in zip(kinds, (Base, WithTerms, WithValues)):
                register_encoding(name)(cls)
            with fused.force_backend("cpu"):
                build(kinds)
            assert not [w for w in caught if issubclass(w.category, NoKernelFormWarning)]
            with fused.force_backend("gpu"):
                build(kinds)
                build(kinds)  # told already
        told = [w for w in caught if issubclass(w.category, NoKernelFormWarning)]
        assert [str(w.message).split()[1] for w in told] == ["'test_told_bias'", "'test_told_values'"]
        assert "on GPU / TPU its attention runs the XLA path" in str(told[0].message)
        assert "define kernel_terms" in str(told[0].message)
        assert "its values keep it there as well" in str(told[1].message)
    finally:
        for name in kinds:
            ENCODINGS.pop(name, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoKernelFormWarning)
        for _name, cls in ENCODINGS.items():  # no built-in is told
            if cls.__module__.startswith("posenc.model.encodings."):
                fused.tell_no_kernel_form(cls)


def test_api_docs_describe_every_member_of_the_encoding_protocol():
    """Every public hook, declaration, class fact and derived fact of Encoding is in the protocol
    section of docs/api.md, so a new hook cannot go undocumented."""
    api = open(os.path.join(ROOT, "docs", "api.md")).read()
    start = api.index("## The encoding protocol")
    section = api[start:api.index("\n## ", start + 1)]
    protocol = [c for c in Encoding.__mro__ if c.__module__.startswith("posenc.model.")]  # its data hooks too
    members = sorted({n for c in protocol for n in vars(c) if not n.startswith("_")})
    assert {"bias", "prepare", "attention", "update_cache", "relative", "spans"} <= set(members)
    missing = [n for n in members if f"`{n}" not in section]
    assert not missing, f"docs/api.md does not describe Encoding.{', '.join(missing)}"


def test_an_unknown_kind_points_at_plugins():
    """A grid of one's own encoding reported without its module: the error says how to load it."""
    with pytest.raises(ValueError, match=r"unknown position kind 'half_alibi'; choose one of: abacus, .* "
                                         r"\(an encoding of your own registers when its module is "
                                         r"imported: --plugins=MODULE on the command line\)"):
        registry.get("half_alibi")
