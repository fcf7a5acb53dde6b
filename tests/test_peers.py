"""The "peer for node id" lookup (server/peers.py) and how a broker's inter-broker settings say to reach other brokers (server/network_peer.py inter_broker_security)."""
from __future__ import annotations

import pytest
import trio

from trireme.server.broker import Broker
from trireme.server.config import Config, ConfigError
from trireme.server.local_peer import LocalPeer
from trireme.server.network_peer import NetworkPeer, inter_broker_security
from trireme.server.peers import Peers, PeerUnavailable
from trireme.state.storage import MemoryStorage
from trireme.wire import error_codes as E


def test_a_broker_is_its_own_local_peer_and_knows_no_other_node_yet():
    broker = Broker(Config(data_dir="/data", values={"node.id": 3}), MemoryStorage())
    assert isinstance(broker.peer(3), LocalPeer) and broker.peer(3) is broker.local_peer
    with pytest.raises(PeerUnavailable) as failure:
        broker.peer(4)
    assert failure.value.node_id == 4 and failure.value.error_code == E.NETWORK_EXCEPTION.code


def test_peers_makes_one_network_peer_per_address_and_a_new_one_when_it_moves():
    made = []

    def make(node_id, host, port, nursery):
        made.append((node_id, host, port))
        return NetworkPeer(node_id, host, port, nursery, request_timeout_s=1)

    async def main():
        peers = Peers(1, "local", make)
        peers.set_address(2, "127.0.0.1", 9093)
        with pytest.raises(PeerUnavailable, match="not running"):
            peers.peer(2)                                   # no task group for connections yet
        async with trio.open_nursery() as nursery:
            await nursery.start(peers.run)
            assert peers.peer(1) == "local"
            first = peers.peer(2)
            assert peers.peer(2) is first
            peers.set_address(2, "127.0.0.1", 9093)         # the same address: the same peer
            assert peers.peer(2) is first
            peers.set_address(2, "127.0.0.1", 9094)
            moved = peers.peer(2)
            assert moved is not first and (moved.host, moved.port) == ("127.0.0.1", 9094)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert made == [(2, "127.0.0.1", 9093), (2, "127.0.0.1", 9094)]


def _config(values: dict) -> Config:
    config = Config(data_dir="/data")
    config.update(values)
    config.resolve_listeners()
    return config


PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" '
              'password="broker-secret" user_broker="broker-secret";')
SASL_LISTENERS = {"listeners": "PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9094",
                  "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_PLAINTEXT",
                  "inter.broker.listener.name": "INTERNAL", "sasl.enabled.mechanisms": "PLAIN"}


def test_inter_broker_security_follows_the_inter_broker_listener():
    assert inter_broker_security(_config({})).protocol == "PLAINTEXT"
    security = inter_broker_security(_config({**SASL_LISTENERS, "sasl.mechanism.inter.broker.protocol": "PLAIN",
                                              "listener.name.internal.plain.sasl.jaas.config": PLAIN_JAAS}))
    assert (security.protocol, security.ssl_context, security.sasl_mechanism, security.username,
            security.password) == ("SASL_PLAINTEXT", None, "PLAIN", "broker", "broker-secret")


@pytest.mark.parametrize("values, why", [
    ({"listener.name.internal.plain.sasl.jaas.config": PLAIN_JAAS}, "GSSAPI"),     # Kafka's default mechanism
    ({"sasl.mechanism.inter.broker.protocol": "PLAIN", "listener.name.internal.plain.sasl.jaas.config":
      'org.apache.kafka.common.security.plain.PlainLoginModule required user_broker="broker-secret";'},
     "username and password"),
])
def test_inter_broker_sasl_without_usable_credentials_is_a_config_error(values, why):
    with pytest.raises(ConfigError, match=why):
        inter_broker_security(_config({**SASL_LISTENERS, **values}))
