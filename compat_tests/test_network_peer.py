"""Broker-to-broker requests over the wire (server/network_peer.py) against real broker processes: a peer as a broker's own ``Peers`` lookup makes it sends WriteTxnMarkers and AddPartitionsToTxn (v5, VerifyOnly) to another broker and gets their answers and effects; a stopped broker raises PeerUnavailable, and the peer recovers when it is back; many concurrent calls on one connection get their own answers; TLS (mTLS), SASL_SSL (SCRAM) and SASL_PLAINTEXT (PLAIN) listeners are reached as the inter-broker settings say, and the receiving broker authorizes a peer's markers by its principal's ClusterAction.

The peer runs in the test (node 1 standing for the coordinator's broker), with the broker under test as node 2 of its
address book: until brokers form a cluster no broker has another in its address book.
"""
from __future__ import annotations

import dataclasses
import functools

import outcome
import pytest
import trio
import trio.testing

from compat_tests import security
from compat_tests.test_bad_input import RawConn, create_topic, unique
from compat_tests.test_bad_transactions import add_partitions, end_txn, init, lso, produce_txn, txn_batch
from compat_tests.test_transactions_python import read_confluent
from trireme.server.config import Config
from trireme.server.network_peer import PLAINTEXT, NetworkPeer, inter_broker_security
from trireme.server.peers import Peers, PeerUnavailable
from trireme.wire import error_codes as E
from trireme.wire.codec import message

B = 2                          # the broker under test's node id in the test's address book
TIMEOUT_S = 5.0                # the peers' request.timeout.ms
_MARKERS = message("WriteTxnMarkersRequest").cls
_ADD = message("AddPartitionsToTxnRequest").cls
_PRODUCERS = message("DescribeProducersRequest").cls

STUCK_TOPIC = "peer-stuck"


def with_peer(bootstrap: str, body, *, security=PLAINTEXT, max_in_flight: int = 64):
    """Run ``await body(peers)`` with a ``Peers`` lookup of node 1 whose address book has node 2 at ``bootstrap``."""
    host, _, port = bootstrap.rpartition(":")

    def make(node_id, host, port, nursery):
        return NetworkPeer(node_id, host, port, nursery, request_timeout_s=TIMEOUT_S, security=security,
                           max_in_flight=max_in_flight)

    async def main():
        peers = Peers(1, None, make)
        peers.set_address(B, host, int(port))
        async with trio.open_nursery() as nursery:
            await nursery.start(peers.run)
            result = await outcome.acapture(body, peers)      # raised as itself, not in the nursery's group
            nursery.cancel_scope.cancel()
        return result.unwrap()

    return trio.run(main)


def producers(topic: str, partitions):
    return _PRODUCERS(topics=[_PRODUCERS.TopicRequest(name=topic, partition_indexes=list(partitions))])


@pytest.mark.server_config({"trireme.debug.transaction.marker.refuse": f"{STUCK_TOPIC}-0"})
def test_write_txn_markers_over_the_wire_end_a_prepared_transaction(server):
    """The coordinator's marker for partition 0 is refused by fault injection (the transaction stays prepared); the
    same marker sent by a peer over the wire is written: the last stable offset moves and a read_committed consumer
    reads the transaction's records."""
    with RawConn(server.bootstrap) as conn:
        create_topic(conn, STUCK_TOPIC, partitions=1)
        tid = unique("tx-peer")
        status, pid, epoch = init(conn, tid)
        assert status == 0
        assert add_partitions(conn, tid, pid, epoch, STUCK_TOPIC, [0]) == {(STUCK_TOPIC, 0): 0}
        assert produce_txn(conn, tid, STUCK_TOPIC, 0, txn_batch(pid, epoch, values=(b"a", b"b"))) == 0
        assert end_txn(conn, tid, pid, epoch, True) == 0
        assert lso(conn, STUCK_TOPIC, 0) == 0                 # prepared, its marker refused

        async def send(peers):
            return await peers.peer(B).call("WriteTxnMarkers", 1, _MARKERS(markers=[_MARKERS.WritableTxnMarker(
                producer_id=pid, producer_epoch=epoch, transaction_result=True, coordinator_epoch=0,
                topics=[_MARKERS.WritableTxnMarker.WritableTxnMarkerTopic(name=STUCK_TOPIC, partition_indexes=[0])])]))

        answer = with_peer(server.bootstrap, send)
        assert [(m.producer_id, t.name, p.partition_index, p.error_code)
                for m in answer.markers for t in m.topics for p in t.partitions] == [(pid, STUCK_TOPIC, 0, 0)]
        assert lso(conn, STUCK_TOPIC, 0) == 3                 # two records and the marker
    got, _ = read_confluent(server.bootstrap, [(STUCK_TOPIC, 0)], "read_committed")
    assert len(got[(STUCK_TOPIC, 0)]) == 2


