"""Client input that drives work on the broker's event loop is bounded: no request stalls the others.

Raw requests against a real `trireme serve`: ListTransactions v2's TransactionalIdPattern (a
linear-time RE2 engine with Kafka's full-match semantics, matched off the event loop), and the
bounds on other client-given patterns, counts and sizes the audit of issue 20 found.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from compat_tests.test_bad_input import (LogWatch, RawConn, api_versions, assert_healthy, create_topic, metadata,
                                        produce, batch, req, unique)
from compat_tests.clients import wait_until
from compat_tests.test_bad_transactions import init
from trireme.wire import error_codes as E
from trireme.wire.codec import message

pytestmark = pytest.mark.trireme_only("RE2's bounds and the broker's log")


def list_transactions(conn: RawConn, pattern: str | None, version: int = 2, **fields):
    r = conn.request("ListTransactions", version, req("ListTransactions", state_filters=[], producer_id_filters=[],
                                                      duration_filter=-1, transactional_id_pattern=pattern, **fields))
    return r.error_code, sorted(t.transactional_id for t in r.transaction_states)


def test_pathological_pattern_answers_promptly_and_others_are_served(module_server):
    """`(c+)+x` against an id of 40 c's took Python's backtracking `re` hours on the event loop (30: 55 s)."""
    log = LogWatch(module_server)
    victim = "c" * 40
    with RawConn(module_server.bootstrap) as conn, RawConn(module_server.bootstrap, timeout=5) as witness:
        assert init(conn, victim)[0] == 0
        cid = conn.send_request("ListTransactions", 2, req("ListTransactions", state_filters=[],
                                                           producer_id_filters=[], duration_filter=-1,
                                                           transactional_id_pattern="(c+)+x"))
        # Meanwhile another connection is served (hang guard: it timed out after 5 s before the fix).
        assert api_versions(witness).error_code == 0
        assert metadata(witness).brokers
        r = conn.read_response("ListTransactions", 2, cid, timeout=10)
        assert (r.error_code, r.transaction_states) == (0, [])
        assert list_transactions(conn, "(c+)+") == (0, [victim])
    assert_healthy(module_server, RawConn(module_server.bootstrap))
    assert "Traceback" not in log.text()


def test_pattern_semantics_are_re2_full_match(module_server):
    """Kafka: RE2/J's ``Pattern.compile(p).matcher(id).matches()``: the whole id, RE2 syntax."""
    prefix = unique("re2")
    ids = [f"{prefix}-abc", f"{prefix}-abc-1", f"{prefix}-x9"]
    with RawConn(module_server.bootstrap) as conn:
        for tid in ids:
            assert init(conn, tid)[0] == 0
        assert list_transactions(conn, f"{prefix}-abc")[1] == [f"{prefix}-abc"]        # not a search
        assert list_transactions(conn, f"{prefix}-.*")[1] == sorted(ids)
        assert list_transactions(conn, "abc")[1] == []
        # RE2 syntax Python's re lacks: Unicode classes.
        assert list_transactions(conn, prefix + r"-\pL+")[1] == [f"{prefix}-abc"]
        assert list_transactions(conn, prefix + r"-[[:alpha:]]+")[1] == [f"{prefix}-abc"]
        # Empty (or null) pattern: no filter.
        assert set(ids) <= set(list_transactions(conn, "")[1])
        assert set(ids) <= set(list_transactions(conn, None)[1])


@pytest.mark.parametrize("pattern", [
    r"(a)\1",                # back-reference: Python's re accepts it, RE2 (and RE2/J) do not
    r"(?=a)a",               # look-ahead
    r"[",                    # syntax
    "a{1001}",               # RE2's repetition limit
    "(?s)(" + "|".join(f".*{x}.{{999}}{y}" for x in "abcd" for y in "abcd") + ")x",   # program over 1 MiB
])
def test_refused_patterns_answer_invalid_regular_expression(module_server, pattern):
    log = LogWatch(module_server)
    with RawConn(module_server.bootstrap) as conn:
        assert list_transactions(conn, pattern) == (E.INVALID_REGULAR_EXPRESSION.code, [])
        assert api_versions(conn).error_code == 0
    time.sleep(0.2)
    text = log.text()
    assert "Error parsing" not in text and "re2.cc" not in text, text[-2000:]   # RE2's own stderr logging is off


# --------------------------------------------------------------------------- strings over 32,767 bytes

