"""The checkpoint families ``posenc.hf`` loads: one module per family or family group, each registering itself.

Every module of this package is imported here, and each registers its
``config.json`` ``model_type`` values (:func:`posenc.hf.registry.register`)
with a :class:`~posenc.hf.registry.Family`: the preset, ``fields(hf)`` (the
config as dotted ``model.*`` fields, built from :mod:`posenc.hf.fields` and
:mod:`posenc.hf.rope_fields`) and ``params(hf, tensors, spec)`` (the tensors
in place, :mod:`posenc.hf.hf_params`). Adding a family means adding its module
(and its fixture under tests/data/hf_models), and nothing else. Every config
field that would change the computation and that posenc cannot express is
refused by name, in one line (:func:`posenc.hf.registry.unsupported`).
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
