"""What a run or a study leaves in its workdir, and how it gets there safely.

One concern per module: :mod:`~posenc.workdir.files` (every file written
atomically; a killed writer's temporary files cleaned up),
:mod:`~posenc.workdir.lock` (one process per workdir),
:mod:`~posenc.workdir.checkpoint` (Orbax checkpoints),
:mod:`~posenc.workdir.records` (checkpoint records and a run's train log,
resumed where a killed run stopped) and :mod:`~posenc.workdir.results`
(result rows, their schema and the config hash that names a run).

This package knows nothing of models or training: it stores what the
training layer hands it.
"""
