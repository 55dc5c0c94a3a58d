"""Deterministic synthetic tasks and byte-level text for length-extrapolation studies.

    import posenc.tasks as tasks
    task = tasks.make("copy", seed=0, alphabet=16)
    b = task.batch(jax.random.key(0), 32, 64)                  # training sizes 1..max_size(64)
    b = task.batch(key, 32, 256, split="eval")                 # every example at max_size(256)
    b["inputs"], b["targets"]: int32 [B, L]; b["mask"]: float32 [B, L], 1.0 on answer tokens

Every task has ``name``, ``vocab_size`` (specials included), ``batch(key,
batch_size, length, *, min_size=None, split="train")``, ``max_size(length)``
and ``metadata()``. Formats and token ids: :mod:`posenc.tasks.base`,
:mod:`posenc.tasks.synthetic`, :mod:`posenc.tasks.algorithmic`,
:mod:`posenc.tasks.text`.
"""

from __future__ import annotations

from posenc.tasks.algorithmic import PLUS, Addition, Recall
from posenc.tasks.base import BOS, EOS, FIRST_SYMBOL, NUM_SPECIAL, PAD, SEP, SPLITS, Task
from posenc.tasks.synthetic import Copy, Parity, Reverse, Sort
from posenc.tasks.text import Text

_CLASSES = {cls.name: cls for cls in (Copy, Reverse, Recall, Sort, Addition, Parity, Text)}

TASKS: dict[str, str] = {
    "copy": "BOS x SEP x: copy a string of `alphabet` symbols",
    "reverse": "BOS x SEP reversed(x)",
    "recall": "associative recall: BOS k1 v1 .. kn vn SEP then each key queried, answer its value",
    "sort": "BOS x SEP sorted(x)",
    "addition": "BOS a + b = c EOS, n-digit operands, sum digits reversed by default",
    "parity": "BOS bits SEP parity bit (negative control: does not extrapolate)",
    "text": "byte-level language modelling on the Python stdlib source (hash in metadata)",
}

_OPTIONS = {
    "copy": ("alphabet",),
    "reverse": ("alphabet",),
    "sort": ("alphabet",),
    "recall": ("keys", "values"),
    "addition": ("reverse_output", "reverse_operands"),
    "parity": (),
    "text": ("max_bytes", "eval_fraction"),
}


def make(name: str, *, seed: int = 0, **options):
    """The task ``name`` (one of ``TASKS``) with its ``options``; ValueError on a bad name or option."""
    if name not in _CLASSES:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    allowed = _OPTIONS[name]
    for option in options:
        if option not in allowed:
            raise ValueError(
                f"unknown option {option!r} for task {name!r}; choose from: "
                f"{', '.join(allowed) if allowed else '(none)'}"
            )
    return _CLASSES[name](seed=seed, **options)


__all__ = [
    "TASKS", "make", "Task", "Copy", "Reverse", "Recall", "Sort", "Addition", "Parity", "Text",
    "PAD", "BOS", "SEP", "EOS", "PLUS", "FIRST_SYMBOL", "NUM_SPECIAL", "SPLITS",
]
