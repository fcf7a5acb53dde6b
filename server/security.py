"""The broker's security facade: who may do what (the authorizer), the stored SCRAM credentials and client quotas.

Handlers ask through :meth:`RequestContext.authorize <trireme.server.dispatch.RequestContext.authorize>`;
authentication asks :meth:`Security.scram_credential`; quota enforcement asks :meth:`Security.client_quota`.
Without an authorizer configured (``authorizer.class.name`` unset) every request is allowed, as in Kafka.
With one (Kafka's class names or ``trireme``), decisions are Kafka's StandardAuthorizer's
(:class:`~trireme.state.acls.Authorizer`), with ``super.users`` and ``allow.everyone.if.no.acl.found``.

ACLs, SCRAM credentials and client quotas are durable as records in ``__cluster_metadata``: each is a
*section* of :attr:`Security.metadata` (state/cluster_metadata.py explains the protocol), and
:meth:`Security.update` is how a change is decided, written and replayed (server/cluster_metadata.py).
"""
from __future__ import annotations

import functools
import ipaddress
import logging
import os

from trireme.state.acls import Authorizer, Operation, ResourceType, parse_super_users
from trireme.state.client_quotas import ClientQuotas
from trireme.state.cluster_metadata import AclRecords, ClusterMetadata
from trireme.state.scram_credentials import (MECHANISMS, AddScramError, ScramCredential, ScramCredentials,
                                             parse_add_scram)

from .startup import StartupError

log = logging.getLogger("trireme.security")

# authorizer.class.name values that turn the authorizer on: Kafka 4's, Kafka 3's (ZooKeeper-era) and ours.
AUTHORIZER_CLASS_NAMES = frozenset({"org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                                    "kafka.security.authorizer.AclAuthorizer", "trireme"})


@functools.lru_cache(maxsize=4096)
def java_host_address(host: str) -> str:
    """A client's IP address (as Python writes it) as Kafka compares it with ACL hosts: Java's
    ``InetAddress.getHostAddress()``, which writes IPv6 as eight uncompressed lower-case hex groups
    (``0:0:0:0:0:0:0:1``, not ``::1``) and an IPv4-mapped address as its IPv4 dotted quad; a zone (``%eth0``) is
    kept.  IPv4 and anything else unchanged."""
    if ":" not in host:
        return host
    address, sep, zone = host.partition("%")
    try:
        ip = ipaddress.IPv6Address(address)
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    packed = ip.packed
    return ":".join(format(int.from_bytes(packed[i:i + 2], "big"), "x") for i in range(0, 16, 2)) + sep + zone


class Security:
    def __init__(self, config):
        self.config = config
        name = config["authorizer.class.name"]
        if name and name not in AUTHORIZER_CLASS_NAMES:
            raise StartupError(f"authorizer.class.name={name}: not an authorizer of this broker (use "
                               f"org.apache.kafka.metadata.authorizer.StandardAuthorizer, "
                               f"kafka.security.authorizer.AclAuthorizer or trireme, or leave it unset)")
        self.authorizer_enabled = bool(name)
        self.authorizer = Authorizer(parse_super_users(config["super.users"]),
                                     config["allow.everyone.if.no.acl.found"])
        try:
            self._add_scram = parse_add_scram(config["trireme.storage.add.scram"])
        except AddScramError as e:
            raise StartupError(f"trireme.storage.add.scram: {e}") from None
        self.acls = AclRecords(self.authorizer, config["trireme.max.acls"])
        self.scram = ScramCredentials()
        self.client_quotas = ClientQuotas(config["trireme.max.client.quota.entities"])
        # The sections of __cluster_metadata, registered before the log is replayed (one per kind of metadata).
        self.metadata = ClusterMetadata([self.acls, self.scram, self.client_quotas])
        self.service = None             # server.cluster_metadata.ClusterMetadataService, once the log is loaded

    def attach(self, service) -> None:
        """The loaded ``__cluster_metadata`` service (the broker writes :meth:`initial_records` to it when new)."""
        self.service = service

    def initial_records(self) -> list:
        """The records of ``trireme.storage.add.scram`` (each with a fresh random salt unless one is given), for a
        new data directory (``__cluster_metadata`` never written).  Logs user names and mechanisms, never a password."""
        records = []
        for entry in self._add_scram:
            records.append(entry.record(os.urandom(32)))
            log.info("adding SCRAM credential user=%s mechanism=%s (trireme.storage.add.scram)", entry.user,
                     MECHANISMS[entry.mechanism][0])
        return records

    async def update(self, decide):
        """Change security metadata: ``decide()`` → (records, answer) is called on the state every earlier change
        left (no other change in between), its records are appended to ``__cluster_metadata``, made durable and
        replayed; → the answer.  Raises server.cluster_metadata.MetadataUnavailable when the log cannot be
        written (KAFKA_STORAGE_ERROR for the client)."""
        return await self.service.update(decide)

    async def write(self, records: list) -> None:
        """Append ``records`` durably and replay them (:meth:`update` without a decision)."""
        await self.update(lambda: (records, None))

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        """Whether ``principal`` connecting from ``host`` may do ``operation`` on the resource (``host`` compared with
        ACL hosts as Kafka writes it: :func:`java_host_address`)."""
        if not self.authorizer_enabled:
            return True
        return self.authorizer.authorize(principal, java_host_address(host), operation, resource_type, name)

    def authorize_by_resource_type(self, principal: str, host: str, operation: Operation,
                                   resource_type: ResourceType) -> bool:
        """Kafka's authorizeByResourceType: whether the principal may do ``operation`` on at least one resource of
        the type (InitProducerId's idempotence check: Write on some topic without IdempotentWrite)."""
        if not self.authorizer_enabled:
            return True
        return self.authorizer.authorize_by_resource_type(principal, java_host_address(host), operation,
                                                          resource_type)

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """The stored SCRAM credential of ``user`` for ``mechanism`` (SCRAM-SHA-256/512), or None: a
        (salt, stored_key, server_key, iterations) tuple, what scramp's ``auth_fn`` returns."""
        return self.scram.get(user, mechanism)

    def client_quota(self, user: str | None, client_id: str | None) -> dict[str, float]:
        """The quotas that apply to this (user, client id) by Kafka's precedence: quota key → value."""
        return self.client_quotas.client_quota(user or "", client_id or "")
