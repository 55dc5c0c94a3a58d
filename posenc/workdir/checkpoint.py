"""Orbax checkpoints of the ``(model, optimizer)`` state plus a JSON record.

Each checkpoint ``DIR/<step>/`` holds ``state`` (the pure-dict form of the
nnx state: parameters, optimizer moments and step count) and ``record``
(JSON: step, train metrics, cumulative train seconds) and ``integrity``
(JSON: a CRC-32 of every state array's bytes and of the record). Orbax
writes to a temporary directory and renames it when complete, so a killed
save never leaves a half checkpoint behind (temporary directories of killed
saves are removed when the next process opens the directory); the newest
``max_to_keep`` are kept. Saving is synchronous so a checkpoint exists on
disk when ``save`` returns.

Restoring the newest checkpoint checks it against its ``integrity`` record.
If it cannot be read (truncated or corrupted files, a checksum that does
not match), the next older one is tried, with a warning naming both steps,
and the unreadable ones are moved to ``<directory>_unreadable/`` (kept for
inspection, out of the way of the steps that will be saved again). Nothing
is unpickled: arrays are read by TensorStore into the template's shapes,
dtypes and shardings, records are JSON.

Sharded states (several devices, :mod:`posenc.training.sharding`) are saved
collectively: with several processes every process calls ``save`` and
Orbax writes each array's shards once. ``restore`` places every array with
the sharding of the template ``state``, so a checkpoint written on N devices
(replicated or FSDP-sharded) restores on M devices, e.g. 4 -> 1 and 1 -> 4.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import zlib

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


class CheckpointError(ValueError):
    """No checkpoint of a directory can be read (the message lists each step's error)."""


class CorruptCheckpoint(ValueError):
    """A checkpoint's contents do not match its integrity record."""


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def _record_crc(record) -> int:
    return _crc(json.dumps(record, sort_keys=True, separators=(",", ":")).encode())


def _leaf_sums(pure) -> dict | None:
    """``{path: [dtype, shape, crc32]}`` of the savable pure dict; None if some array is not
    fully addressable here (several processes: each holds only its shards)."""
    leaves = jax.tree_util.tree_flatten_with_path(pure)[0]
    if any(isinstance(x, jax.Array) and not x.is_fully_addressable for _, x in leaves):
        return None
    out = {}
    for path, x in leaves:
        a = np.ascontiguousarray(jax.device_get(x))
        out[jax.tree_util.keystr(path)] = [str(a.dtype), list(a.shape), _crc(a.tobytes())]
    return out


def _verify(pure, record, integrity: dict) -> None:
    if integrity.get("record_crc32") is not None and _record_crc(record) != integrity["record_crc32"]:
        raise CorruptCheckpoint("the record does not match its checksum")
    saved = integrity.get("leaves")
    if saved is None:
        return
    now = _leaf_sums(pure)
    if now is None:
        return
    for path in sorted(set(saved) | set(now)):
        if saved.get(path) != now.get(path):
            raise CorruptCheckpoint(f"state array {path} does not match its checksum "
                                    f"(saved {saved.get(path)}, read {now.get(path)})")


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
                    max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False,
                    cleanup_tmp_directories=True,  # half-written saves of killed processes
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
        integrity = {"leaves": _leaf_sums(pure), "record_crc32": _record_crc(record)}
        with _quiet():
            self._manager.save(
                int(step),
                args=ocp.args.Composite(state=ocp.args.StandardSave(pure), record=ocp.args.JsonSave(record),
                                        integrity=ocp.args.JsonSave(integrity)),
                force=True,
            )
            self._manager.wait_until_finished()

    def _restore(self, state: nnx.State, step: int) -> tuple[nnx.State, dict]:
        template = nnx.to_pure_dict(state)
        abstract = jax.tree.map(_abstract, template)
        args = dict(state=ocp.args.StandardRestore(abstract), record=ocp.args.JsonRestore())
        checked = os.path.isdir(os.path.join(self.directory, str(step), "integrity"))
        if checked:  # checkpoints written before integrity records restore unchecked
            args["integrity"] = ocp.args.JsonRestore()
        with _quiet():
            restored = self._manager.restore(int(step), args=ocp.args.Composite(**args))
        record = dict(restored["record"])
        if checked:
            _verify(restored["state"], record, dict(restored["integrity"]))
        nnx.replace_by_pure_dict(state, _from_savable(restored["state"], template))
        return state, record

    def restore(self, state: nnx.State, step: int | None = None) -> tuple[nnx.State, dict]:
        """``(state, record)`` of checkpoint ``step``; ``state`` is the template (filled in place).

        ``step=None``: the newest readable checkpoint; unreadable newer ones are
        warned about (naming both steps) and moved to ``<directory>_unreadable``.
        CheckpointError if none can be read; ``state`` is unchanged then.
        """
        if step is not None:
            return self._restore(state, int(step))
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise ValueError(f"no checkpoint in {self.directory}")
        failed = []
        for s in steps:
            try:
                out = self._restore(state, s)
            except Exception as e:  # noqa: BLE001  (any read error: TensorStore, JSON, checksum)
                failed.append((s, f"{type(e).__name__}: {_first_line(e)}"))
                logging.warning("checkpoint step %d in %s cannot be read (%s)", s, self.directory,
                                failed[-1][1])
                continue
            if failed:
                moved = self._set_aside([f for f, _ in failed])
                logging.warning(
                    "resumed from checkpoint step %d instead of the newest, step %d, which cannot be "
                    "read (%s); unreadable checkpoints moved to %s", s, failed[0][0], failed[0][1],
                    ", ".join(moved))
            return out
        raise CheckpointError(f"no checkpoint in {self.directory} can be read: "
                              + "; ".join(f"step {s}: {why}" for s, why in failed)
                              + ". Remove the directory to start the run over.")

    def _set_aside(self, steps) -> list[str]:
        """Move checkpoints ``steps`` to ``<directory>_unreadable/`` (process 0); their paths."""
        target_root = self.directory + "_unreadable"
        moved = []
        for s in steps:
            target = os.path.join(target_root, str(s))
            n = 1
            while os.path.exists(target):
                target, n = os.path.join(target_root, f"{s}-{n}"), n + 1
            if jax.process_index() == 0:
                os.makedirs(target_root, exist_ok=True)
                shutil.move(os.path.join(self.directory, str(s)), target)
            moved.append(target)
        if jax.process_count() > 1:
            ocp.multihost.sync_global_processes("posenc_checkpoint_set_aside")
        with _quiet():
            self._manager.reload()
        return moved

    def close(self) -> None:
        with _quiet():
            self._manager.close()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""
