"""passkey: a number hidden at a chosen depth in repeated filler text (Mohtashami & Jaggi 2023).

The prompt of epfml/landmark-attention ``llama/run_test.py``
(``generate_prompt``), byte for byte, followed by the key (the first line
is :data:`DESCRIPTION`, one line in the prompt)::

    There is an important info hidden inside a lot of irrelevant text. Find it and
        memorize them. I will quiz you about the important information there.
    <prefix: the first n_prefix characters of the filler>
    The pass key is 12345. Remember it. 12345 is the pass key.
    <suffix: the first n - n_prefix characters of the filler>
    What is the pass key? The pass key is 12345

The filler is "The grass is green. The sky is blue. The sun is yellow. Here
we go. There and back again." repeated with single spaces; the key is
uniform in [1, 50000] (written without leading zeros, 1 to 5 digits); its
digits after the final "is " are the answer tokens. Size n is the number
of filler characters (the original's ``n_garbage``), so
``seq_len(n) = n + 253`` at most (5-digit keys; shorter keys end earlier,
padded).

Depth: ``n_prefix`` is uniform in ``[0, n]`` as in the original
(``depth=None``, the default, for training), or ``round(depth * n)`` for
a fixed ``depth`` in [0, 1] (0: the key right after the instructions, 1:
right before the question). ``eval_sweep`` sweeps depth over 0, 0.25,
0.5, 0.75 and 1 (see :meth:`posenc.tasks.registry.Registered.sweep`).

Tokens are raw bytes (ids 0-255, vocabulary 256, padding with NUL), the
vocabulary of the ``text`` task, so a byte-level language model trained on
``text`` can be scored on passkey (e.g. after RoPE context extension).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.tasks.base import WORD, Task, gather, uniform

DESCRIPTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
               "I will quiz you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"
MAX_KEY = 50000
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _bytes(text):
    return jnp.asarray(np.frombuffer(text.encode("ascii"), np.uint8).astype(np.int32))


class Passkey(Task):
    """passkey: retrieve a 1-5 digit key hidden at a depth of n filler characters (module docstring)."""

    names = ("passkey",)
    description = "byte-level passkey retrieval: a number hidden at a depth in n characters of filler"
    source = "Mohtashami & Jaggi 2023; epfml/landmark-attention llama/run_test.py generate_prompt"
    eval_sweep = {"depth": DEPTHS}
    traced_options = ("depth",)  # the depth sweep shares one evaluation program per length
    smallest = 0
    symbols = ()

    def __init__(self, *, depth: float | None = None, seed: int = 0):
        self.depth = None if depth is None else checks.number("depth", depth, minimum=0.0, maximum=1.0)
        super().__init__(seed=seed)

    @property
    def vocab_size(self) -> int:
        return 256

    def render(self, ids) -> str:
        return bytes(int(i) for i in np.asarray(ids).ravel()).decode("ascii", "replace")

    @property
    def law(self) -> str:
        return f"n + {self.seq_len(0)}"

    def seq_len(self, n: int) -> int:
        # description \n prefix \n info \n suffix \n question, " ", the key.
        digits = len(str(MAX_KEY))
        info = len(_info("9" * digits))
        return len(DESCRIPTION) + 1 + n + 1 + info + 1 + 1 + len(QUESTION) + 1 + digits

    def _bounds(self, max_n):
        return [MAX_KEY, WORD]

    def _example(self, draws, n, max_n, width):
        key = 1 + draws[0]
        digits = jnp.sum((key >= 10 ** jnp.arange(5)).astype(jnp.int32))
        key_chars = 48 + (key // 10 ** jnp.maximum(digits - 1 - jnp.arange(5), 0)) % 10
        prefix = uniform(draws[1], 0, n) if self.depth is None else jnp.round(self.depth * n).astype(jnp.int32)
        pieces = [
            (_bytes(DESCRIPTION + "\n"), None),
            ("filler", prefix),
            (_bytes("\nThe pass key is "), None), ("key", None), (_bytes(". Remember it. "), None), ("key", None),
            (_bytes(" is the pass key.\n"), None),
            ("filler", n - prefix),
            (_bytes("\n" + QUESTION + " "), None), ("answer", None),
        ]
        filler = _bytes(FILLER + " ")
        pos = jnp.arange(width)
        tokens = jnp.zeros(width, jnp.int32)
        answer = jnp.zeros(width, bool)
        offset = 0
        for ids, count in pieces:
            if isinstance(ids, str) and ids == "filler":
                values = gather(filler, (pos - offset) % filler.shape[0])
            elif isinstance(ids, str):
                values, count = gather(key_chars, pos - offset), digits
            else:
                values, count = gather(ids, pos - offset), ids.shape[0]
            inside = (pos >= offset) & (pos < offset + count)
            tokens = jnp.where(inside, values, tokens)
            if isinstance(ids, str) and ids == "answer":
                answer = inside
            offset = offset + count
        return tokens, answer


def _info(key: str) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key."


__all__ = ["Passkey", "DESCRIPTION", "FILLER", "QUESTION", "DEPTHS"]
