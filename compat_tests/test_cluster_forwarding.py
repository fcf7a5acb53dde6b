"""Two brokers on one PostgreSQL: metadata changes sent to the broker that is not the controller go to the controller in an Envelope (KIP-590), which writes them to __cluster_metadata; the client gets the controller's answer on its own connection, and both brokers then serve the change.

tests/test_forwarding.py covers every forwarded API through the Envelope handler.
"""
from __future__ import annotations

import pytest

from compat_tests.cluster_support import Cluster, requests_handled
from compat_tests.test_bad_input import RawConn, req
from compat_tests.test_cluster import controller, wait_for
from trireme.wire.codec import message

pytestmark = pytest.mark.trireme_only("starts trireme serve processes on a PostgreSQL of its own")

# The authorizer on; on PLAINTEXT clients and brokers are all User:ANONYMOUS, a super user (so a broker has
# ClusterAction).  Metrics on, to count the Envelopes each broker handled.
SECURED = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
           "super.users": "User:ANONYMOUS", "trireme.metrics.listen": "127.0.0.1:0"}


def create_topic(conn, name, partitions=3, validate_only=False):
    ct = message("CreateTopicsRequest").cls
    return conn.request("CreateTopics", 7, ct(topics=[ct.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=-1, assignments=[], configs=[])], timeout_ms=30000,
        validate_only=validate_only), timeout=90)


def topics_of(conn):
    return {t.name: len(t.partitions) for t in conn.request(
        "Metadata", 12, req("Metadata", topics=None, allow_auto_topic_creation=False)).topics}


def acls_of(conn):
    da = req("DescribeAcls", resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
             principal_filter=None, host_filter=None, operation=1, permission_type=1)
    return [(r.resource_name, a.principal) for r in conn.request("DescribeAcls", 3, da).resources for a in r.acls]


def test_metadata_changes_on_a_broker_that_is_not_the_controller_are_made_by_the_controller(
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
            mark, other_mark = controller_broker.log_position(), other_broker.log_position()
            assert requests_handled(controller_broker, "Envelope") == 0
            created = create_topic(conn, "forwarded")       # RawConn checks the answer's correlation id
            assert [(t.name, t.error_code, t.num_partitions) for t in created.topics] == [("forwarded", 0, 3)]
            assert [t.error_code for t in create_topic(conn, "forwarded").topics] == [36]   # TOPIC_ALREADY_EXISTS
            refused = create_topic(conn, "other", partitions=0)
            assert [t.error_code for t in refused.topics] == [37]                            # INVALID_PARTITIONS
            assert refused == create_topic(direct, "other", partitions=0)
            assert "created topic name=forwarded" in controller_broker.log_text(mark)
            assert "created topic name=forwarded" not in other_broker.log_text(other_mark)
            wait_for("the topic on both brokers", lambda: topics_of(conn).get("forwarded") == 3 ==
                     topics_of(direct).get("forwarded"))

            ca = message("CreateAclsRequest").cls
            acl = conn.request("CreateAcls", 3, ca(creations=[ca.AclCreation(
                resource_type=2, resource_name="forwarded", resource_pattern_type=3, principal="User:bob", host="*",
                operation=3, permission_type=3)]), timeout=90)
            assert [r.error_code for r in acl.results] == [0]
            assert acls_of(direct) == [("forwarded", "User:bob")]
            wait_for("the ACL on the other broker", lambda: acls_of(conn) == [("forwarded", "User:bob")])

            # Metadata auto-creating a topic there: LEADER_NOT_AVAILABLE at once; the controller creates it
            auto = conn.request("Metadata", 12, req("Metadata", topics=[req("Metadata").MetadataRequestTopic(
                name="auto-created")], allow_auto_topic_creation=True))
            assert [(t.name, t.error_code) for t in auto.topics] == [("auto-created", 5)]     # LEADER_NOT_AVAILABLE
            wait_for("the auto-created topic on both brokers", lambda: "auto-created" in topics_of(direct)
                     and "auto-created" in topics_of(conn))
            assert "created topic name=auto-created" in controller_broker.log_text(mark)
            assert "created topic name=auto-created" not in other_broker.log_text(other_mark)
            assert requests_handled(controller_broker, "Envelope") == 5
            assert requests_handled(other_broker, "Envelope") == 0
