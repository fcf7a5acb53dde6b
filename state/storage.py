"""The file-access interface the log uses instead of `os`: real files, and an in-memory, crash-simulating twin."""
from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import random
import threading
from abc import ABC, abstractmethod

_IOV_MAX = 1024       # buffers per pwritev call (Linux's UIO_MAXIOV)
_ZEROS = memoryview(bytes(1 << 20))     # AppendFile.preallocate writes this much at a time
TEMP_SUFFIX = ".tmp"  # `write_atomic` stages data in `path + TEMP_SUFFIX`; leftovers may be removed

# Errors that mean "out of descriptors (or kernel memory for them)", not a broken disk: never sticky,
# never a reason to take a log offline; retried once descriptors are free.
DESCRIPTOR_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Errors that mean "no space (or quota) left": a write refused before anything past the logical end counted.
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class SyncFailed(OSError):
    """An fsync (of a file or a directory) failed: what the page cache held is not known to be on disk, and a
    later fsync may report success without writing it (Linux drops the dirty pages), so it is never retried."""


def out_of_space(error: BaseException) -> bool:
    """Whether ``error`` is a write refused for want of space or quota, not a failed fsync: the write left nothing
    past the file's logical end, so it can simply be tried again once space returns."""
    return isinstance(error, OSError) and not isinstance(error, SyncFailed) and error.errno in SPACE_ERRNOS


class ReadFile(ABC):
    """An open file that can be read at any position."""

    path: str

    @property
    @abstractmethod
    def size(self) -> int:
        """Current length of the file in bytes."""

    @abstractmethod
    def read(self, pos: int, n: int) -> bytes:
        """Up to `n` bytes at `pos` (fewer only at end of file)."""

    @abstractmethod
    def close(self) -> None:
        """Release the file; further calls fail."""


class _ExtentChange:
    """Around a change of a file's size or blocks (``with file._extent_changing:``): the file's version moves before
    it (a sync that starts later does not count the change as synced until it is done) and after it (nor does one
    that started meanwhile).  One object per file, reused: an append that grows the file is on the produce path."""

    __slots__ = ("_file",)

    def __init__(self, file: "AppendFile") -> None:
        self._file = file

    def __enter__(self) -> None:
        self._file._extent_version += 1

    def __exit__(self, *exc) -> None:
        self._file._extent_version += 1