def test_add_partitions_to_txn_verify_only_over_the_wire(server):
    """AddPartitionsToTxn v5 VerifyOnly, as a partition leader asks the coordinator: a partition of the open
    transaction is verified, another is not (and VerifyOnly adds nothing)."""
    with RawConn(server.bootstrap) as conn:
        topic = unique("verify")
        create_topic(conn, topic, partitions=2)
        tid = unique("tx-verify")
        status, pid, epoch = init(conn, tid)
        assert status == 0
        assert add_partitions(conn, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}

        async def verify(peers):
            return await peers.peer(B).call("AddPartitionsToTxn", 5, _ADD(transactions=[_ADD.AddPartitionsToTxnTransaction(
                transactional_id=tid, producer_id=pid, producer_epoch=epoch, verify_only=True,
                topics=[_ADD.AddPartitionsToTxnTopic(name=topic, partitions=[0, 1])])]))

        for _ in range(2):                                    # the second time: VerifyOnly added nothing
            answer = with_peer(server.bootstrap, verify)
            assert answer.error_code == 0
            assert {(r.transactional_id, t.name, p.partition_index): p.partition_error_code
                    for r in answer.results_by_transaction for t in r.topic_results
                    for p in t.results_by_partition} == {(tid, topic, 0): 0,
                                                         (tid, topic, 1): E.INVALID_TXN_STATE.code}
        assert end_txn(conn, tid, pid, epoch, False) == 0


def test_a_stopped_broker_raises_peer_unavailable_and_the_peer_recovers(server):
    """One peer across the broker's stop and start: a call while it is down raises PeerUnavailable
    (NETWORK_EXCEPTION) before the request timeout; once it is back the same peer reconnects and answers."""
    with RawConn(server.bootstrap) as conn:
        topic = unique("down")
        create_topic(conn, topic, partitions=1)

    async def body(peers):
        peer = peers.peer(B)
        answers = [await peer.call("DescribeProducers", 0, producers(topic, [0]))]
        server.stop()
        with trio.fail_after(TIMEOUT_S):                      # refused at once, not left to the timeout
            with pytest.raises(PeerUnavailable) as failure:
                await peer.call("DescribeProducers", 0, producers(topic, [0]))
        assert failure.value.error_code == E.NETWORK_EXCEPTION.code and failure.value.node_id == B
        await trio.to_thread.run_sync(server.start)
        answers.append(await peer.call("DescribeProducers", 0, producers(topic, [0])))
        assert peers.peer(B) is peer
        return answers

    answers = with_peer(server.bootstrap, body)
    assert [(t.name, p.partition_index, p.error_code) for a in answers for t in a.topics for p in t.partitions] == \
        [(topic, 0, 0), (topic, 0, 0)]


def test_a_silent_listener_times_out_with_request_timed_out():
    """A listener that accepts and never answers: REQUEST_TIMED_OUT after request.timeout.ms (on trio's virtual clock,
    no wall-clock wait), the connection closed."""
    async def main():
        accepted = []

        async def silent(stream):
            accepted.append(stream)
            await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            peer = NetworkPeer(B, "127.0.0.1", port, nursery, request_timeout_s=TIMEOUT_S)
            started = trio.current_time()
            with pytest.raises(PeerUnavailable) as failure:
                await peer.call("DescribeProducers", 0, producers("t", [0]))
            assert failure.value.error_code == E.REQUEST_TIMED_OUT.code
            assert trio.current_time() - started >= TIMEOUT_S
            assert len(accepted) == 1
            received = bytearray()
            while chunk := await accepted[0].receive_some(65536):     # the request, then the end: closed by the peer
                received += chunk
            assert int.from_bytes(received[:4], "big") == len(received) - 4
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.1))


def test_many_concurrent_calls_on_one_connection_get_their_own_answers(server):
    """300 calls at once over one connection with at most 8 in flight: each answer names the partition its request
    asked about, and the broker saw one connection."""
    partitions = 16
    with RawConn(server.bootstrap) as conn:
        topic = unique("pipelined")
        create_topic(conn, topic, partitions=partitions)
    before = server.log_text().count("connection open")

    async def body(peers):
        peer = peers.peer(B)
        pairs = []

        async def one(i):
            answer = await peer.call("DescribeProducers", 0, producers(topic, [i % partitions]))
            pairs.append((i % partitions, [(t.name, p.partition_index) for t in answer.topics for p in t.partitions]))

        async with trio.open_nursery() as nursery:
            for i in range(300):
                nursery.start_soon(one, i)
        return pairs

    pairs = with_peer(server.bootstrap, body, max_in_flight=8)
    assert len(pairs) == 300
    assert all(got == [(topic, asked)] for asked, got in pairs)
    assert server.log_text().count("connection open") - before == 1


