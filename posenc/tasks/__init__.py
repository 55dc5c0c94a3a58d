"""Deterministic synthetic tasks and text for length-extrapolation studies.

    import posenc.tasks as tasks
    task = tasks.make("copy", seed=0, alphabet=16)
    b = task.batch(jax.random.key(0), 32, 64)                  # training sizes smallest..max_size(64)
    b = task.batch(key, 32, 256, split="eval")                 # every example at max_size(256)
    b["inputs"], b["targets"]: int32 [B, L]; b["mask"]: float32 [B, L], 1.0 on answer tokens

Every task has ``name``, ``vocab_size`` (specials included), ``level``
("R", "DCF", "CS" or None), ``source``, ``batch(key, batch_size, length, *,
min_size=None, split="train")``, ``max_size(length)``, ``min_length()``,
``metadata()``, ``options()`` and ``with_options(**overrides)``; a task
with an ``eval_sweep`` (passkey depth, flip-flop ignore probability) lists
its sweep points with ``sweep()``. The registry (:mod:`posenc.tasks.registry`)
is read off the task classes: ``TASKS`` maps every name (aliases included)
to its description, ``spec(name)`` gives its source, level and options.

Families: :mod:`~posenc.tasks.synthetic` (copy, reverse, sort, parity),
:mod:`~posenc.tasks.algorithmic` (recall), :mod:`~posenc.tasks.arithmetic`
(addition in the papers' formats, with index hints or coupled positions;
multi-operand addition) and :mod:`~posenc.tasks.multiplication`, the Chomsky hierarchy
of Delétang et al. 2023 (:mod:`~posenc.tasks.chomsky_regular`,
:mod:`~posenc.tasks.chomsky_dcf`, :mod:`~posenc.tasks.chomsky_cs`),
Kazemnejad et al. 2023 (:mod:`~posenc.tasks.kazemnejad`), recall and state
tracking (:mod:`~posenc.tasks.recall_tasks`), :mod:`~posenc.tasks.passkey`
and :mod:`~posenc.tasks.text`. Token ids: :mod:`posenc.tasks.base`.
"""

from __future__ import annotations

import importlib
import pkgutil

from posenc.tasks.base import BOS, EOS, FIRST_SYMBOL, NUM_SPECIAL, PAD, SEP, SPLITS, Task
from posenc.tasks.registry import LEVELS, TASKS, make, spec, task_class

# Family modules in the order TASKS lists them; any other module of the
# package is imported after them, so a new file of task classes needs no edit here.
_FAMILIES = ("synthetic", "algorithmic", "arithmetic", "multiplication", "chomsky_regular", "chomsky_dcf",
             "chomsky_cs", "kazemnejad", "recall_tasks", "passkey", "text")
_MODULES = sorted(m.name for m in pkgutil.iter_modules(__path__))
for _module in (*(m for m in _FAMILIES if m in _MODULES), *_MODULES):
    importlib.import_module(f"{__name__}.{_module}")

from posenc.tasks.algorithmic import Recall  # noqa: E402
from posenc.tasks.arithmetic import PLUS, Addition, MultiAddition  # noqa: E402
from posenc.tasks.multiplication import Multiplication  # noqa: E402
from posenc.tasks.synthetic import Copy, Parity, Reverse, Sort  # noqa: E402
from posenc.tasks.text import Text  # noqa: E402

__all__ = [
    "TASKS", "LEVELS", "make", "spec", "task_class", "Task", "Copy", "Reverse", "Recall", "Sort", "Addition",
    "MultiAddition", "Multiplication", "Parity", "Text", "PAD", "BOS", "SEP", "EOS", "PLUS", "FIRST_SYMBOL",
    "NUM_SPECIAL", "SPLITS",
]
