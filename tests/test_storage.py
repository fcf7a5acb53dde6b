"""Tests for state.storage: real files and the in-memory twin behave alike, and the twin's crash model holds."""
from __future__ import annotations

import errno
import os
import random
import resource

import pytest

from trireme.state.storage import AppendFile, FileStorage, MemoryStorage


@pytest.fixture(params=["file", "memory"])
def storage(request, tmp_path):
    return FileStorage(tmp_path) if request.param == "file" else MemoryStorage()


def test_append_read_size(storage):
    storage.makedirs("a/b")
    f = storage.open_append("a/b/x.log")
    assert isinstance(f, AppendFile) and f.size == 0
    f.write(b"hello ")
    f.write(bytearray(b"big "))
    f.write(memoryview(b"..world..")[2:7])
    assert f.size == 15
    assert f.read(0, 100) == b"hello big world"
    assert f.read(6, 3) == b"big"
    assert storage.read("a/b/x.log", 10, 5) == b"world"
    assert storage.read_all("a/b/x.log") == b"hello big world"
    assert storage.size("a/b/x.log") == 15
    f.sync()
    f.truncate(5)
    assert f.size == 5 and storage.read_all("a/b/x.log") == b"hello"
    f.write(b"!")
    assert storage.read_all("a/b/x.log") == b"hello!"
    f.close()
    g = storage.open_append("a/b/x.log")  # reopening appends at the end
    assert g.size == 6
    g.write(b"?")
    g.close()
    r = storage.open_read("a/b/x.log")
    assert r.size == 7 and r.read(5, 10) == b"!?"
    r.close()


def test_preallocate_writes_durable_zeros_past_the_logical_end(storage):
    storage.makedirs("d")
    f = storage.open_append("d/z.log")
    storage.sync_dir("d")
    f.write(b"abc")
    assert f.allocated == 3
    f.preallocate((1 << 20) + 10)                   # more than one step of zeros
    assert f.size == 3 and f.allocated == (1 << 20) + 10
    assert storage.size("d/z.log") == (1 << 20) + 10
    f.write(b"def")                                 # over the zeros
    assert f.size == 6 and storage.read("d/z.log", 0, 8) == b"abcdef\0\0"
    f.preallocate(100)                              # already there: nothing
    assert f.allocated == (1 << 20) + 10
    if isinstance(storage, MemoryStorage):
        after = storage.crash()
        assert after.read_all("d/z.log") == b"abc" + bytes((1 << 20) + 7)    # the zeros were synced (not the append)
    f.cut_ahead()
    assert storage.read_all("d/z.log") == b"abcdef" and f.allocated == 6
    f.preallocate(50)                               # never again after a cut
    assert storage.size("d/z.log") == 6
    f.write(b"g")
    assert storage.read_all("d/z.log") == b"abcdefg"
    f.close()


def test_extent_synced_says_whether_a_sync_would_have_data_alone_to_write(storage):
    storage.makedirs("d")
    f = storage.open_append("d/e.log")
    assert not f.extent_synced                      # never synced
    f.write(b"abc")
    f.sync()
    assert f.extent_synced
    f.write(b"d")                                   # past the end: the file grows
    assert not f.extent_synced
    f.sync()
    f.preallocate(100)                              # zeros written and synced
    assert f.extent_synced
    f.write(b"e" * 50)                              # over the zeros
    assert f.extent_synced
    f.write(b"f" * 50)                              # across their end
    assert not f.extent_synced
    f.sync()
    assert f.extent_synced
    f.truncate(10)
    assert not f.extent_synced
    f.sync()
    f.preallocate(40)
    f.cut_ahead()                                   # the zeros given back
    assert not f.extent_synced
    f.sync()
    assert f.extent_synced
    f.close()


def test_unsynced_bytes_count_the_appends_since_the_last_sync(storage):
    storage.makedirs("d")
    f = storage.open_append("d/u.log")
    f.write(b"abc")
    f.write_vectored([b"de", b"f"])
    assert f.unsynced_bytes == 6
    f.sync()
    assert f.unsynced_bytes == 0
    f.write(b"g")
    assert f.unsynced_bytes == 1
    f.close()


