"""Dotted-field overrides: :mod:`posenc.config.overrides` (the one applier), under its earlier name."""

from posenc.config.overrides import apply, as_dict, coerce, fields  # noqa: F401
