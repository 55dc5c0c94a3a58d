"""Orbax checkpoints of the ``(model, optimizer)`` state plus a JSON record.

Each checkpoint ``DIR/<step>/`` holds ``state`` (the pure-dict form of the
nnx state: parameters, optimizer moments and step count) and ``record``
(JSON: step, train metrics, cumulative train seconds). Orbax writes to a
temporary directory and renames it when complete, so a killed save never
leaves a half checkpoint behind; the newest ``max_to_keep`` are kept.
Saving is synchronous so a checkpoint exists on disk when ``save`` returns.

Sharded states (several devices, :mod:`posenc.training.sharding`) are saved
collectively: with several processes every process calls ``save`` and
Orbax writes each array's shards once. ``restore`` places every array with
the sharding of the template ``state``, so a checkpoint written on N devices
(replicated or FSDP-sharded) restores on M devices, e.g. 4 -> 1 and 1 -> 4.
"""

from __future__ import annotations

import contextlib
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx


@contextlib.contextmanager
def _quiet():
    # Orbax logs every file operation at INFO through absl; keep run logs readable.
    level = logging.get_verbosity()
    logging.set_verbosity(logging.WARNING)
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_savable(tree):
    # Typed PRNG keys (e.g. dropout streams) are stored as their raw uint32 data.
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _from_savable(tree, template):
    return jax.tree.map(
        lambda x, t: jax.random.wrap_key_data(x, impl=jax.random.key_impl(t)) if _is_key(t) else x,
        tree, template,
    )


def _abstract(x):
    # The restore target of one leaf: its shape, dtype and (for jax arrays) the sharding
    # it should land in, whatever the sharding it was saved with.
    raw = jax.random.key_data(x) if _is_key(x) else x
    if isinstance(raw, jax.Array):
        return jax.ShapeDtypeStruct(raw.shape, raw.dtype, sharding=raw.sharding)
    return np.zeros(np.shape(raw), np.asarray(raw).dtype)


class Checkpointer:
    """Save / restore nnx state by step under ``directory`` (keeps the last ``max_to_keep``)."""

    def __init__(self, directory: str, *, max_to_keep: int = 2):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = os.path.abspath(directory)
        with _quiet():
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
                ),
            )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: nnx.State, record: dict) -> None:
        """Write ``state`` and the JSON ``record`` as checkpoint ``step``."""
        pure = _to_savable(nnx.to_pure_dict(state))
        with _quiet():
            self._manager.save(
                int(step),
                args=ocp.args.Composite(state=ocp.args.StandardSave(pure), record=ocp.args.JsonSave(record)),
                force=True,
            )
            self._manager.wait_until_finished()

    def restore(self, state: nnx.State, step: int | None = None) -> tuple[nnx.State, dict]:
        """``(state, record)`` of checkpoint ``step`` (newest if None); ``state`` is the template."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"no checkpoint in {self.directory}")
        template = nnx.to_pure_dict(state)
        abstract = jax.tree.map(_abstract, template)
        with _quiet():
            restored = self._manager.restore(
                int(step),
                args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), record=ocp.args.JsonRestore()),
            )
        pure = _from_savable(restored["state"], template)
        nnx.replace_by_pure_dict(state, pure)
        return state, dict(restored["record"])

    def close(self) -> None:
        with _quiet():
            self._manager.close()