def test_a_write_that_grows_the_file_while_a_sync_starts_is_not_counted_as_synced(storage):
    """The flush thread's sync may start while the event loop's append is in its write (the GIL released): the
    version moves after the write too, so that sync does not count the growth as durable."""
    storage.makedirs("d")
    f = storage.open_append("d/e.log")
    f.write(b"abc")
    f.sync()
    with f._extent_changing:                        # a growing write under way ...
        f.sync()                                    # ... when a sync starts and ends
    assert not f.extent_synced
    f.sync()
    assert f.extent_synced
    f.close()


def test_a_write_during_a_sync_is_not_counted_as_synced(storage):
    storage.makedirs("d")
    f = storage.open_append("d/e.log")
    f.write(b"abc")
    real = f._fsync

    def write_meanwhile():                          # as the event loop appends while the flush thread syncs
        f.write(b"more")
        real()
    f._fsync = write_meanwhile
    f.sync()
    assert not f.extent_synced
    f._fsync = real
    f.sync()
    assert f.extent_synced
    f.close()


def test_a_crash_tears_an_append_over_zeros_as_it_tears_one_past_the_end():
    storage = MemoryStorage()
    storage.makedirs("d")
    f = storage.open_append("d/z.log")
    storage.sync_dir("d")
    f.write(b"a" * 100)
    f.preallocate(4096)                             # syncs the first 100 bytes and the zeros
    f.write(b"b" * 300)
    outcomes = set()
    for seed in range(200):
        after = storage.crash(torn_tail=True, rng=random.Random(seed)).read_all("d/z.log")
        assert len(after) == 4096 and after[:100] == b"a" * 100
        outcomes.add(after[100:400])
    assert b"b" * 300 in outcomes and any(o.startswith(b"b") and o.endswith(b"\0") for o in outcomes)
    assert len(outcomes) > 20                       # cut short, bytes flipped, a range of zeros


def test_truncate_drops_the_zeros_too(storage):
    f = storage.open_append("t.log")
    f.write(b"abcdef")
    f.preallocate(4096)
    f.truncate(2)
    assert f.size == f.allocated == 2 and storage.read_all("t.log") == b"ab"
    f.close()


def test_write_vectored_appends_the_buffers_in_order(storage):
    f = storage.open_append("v.log")
    f.write(b"head:")
    parts = [b"a" * 3, b"", bytearray(b"bc"), memoryview(b"..def..")[2:5]] + [bytes([65 + i % 26]) for i in range(1500)]
    f.write_vectored(parts)         # more buffers than one pwritev takes
    expected = b"head:" + b"".join(bytes(p) for p in parts)
    assert f.size == len(expected) and storage.read_all("v.log") == expected
    f.close()


def test_memoryview_of_other_format_is_written_as_bytes(storage):
    import array

    storage.makedirs("d")
    f = storage.open_append("d/f")
    f.write(memoryview(array.array("i", [1, 2])))
    assert f.size == 8
    f.close()


def test_names(storage):
    storage.makedirs("d/sub")
    assert storage.exists("d") and storage.exists("d/sub") and not storage.exists("d/f")
    storage.open_append("d/f").close()
    storage.write_atomic("d/g", b"data")
    assert storage.list("d") == ["f", "g", "sub"]
    assert storage.read_all("d/g") == b"data"
    storage.write_atomic("d/g", b"new", durable=False)
    assert storage.read_all("d/g") == b"new"
    storage.remove("d/f")
    with pytest.raises(FileNotFoundError):
        storage.remove("d/f")
    storage.remove("d/f", missing_ok=True)
    with pytest.raises(FileNotFoundError):
        storage.read_all("d/f")
    storage.sync_dir("d")
    storage.remove("d/g")
    storage.remove_dir("d/sub")
    assert storage.list("d") == []
    storage.remove_dir("d")
    assert not storage.exists("d")


