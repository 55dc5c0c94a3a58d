"""Argument checks shared by every module: each returns the clean value or raises ValueError.

Messages name the argument, the bad value and what is allowed, e.g.
``ValueError("num_buckets must be an integer >= 2; got 0")``. Only concrete
(Python / NumPy) values are inspected; callers skip traced values.

    integer("num_heads", 4, minimum=1) -> 4
    number("eps", 1e-6, positive=True) -> 1e-06
    choice("layout", "half", ("half", "interleaved")) -> "half"
    no_extra("frequencies('linear')", {"beta_fast": 32.0}, allowed=("base", "factor"))  # ValueError
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any


def is_int(value) -> bool:
    """True for Python / NumPy integers, never for bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """True for Python / NumPy real numbers (ints included) and concrete 0-d real arrays, never for bool."""
    if isinstance(value, (bool,)) or type(value).__name__ == "bool_":
        return False
    if isinstance(value, numbers.Real):
        return True
    # a concrete 0-d NumPy / JAX array of a real dtype (traced values are never inspected)
    dtype = getattr(value, "dtype", None)
    return (getattr(value, "ndim", None) == 0 and dtype is not None and dtype.kind in "iuf"
            and not type(value).__name__.endswith("Tracer"))


def static(name: str, value) -> None:
    """ValueError if ``value`` is a traced array (inside jit / vmap / grad): hyper-parameters that
    set a program's shapes or constants must be Python numbers known when it is traced."""
    if "Tracer" in type(value).__name__:
        raise ValueError(f"{name} must be a static Python number, known when the program is traced; got a "
                         f"traced value ({type(value).__name__}): pass it outside jax.jit, or as a static "
                         "argument (static_argnames)")


def integer(name: str, value, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``int(value)`` if it is an integer in ``[minimum, maximum]``, else ValueError."""
    static(name, value)
    if not is_int(value) or (minimum is not None and value < minimum) or (
            maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {_int_range(minimum, maximum)}; got {value!r}")
    return int(value)


def _int_range(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an integer >= {minimum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return "an integer"


def number(name: str, value, *, positive: bool = False, minimum: float | None = None,
           maximum: float | None = None, below: float | None = None) -> float:
    """``float(value)`` if it is a finite real number in range, else ValueError.

    ``positive``: > 0; ``minimum`` / ``maximum``: inclusive bounds; ``below``:
    exclusive upper bound.
    """
    static(name, value)
    ok = is_real(value) and math.isfinite(float(value))
    if ok:
        value = float(value)
    if ok and positive and not value > 0:
        ok = False
    if ok and minimum is not None and value < minimum:
        ok = False
    if ok and maximum is not None and value > maximum:
        ok = False
    if ok and below is not None and not value < below:
        ok = False
    if not ok:
        parts = ["a finite number"]
        if positive:
            parts.append("> 0")
        if minimum is not None:
            parts.append(f">= {minimum}")
        if maximum is not None:
            parts.append(f"<= {maximum}")
        if below is not None:
            parts.append(f"< {below}")
        raise ValueError(f"{name} must be {' '.join(parts)}; got {value!r}")
    return float(value)


def boolean(name: str, value) -> bool:
    """``value`` if it is True or False (NumPy bools included), else ValueError."""
    if not isinstance(value, (bool,)) and type(value).__name__ != "bool_":
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return bool(value)


def choice(name: str, value, allowed: Iterable[str]) -> str:
    """``value`` if it is one of ``allowed``; else ValueError listing them (sorted)."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; choose one of: {', '.join(sorted(allowed))}")
    return value


def no_extra(where: str, given: dict, *, allowed: Iterable[str]) -> None:
    """ValueError if ``given`` has a key outside ``allowed`` (a keyword the callee does not use)."""
    allowed = tuple(allowed)
    extra = sorted(k for k in given if k not in allowed)
    if extra:
        takes = ", ".join(allowed) if allowed else "no keywords"
        raise ValueError(f"{where} does not use {', '.join(extra)}; it takes: {takes}")


# Field checks: ``check(full field name, value) -> clean value``, or ValueError naming the field
# (the checks of config fields and of model units' options, posenc.config.schema.Field).
Check = Callable[[str, Any], Any]


def positive_int(name, value) -> int:
    return integer(name, value, minimum=1)


def nonnegative_int(name, value) -> int:
    return integer(name, value, minimum=0)


def positive(name, value) -> float:
    return number(name, value, positive=True)


def nonnegative(name, value) -> float:
    return number(name, value, minimum=0.0)


def one_of(*allowed: str) -> Check:
    """A check accepting exactly the strings ``allowed``."""

    def check(name, value):
        return choice(name, value, allowed)

    return check


def optional(check: Check) -> Check:
    """``check``, but None is accepted (and kept)."""

    def wrapped(name, value):
        return None if value is None else check(name, value)

    return wrapped


def positive_floats(name, value) -> tuple[float, ...]:
    """A tuple (or list) of positive finite numbers, e.g. LongRoPE's factors."""
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of positive numbers; got {value!r}")
    return tuple(number(f"{name}[{i}]", v, positive=True) for i, v in enumerate(value))