@pytest.mark.parametrize("length", [32768, 40000])
def test_overlong_transactional_id_closes_the_connection(module_server, length):
    """A flexible request can carry a compact string longer than 32,767 bytes; Kafka's generated reader refuses it
    ("string field transactionalId had invalid length") and the broker closes the connection.  It used to reach
    the transaction log's encoder and raise there, once per request."""
    log = LogWatch(module_server)
    tid = "t" * length
    with RawConn(module_server.bootstrap) as conn:
        conn.send_request("InitProducerId", 4, req("InitProducerId", transactional_id=tid, transaction_timeout_ms=60000,
                                                   producer_id=-1, producer_epoch=-1))
        conn.expect_closed()
    line = log.wait_for("closing connection:", "malformed InitProducerId v4 request")
    assert f"string of {length} bytes is over the 32767-byte limit" in line, line
    with RawConn(module_server.bootstrap) as witness:
        assert_healthy(module_server, witness)
        # The longest id Kafka reads still works, and nothing of the refused one was stored.
        longest = unique("t").ljust(32767, "t")
        assert init(witness, longest)[0] == 0
        listed = list_transactions(witness, "t.*")[1]
        assert longest in listed and max(map(len, listed)) == 32767
    assert "Traceback" not in log.text(), log.text()[-4000:]


# --------------------------------------------------------------------------- auto-creation on a full disk

