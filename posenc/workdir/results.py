"""Results: one JSON row per (run, eval length), atomic JSONL files, config hashes.

A row holds at least :data:`REQUIRED_FIELDS`. Metrics that do not apply
(e.g. a learned table evaluated past its rows) are ``null`` and the row says
why in ``not_applicable``. Files are replaced atomically (write a temporary
file in the same directory, fsync, ``os.replace``): a killed writer leaves
the previous file intact, and rows are keyed by ``(config_hash,
eval_variant, eval_length)`` so a rerun never duplicates them. The config hash
leaves out ``eval.*``: a trained run evaluated again (other lengths, variants)
adds rows under the same hash, and replaces those of a length evaluated again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from posenc.workdir import files

REQUIRED_FIELDS = (
    "task", "position", "norm", "placement", "seed", "train_length", "eval_length",
    "loss", "accuracy", "exact_match", "steps", "config_hash",
)
METRICS = ("loss", "accuracy", "exact_match")

# Fields that say where or how verbosely a run happens, not what it computes.
VOLATILE_FIELDS = (
    "workdir", "name", "mesh",  # the device layout is not the experiment
    "train.checkpoint_every", "train.keep_checkpoints", "train.log_every",
    "train.tensorboard", "train.progress", "train.max_steps_this_run",
    "train.steps_per_call",  # bit-identical results for every value: only the speed changes
)


def _to_dict(config) -> dict:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _drop(d: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        d = d.get(p)
        if not isinstance(d, dict):
            return
    d.pop(last, None)


def canonical_json(obj) -> str:
    """Sorted-key compact JSON; tuples become lists (stable across reloads)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=files.json_default)


# The evaluation: what is measured of a trained model, not which model is trained. A run
# evaluated again at other lengths or variants (the same command with other eval.* fields)
# keeps its identity, its checkpoints and its rows, and adds rows.
EVALUATION_FIELDS = ("eval",)


def config_hash(config) -> str:
    """sha256 (hex) of the canonical JSON of ``config`` minus :data:`VOLATILE_FIELDS` and
    :data:`EVALUATION_FIELDS`: the identity of the trained model."""
    d = json.loads(canonical_json(_to_dict(config)))
    for f in VOLATILE_FIELDS + EVALUATION_FIELDS:
        _drop(d, f)
    return hashlib.sha256(canonical_json(d).encode()).hexdigest()


def validate_row(row: dict) -> dict:
    """Return ``row`` if it has every required field with a sensible type, else raise ValueError."""
    missing = [f for f in REQUIRED_FIELDS if f not in row]
    if missing:
        raise ValueError(f"results row is missing fields {missing}; required: {', '.join(REQUIRED_FIELDS)}")
    for f in ("seed", "train_length", "eval_length", "steps"):
        if not isinstance(row[f], int) or isinstance(row[f], bool):
            raise ValueError(f"results field {f!r} must be an int, got {row[f]!r}")
    for f in METRICS:
        if row[f] is not None and not isinstance(row[f], (int, float)):
            raise ValueError(f"results field {f!r} must be a number or null, got {row[f]!r}")
    if not (isinstance(row["config_hash"], str) and len(row["config_hash"]) == 64):
        raise ValueError(f"config_hash must be a 64-character sha256 hex string, got {row['config_hash']!r}")
    return row


def make_row(**fields) -> dict:
    """A validated, JSON-clean results row."""
    return validate_row(files._clean(dict(fields)))


def row_key(row: dict) -> tuple:
    """(config_hash, eval_variant, eval_length, sweep point[, checkpoint]): one row per key in a results
    file; ``checkpoint`` where a run reports two (``posenc.training.selection``: last, best_long_val)."""
    key = (row["config_hash"], row.get("eval_variant"), row["eval_length"], canonical_json(row.get("sweep")))
    return key + (row["checkpoint"],) if row.get("checkpoint") else key


def merge_rows(old: Iterable[dict], new: Iterable[dict]) -> list[dict]:
    """Rows of ``old`` and ``new`` with one row per key; ``new`` wins, order kept."""
    merged: dict[tuple, dict] = {}
    for r in list(old) + list(new):
        merged[row_key(r)] = r
    return list(merged.values())


def atomic_write_text(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (:func:`posenc.workdir.files.atomic_write`)."""
    files.atomic_write(path, text)