def test_read_past_end_is_short(storage):
    storage.makedirs("d")
    f = storage.open_append("d/f")
    f.write(b"abc")
    assert f.read(2, 10) == b"c"
    assert f.read(5, 10) == b""
    f.close()


def test_sync_after_close_raises_ebadf_without_poisoning(storage):
    storage.makedirs("d")
    f = storage.open_append("d/f")
    f.close()
    with pytest.raises(OSError):
        f.sync()


# --- the crash model ----------------------------------------------------------------------------


def test_crash_keeps_only_fsynced_bytes():
    s = MemoryStorage()
    s.makedirs("d")
    f = s.open_append("d/f")
    f.write(b"durable")
    f.sync()
    s.sync_dir("d")
    f.write(b"+volatile")
    after = s.crash()
    assert after.read_all("d/f") == b"durable"
    assert s.read_all("d/f") == b"durable+volatile"  # the original is untouched


def test_crash_loses_entries_not_dir_synced():
    s = MemoryStorage()
    s.makedirs("d")
    f = s.open_append("d/f")
    f.write(b"x")
    f.sync()  # the data is durable, but the name is not
    assert s.crash().list("d") == []
    s.sync_dir("d")
    assert s.crash().read_all("d/f") == b"x"
    s.remove("d/f")
    assert s.crash().list("d") == ["f"]  # removal not yet durable
    s.sync_dir("d")
    assert s.crash().list("d") == []


def test_write_atomic_is_old_or_new():
    s = MemoryStorage()
    s.makedirs("d")
    s.write_atomic("d/c", b"old")
    s.write_atomic("d/c", b"new", durable=False)
    assert s.crash().read_all("d/c") == b"old"
    s.write_atomic("d/c", b"newer")
    assert s.crash().read_all("d/c") == b"newer"
    assert s.crash().list("d") == ["c"]


def test_truncation_not_synced_may_be_undone():
    s = MemoryStorage()
    s.makedirs("d")
    f = s.open_append("d/f")
    f.write(b"abcdef")
    f.sync()
    s.sync_dir("d")
    f.truncate(2)
    assert s.crash().read_all("d/f") == b"abcdef"
    outcomes = {s.crash(torn_tail=True, rng=random.Random(i)).read_all("d/f") for i in range(20)}
    assert outcomes <= {b"abcdef", b"ab"}


def test_torn_tail_keeps_durable_prefix_and_some_garbled_suffix():
    s = MemoryStorage()
    s.makedirs("d")
    f = s.open_append("d/f")
    f.write(b"D" * 100)
    f.sync()
    s.sync_dir("d")
    f.write(b"V" * 1000)
    seen_lengths, seen_garbled = set(), False
    for seed in range(50):
        data = s.crash(torn_tail=True, rng=random.Random(seed)).read_all("d/f")
        assert data[:100] == b"D" * 100 and len(data) <= 1100
        seen_lengths.add(len(data))
        seen_garbled |= any(b != ord("V") for b in data[100:])
    assert len(seen_lengths) > 10 and seen_garbled


def test_directories_are_durable_once_created():
    s = MemoryStorage()
    s.makedirs("a/b")
    assert s.crash().exists("a/b")


# --- fault injection ----------------------------------------------------------------------------


def test_injected_write_failure_leaves_logical_size():
    s = MemoryStorage()
    s.makedirs("d")
    f = s.open_append("d/f")
    f.write(b"good")
    s.fail_next_write()
    with pytest.raises(OSError):
        f.write(b"0123456789")
    assert f.size == 4
    f.write(b"more")  # overwrites the partial garbage
    assert f.read(0, 100)[:8] == b"goodmore"
    assert f.size == 8


def test_injected_write_failure_in_write_atomic_keeps_old():
    s = MemoryStorage()
    s.makedirs("d")
    s.write_atomic("d/c", b"old")
    s.fail_next_write()
    with pytest.raises(OSError):
        s.write_atomic("d/c", b"new")
    assert s.read_all("d/c") == b"old"


