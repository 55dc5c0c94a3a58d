import re

import pytest

from posenc import registry

CHECKS = [
    (registry.check_position_kind, registry.POSITION_KINDS, "position kind"),
    (registry.check_norm_kind, registry.NORM_KINDS, "norm kind"),
    (registry.check_placement, registry.PLACEMENTS, "norm placement"),
    (registry.check_qk_norm, registry.QK_NORMS, "qk_norm"),
]

ATTACH_POINTS = {"embed", "qk", "logits", "values"}


@pytest.mark.parametrize("check, table, label", CHECKS)
def test_every_name_is_accepted(check, table, label):
    assert table, label
    for name in table:
        assert check(name) == name


@pytest.mark.parametrize("check, table, label", CHECKS)
@pytest.mark.parametrize("bad", ["rop", "", "ROPE", None, 3])
def test_errors_list_every_choice(check, table, label, bad):
    with pytest.raises(ValueError) as info:
        check(bad)
    msg = str(info.value)
    assert msg.startswith(f"unknown {label} {bad!r}; choose one of: ")
    listed = msg.split("choose one of: ", 1)[1].split(", ")
    assert listed == sorted(table)


def test_position_kinds_have_attach_points_and_descriptions():
    for name, (points, description) in registry.POSITION_KINDS.items():
        assert isinstance(points, tuple) and set(points) <= ATTACH_POINTS, name
        assert registry.attach_points(name) == points
        assert isinstance(description, str) and description, name
    assert registry.attach_points("nope") == ()
    assert registry.attach_points("shaw") == ("logits", "values")
    with pytest.raises(ValueError, match=re.escape("unknown position kind 'rop'; choose one of: alibi,")):
        registry.attach_points("rop")


def test_every_non_rope_position_kind_has_a_pure_module():
    # Each registered non-RoPE kind maps to the pure functions that implement it.
    import posenc.absolute
    import posenc.alibi
    import posenc.cope
    import posenc.fire
    import posenc.irope
    import posenc.kerple
    import posenc.shaw
    import posenc.t5
    import posenc.transformer_xl

    implemented = {
        "sinusoidal": posenc.absolute.sinusoidal,
        "learned": posenc.absolute.learned,
        "alibi": posenc.alibi.bias,
        "t5": posenc.t5.bias,
        "shaw": posenc.shaw.logits,
        "transformer_xl": posenc.transformer_xl.logits,
        "kerple_log": posenc.kerple.bias,
        "kerple_power": posenc.kerple.bias,
        "fire": posenc.fire.bias,
        "cope": posenc.cope.logits,
        "irope": posenc.irope.layer_kinds,
    }
    # The RoPE family (rope, xpos) lives in posenc.rope / posenc.xpos; nope needs no function.
    assert set(implemented) == set(registry.POSITION_KINDS) - {"nope", "rope", "xpos"}
    assert all(callable(f) for f in implemented.values())
    assert {k.split("_")[1] for k in registry.POSITION_KINDS if k.startswith("kerple_")} == set(posenc.kerple.KINDS)


def test_descriptions_are_strings():
    for table in (registry.NORM_KINDS, registry.PLACEMENTS, registry.QK_NORMS):
        for name, description in table.items():
            assert isinstance(name, str) and isinstance(description, str) and description
