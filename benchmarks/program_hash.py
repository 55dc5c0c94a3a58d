"""A hash of each benchmark case's compiled train program, debug metadata removed.

    python -m benchmarks.program_hash --case T R

Run it in two checkouts (e.g. a ``git worktree`` of an older commit, with
``PYTHONPATH`` set to it): equal hashes mean the two compile the very same
program for every position of the case (benchmarks/cases.py: rope, alibi,
t5, nope), so their step times, and their ratios against the peer, are equal
by construction; only run-to-run noise separates two timings. Source file
names, line numbers, stack frames and function names are removed before
hashing; the instructions, shapes, layouts and fusions are what is compared.
"""

from __future__ import annotations

import argparse
import hashlib
import re


def normalized(text: str) -> str:
    """The compiled module's text without its debug metadata."""
    text = re.sub(r"metadata=\{[^}]*\}", "", text)
    text = re.sub(r",? ?stack_frame_id=\d+", "", text)
    return "\n".join(line for line in text.splitlines() if not re.match(r"^\d+ ", line))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", default=["T", "R"], choices=("T", "R"))
    parser.add_argument("--steps", type=int, default=10, help="the chunk program's steps per call")
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    from benchmarks import cases, workload
    from posenc.training import step as step_lib

    for case in args.case:
        config = cases.get_config(case)
        for position in config.bench.positions:
            c = workload.config_for(config, position)
            if hasattr(workload, "train_spec"):
                fn = step_lib.train_chunk_fn(workload.train_spec(c), args.steps)
            else:  # checkouts before the train specs (c0b18ce and earlier)
                fn = step_lib.train_chunk_fn(workload.RandomTokens(int(c.model.vocab_size)), c, args.steps)
            _, graphdef, state = workload.fresh_state(c)
            text = fn.lower(graphdef, state, jax.random.key(0), np.int32(0), np.int32(args.steps)).compile().as_text()
            body = normalized(text)
            print(f"case {case} {position}: {hashlib.sha256(body.encode()).hexdigest()[:16]} "
                  f"({len(body.splitlines())} lines)")


if __name__ == "__main__":
    main()
