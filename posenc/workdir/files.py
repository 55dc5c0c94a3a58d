"""Files written atomically, and the temporary files a killed writer leaves behind.

Every file posenc writes (results, configs, logs, tables, figures) goes
through :func:`atomic_write`: the content goes to a temporary file in the
same directory, is flushed and fsync-ed, then ``os.replace``-d over the
target, so a reader sees the old file or the new one, never a part. A
writer killed in between (SIGKILL) leaves its temporary file; the name
carries the writer's pid (``.<name>.<pid>.<random>.tmp``), so
:func:`remove_stale_temps` can tell a dead writer's leftovers from a live
one's and removes them when a run or study starts again.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable

_TEMP = re.compile(r"^\..+\.(\d+)\.[^.]+\.tmp$")


def _clean(value):
    # JSON has no NaN / Infinity: store them as null (json.dumps would write invalid JSON otherwise).
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return _clean(value.item())
    return value


def json_default(o):
    """``json.dumps``'s ``default``: arrays as lists, ConfigDicts as dicts."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def atomic_write(path: str, content: str | bytes | Callable) -> str:
    """Replace ``path`` with ``content`` atomically; returns ``path`` (mode 0666 less the umask).

    ``content``: text, bytes, or ``write(file)`` called with the temporary
    file opened in binary mode (e.g. ``lambda f: fig.savefig(f, format="png")``).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{os.getpid()}.", suffix=".tmp",
                               dir=directory)
    try:
        # mkstemp makes the file 0600; the file it becomes gets what open() would give it
        # (0666 less the umask), so colleagues on a shared filesystem can read results
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str, obj) -> str:
    """Atomically write ``obj`` as indented, sorted JSON (NaN / Inf as null)."""
    return atomic_write(path, json.dumps(_clean(obj), indent=2, sort_keys=True, default=json_default) + "\n")


def write_jsonl(path: str, rows: Iterable[dict]) -> str:
    """Atomically write ``rows`` (one JSON object per line) to ``path``."""
    return atomic_write(path, "".join(json.dumps(_clean(r), sort_keys=True, default=json_default) + "\n"
                                      for r in rows))


def read_jsonl(path: str) -> list[dict]:
    """Rows of a JSONL file; ``[]`` if it does not exist."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_json(path: str, default=None):
    """The JSON value in ``path``, or ``default`` if there is no such file."""
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temps(directory: str) -> list[str]:
    """Temporary files of :func:`atomic_write` under ``directory`` whose writer is no longer running."""
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            m = _TEMP.match(name)
            if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
                found.append(os.path.join(root, name))
    return found


def remove_stale_temps(directory: str) -> list[str]:
    """Remove what killed writers left under ``directory`` (see :func:`stale_temps`); returns the paths."""
    removed = []
    for path in stale_temps(directory):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed
