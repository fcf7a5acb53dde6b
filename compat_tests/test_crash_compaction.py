"""Crash safety of log compaction: kill -9 the broker while its log cleaner works on a dirty partition, in a
loop, and check after every restart that nothing acknowledged is lost and the view is a compacted one (every
record stored is the one acknowledged at its offset, offsets strictly increasing, each key's latest
acknowledged value present), then that the cleaner finishes the job (latest value per key, nothing else of
the watched keys), and that the segment files hold whole batches with valid CRCs and no offset twice (a
crash leaves the old segments or the new ones, never a mixture).

Each round an idempotent confluent-kafka producer (the same one across every kill: its producer state must
survive the cleaning and the crash) overwrites a few hundred keys with a burst of records, waits for every
acknowledgement, and the broker is killed after a seeded random delay while the cleaner is busy with the
burst.  TRIREME_COMPACTION_CRASH_KILLS rounds (CI: 3; `make compaction-crash-loop`: CRASH_KILLS, default 60),
kill points from TRIREME_CRASH_SEED.
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from trireme.wire import records

from compat_tests import clients
from compat_tests.compaction_support import (
    BROKER_CONFIG,
    Sent,
    Stored,
    compact_config,
    compacted,
    create_topic,
    filler,
    latest,
    produce,
    read_partition,
    wait_compacted,
    watermarks,
)
from compat_tests.python_clients import unique_topic

SEED = int(os.environ.get("TRIREME_CRASH_SEED", "7331"))
KILLS = int(os.environ.get("TRIREME_COMPACTION_CRASH_KILLS", "3"))
KEYS = [f"ck-{i:03d}".encode() for i in range(300)]
BURST = 3000            # records per round: ~600 KB over 16 KiB segments, a cleaning of a second or more here

pytestmark = [pytest.mark.server_config(BROKER_CONFIG), pytest.mark.trireme_only("kills the broker's process")]


def check_after_restart(view: list[Stored], sent: list[Sent], what: str) -> None:
    offsets = [r.offset for r in view]
    assert offsets == sorted(set(offsets)), f"{what}: offsets not strictly increasing (seed {SEED})"
    by_offset = {s.offset: s for s in sent}
    for r in view:
        s = by_offset.get(r.offset)
        assert s is not None and (r.key, r.value) == (s.key, s.value), \
            f"{what}: offset {r.offset} holds {r.key!r}={r.value!r}, acknowledged was {s} (seed {SEED})"
    present = {r.offset for r in view}
    lost = [s for s in latest(sent).values() if s.offset not in present]
    assert not lost, f"{what}: {len(lost)} keys lost their latest acknowledged value, e.g. {lost[:3]} (seed {SEED})"


def processes_in(workdir: Path) -> list[int]:
    """Pids of the processes whose working directory is ``workdir`` (the broker's, inherited by its children)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == workdir:
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def check_segment_files(data_dir: Path, topic: str) -> int:
    """Whole batches, valid CRCs, batch offsets strictly increasing across the partition's segments (old and
    new segments side by side would repeat offsets); no segment file of another kind left behind."""
    directory = data_dir / "logs" / f"{topic}-0"
    segments = sorted(directory.glob("*.log"), key=lambda p: int(p.stem))
    assert segments, f"no segment files in {directory}"
    last = -1
    for path in segments:
        data = path.read_bytes()
        assert int(path.stem) > last, f"{path.name} starts at or below offset {last}, already in an earlier segment"
        sizes = 0
        batches, zeros = clients.segment_batches(data, active=path == segments[-1])
        for pos, header in batches:
            assert records.crc_ok(data, pos, header), f"{path}: bad CRC in the batch at byte {pos}"
            assert header.base_offset > last, f"{path}: batch at byte {pos} repeats offset {header.base_offset}"
            last = header.next_offset - 1
            sizes += header.size
        assert sizes + zeros == len(data), f"{path}: {len(data) - sizes} bytes after the last whole batch"
    return len(segments)


@pytest.mark.timeout(600 + 60 * KILLS)
def test_kill9_during_cleaning_loop(server):
    topic = unique_topic("compact-crash")
    create_topic(server.bootstrap, topic, compact_config(segment_bytes=16384))
    rnd = random.Random(f"{SEED}:compaction-crash")
    # 16 KiB batches: segments roll during a burst, so the cleaner starts on it before the burst ends
    producer = Producer({"bootstrap.servers": server.bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 16384,
                         "enable.idempotence": True, "message.timeout.ms": 60000,
                         "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
                         "retry.backoff.ms": 50, "retry.backoff.max.ms": 500})
    sent: list[Sent] = []
    during = 0
    workdir = Path(server.workdir).resolve()
    for round_ in range(KILLS):
        burst = []
        for i in range(BURST):
            key = KEYS[rnd.randrange(len(KEYS))]
            value = None if i % 97 == 0 else f"{key.decode()}:{round_}:{i}:".encode() + b"v" * 150
            burst.append((key, value))
        sent += produce(server.bootstrap, topic, burst, producer=producer)
        # A cleaning under way shows as a child process of the broker (it cleans in one); when one shows within
        # 3 s, the kill comes a random moment into it, else after a random delay.
        deadline = time.monotonic() + 3
        while not cleaner_processes(server, workdir) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rnd.uniform(0.0, 0.5))
        if cleaner_processes(server, workdir):
            during += 1
        server.kill9()
        check_after_restart(read_partition(server.bootstrap, topic), sent, f"after kill {round_ + 1}")
        assert watermarks(server.bootstrap, topic)[0] == 0, f"after kill {round_ + 1}: the log start offset moved"
    print(f"\ncompaction crash loop: {KILLS} kills (seed {SEED}), {during} of them while a cleaner process ran; "
          f"{len(sent)} records acknowledged")

    sent += filler(server.bootstrap, topic, size=9000)     # the last burst's segment rolls: cleanable
    keys = set(KEYS)
    wait_compacted(server.bootstrap, topic, keys)
    view = read_partition(server.bootstrap, topic)
    check_after_restart(view, sent, "after the final cleaning")
    assert [(r.offset, r.key, r.value) for r in view] == \
        [(s.offset, s.key, s.value) for s in compacted(sent, tombstones=True)]
    server.restart(between=lambda: check_segment_files(Path(server.data_dir), topic))
    # The idempotent producer carries on after all that: no OUT_OF_ORDER_SEQUENCE, no duplicate.
    more = produce(server.bootstrap, topic, [(k, b"after-the-loop") for k in KEYS[:20]], producer=producer)
    view = read_partition(server.bootstrap, topic)
    assert [r.value for r in view].count(b"after-the-loop") == 20
    check_after_restart(view, sent + more, "after the loop")


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def cleaner_processes(server, workdir: Path) -> list[int]:
    """The running broker's children in its directory: its cleaner (and what that needs), not what a killed
    broker left behind."""
    if server.proc is None:
        return []
    return [pid for pid in processes_in(workdir) if parent_of(pid) == server.proc.pid]


