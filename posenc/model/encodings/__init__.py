"""The built-in encodings: one module per unit, each registering itself.

Every module of this package is imported here, so adding a built-in encoding
means adding its module (and its pure module, tests and README row), and
nothing else. Plugins register the same way from outside the repository
(``posenc.model.register_encoding``).
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
