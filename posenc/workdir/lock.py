"""One process per workdir, one kind of thing per workdir.

A workdir holds one run (``config.json``) or one study (``study.json``), of
one config: :func:`check_kind` refuses, in one line before anything is
written, a run where a study is, a study where a run is (and the claims of
``prepare.claim`` and the study engine refuse another config).

``with hold(workdir): ...`` takes ``workdir/.lock`` for the block. The lock
is an exclusive ``flock`` on that file, so the kernel releases it the moment
the holding process exits, however it exits (SIGKILL included); the file
records the holder (pid, host, boot id, process start time, command, time
taken) for the message a second process gets::

    WorkdirInUse: /tmp/run is in use by pid 4242 on host lab1 (since
    2026-11-30T10:12:00, `python -m posenc train ...`) ...

A lock file left by a process that is gone (its pid no longer runs on this
host, or now runs another process: the start time differs) is stale: the
next process takes it over with a warning naming the old holder. A holder
on another host cannot be checked from here, so its lock is never taken
over; remove the file by hand once that process is gone. Where the
filesystem has no ``flock`` (``ENOLCK``, ``EOPNOTSUPP``) the record alone
decides, by the same rules (best effort: two processes starting in the same
instant could both take it). Holding is reentrant within one process (a
grid holds its workdir while its runs hold theirs); :func:`ensure_held`
(used by ``setup.claim``) takes a lock that is kept until the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time

from absl import logging

LOCK_NAME = ".lock"
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_HELD: dict[str, list] = {}  # lock path -> [fd, depth] of the locks this process holds
_UNTIL_EXIT: set[str] = set()  # taken by ensure_held: released at exit
_GUARD = threading.RLock()


class WorkdirInUse(RuntimeError):
    """Another live process holds the workdir (the message names it)."""


RUN_FILE = "config.json"  # a run's workdir: its config and hash
STUDY_FILE = "study.json"  # a study's workdir: the study, its config and points
MARKERS = {"run": RUN_FILE, "study": STUDY_FILE}


class WorkdirHoldsOther(ValueError):
    """The workdir holds another kind of thing or another config (the message says what, and what to do)."""


def _rows(workdir: str) -> int:
    try:
        with open(os.path.join(workdir, "results.jsonl")) as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def held_kind(workdir: str) -> str | None:
    """"run" or "study" if ``workdir`` holds one (its marker file), else None."""
    for kind, marker in MARKERS.items():
        if os.path.exists(os.path.join(workdir, marker)):
            return kind
    return None


def describe_contents(workdir: str) -> str:
    """What ``workdir`` holds, for a message: 'a run (config.json, 4 result rows)', 'the compare study
    (study.json, 8 result rows)' or 'nothing posenc wrote'."""
    kind = held_kind(workdir)
    if kind is None:
        return "nothing posenc wrote"
    rows = _rows(workdir)
    if kind == "run":
        return f"a run ({RUN_FILE}, {rows} result rows)"
    try:
        with open(os.path.join(workdir, STUDY_FILE)) as f:
            name = json.load(f).get("study") or "a"
    except (OSError, ValueError):
        name = "a"
    return f"{'the ' + name if name != 'a' else 'a'} study ({STUDY_FILE}, {rows} result rows)"


