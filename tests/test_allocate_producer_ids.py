"""AllocateProducerIds on the controller: a block of producer ids reserved (durably) for the broker that asks."""
from __future__ import annotations

import pytest

from tests.test_admin_handlers import call, make_broker
from trireme.server.dispatch import API_KEYS, advertised_versions
from trireme.wire import error_codes as E
from trireme.wire.codec import message

REQUEST = message("AllocateProducerIdsRequest").cls


@pytest.fixture
def broker(tmp_path):
    b = make_broker(tmp_path / "data")
    yield b
    b.close()


def test_the_controller_reserves_disjoint_blocks_for_the_asker_and_for_itself(broker):
    first = call(broker, "AllocateProducerIds", 0, REQUEST(broker_id=broker.node_id, broker_epoch=-1))
    second = call(broker, "AllocateProducerIds", 0, REQUEST(broker_id=broker.node_id, broker_epoch=-1))
    assert (first.error_code, second.error_code) == (0, 0)
    assert first.producer_id_len == second.producer_id_len == broker.producer_ids.block_size
    assert second.producer_id_start == first.producer_id_start + first.producer_id_len
    assert broker.producer_ids.block_end == second.producer_id_start + second.producer_id_len


def test_an_unregistered_broker_id_is_refused(broker):
    answer = call(broker, "AllocateProducerIds", 0, REQUEST(broker_id=broker.node_id + 5, broker_epoch=-1))
    assert (answer.error_code, answer.producer_id_start, answer.producer_id_len) == \
        (E.BROKER_ID_NOT_REGISTERED.code, -1, 0)


def test_only_a_principal_with_cluster_action_may_ask(tmp_path):
    b = make_broker(tmp_path / "acl", authorizer_class_name="trireme")
    try:
        answer = call(b, "AllocateProducerIds", 0, REQUEST(broker_id=b.node_id, broker_epoch=-1))
        assert answer.error_code == E.CLUSTER_AUTHORIZATION_FAILED.code
    finally:
        b.close()


def test_it_is_not_listed_to_clients():
    assert API_KEYS["AllocateProducerIds"] not in advertised_versions()
