"""Training, checkpoints, length evaluation and results for posenc decoders.

    from posenc.training import run
    rows = run(config, "/tmp/run")       # validate, train, checkpoint, resume, evaluate, write results

Modules, one concern each: :mod:`~posenc.training.prepare` (validate a config
once, resolve it, claim a workdir), :mod:`~posenc.training.steploop` (the
step loop shared by every trainer), :mod:`~posenc.training.loop` (one run),
:mod:`~posenc.training.multiseed` (seeds vmapped together),
:mod:`~posenc.training.finish` (a run's result rows),
:mod:`~posenc.training.step` (jitted functional steps),
:mod:`~posenc.training.optim`, :mod:`~posenc.training.evaluate` (length
evaluation, with :mod:`~posenc.training.eval_step` and
:mod:`~posenc.training.decode`). What a run leaves on disk (lock,
checkpoints, records, result rows, atomic files) is :mod:`posenc.workdir`.
"""

from posenc.training.loop import run
from posenc.training.prepare import ConfigError, Resolved, resolve

__all__ = ["run", "resolve", "Resolved", "ConfigError"]