class AppendFile(ReadFile):
    """A file open for appending at its logical end, readable at any position.

    `sync()` may run in a worker thread while another thread writes or reads. A failed
    fsync is sticky: every later `sync()` raises too, because after a failed fsync the
    kernel may have dropped the dirty pages and a retry could falsely report success.
    """

    def __init__(self) -> None:
        self._sync_failed: OSError | None = None
        # bumped (_extent_changing) before and after every change of the file's size or blocks; the last successful
        # sync records the version it found as it started (see extent_synced)
        self._extent_version = 1
        self._extent_synced = 0
        self._extent_changing = _ExtentChange(self)     # ``with self._extent_changing:`` around such a change
        self._written = 0               # bytes appended so far, and as of the last successful sync's start
        self._written_synced = 0

    @abstractmethod
    def write(self, buf: bytes | bytearray | memoryview) -> None:
        """Append all of `buf` at the logical end. On OSError the logical size is unchanged."""

    def write_vectored(self, buffers: list) -> None:
        """Append the buffers one after another, as `write` of their concatenation (implementations may gather
        them with one system call instead of joining them first)."""
        self.write(b"".join(buffers))

    @abstractmethod
    def truncate(self, n: int) -> None:
        """Cut the file to `n` bytes (not durable until `sync`)."""

    @property
    def allocated(self) -> int:
        """Where the file's written blocks end: its size, or further once `preallocate` wrote zeros past it."""
        return self.size

    def preallocate(self, end: int) -> None:
        """Write zeros from `allocated` up to `end` and make them durable (`sync`), leaving the logical size as it
        is: appends up to `end` then write over blocks the file system has written and counted already, so an
        fsync after them has no metadata to commit (neither the file's size nor its blocks change) and costs
        about half as much (docs/performance.md, "Zeros written ahead of small rounds").  The zeros past the
        logical end are what a torn append leaves too: recovery cuts them.  Implementations that cannot do it do
        nothing.  Raises OSError (a failed fsync is sticky, as for `sync`; a write that fails gives back the
        zeros this call wrote)."""

    def cut_ahead(self) -> None:
        """Give back what `preallocate` wrote past the logical end, and preallocate nothing more (a segment that
        takes no more appends)."""

    @property
    def extent_synced(self) -> bool:
        """Whether the file's size and blocks are what the last successful `sync` made durable: everything written
        since lies over blocks the file had then (zeros written by `preallocate`), so the next `sync` has data alone
        to write, no metadata, and is about as short as an fsync gets (the broker then runs it on its event loop:
        server/broker.py, Broker._flush_inline).  False for a file never synced."""
        return self._extent_synced == self._extent_version

    @property
    def unsynced_bytes(self) -> int:
        """Bytes appended since the last successful `sync` started (what the next one has to write, about)."""
        return self._written - self._written_synced

    def sync(self) -> None:
        """Make everything written so far durable (fsync). Raises OSError on failure (SyncFailed for a device
        failure, whatever its errno), forever after."""
        if self._sync_failed is not None:
            raise SyncFailed(errno.EIO, f"an earlier fsync of {self.path} failed: {self._sync_failed}")
        version = self._extent_version      # what a concurrent write changes after this is not known to be covered
        written = self._written
        try:
            self._fsync()
        except OSError as exc:
            # Syncing a closed file, or finding no descriptor to reopen it with, is not a device failure.
            if exc.errno == errno.EBADF or exc.errno in DESCRIPTOR_ERRNOS:
                raise
            self._sync_failed = exc
            raise SyncFailed(exc.errno, f"fsync of {self.path} failed: {exc.strerror or exc}") from exc
        self._extent_synced = version
        self._written_synced = written

    @abstractmethod
    def _fsync(self) -> None:
        """The implementation's fsync; raises OSError(EBADF) when closed."""


class Storage(ABC):
    """Files addressed by '/'-separated paths relative to the storage's root."""

    @property
    def open_descriptors(self) -> int:
        """OS file descriptors the open files hold now (none, for a storage that holds no real files)."""
        return 0

    @abstractmethod
    def open_append(self, path: str) -> AppendFile:
        """Open `path` for appending, creating it (the new entry is durable only after `sync_dir`)."""

    @abstractmethod
    def open_read(self, path: str) -> ReadFile:
        """Open an existing file for reading."""

    @abstractmethod
    def read(self, path: str, pos: int, n: int) -> bytes:
        """Up to `n` bytes of `path` at `pos`."""

    @abstractmethod
    def read_all(self, path: str) -> bytes:
        """The whole content of `path`."""

    @abstractmethod
    def size(self, path: str) -> int:
        """Length of `path` in bytes."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file or directory exists at `path`."""

    @abstractmethod
    def list(self, directory: str) -> list[str]:
        """Sorted names of the entries directly inside `directory`."""

    @abstractmethod
    def makedirs(self, path: str) -> None:
        """Create a directory and its parents if missing."""

    @abstractmethod
    def remove(self, path: str, missing_ok: bool = False) -> None:
        """Delete a file (the removal is durable only after `sync_dir`)."""

    @abstractmethod
    def remove_dir(self, path: str) -> None:
        """Delete an empty directory."""

    @abstractmethod
    def write_atomic(self, path: str, data: bytes, durable: bool = True) -> None:
        """Replace `path` with `data` atomically: after a crash it holds the old or the new content.

        With `durable` (the default) the new content is on disk when this returns
        (temp file fsynced, renamed over `path`, directory fsynced).
        """

    @abstractmethod
    def sync_dir(self, directory: str) -> None:
        """Make the creations, renames and removals of entries in `directory` durable (SyncFailed if the device
        failed it)."""

    def available_bytes(self, path: str) -> int | None:
        """Bytes an unprivileged writer could still write under `path` (None: not known)."""
        return None

    def rename(self, src: str, dst: str) -> None:
        """Rename `src` to `dst` in the same directory, replacing `dst` (durable only after `sync_dir`)."""
        raise NotImplementedError


# --- real files ------------------------------------------------------------------------------


