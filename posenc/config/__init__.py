"""Config declarations and overrides: :mod:`~posenc.config.schema`, :mod:`~posenc.config.overrides`."""
