"""The task registry: each task class declares its names, description, source, level and options.

A class joins the registry by setting ``names`` (its registry name first,
then aliases) in its own body, together with a one-line ``description`` and
its ``source`` (paper and code the definition follows); ``level`` is its
Chomsky-hierarchy class where it has one (:data:`LEVELS`). Its options are
the keyword-only parameters of its ``__init__`` (``seed`` excluded), with
their defaults, so the registry, :data:`TASKS`, option validation and
:func:`spec` are read off the classes and never kept in a second table::

    class Palindrome(Task):
        names = ("palindrome",)
        description = "BOS x SEP (1 if x reads the same backwards)"
        source = "..."
        level = "CS"

        def __init__(self, *, alphabet: int = 2, seed: int = 0): ...

``suite`` names the published suite a task belongs to (``"chomsky"``: the
15 tasks of Delétang et al. 2023; Kazemnejad et al.'s reverse and sort have a
hierarchy level but are not of it).

Evaluation sweeps: ``eval_sweep = {"depth": (0.0, 0.5, 1.0)}`` names an
option and the values evaluation should try; :meth:`Registered.sweep` makes
the task at each value (``with_options``), so every point is an ordinary
task with its own ``options()`` and ``metadata()``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping

LEVELS = {"R": "regular", "DCF": "deterministic context-free", "CS": "context-sensitive"}

_REGISTRY: dict[str, type] = {}


class Registered:
    """Mixin of every task: registry names, description, source, level, options and sweeps."""

    names: tuple[str, ...] = ()
    name: str = ""
    description: str = ""
    source: str = ""
    level: str | None = None
    suite: str | None = None  # the task suite it belongs to ("chomsky": the 15 tasks of Deletang et al.)
    eval_sweep: dict = {}
    # float options the batch functions read only in jax arithmetic, so they may be traced scalars:
    # an evaluation program takes them as arguments, and the sweep points over them share it
    traced_options: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("names")
        if not own:
            return
        if isinstance(own, str) or not all(isinstance(n, str) and n for n in own):
            raise TypeError(f"{cls.__name__}.names must be a tuple of names, got {own!r}")
        for attr in ("description", "source"):
            if not cls.__dict__.get(attr):
                raise TypeError(f"task class {cls.__name__} must declare its own {attr}")
        if cls.level is not None and cls.level not in LEVELS:
            raise TypeError(f"{cls.__name__}.level {cls.level!r}; choose one of: {', '.join(LEVELS)} or None")
        defaults = cls.option_defaults()
        for option, values in cls.eval_sweep.items():
            if option not in defaults or not isinstance(values, tuple) or not values:
                raise TypeError(f"{cls.__name__}.eval_sweep[{option!r}] must be a non-empty tuple "
                                f"of values of one of its options ({', '.join(defaults) or 'none'})")
        for option in cls.traced_options:
            if option not in defaults:
                raise TypeError(f"{cls.__name__}.traced_options names {option!r}, not one of its options "
                                f"({', '.join(defaults) or 'none'})")
        for n in own:  # all names are checked before any is registered
            other = _REGISTRY.get(n)
            if other is not None and other.__qualname__ != cls.__qualname__:
                raise TypeError(f"task name {n!r} is declared by both {other.__name__} and {cls.__name__}")
        _REGISTRY.update(dict.fromkeys(own, cls))
        cls.name = own[0]

    @classmethod
    def option_defaults(cls) -> dict:
        """``{option: default}``: the keyword-only parameters of ``__init__`` except ``seed``."""
        params = inspect.signature(cls.__init__).parameters.values()
        return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.name != "seed"}

    def options(self) -> dict:
        """The task's options as made (each is stored as the attribute of the same name)."""
        return {k: getattr(self, k) for k in self.option_defaults()}

    def with_options(self, **overrides):
        """The same task (name, seed, options) with ``overrides`` replacing some options."""
        return make(self.name, seed=self.seed, **{**self.options(), **overrides})

    def with_traced(self, values: dict):
        """A copy of the task whose ``traced_options`` in ``values`` are the given (traced) scalars.

        Only the batch functions of the copy may be used: ``__init__``'s checks do not run.
        """
        bad = sorted(set(values) - set(self.traced_options))
        if bad:
            raise ValueError(f"task {self.name!r}: options {bad} are not traced; traced options: "
                             f"{', '.join(self.traced_options) or 'none'}")
        twin = copy.copy(self)
        for option, value in values.items():
            setattr(twin, option, value)
        return twin

    def sweep(self) -> list:
        """``[(option, value, task)]`` for every value of every option in ``eval_sweep``."""
        return [(option, v, self.with_options(**{option: v}))
                for option, values in self.eval_sweep.items() for v in values]

    def describe(self) -> dict:
        """Name, level, source and options: the facts every ``metadata()`` starts with."""
        return {"name": self.name, "task": type(self).name, "level": self.level,
                "source": self.source, **self.options()}


class _Names(Mapping):
    """Read-only live view ``name -> description`` over the registry (aliases included)."""

    def __getitem__(self, name):
        cls = _REGISTRY[name]
        return cls.description if name == cls.name else f"{cls.description} (same task as {cls.name!r})"

    def __iter__(self):
        return iter(_REGISTRY)

    def __len__(self):
        return len(_REGISTRY)

    def __repr__(self):
        return f"TASKS({', '.join(_REGISTRY)})"


TASKS: Mapping[str, str] = _Names()


def task_class(name: str) -> type:
    """The class registered as ``name``; ValueError listing every name if there is none."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def make(name: str, *, seed: int = 0, **options):
    """The task ``name`` (one of ``TASKS``) with its ``options``; ValueError on a bad name or option."""
    cls = task_class(name)
    allowed = cls.option_defaults()
    for option in options:
        if option not in allowed:
            raise ValueError(
                f"unknown option {option!r} for task {name!r}; choose from: "
                f"{', '.join(allowed) if allowed else '(none)'}"
            )
    task = cls(seed=seed, **options)
    task.name = name  # an alias stays visible in metadata and tables
    return task


def spec(name: str) -> dict:
    """JSON-serialisable facts about task ``name``: names, description, source, level, options, sweep."""
    cls = task_class(name)
    return {
        "name": name,
        "task": cls.name,
        "names": list(cls.names),
        "description": cls.description,
        "source": cls.source,
        "level": cls.level,
        "suite": cls.suite,
        "eval_sizes": getattr(cls, "eval_sizes", None),
        "options": dict(cls.option_defaults()),
        "eval_sweep": {k: list(v) for k, v in cls.eval_sweep.items()},
    }
