"""posenc: positional encodings and normalization for transformer decoders.

Pure functions (jax only) live in the top-level modules; ``posenc.model``
composes them into a Flax NNX decoder. See docs/api.md.
"""

import importlib
import importlib.util

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy submodule import: `import posenc; posenc.rope.apply(...)` works without
    # importing every module (and Flax) at `import posenc`. Any module or package
    # in this directory is reachable, so a new module needs no list entry here.
    if not name.startswith("_") and importlib.util.find_spec(f"posenc.{name}") is not None:
        return importlib.import_module(f"posenc.{name}")
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")


def __dir__():
    import pkgutil

    return sorted({*globals(), *(m.name for m in pkgutil.iter_modules(__path__))})