@pytest.fixture
def full_disk_server(request):
    """A broker whose data directory is a 4 MiB tmpfs (mounting needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs as the data directory needs root")
    from compat_tests.conftest import ServerProcess
    workdir = Path(tempfile.mkdtemp(prefix="trireme-full-"))
    srv = ServerProcess(workdir, config={"trireme.fsync.enable": False})
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(srv.data_dir)], check=True)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
        subprocess.run(["umount", "-l", str(srv.data_dir)], check=False)
        if not request.node.rep_call.failed:
            shutil.rmtree(workdir, ignore_errors=True)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` up to the last byte; → the filler file (delete it to free the space)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def alter_retention(conn: RawConn, topic: str, value: str) -> int:
    cls = message("IncrementalAlterConfigsRequest").cls
    alter = cls(resources=[cls.AlterConfigsResource(resource_type=2, resource_name=topic, configs=[
        cls.AlterConfigsResource.AlterableConfig(name="retention.ms", config_operation=0, value=value)])])
    [result] = conn.request("IncrementalAlterConfigs", 1, alter).responses
    return result.error_code


def fill_metadata_log(conn: RawConn, topic: str) -> None:
    """On a full disk: topic changes are records of __cluster_metadata, and the file's last page may still hold a few
    (a write there needs no new block).  Change ``topic`` until one finds no space: the metadata log is then offline
    (every topic change answers KAFKA_STORAGE_ERROR) until its failed write is retried with space free."""
    for i in range(1000):                   # a 4 KiB page holds a few dozen such records
        code = alter_retention(conn, topic, str(10**17 + i))
        if code:
            assert code == E.KAFKA_STORAGE_ERROR.code
            return
    pytest.fail("the metadata log never ran out of space")


def metadata_auto_create(conn: RawConn, names: list[str], version: int = 12):
    cls = message("MetadataRequest").cls
    r = conn.request("Metadata", version, cls(topics=[cls.MetadataRequestTopic(name=n) for n in names],
                                              allow_auto_topic_creation=True))
    return {t.name: (t.error_code, len(t.partitions)) for t in r.topics}


def test_auto_create_on_a_full_disk_answers_storage_error(full_disk_server):
    """Metadata auto-creating a topic on a full disk raised OSError in the handler; now that topic gets
    KAFKA_STORAGE_ERROR (retriable: the client asks again), nothing of it is left behind, and once space is
    free the same request creates it."""
    server = full_disk_server
    log = LogWatch(server)
    with RawConn(server.bootstrap) as conn:
        existing = unique("before")
        create_topic(conn, existing)
        filler = fill(server.data_dir)
        fill_metadata_log(conn, existing)
        name = unique("auto")
        assert metadata_auto_create(conn, [name, existing]) == {
            name: (E.KAFKA_STORAGE_ERROR.code, 0), existing: (0, 1)}
        assert_healthy(server, conn)
        assert not list((server.data_dir / "logs").glob(name + "-*"))           # nothing left behind
        # CreateTopics goes the same way (it raised the same OSError).
        cls = message("CreateTopicsRequest").cls
        other = unique("create")
        r = conn.request("CreateTopics", 7, cls(topics=[cls.CreatableTopic(name=other, num_partitions=1,
                                                                           replication_factor=1)], timeout_ms=10000))
        assert [(t.name, t.error_code) for t in r.topics] == [(other, E.KAFKA_STORAGE_ERROR.code)]
        filler.unlink()
        # the metadata log is back once its failed write is retried (server/broker.py, run_storage_retry)
        wait_until(lambda: metadata_auto_create(conn, [name]) == {name: (0, 1)}, timeout=30,
                   what="auto-creation once space is free")
        [r] = produce(conn, name, {0: batch([b"after"])})
        assert r.error_code == 0
    text = log.text()
    assert "Traceback" not in text, text[-4000:]


def test_every_topic_registry_change_on_a_full_disk_answers_storage_error(full_disk_server):
    """CreatePartitions, IncrementalAlterConfigs and DeleteTopics write the topic registry too: on a full disk each
    answers KAFKA_STORAGE_ERROR and changes nothing (CreatePartitions raised OSError out of the handler, a traceback
    and a closed connection), and each works once space is free."""
    server = full_disk_server
    log = LogWatch(server)
    with RawConn(server.bootstrap) as conn:
        topic = unique("registry")
        create_topic(conn, topic)
        filler = fill(server.data_dir)
        fill_metadata_log(conn, topic)
        pcls = message("CreatePartitionsRequest").cls
        grow = pcls(topics=[pcls.CreatePartitionsTopic(name=topic, count=2, assignments=None)], timeout_ms=10000)
        r = conn.request("CreatePartitions", 3, grow)
        assert [(t.name, t.error_code) for t in r.results] == [(topic, E.KAFKA_STORAGE_ERROR.code)]
        acls = message("IncrementalAlterConfigsRequest").cls
        alter = acls(resources=[acls.AlterConfigsResource(resource_type=2, resource_name=topic, configs=[
            acls.AlterConfigsResource.AlterableConfig(name="retention.ms", config_operation=0, value="60000")])])
        r = conn.request("IncrementalAlterConfigs", 1, alter)
        assert [x.error_code for x in r.responses] == [E.KAFKA_STORAGE_ERROR.code]
        dcls = message("DeleteTopicsRequest").cls
        r = conn.request("DeleteTopics", 4, dcls(topic_names=[topic], timeout_ms=10000))
        assert [(x.name, x.error_code) for x in r.responses] == [(topic, E.KAFKA_STORAGE_ERROR.code)]
        assert metadata_auto_create(conn, [topic]) == {topic: (0, 1)}           # all unchanged
        assert_healthy(server, conn)
        filler.unlink()
        wait_until(lambda: [t.error_code for t in conn.request("CreatePartitions", 3, grow).results] == [0],
                   timeout=30, what="CreatePartitions once the metadata log's write is retried")
        assert [x.error_code for x in conn.request("IncrementalAlterConfigs", 1, alter).responses] == [0]
        r = conn.request("DeleteTopics", 4, dcls(topic_names=[topic], timeout_ms=10000))
        assert [(x.name, x.error_code) for x in r.responses] == [(topic, 0)]
    text = log.text()
    assert "Traceback" not in text, text[-4000:]


# --------------------------------------------------------------------------- repeats in one request

REPEATS = 20000


def test_repeated_entries_do_not_multiply_the_response(module_server):
    """A name repeated in one request is answered once where the answer is big and comes from the broker's state:
    each repeat of the broker's DescribeConfigs resource cost 8.5 KiB of response for 5 bytes of request (a 1 MiB
    request built a 1.7 GB response on the event loop); Metadata answers the set of the names, as Kafka does."""
    with RawConn(module_server.bootstrap, timeout=30) as conn:
        topic = unique("big")
        create_topic(conn, topic, partitions=50)
        mcls = message("MetadataRequest").cls
        r = conn.request("Metadata", 12, mcls(topics=[mcls.MetadataRequestTopic(name=topic)] * REPEATS,
                                               allow_auto_topic_creation=False))
        assert [(t.name, len(t.partitions)) for t in r.topics] == [(topic, 50)]

        ccls = message("DescribeConfigsRequest").cls
        broker = ccls.DescribeConfigsResource(resource_type=4, resource_name="1", configuration_keys=None)
        r = conn.request("DescribeConfigs", 4, ccls(resources=[broker] * REPEATS, include_synonyms=True,
                                                    include_documentation=True))
        assert len(r.results) == REPEATS                           # every resource answered, in order
        first, *repeats = r.results
        assert first.error_code == 0 and len(first.configs) > 20
        assert {(x.error_code, x.error_message, len(x.configs)) for x in repeats} == \
            {(E.INVALID_REQUEST.code, "Duplicate resource", 0)}

        group = unique("g")
        r = conn.request("DescribeGroups", 5, req("DescribeGroups", groups=[group] * REPEATS))
        assert [g.group_id for g in r.groups] == [group]

        ocls = message("OffsetFetchRequest").cls
        r = conn.request("OffsetFetch", 8, ocls(groups=[ocls.OffsetFetchRequestGroup(group_id=group, topics=None)]
                                                * REPEATS, require_stable=False))
        assert [g.group_id for g in r.groups] == [group]
    assert_healthy(module_server, RawConn(module_server.bootstrap))


def test_repeated_transaction_ids_and_partitions_are_described_once(module_server):
    with RawConn(module_server.bootstrap, timeout=30) as conn:
        topic = unique("txd")
        create_topic(conn, topic)
        tid = unique("tx")
        assert init(conn, tid)[0] == 0
        r = conn.request("DescribeTransactions", 0, req("DescribeTransactions", transactional_ids=[tid] * REPEATS))
        assert [(t.transactional_id, t.error_code) for t in r.transaction_states] == [(tid, 0)]
        pcls = message("DescribeProducersRequest").cls
        r = conn.request("DescribeProducers", 0, pcls(topics=[pcls.TopicRequest(name=topic,
                                                                                partition_indexes=[0] * REPEATS)]))
        assert [[p.partition_index for p in t.partitions] for t in r.topics] == [[0]]