def _as_bytes_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _pread_full(fd: int, pos: int, n: int) -> bytes:
    data = os.pread(fd, n, pos)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, pos + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class _Descriptors:
    """The descriptors of a FileStorage's open files, at most `limit` at once.

    When a file needs one beyond the limit (or the process is out of descriptors), idle files give
    theirs back, least recently used first (a clock: a file used since the last sweep gets a second
    chance); a file whose descriptor was taken reopens its path on next use.  A descriptor in use
    (a write, a read, an fsync in a worker thread) is never taken.  On Linux an fsync through a new
    descriptor writes back everything written through the old one: dirty pages belong to the file.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._files: dict[_FileHandle, None] = {}   # insertion order = sweep order
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._files)

    def add(self, handle: _FileHandle) -> None:
        with self._lock:
            self._files[handle] = None
            excess = len(self._files) - self.limit
        if excess > 0:
            self.shed(excess)

    def discard(self, handle: _FileHandle) -> None:
        with self._lock:
            self._files.pop(handle, None)

    def shed(self, n: int) -> int:
        """Close up to `n` idle files' descriptors; → how many were closed."""
        closed = 0
        with self._lock:
            for _ in range(2 * len(self._files)):
                if closed >= n or not self._files:
                    break
                handle = next(iter(self._files))
                del self._files[handle]
                if handle.recent:
                    handle.recent = False
                    self._files[handle] = None
                    continue
                taken = handle._take_descriptor()
                if taken is None:
                    self._files[handle] = None      # in use: keep it
                elif taken:
                    closed += 1
        return closed


