"""Modules that moved keep their earlier import paths: the same module, or the same functions."""

import importlib

import pytest

from posenc import diagnostics, norms, qk_norm, stability, z_loss


@pytest.mark.parametrize("old, new", [("posenc.registry", "posenc.norm_names"),
                                      ("posenc.path_attention", "posenc.path"),
                                      ("posenc.training.setup", "posenc.training.prepare")])
def test_a_moved_module_is_its_new_module_under_its_earlier_name(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_the_earlier_overrides_module_names_the_one_applier():
    from posenc.config import overrides
    from posenc.training import overrides as earlier

    for name in ("apply", "as_dict", "coerce", "fields"):
        assert getattr(earlier, name) is getattr(overrides, name)


def test_posenc_stability_names_the_functions_of_their_new_modules():
    pairs = {"qk_norm": qk_norm.qk_norm, "qk_norm_init": qk_norm.qk_norm_init, "QK_NORMS": qk_norm.QK_NORMS,
             "z_loss": z_loss.z_loss, "embed_scale": norms.embed_scale,
             "max_attention_logit": diagnostics.max_attention_logit,
             "attention_entropy": diagnostics.attention_entropy, "logit_stats": diagnostics.logit_stats,
             "lr_sensitivity": diagnostics.lr_sensitivity}
    for name, new in pairs.items():
        assert getattr(stability, name) is new, name