def test_failed_fsync_is_sticky_and_not_durable():
    s = MemoryStorage()
    s.makedirs("d")
    s.sync_dir("d")
    f = s.open_append("d/f")
    s.sync_dir("d")
    f.write(b"data")
    s.fail_next_sync()
    with pytest.raises(OSError):
        f.sync()
    with pytest.raises(OSError):
        f.sync()  # a retry must not pretend the data is safe
    assert s.crash().read_all("d/f") == b""
    g = s.open_append("d/f")  # a fresh handle (e.g. after restart) may sync again
    g.sync()
    assert s.crash().read_all("d/f") == b"data"


def test_injected_dir_sync_failure():
    s = MemoryStorage()
    s.makedirs("d")
    s.open_append("d/f").close()
    s.fail_next_sync()
    with pytest.raises(OSError):
        s.sync_dir("d")
    assert s.crash().list("d") == []


def test_memory_counts_syncs():
    s = MemoryStorage()
    s.makedirs("d")
    f = s.open_append("d/f")
    f.sync()
    s.sync_dir("d")
    assert (s.syncs, s.dir_syncs) == (1, 1)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fds_under(directory) -> int:
    """Descriptors this process holds on files under ``directory``: not a count of all of them, which other
    tests' threads change meanwhile."""
    prefix = os.path.realpath(directory) + os.sep
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:                       # closed meanwhile (or the listing's own descriptor)
            continue
        held += target.startswith(prefix)
    return held


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count descriptors")
def test_file_storage_holds_at_most_max_open_files_descriptors(tmp_path):
    s = FileStorage(tmp_path, max_open_files=3)
    s.makedirs("d")
    assert _fds_under(tmp_path) == 0
    files = [s.open_append(f"d/{i}") for i in range(10)]
    for i, f in enumerate(files):
        f.write(b"x%d" % i)
    assert s.open_descriptors <= 3 and _fds_under(tmp_path) <= 3
    for i, f in enumerate(files):             # each reopens its file on demand, at its logical end
        f.write(b"y")
        f.sync()
        assert f.read(0, 3) == b"x%dy" % i and f.size == 3
    readers = [s.open_read(f"d/{i}") for i in range(10)]
    assert [r.read(0, 3) for r in readers] == [b"x%dy" % i for i in range(10)]
    assert [r.size for r in readers] == [3] * 10
    assert s.open_descriptors <= 3 and _fds_under(tmp_path) <= 3
    files[0].close()
    with pytest.raises(OSError) as closed:
        files[0].read(0, 1)
    assert closed.value.errno == errno.EBADF
    for f in files[1:] + readers:
        f.close()
    assert s.open_descriptors == 0 and _fds_under(tmp_path) == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count descriptors")
def test_file_storage_out_of_descriptors_gives_back_idle_ones(tmp_path):
    """When the process runs out of descriptors, opening a file closes idle cached ones and goes on; an fsync
    that finds no descriptor fails without being sticky and succeeds once descriptors are free."""
    s = FileStorage(tmp_path)
    s.makedirs("d")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (_fds() + 8, hard))
        for i in range(40):                   # far more than the limit allows open at once
            files.append(s.open_append(f"d/{i}"))
            files[-1].write(b"v%d" % i)
        assert s.open_descriptors < 20          # some were given back
        s._descriptors.shed(len(s._descriptors))      # every cached descriptor given back, then none left
        hog = []
        try:
            while True:
                hog.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as e:
            assert e.errno == errno.EMFILE
        busy = files[0]
        with pytest.raises(OSError) as out:
            busy.sync()
        assert out.value.errno == errno.EMFILE
        for fd in hog:
            os.close(fd)
        busy.sync()                           # not sticky: works again once descriptors are free
        assert [f.read(0, 4) for f in files] == [b"v%d" % i for i in range(40)]
    finally:
        for f in files:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