class _FileHandle:
    """A file's descriptor, opened again on demand after the storage's descriptor cache took it."""

    def __init__(self, storage: FileStorage, path: str, flags: int, fd: int) -> None:
        self.path = path
        self._storage = storage
        self._flags = flags & ~(os.O_CREAT | os.O_TRUNC)      # a reopen finds the file it opened
        self._fd = fd
        self._users = 0
        self._closed = False
        self.recent = True
        self._lock = threading.Lock()  # guards _fd and _users: no descriptor is closed or recycled under a user
        storage._descriptors.add(self)

    def _pin(self) -> int:
        with self._lock:
            if self._fd < 0:
                if self._closed:
                    raise OSError(errno.EBADF, f"{self.path} is closed")
                self._fd = self._storage._open(self.path, self._flags)
                self._storage._descriptors.add(self)
            self._users += 1
            self.recent = True
            return self._fd

    def _unpin(self) -> None:
        with self._lock:
            self._users -= 1
            if self._closed and not self._users and self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _take_descriptor(self) -> bool | None:
        """Close the descriptor if nobody uses it: True if closed, False if there was none, None if in use."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._users:
                return None
            if self._fd < 0:
                return False
            os.close(self._fd)
            self._fd = -1
            return True
        finally:
            self._lock.release()

    def _pread(self, pos: int, n: int) -> bytes:
        fd = self._pin()
        try:
            return _pread_full(fd, pos, n)
        finally:
            self._unpin()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if not self._users and self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        self._storage._descriptors.discard(self)


class _FileReadFile(_FileHandle, ReadFile):
    @property
    def size(self) -> int:
        fd = self._pin()
        try:
            return os.fstat(fd).st_size
        finally:
            self._unpin()

    def read(self, pos: int, n: int) -> bytes:
        return self._pread(pos, n)


class _FileAppendFile(_FileHandle, AppendFile):
    def __init__(self, storage: FileStorage, path: str, flags: int, fd: int) -> None:
        AppendFile.__init__(self)
        _FileHandle.__init__(self, storage, path, flags, fd)
        self._size = self._allocated = os.fstat(fd).st_size
        self._extent = threading.Lock()         # an append and the zeros written past it never overlap
        self._cut = False                       # cut_ahead was called: no more zeros

    @property
    def size(self) -> int:
        return self._size

    @property
    def allocated(self) -> int:
        return self._allocated

    def preallocate(self, end: int) -> None:
        # a step at a time, each under the lock: an append (another thread) waits for one step at most, and a
        # step starts past whatever was appended meanwhile
        wrote = False
        first = self._allocated
        while True:
            with self._extent:
                start = max(self._allocated, self._size)
                if start >= end or self._closed or self._cut:
                    break
                n = min(end - start, len(_ZEROS))
                with self._extent_changing:
                    fd = self._pin()
                    try:
                        written = os.pwrite(fd, _ZEROS[:n], start)
                        if written <= 0:
                            raise OSError(errno.ENOSPC, f"no zeros written to {self.path}")
                    except OSError:
                        try:                        # give back what this call took (disk full: to other writes)
                            self._truncate(max(first, self._size))
                        except OSError:
                            pass
                        raise
                    finally:
                        self._unpin()
                    self._allocated = start + written
                wrote = True
        if wrote:
            self.sync()

    def cut_ahead(self) -> None:
        with self._extent:
            self._cut = True
            if self._allocated > self._size:
                self._truncate(self._size)

    def write(self, buf: bytes | bytearray | memoryview) -> None:
        self.write_vectored([buf])

    def write_vectored(self, buffers: list) -> None:
        """One `pwritev` per IOV_MAX buffers, continuing after short writes; on failure the file is cut back to
        where it was, so no partial batch is left for recovery to find."""
        with self._extent:
            self._write_vectored(buffers)

    def _write_vectored(self, buffers: list) -> None:
        views = [v for v in (_as_bytes_view(b) for b in buffers) if len(v)]
        pos = self._size
        total = sum(len(v) for v in views)
        if pos + total > self._allocated:
            with self._extent_changing:
                self._pwritev(views, pos, total)
        else:
            self._pwritev(views, pos, total)
        self._written += total

    def _pwritev(self, views: list, pos: int, total: int) -> None:
        done = 0
        first = 0
        fd = self._pin()
        try:
            while first < len(views):
                n = os.pwritev(fd, views[first:first + _IOV_MAX], pos + done)
                done += n
                while n and n >= len(views[first]):
                    n -= len(views[first])
                    first += 1
                if n:
                    views[first] = views[first][n:]
        except OSError:
            try:
                with self._extent_changing:
                    os.ftruncate(fd, pos)
                    self._allocated = pos
            except OSError:
                pass
            raise
        finally:
            self._unpin()
        self._size = pos + total
        self._allocated = max(self._allocated, self._size)

    def read(self, pos: int, n: int) -> bytes:
        return self._pread(pos, n)

    def truncate(self, n: int) -> None:
        with self._extent:
            self._truncate(n)

    def _truncate(self, n: int) -> None:
        with self._extent_changing:
            fd = self._pin()
            try:
                os.ftruncate(fd, n)
            finally:
                self._unpin()
            self._size = self._allocated = n

    def _fsync(self) -> None:
        fd = self._pin()
        try:
            os.fdatasync(fd)  # data and the size that reaches it: all an append needs
        finally:
            self._unpin()


class FileStorage(Storage):
    """Real files under `root`; the open files hold at most `max_open_files` descriptors (see _Descriptors)."""

    def __init__(self, root: str | os.PathLike[str], max_open_files: int = 1 << 30) -> None:
        self.root = os.fspath(root)
        self._descriptors = _Descriptors(max_open_files)

    @property
    def open_descriptors(self) -> int:
        """Descriptors the open files hold now."""
        return len(self._descriptors)

    def _abs(self, path: str) -> str:
        return os.path.join(self.root, path)

    def _open(self, path: str, flags: int) -> int:
        """os.open; out of descriptors, the idle open files give half of theirs back and it tries once more."""
        try:
            return os.open(self._abs(path), flags | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno not in DESCRIPTOR_ERRNOS or not self._descriptors.shed(max(1, len(self._descriptors) // 2)):
                raise
        return os.open(self._abs(path), flags | os.O_CLOEXEC, 0o644)

    def open_append(self, path: str) -> AppendFile:
        flags = os.O_RDWR | os.O_CREAT
        return _FileAppendFile(self, path, flags, self._open(path, flags))

    def open_read(self, path: str) -> ReadFile:
        return _FileReadFile(self, path, os.O_RDONLY, self._open(path, os.O_RDONLY))

    def read(self, path: str, pos: int, n: int) -> bytes:
        fd = self._open(path, os.O_RDONLY)
        try:
            return _pread_full(fd, pos, n)
        finally:
            os.close(fd)

    def read_all(self, path: str) -> bytes:
        with open(self._open(path, os.O_RDONLY), "rb") as f:
            return f.read()

    def size(self, path: str) -> int:
        return os.stat(self._abs(path)).st_size

    def exists(self, path: str) -> bool:
        return os.path.exists(self._abs(path))

    def list(self, directory: str) -> list[str]:
        return sorted(os.listdir(self._abs(directory)))

    def makedirs(self, path: str) -> None:
        os.makedirs(self._abs(path), exist_ok=True)

    def remove(self, path: str, missing_ok: bool = False) -> None:
        try:
            os.remove(self._abs(path))
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_dir(self, path: str) -> None:
        os.rmdir(self._abs(path))

    def write_atomic(self, path: str, data: bytes, durable: bool = True) -> None:
        target = self._abs(path)
        temp = target + TEMP_SUFFIX
        fd = self._open(path + TEMP_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            try:
                view = _as_bytes_view(data)
                done = 0
                while done < len(view):
                    done += os.write(fd, view[done:])
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, target)
        except OSError:
            with contextlib.suppress(OSError):      # a disk-full leftover would hold on to the space it took
                os.remove(temp)
            raise
        if durable:
            self.sync_dir(posixpath.dirname(path))

    def rename(self, src: str, dst: str) -> None:
        os.replace(self._abs(src), self._abs(dst))

    def sync_dir(self, directory: str) -> None:
        fd = self._open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        except OSError as exc:
            raise SyncFailed(exc.errno, f"fsync of directory {directory or '.'} failed: {exc.strerror or exc}") \
                from exc
        finally:
            os.close(fd)

    def available_bytes(self, path: str) -> int | None:
        try:
            st = os.statvfs(self._abs(path))
        except OSError:
            return None
        return st.f_bavail * st.f_frsize


# --- the in-memory, crash-simulating twin ----------------------------------------------------


class _Inode:
    """One file's bytes: `data` as the page cache sees it, `durable` as of the last fsync."""

    __slots__ = ("data", "durable")

    def __init__(self, data: bytes = b"", durable: bytes = b"") -> None:
        self.data = bytearray(data)
        self.durable = durable


