"""The ACL matrix for the client quota APIs: AlterClientQuotas needs AlterConfigs on the cluster, DescribeClientQuotas
DescribeConfigs (Kafka's KafkaApis); without it CLUSTER_AUTHORIZATION_FAILED and nothing changes."""
from __future__ import annotations

import pytest

from acl_matrix import Case, Changes, call_as, cluster, only, run_case, succeeded
from trireme.state.acls import Operation
from trireme.wire import error_codes as E
from trireme.wire.codec import message

ACQ = message("AlterClientQuotasRequest").cls
DCQ = message("DescribeClientQuotasRequest").cls
DENIED = E.CLUSTER_AUTHORIZATION_FAILED.code


def alter_request(user: str, value: float) -> ACQ:
    return ACQ(validate_only=False, entries=[ACQ.EntryData(
        entity=[ACQ.EntryData.EntityData(entity_type="user", entity_name=user)],
        ops=[ACQ.EntryData.OpData(key="producer_byte_rate", value=value, remove=False)])])


async def one_quota(broker):
    response = await call_as(broker, "AlterClientQuotas", 1, alter_request("bob", 2048.0))
    assert [e.error_code for e in response.entries] == [0]


def described(response, broker) -> None:
    succeeded(response, broker)
    assert [[(e.entity_type, e.entity_name) for e in x.entity] for x in response.entries] == [[("user", "bob")]]


QUOTA_CASES = [
    Case("alter-client-quotas", "AlterClientQuotas", 1, lambda b, _: alter_request("alice", 1024.0),
         (cluster(Operation.ALTER_CONFIGS),), only(DENIED), succeeded),
    Case("alter-client-quotas-v0", "AlterClientQuotas", 0, lambda b, _: alter_request("alice", 1024.0),
         (cluster(Operation.ALTER_CONFIGS),), only(DENIED), succeeded),
    Case("describe-client-quotas", "DescribeClientQuotas", 1, lambda b, _: DCQ(components=[], strict=False),
         (cluster(Operation.DESCRIBE_CONFIGS),), only(DENIED), described, setup=one_quota, changes=Changes.NOTHING),
]


@pytest.mark.parametrize("case", QUOTA_CASES, ids=str)
def test_client_quota_matrix(case):
    run_case(case)