def secured_config(tmp_path, tls, inter_broker: dict) -> Config:
    """The secured test broker's configuration (compat_tests/security.py) with ``inter_broker`` settings, as the
    broker reading it would build its peers' security (inter_broker_security)."""
    config = Config(data_dir=str(tmp_path))
    config.update({**security.secured_broker_config(tls), **inter_broker})
    config.resolve_listeners(("127.0.0.1", 0))
    return config


def describe_through(bootstrap: str, peer_security) -> list:
    async def body(peers):
        answer = await peers.peer(B).call("DescribeProducers", 0, producers("absent-topic", [0]))
        return [(t.name, p.error_code) for t in answer.topics for p in t.partitions]
    return with_peer(bootstrap, body, security=peer_security)


def test_an_ssl_inter_broker_listener_is_reached_with_the_brokers_certificate(secured_server, tmp_path):
    """mTLS (the SSL listener requires client certificates): the broker's keystore is its client certificate, its
    trust store checks the other broker's, with the host name."""
    config = secured_config(tmp_path, secured_server.tls, {"inter.broker.listener.name": "SSL"})
    peer_security = inter_broker_security(config)
    assert peer_security.protocol == "SSL" and peer_security.ssl_context.check_hostname
    assert describe_through(secured_server.ssl, peer_security) == [("absent-topic", E.UNKNOWN_TOPIC_OR_PARTITION.code)]


def test_a_sasl_ssl_inter_broker_listener_is_reached_with_scram(secured_server, tmp_path):
    """SASL_SSL with SCRAM-SHA-512: the credentials of the listener's JAAS line; a wrong password is
    PeerUnavailable."""
    jaas = (f"org.apache.kafka.common.security.scram.ScramLoginModule required username=\"{security.SCRAM_USER}\" "
            f"password=\"{{}}\";")
    name = f"listener.name.sasl_ssl.{security.SCRAM_MECHANISM.lower()}.sasl.jaas.config"
    settings = {"inter.broker.listener.name": "SASL_SSL",
                "sasl.mechanism.inter.broker.protocol": security.SCRAM_MECHANISM}
    config = secured_config(tmp_path, secured_server.tls, {**settings, name: jaas.format(security.SCRAM_PASSWORD)})
    peer_security = inter_broker_security(config)
    assert (peer_security.protocol, peer_security.sasl_mechanism, peer_security.username) == \
        ("SASL_SSL", security.SCRAM_MECHANISM, security.SCRAM_USER)
    assert describe_through(secured_server.sasl_ssl, peer_security) == \
        [("absent-topic", E.UNKNOWN_TOPIC_OR_PARTITION.code)]

    wrong = inter_broker_security(secured_config(tmp_path, secured_server.tls, {**settings, name: jaas.format("no")}))
    with pytest.raises(PeerUnavailable, match="SASL authentication failed"):
        describe_through(secured_server.sasl_ssl, wrong)


BROKER_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" '
               'password="broker-secret" user_broker="broker-secret" user_alice="alice-secret";')


@pytest.mark.server_config({
    "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": BROKER_JAAS,
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:broker"})
def test_a_peers_markers_need_cluster_action_on_the_receiving_broker(server, tmp_path):
    """SASL_PLAINTEXT with PLAIN, an authorizer on: the broker's principal (a super user, as Kafka's brokers are)
    may send WriteTxnMarkers; another principal without ClusterAction is answered CLUSTER_AUTHORIZATION_FAILED."""
    config = Config(data_dir=str(tmp_path))
    config.update({**server.config, "inter.broker.listener.name": "SASL_PLAINTEXT",
                   "sasl.mechanism.inter.broker.protocol": "PLAIN"})
    config.resolve_listeners(("127.0.0.1", 0))
    as_broker = inter_broker_security(config)
    assert (as_broker.protocol, as_broker.sasl_mechanism, as_broker.username) == ("SASL_PLAINTEXT", "PLAIN", "broker")
    as_alice = dataclasses.replace(as_broker, username="alice", password="alice-secret")

    async def send(peers):
        answer = await peers.peer(B).call("WriteTxnMarkers", 1, _MARKERS(markers=[_MARKERS.WritableTxnMarker(
            producer_id=5, producer_epoch=0, transaction_result=False, coordinator_epoch=0,
            topics=[_MARKERS.WritableTxnMarker.WritableTxnMarkerTopic(name="absent-topic", partition_indexes=[0])])]))
        return [p.error_code for m in answer.markers for t in m.topics for p in t.partitions]

    address = server.bootstrap_for("SASL_PLAINTEXT")
    assert with_peer(address, send, security=as_broker) == [E.UNKNOWN_TOPIC_OR_PARTITION.code]
    assert with_peer(address, send, security=as_alice) == [E.CLUSTER_AUTHORIZATION_FAILED.code]
