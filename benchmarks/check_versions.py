"""The accelerator check's version gate: the libraries it reports and pyproject.toml's minimums.

The environment stage stops the check in one line when an installed
dependency is below the version ``pyproject.toml`` requires (or missing);
the install stage installs a carried fallback wheel only for a dependency
below its minimum.
"""

from __future__ import annotations

import itertools
import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The libraries whose versions the environment stage reports (pyproject.toml sets the minimums).
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "chex", "orbax-checkpoint", "ml-collections", "absl-py",
             "numpy", "matplotlib", "tqdm", "jax-cuda13-plugin", "jax-cuda12-plugin", "libtpu", "torch",
             "x-transformers", "einops")


def version_tuple(text: str) -> tuple:
    """'0.11.2' -> (0, 11, 2); a pre-release or local suffix is dropped ('2.13.0+cu130' -> (2, 13, 0))."""
    out = []
    for part in text.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def minimum_versions() -> dict:
    """{distribution: minimum version} of pyproject.toml's dependencies (the ``>=`` ones)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    out = {}
    for dep in deps:
        name, _, minimum = dep.partition(">=")
        if minimum:
            out[name.strip().split("[")[0]] = minimum.split(",")[0].strip()
    return out


def unsupported(versions: dict) -> list[str]:
    """'name found < minimum' for each installed-or-missing dependency below pyproject.toml's minimum."""
    out = []
    for name, minimum in minimum_versions().items():
        found = versions.get(name)
        if found is None:
            out.append(f"{name} missing (needs >= {minimum})")
        elif version_tuple(found) < version_tuple(minimum):
            out.append(f"{name} {found} < {minimum}")
    return out


def distribution(wheel: str) -> str:
    """'.../orbax_checkpoint-0.12.8-py3-none-any.whl' -> 'orbax-checkpoint'."""
    return os.path.basename(wheel).split("-")[0].replace("_", "-").lower()
