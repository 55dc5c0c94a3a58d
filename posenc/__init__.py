"""posenc: positional encodings and normalization for transformer decoders.

Pure functions (jax only) live in the top-level modules; ``posenc.model``
composes them into a Flax NNX decoder. See docs/api.md.
"""

from posenc import registry

__version__ = "0.1.0"

_PURE = (
    "absolute", "rope", "rope_scaling", "xpos", "alibi", "t5", "shaw", "transformer_xl", "kerple",
    "fire", "cope", "irope", "norms", "placements", "stability",
)


def __getattr__(name):
    # Lazy submodule import: `import posenc; posenc.rope.apply(...)` works
    # without importing every module (and Flax) at `import posenc`.
    if name in _PURE or name in ("model", "tasks", "training"):
        import importlib

        return importlib.import_module(f"posenc.{name}")
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")
