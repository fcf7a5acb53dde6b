"""Two brokers on one PostgreSQL: CreateTopics sent to the broker that is not the controller is forwarded to the controller in an Envelope (KIP-590), which creates the topic, and the client gets the controller's answer on its own connection; a topic Metadata auto-creates there is created by the controller too.

(tests/test_forwarding.py covers every forwarded API through the Envelope handler.)"""
from __future__ import annotations

import pytest

from compat_tests.cluster_support import Cluster
from compat_tests.test_bad_input import RawConn, req
from compat_tests.test_cluster import controller, wait_for
from trireme.wire.codec import message

pytestmark = pytest.mark.trireme_only("starts trireme serve processes on a PostgreSQL of its own")

# The authorizer on; on PLAINTEXT clients and brokers are all User:ANONYMOUS, a super user (so a broker has
# ClusterAction).
SECURED = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
           "super.users": "User:ANONYMOUS"}


def create_topic(conn, name, partitions=3):
    ct = message("CreateTopicsRequest").cls
    return conn.request("CreateTopics", 7, ct(topics=[ct.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=-1, assignments=[], configs=[])], timeout_ms=30000),
        timeout=90)


def topics_of(conn):
    return {t.name: len(t.partitions) for t in conn.request(
        "Metadata", 12, req("Metadata", topics=None, allow_auto_topic_creation=False)).topics}


def test_create_topics_and_auto_creation_on_a_broker_that_is_not_the_controller(tmp_path, postgres_database):
    with Cluster(tmp_path, postgres_database, size=2, **SECURED) as cluster:
        boss = wait_for("a controller", lambda: controller(postgres_database))
        other = 2 if boss == 1 else 1
        controller_broker, other_broker = cluster.brokers[boss], cluster.brokers[other]
        with RawConn(other_broker.bootstrap, timeout=30) as conn, \
                RawConn(controller_broker.bootstrap, timeout=30) as direct:
            # the other broker knows who the controller is (its poll of the database)
            wait_for("the other broker naming the controller", lambda: conn.request(
                "Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False)).controller_id == boss)
            mark = controller_broker.log_position()
            other_mark = other_broker.log_position()
            answer = create_topic(conn, "forwarded")        # RawConn checks the answer's correlation id
            assert [(t.name, t.error_code) for t in answer.topics] == [("forwarded", 0)]
            assert [(t.name, t.error_code) for t in create_topic(conn, "forwarded").topics] == \
                [("forwarded", 36)]                         # TOPIC_ALREADY_EXISTS, from the controller
            assert "created topic name=forwarded" in controller_broker.log_text(mark)
            assert "created topic name=forwarded" not in other_broker.log_text(other_mark)
            assert topics_of(direct).get("forwarded") == 3
            # Metadata auto-creating a topic there: LEADER_NOT_AVAILABLE at once, the controller creates it
            auto = conn.request("Metadata", 12, req("Metadata", topics=[req("Metadata").MetadataRequestTopic(
                name="auto-created")], allow_auto_topic_creation=True))
            assert [(t.name, t.error_code) for t in auto.topics] == [("auto-created", 5)]     # LEADER_NOT_AVAILABLE
            wait_for("the controller creating it", lambda: "auto-created" in topics_of(direct))
            assert "created topic name=auto-created" in controller_broker.log_text(mark)
            assert "created topic name=auto-created" not in other_broker.log_text(other_mark)