class _MemoryReadFile(ReadFile):
    def __init__(self, storage: MemoryStorage, path: str, inode: _Inode) -> None:
        self.path = path
        self._storage = storage
        self._inode = inode
        self._closed = False

    @property
    def size(self) -> int:
        return len(self._inode.data)

    def read(self, pos: int, n: int) -> bytes:
        if self._closed:
            raise OSError(errno.EBADF, f"{self.path} is closed")
        with self._storage._lock:
            return bytes(self._inode.data[pos : pos + n])

    def close(self) -> None:
        self._closed = True


class _MemoryAppendFile(AppendFile):
    def __init__(self, storage: MemoryStorage, path: str, inode: _Inode) -> None:
        super().__init__()
        self.path = path
        self._storage = storage
        self._inode = inode
        self._size = len(inode.data)
        self._closed = False
        self._cut = False

    @property
    def size(self) -> int:
        return self._size

    def write(self, buf: bytes | bytearray | memoryview) -> None:
        view = _as_bytes_view(buf)
        with self._storage._lock:
            self._check_open()
            pos = self._size
            with self._extent_changing if pos + len(view) > len(self._inode.data) else contextlib.nullcontext():
                if self._storage._take_write_fault():
                    # A partial write that could not be cleaned up: garbage past the logical end.
                    self._inode.data[pos : pos + len(view) // 2] = view[: len(view) // 2]
                    raise OSError(errno.ENOSPC, f"injected write failure on {self.path}")
                self._inode.data[pos : pos + len(view)] = view
                self._size = pos + len(view)
            self._written += len(view)

    def read(self, pos: int, n: int) -> bytes:
        with self._storage._lock:
            self._check_open()
            return bytes(self._inode.data[pos : pos + n])

    def truncate(self, n: int) -> None:
        with self._storage._lock:
            self._check_open()
            with self._extent_changing:
                del self._inode.data[n:]
                self._size = n

    @property
    def allocated(self) -> int:
        return max(self._size, len(self._inode.data))

    def preallocate(self, end: int) -> None:
        with self._storage._lock:
            self._check_open()
            start = self.allocated
            if start >= end or self._cut:
                return
            with self._extent_changing:
                self._inode.data[start:end] = bytes(end - start)
        self.sync()

    def cut_ahead(self) -> None:
        with self._storage._lock:
            self._check_open()
            self._cut = True
            if len(self._inode.data) > self._size:
                with self._extent_changing:
                    del self._inode.data[self._size:]

    def _fsync(self) -> None:
        with self._storage._lock:
            self._check_open()
            self._storage._take_sync_fault(self.path)
            self._inode.durable = bytes(self._inode.data)
            self._storage.syncs += 1

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise OSError(errno.EBADF, f"{self.path} is closed")


class MemoryStorage(Storage):
    """In-memory files with a pessimistic crash model, for crash tests.

    The model: each file has page-cache content and durable content (as of its last
    fsync). The name space (which path names which file) likewise has a live and a
    durable version per directory: creating, renaming over or removing a file is durable
    only after `sync_dir` of its directory. `crash()` returns a new storage holding only
    the durable name space and, for each file, only its durable content — optionally with
    a random prefix of the unsynced appended bytes kept and possibly garbled (a torn
    write). Simplification: directories themselves are durable as soon as created.
    All methods are thread-safe (one lock).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._files: dict[str, _Inode] = {}
        self._durable_files: dict[str, _Inode] = {}
        self._dirs: set[str] = {""}
        self._write_faults = self._writes_before_fault = 0
        self._sync_faults = self._syncs_before_fault = 0
        self.full = False  # while set, every file write fails as on a full disk (ENOSPC)
        self.syncs = 0  # completed file fsyncs, for tests
        self.dir_syncs = 0

    # -- fault injection --

    def fail_next_write(self, count: int = 1, after: int = 0) -> None:
        """Make `count` file writes, after `after` good ones, write half their bytes and fail (ENOSPC)."""
        with self._lock:
            self._write_faults, self._writes_before_fault = count, after

    def fail_next_sync(self, count: int = 1, after: int = 0) -> None:
        """Make `count` fsyncs (file or directory), after `after` good ones, fail with OSError(EIO)."""
        with self._lock:
            self._sync_faults, self._syncs_before_fault = count, after

    def _take_write_fault(self) -> bool:
        if self.full:
            return True
        if self._write_faults > 0:
            if self._writes_before_fault > 0:
                self._writes_before_fault -= 1
                return False
            self._write_faults -= 1
            return True
        return False

    def _take_sync_fault(self, path: str) -> None:
        if self._sync_faults > 0:
            if self._syncs_before_fault > 0:
                self._syncs_before_fault -= 1
                return
            self._sync_faults -= 1
            raise OSError(errno.EIO, f"injected fsync failure on {path}")

    # -- crash --

    def crash(self, torn_tail: bool = False, rng: random.Random | None = None) -> MemoryStorage:
        """A new storage holding only what was durable, as after a power loss."""
        rng = rng or random.Random()
        with self._lock:
            after = MemoryStorage()
            after._dirs = set(self._dirs)
            for path, inode in sorted(self._durable_files.items()):
                content = _torn(inode, rng) if torn_tail else inode.durable
                after._files[path] = after._durable_files[path] = _Inode(content, content)
            return after

    # -- the Storage interface --

    @staticmethod
    def _norm(path: str) -> str:
        path = posixpath.normpath(path).lstrip("/")
        return "" if path == "." else path

    def _inode(self, path: str) -> _Inode:
        try:
            return self._files[self._norm(path)]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "no such file", path) from None

    def _check_parent(self, path: str) -> None:
        if posixpath.dirname(path) not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", posixpath.dirname(path))

    def open_append(self, path: str) -> AppendFile:
        path = self._norm(path)
        with self._lock:
            inode = self._files.get(path)
            if inode is None:
                self._check_parent(path)
                inode = self._files[path] = _Inode()
            return _MemoryAppendFile(self, path, inode)

    def open_read(self, path: str) -> ReadFile:
        with self._lock:
            return _MemoryReadFile(self, self._norm(path), self._inode(path))

    def read(self, path: str, pos: int, n: int) -> bytes:
        with self._lock:
            return bytes(self._inode(path).data[pos : pos + n])

    def read_all(self, path: str) -> bytes:
        with self._lock:
            return bytes(self._inode(path).data)

    def size(self, path: str) -> int:
        with self._lock:
            return len(self._inode(path).data)

    def exists(self, path: str) -> bool:
        path = self._norm(path)
        with self._lock:
            return path in self._files or path in self._dirs

    def list(self, directory: str) -> list[str]:
        directory = self._norm(directory)
        with self._lock:
            if directory not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", directory)
            names = {posixpath.basename(p) for p in self._files if posixpath.dirname(p) == directory}
            names.update(posixpath.basename(d) for d in self._dirs if d and posixpath.dirname(d) == directory)
            return sorted(names)

    def makedirs(self, path: str) -> None:
        path = self._norm(path)
        with self._lock:
            while path not in self._dirs:
                self._dirs.add(path)
                path = posixpath.dirname(path)

    def remove(self, path: str, missing_ok: bool = False) -> None:
        with self._lock:
            if self._files.pop(self._norm(path), None) is None and not missing_ok:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)

    def remove_dir(self, path: str) -> None:
        path = self._norm(path)
        with self._lock:
            if path not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
            if self.list(path):
                raise OSError(errno.ENOTEMPTY, "directory not empty", path)
            self._dirs.discard(path)
            for name in [p for p in self._durable_files if posixpath.dirname(p) == path]:
                del self._durable_files[name]

    def write_atomic(self, path: str, data: bytes, durable: bool = True) -> None:
        path = self._norm(path)
        with self._lock:
            self._check_parent(path)
            self._files[path + TEMP_SUFFIX] = temp = _Inode()
            if self._take_write_fault():
                del self._files[path + TEMP_SUFFIX]     # as FileStorage, which removes what it could not write
                raise OSError(errno.ENOSPC, f"injected write failure on {path}{TEMP_SUFFIX}")
            temp.data[:] = data
            if durable:
                self._take_sync_fault(path + TEMP_SUFFIX)
                temp.durable = bytes(data)
            self._files[path] = self._files.pop(path + TEMP_SUFFIX)
            if durable:
                self.sync_dir(posixpath.dirname(path))

    def available_bytes(self, path: str) -> int | None:
        return 0 if self.full else None

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            inode = self._files.pop(self._norm(src), None)
            if inode is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", src)
            self._files[self._norm(dst)] = inode

    def sync_dir(self, directory: str) -> None:
        directory = self._norm(directory)
        with self._lock:
            try:
                self._take_sync_fault(directory)
            except OSError as exc:
                raise SyncFailed(exc.errno, str(exc)) from exc
            for path in [p for p in self._durable_files if posixpath.dirname(p) == directory]:
                if path not in self._files:
                    del self._durable_files[path]
            for path, inode in self._files.items():
                if posixpath.dirname(path) == directory:
                    self._durable_files[path] = inode
            self.dir_syncs += 1


def _torn(inode: _Inode, rng: random.Random) -> bytes:
    """What a crash in the middle of writing back `inode` might leave on disk."""
    live, durable = bytes(inode.data), inode.durable
    if live == durable:
        return durable
    same = len(durable)
    if not live.startswith(durable):
        same = next((i for i, (a, b) in enumerate(zip(live, durable)) if a != b), len(live))
        if len(live) < len(durable) or durable.count(0, same) != len(durable) - same:
            return rng.choice([durable, live])      # truncated or rewritten since the last fsync
        # appended over zeros written ahead (AppendFile.preallocate): torn as an append is, over the zeros
    suffix = bytearray(live[same : same + rng.randint(0, len(live) - same)])
    mode = rng.randrange(3)
    if suffix and mode == 1:  # flip some bytes
        for _ in range(rng.randint(1, 4)):
            suffix[rng.randrange(len(suffix))] ^= rng.randint(1, 255)
    elif suffix and mode == 2:  # a range reads back as zeros (allocated block never written)
        start = rng.randrange(len(suffix))
        end = rng.randint(start + 1, len(suffix))
        suffix[start:end] = bytes(end - start)
    return durable[:same] + bytes(suffix) + durable[same + len(suffix):]