def check_kind(workdir: str, kind: str) -> None:
    """WorkdirHoldsOther if ``workdir`` holds the other kind of thing than ``kind`` ("run" | "study")."""
    held = held_kind(workdir)
    if held is not None and held != kind:
        raise WorkdirHoldsOther(f"{workdir} holds {describe_contents(workdir)}; a {kind} needs a workdir of "
                                f"its own: use another --workdir (or remove this one)")


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    # Field 22 of /proc/<pid>/stat: the process start time in clock ticks since boot. With the
    # boot id it tells a reused pid from the holder itself.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def holder_record() -> dict:
    """This process as a lock holder: pid, host, boot id, start ticks, command, time."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "boot_id": _boot_id(),
            "start_ticks": _start_ticks(pid), "command": " ".join(sys.argv),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def holder_alive(holder: dict) -> bool | None:
    """True / False when ``holder`` is / is not a running process of this host; None if unknowable."""
    if holder.get("host") != socket.gethostname():
        return None
    boot = _boot_id()
    if boot is not None and holder.get("boot_id") not in (None, boot):
        return False  # recorded before the last reboot
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    ticks = holder.get("start_ticks")
    return ticks is None or _start_ticks(pid) in (None, ticks)


def describe(holder: dict | None) -> str:
    if not holder:
        return "a process that has not written its record yet"
    return (f"pid {holder.get('pid')} on host {holder.get('host')} (since {holder.get('since')}, "
            f"`{holder.get('command', '')}`)")


def _read(fd: int) -> dict | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 1 << 16)
        holder = json.loads(data) if data.strip() else None
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        return None


def _busy(path: str, holder: dict | None, why: str) -> WorkdirInUse:
    workdir = os.path.dirname(path)
    return WorkdirInUse(
        f"{workdir} is in use by {describe(holder)}: {why}; a second run there would overwrite its "
        f"checkpoints and results. Wait for it to finish or use another --workdir; if that process "
        f"is gone, delete {path}.")


def _flock(fd: int) -> bool | None:
    """True: locked; False: another open file holds it; None: the filesystem has no flock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in _NO_FLOCK:
            return None
        raise


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _is_me(holder: dict) -> bool:
    me = holder_record()
    return all(holder.get(k) == me[k] for k in ("pid", "host", "boot_id", "start_ticks"))


def _acquire(path: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locked = _flock(fd)
            if locked is False:
                # Give a holder that has just created the file a moment to write its record.
                holder = _read(fd)
                for _ in range(20):
                    if holder:
                        break
                    time.sleep(0.05)
                    holder = _read(fd)
                raise _busy(path, holder, "it holds the lock")
            if not _same_file(fd, path):
                os.close(fd)  # released and removed while we opened it: take the new file
                continue
            holder = _read(fd)
            if holder and not _is_me(holder):
                alive = holder_alive(holder)
                if alive is None:
                    raise _busy(path, holder, "its host cannot be checked from here, so the lock "
                                "is kept")
                if alive:
                    raise _busy(path, holder, "that process is still running")
                logging.warning("taking over the stale lock %s of %s: that process is gone", path,
                                describe(holder))
            record = json.dumps(holder_record()).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
            os.fsync(fd)
            return fd
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise


def _lock_path(workdir: str) -> str:
    workdir = os.path.realpath(workdir)
    os.makedirs(workdir, exist_ok=True)
    return os.path.join(workdir, LOCK_NAME)


def acquire(workdir: str, *, wait: float = 0.0) -> str:
    """Take ``workdir``'s lock (creating ``workdir``); :class:`WorkdirInUse` if a live process has it.

    ``wait``: seconds to keep trying first, for locks that other processes
    hold only briefly (a study's processes starting together each check and
    write its ``study.json`` under the lock). Returns the lock path; pair with
    :func:`release`. Reentrant in one process.
    """
    path = _lock_path(workdir)
    deadline = time.monotonic() + wait
    while True:
        try:
            with _GUARD:
                if path in _HELD:
                    _HELD[path][1] += 1
                else:
                    _HELD[path] = [_acquire(path), 1]
            return path
        except WorkdirInUse:
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.05)


def ensure_held(workdir: str) -> str:
    """Hold ``workdir``'s lock if this process does not already; it is then kept until exit.

    For code paths that claim a workdir without a :func:`hold` block around
    the run: the lock still keeps other processes out, and a kill leaves a
    stale lock that the next process takes over.
    """
    path = _lock_path(workdir)
    with _GUARD:
        if path not in _HELD:
            _HELD[path] = [_acquire(path), 1]
            _UNTIL_EXIT.add(path)
    return path


def _release_at_exit() -> None:
    for path in list(_UNTIL_EXIT):
        release(path)


atexit.register(_release_at_exit)


def release(path: str) -> None:
    """Release one hold of ``path``; the last removes the file, then frees the flock."""
    with _GUARD:
        entry = _HELD.get(path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _HELD[path]
        _UNTIL_EXIT.discard(path)
        # Remove while still holding it: a process waiting on the old file then sees it is gone.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(entry[0])


@contextlib.contextmanager
def hold(workdir: str, *, enabled: bool = True, wait: float = 0.0):
    """Hold ``workdir``'s lock for the block (:func:`acquire`, ``wait`` as there; :func:`release`);
    a no-op if not ``enabled``."""
    if not enabled:
        yield None
        return
    path = acquire(workdir, wait=wait)
    try:
        yield path
    finally:
        release(path)
