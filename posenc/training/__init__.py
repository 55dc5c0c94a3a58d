"""Training, checkpoints, length evaluation and results for posenc decoders.

    from posenc.training import run
    rows = run(config, "/tmp/run")       # train, checkpoint, resume, evaluate, write results

Modules: :mod:`~posenc.training.optim` (AdamW + warmup/cosine + clipping),
:mod:`~posenc.training.step` (jitted functional steps),
:mod:`~posenc.training.loop` (the loop), :mod:`~posenc.training.checkpoint`
(Orbax), :mod:`~posenc.training.evaluate` (length evaluation),
:mod:`~posenc.training.results` (rows, hashes, atomic JSONL) and
:mod:`~posenc.training.report` (table.md and plots).
"""

from posenc.training.loop import NonFiniteError, prepare_config, run, validate_config
from posenc.training.results import config_hash, read_jsonl, write_jsonl

__all__ = ["run", "prepare_config", "validate_config", "NonFiniteError", "config_hash",
           "read_jsonl", "write_jsonl"]
