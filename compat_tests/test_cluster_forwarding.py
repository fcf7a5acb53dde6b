"""Two brokers on one PostgreSQL: CreateTopics sent to the broker that is not the controller goes to the controller in an Envelope (KIP-590), and the client gets the controller's answer on its own connection.

The requests here change nothing (validate-only, or refused by the controller's checks): writing a topic's record
needs the controller to lead ``__cluster_metadata``, which the cluster does not arrange yet.  tests/test_forwarding.py
covers every forwarded API through the Envelope handler, and writes.
"""
from __future__ import annotations

import re
import urllib.request

import pytest

from compat_tests.cluster_support import Cluster
from compat_tests.test_bad_input import RawConn, req
from compat_tests.test_cluster import controller, wait_for
from trireme.wire.codec import message

pytestmark = pytest.mark.trireme_only("starts trireme serve processes on a PostgreSQL of its own")

# The authorizer on; on PLAINTEXT clients and brokers are all User:ANONYMOUS, a super user (so a broker has
# ClusterAction).  Metrics on, to count the Envelopes each broker handled.
SECURED = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
           "super.users": "User:ANONYMOUS", "trireme.metrics.listen": "127.0.0.1:0"}


def create_topic(conn, name, partitions=3, validate_only=True):
    ct = message("CreateTopicsRequest").cls
    return conn.request("CreateTopics", 7, ct(topics=[ct.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=-1, assignments=[], configs=[])], timeout_ms=30000,
        validate_only=validate_only), timeout=90)


def envelopes_handled(broker) -> int:
    url = wait_for("the metrics address", lambda: re.findall(r"metrics on (http://\S+/metrics)",
                                                             broker.stderr_path.read_text(errors="replace")))[-1]
    page = urllib.request.urlopen(url, timeout=10).read().decode()
    found = re.search(r'^trireme_requests_total\{api="Envelope"\} (\S+)$', page, re.M)
    return int(float(found.group(1))) if found else 0


def test_create_topics_on_a_broker_that_is_not_the_controller_is_answered_by_the_controller(
        tmp_path, postgres_database):
    with Cluster(tmp_path, postgres_database, size=2, **SECURED) as cluster:
        boss = wait_for("a controller", lambda: controller(postgres_database))
        other = 2 if boss == 1 else 1
        controller_broker, other_broker = cluster.brokers[boss], cluster.brokers[other]
        with RawConn(other_broker.bootstrap, timeout=30) as conn, \
                RawConn(controller_broker.bootstrap, timeout=30) as direct:
            # the other broker knows who the controller is (its poll of the database)
            wait_for("the other broker naming the controller", lambda: conn.request(
                "Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False)).controller_id == boss)
            assert envelopes_handled(controller_broker) == 0
            valid = create_topic(conn, "forwarded")         # RawConn checks the answer's correlation id
            assert [(t.name, t.error_code, t.num_partitions) for t in valid.topics] == [("forwarded", 0, 3)]
            assert envelopes_handled(controller_broker) == 1
            refused = create_topic(conn, "forwarded", partitions=0)
            assert [t.error_code for t in refused.topics] == [37]          # INVALID_PARTITIONS
            assert refused == create_topic(direct, "forwarded", partitions=0)
            assert envelopes_handled(controller_broker) == 2
            assert envelopes_handled(other_broker) == 0
