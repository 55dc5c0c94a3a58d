"""posenc: positional encodings and normalization for transformer decoders.

The folders are the layers (docs/api.md): the pure functions (jax only) live
in the family packages ``posenc.encodings`` (with ``posenc.encodings.rope``),
``posenc.norms``, ``posenc.attention`` and ``posenc.recurrent`` (the recurrent
mixers); ``posenc.model`` composes them into a Flax NNX decoder. See docs/api.md.

Every module of a family package is public as ``posenc.<name>``, in all three
forms: ``import posenc; posenc.rope.apply``, ``from posenc import rope`` and
``import posenc.rope`` / ``from posenc.rope import apply``. ``posenc.<name>`` is
the very module object of its real home (``posenc.rope is
posenc.encodings.rope.rope``). The modules are found by scanning the family
packages, so a new module needs no list entry here. A real package of posenc
wins over a family module of the same name (``posenc.norms`` is the package,
which re-exports the functions of ``posenc.norms.norms``).

``import posenc`` stays lazy: it imports neither jax nor flax.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import pkgutil
import sys

__version__ = "0.1.0"

# the packages whose modules are public as posenc.<name>
FAMILY_PACKAGES = ("encodings", "encodings.rope", "norms", "attention", "recurrent", "moe")

_family_cache: dict[str, str] | None = None


def family_modules() -> dict[str, str]:
    """``{public name: real dotted name}`` of the family modules, from the files (nothing imported)."""
    global _family_cache
    if _family_cache is None:
        here = os.path.dirname(__file__)
        real = {m.name for m in pkgutil.iter_modules([here])}  # real modules and packages of posenc win
        found: dict[str, str] = {}
        for pkg in FAMILY_PACKAGES:
            for m in pkgutil.iter_modules([os.path.join(here, *pkg.split("."))]):
                if m.ispkg or m.name.startswith("_") or m.name in real:
                    continue
                if m.name in found:
                    raise ImportError(f"posenc.{m.name}: both {found[m.name]} and posenc.{pkg}.{m.name}")
                found[m.name] = f"posenc.{pkg}.{m.name}"
        _family_cache = found
    return _family_cache


class _AliasLoader(importlib.abc.Loader):
    """Loads ``posenc.<name>`` as the already-imported module of its real home."""

    def __init__(self, real: str):
        self.real = real
        self.real_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec):
        module = importlib.import_module(self.real)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module):
        # executed under its real name already; the import system has just set
        # __spec__ to the alias's spec: give the module back its own
        module.__spec__ = self.real_spec


class _FamilyFinder(importlib.abc.MetaPathFinder):
    """Finds ``posenc.<name>`` for the family modules.

    First on ``sys.meta_path``: it answers only for the family names, which no file
    ``posenc/<name>.py`` has (a real module wins, see :func:`family_modules`), and an
    editable install's finder would otherwise answer them from another checkout."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.partition(".")
        if prefix != "posenc" or not name or "." in name:
            return None
        real = family_modules().get(name)
        if real is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))


if not any(type(f).__name__ == "_FamilyFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _FamilyFinder())


def __getattr__(name):
    # Lazy submodule import: `import posenc; posenc.rope.apply(...)` works without
    # importing every module (and Flax) at `import posenc`.
    if not name.startswith("_") and (
        name in family_modules() or importlib.util.find_spec(f"posenc.{name}") is not None
    ):
        return importlib.import_module(f"posenc.{name}")
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *family_modules(), *(m.name for m in pkgutil.iter_modules(__path__))})