def test_no_cleaner_process_outlives_a_killed_broker(server):
    """kill -9 the broker while a cleaning runs in its child process: once the broker is gone, nothing it
    started may go on writing into the data directory (beside the next broker's recovery and its own
    cleanings of the same partition)."""
    topic = unique_topic("compact-orphan")
    create_topic(server.bootstrap, topic, compact_config(segment_bytes=16384))
    workdir = Path(server.workdir).resolve()
    p = Producer({"bootstrap.servers": server.bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 16384})
    for r in range(3):
        produce(server.bootstrap, topic, [(KEYS[i % len(KEYS)], b"v" * 200) for i in range(BURST)], producer=p)
    clients.wait_until(lambda: cleaner_processes(server, workdir), timeout=60, interval=0.02,
                       what="a cleaning to run in a child process")
    left: list[int] = []

    def after_the_kill():
        # the cleaner's SIGKILL (PR_SET_PDEATHSIG) comes with the broker's death, but a process takes a moment to
        # go; one that was never sent it stays, and is what this looks for
        deadline = time.monotonic() + 5
        while processes_in(workdir) and time.monotonic() < deadline:
            time.sleep(0.05)
        left.extend(processes_in(workdir))
    server.kill9(between=after_the_kill)
    assert not left, f"processes of the killed broker still run in its directory: {left}"
