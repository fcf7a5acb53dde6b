"""The data directory's exclusive lock (Kafka's ``.lock`` in each log directory): one broker per directory, its holder named in the file.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on ``DATA_DIR/.lock``, held on an open file for the broker's life and
dropped by the kernel when that file is closed or the process ends (kill -9 included), so a lock file left
behind never blocks anyone.  flock belongs to the open file, not to the process (unlike fcntl's record locks):
a second broker in the same process (trireme.testing runs them on threads) opens the file again and is refused
as another process is.  A broker's cleaner child inherits the locked file, so the lock outlives a killed broker
until its child is gone too; the next broker waits for that when the named holder is dead.  The holder writes ``pid=... host=... listen=HOST:PORT`` into the file; a broker that is
refused reads it back for its one-line error.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import time

from .startup import StartupError, os_reason

LOCK_FILE = ".lock"
# How long a broker waits for the lock a dead broker's cleaner child still holds (it is SIGKILLed with the broker).
DEAD_HOLDER_WAIT_S = 10.0


class DataDirInUse(StartupError):
    """Another broker holds the data directory's lock."""


class DataDirLock:
    """A held lock on a data directory; :meth:`release` (or the process's end) gives it up."""

    def __init__(self, data_dir: str, fd: int):
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, LOCK_FILE)
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: str, listen: str) -> "DataDirLock":
        """Create ``data_dir`` if needed and lock it for this broker (``listen``: the HOST:PORT it serves), or raise
        StartupError naming the directory and why (DataDirInUse naming the holder)."""
        try:
            os.makedirs(data_dir, exist_ok=True)
        except FileExistsError:
            pass                                # a file of that name: said below
        except OSError as e:
            raise StartupError(f"cannot create data directory {data_dir}: {os_reason(e)}") from None
        if not os.path.isdir(data_dir):
            raise StartupError(f"data directory {data_dir} is not a directory")
        if not os.access(data_dir, os.W_OK | os.X_OK):
            raise StartupError(f"data directory {data_dir} is not writable: "
                               f"{os.strerror(errno.EROFS if _read_only(data_dir) else errno.EACCES)}")
        path = os.path.join(data_dir, LOCK_FILE)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StartupError(f"cannot create the lock file {path} of data directory {data_dir}: "
                               f"{os_reason(e)}") from None
        try:
            _flock_after_dead_holder(fd)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DataDirInUse(f"data directory {data_dir} is in use by {_holder_of(holder)} "
                               f"({holder or 'starting: no pid written yet'}; lock file {path})") from None
        except OSError as e:
            os.close(fd)
            raise StartupError(f"cannot lock data directory {data_dir} ({path}): {os_reason(e)}") from None
        lock = cls(data_dir, fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()} listen={listen}\n".encode(), 0)
        except OSError as e:
            lock.release()
            raise StartupError(f"cannot write the lock file {path}: {os_reason(e)}") from None
        return lock

    def fileno(self) -> int:
        """The locked file (a cleaner child inherits it: the lock then lasts until the child is gone too)."""
        assert self._fd is not None
        return self._fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the directory up (closing the file drops the lock; the file stays, as Kafka's does)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _flock_after_dead_holder(fd: int) -> None:
    """Lock ``fd``'s file, or raise BlockingIOError.  When the holder named in it is a broker of this host that is
    no longer running, the lock is its cleaner child's (inherited, server/log_cleaner.py), which dies with it:
    wait for that (up to DEAD_HOLDER_WAIT_S) rather than refuse, or work beside it."""
    deadline = time.monotonic() + DEAD_HOLDER_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if not _holder_dead(_read_holder(fd)) or time.monotonic() > deadline:
                raise
        time.sleep(0.02)


def _holder_dead(holder: str) -> bool:
    fields = dict(item.partition("=")[::2] for item in holder.split())
    if fields.get("host") != socket.gethostname() or not fields.get("pid", "").isdigit():
        return False
    pid = int(fields["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        return ""


def _holder_of(holder: str) -> str:
    """Whose lock it is: a broker in this process (trireme.testing on another thread) or another one."""
    fields = dict(item.partition("=")[::2] for item in holder.split())
    if fields.get("pid") == str(os.getpid()) and fields.get("host") == socket.gethostname():
        return "a broker in this process"
    return "another broker"
