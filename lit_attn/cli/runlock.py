"""One writer per run: `main.py fit` holds RUN/.lock, an operating-system file lock, from before it
writes anything until it ends.

The system drops the lock of a process that ends in any way (a kill -9 too), so a lock is never
stale. Who holds it (process, host, since when) is written beside it, in RUN/.lock.holder, for the
message a second writer gets. Readers (validate, test, compare, sample, TensorBoard) never take it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

LOCK_NAME = ".lock"
HOLDER_NAME = ".lock.holder"
# A holder that is releasing removes the lock file; a contender that opened it just before then locks
# a removed file and tries again on the new one, within this many seconds.
WAIT_S = 0.5


def global_rank_zero() -> bool:
    """Whether this is the first process of its launch, or the only one: RANK, LOCAL_RANK and
    SLURM_PROCID are each 0 or unset."""
    return all(os.environ.get(key, "0") == "0" for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


class RunLock:
    """The lock of one run directory, held by at most one process at a time."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.holder_path = self.run_dir / HOLDER_NAME
        self._lock: Any = None

    @property
    def held(self) -> bool:
        return self._lock is not None

    def acquire(self) -> bool:
        """Take the lock, creating the run directory if needed; False (with a warning on stderr) where
        the filesystem cannot lock files. A one-line ValueError naming the holder if another process has it."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create the run directory {self.run_dir}: {e.strerror}; "
                             f"pass a writable --runs_dir") from None
        for _ in range(20):
            lock = _file_lock(self.path)
            try:
                lock.acquire(timeout=WAIT_S)
            except Timeout:
                raise ValueError(self.refusal()) from None
            except (NotImplementedError, OSError) as e:
                if isinstance(e, OSError) and e.errno != errno.ENOSYS:
                    raise
                print(f"warning: cannot lock {self.path} (its filesystem does not support file locks); "
                      f"a second fit of this run at the same time would not be refused", file=sys.stderr)
                return False
            if _locks_the_path(lock, self.path):
                self._lock = lock
                self._write_holder()
                return True
            lock.release()  # the file was removed by a holder releasing it: lock the one now at the path
        raise ValueError(self.refusal())

    def release(self) -> None:
        """Give the lock up (nothing if not held). Its files are removed first, while it is still held."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        for path in (self.holder_path, self.path):
            with contextlib.suppress(OSError):
                path.unlink()
        lock.release()

    def refusal(self) -> str:
        """The one line for a second writer: who holds the run, and what to do."""
        who = describe_holder(read_holder(self.holder_path))
        return (f"run {self.run_dir.name!r} is being written by {who}; "
                f"wait for it to finish or use another --run name")

    def _write_holder(self) -> None:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        self.holder_path.write_text(json.dumps(info) + "\n")


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holder record at `path`, or None if it is missing or unreadable (being written, or from
    a process on this host that is gone)."""
    try:
        info = json.loads(path.read_text())
        pid, host, since = int(info["pid"]), str(info["host"]), float(info["since"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if host == socket.gethostname() and not _alive(pid):
        return None
    return {"pid": pid, "host": host, "since": since}


def describe_holder(info: dict[str, Any] | None) -> str:
    """'process 1234 on host h (since 18:02:11)', with the date when not today; 'another process' if unknown."""
    if info is None:
        return "another process"
    since = time.localtime(info["since"])
    today = time.localtime()[:3] == since[:3]
    when = time.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M:%S", since)
    return f"process {info['pid']} on host {info['host']} (since {when})"


def _file_lock(path: Path) -> FileLock:
    try:
        # filelock >= 4 would fall back to a lock file that a killed process leaves behind; refuse that.
        return FileLock(path, fallback_to_soft=False)
    except TypeError:  # older filelock: flock only, never a fallback
        return FileLock(path)


def _locks_the_path(lock: FileLock, path: Path) -> bool:
    """Whether the file the lock holds is the one at `path` (not one removed while it was being locked)."""
    fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
    if fd is None:  # a filelock that keeps its descriptor elsewhere: it checks this itself (filelock >= 4)
        return True
    try:
        here, held = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


def _alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill would end the process there, not probe it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True
