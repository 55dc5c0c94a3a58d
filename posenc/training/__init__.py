"""Training, checkpoints, length evaluation and results for posenc decoders.

    from posenc.training import run
    rows = run(config, "/tmp/run")       # validate, train, checkpoint, resume, evaluate, write results

Modules, one concern each: :mod:`~posenc.training.prepare` (validate a config
once, resolve it, claim a workdir), :mod:`~posenc.training.steploop` (the
step loop shared by every trainer), :mod:`~posenc.training.loop` (one run),
:mod:`~posenc.training.multiseed` (seeds vmapped together),
:mod:`~posenc.training.records` (checkpoint records and a run's
bookkeeping), :mod:`~posenc.training.finish` (a run's result rows),
:mod:`~posenc.training.step` (jitted functional steps),
:mod:`~posenc.training.optim`, :mod:`~posenc.training.checkpoint` (Orbax),
:mod:`~posenc.training.evaluate` (length evaluation),
:mod:`~posenc.training.results` (rows, hashes, atomic JSONL) and
:mod:`~posenc.training.report` (table.md and plots).
"""

from posenc.training.loop import run
from posenc.training.prepare import ConfigError, Resolved, resolve
from posenc.training.records import NonFiniteError
from posenc.training.results import config_hash, read_jsonl, write_jsonl

__all__ = ["run", "resolve", "Resolved", "ConfigError", "NonFiniteError", "config_hash",
           "read_jsonl", "write_jsonl"]
