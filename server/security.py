"""The broker's security facade: who may do what (the authorizer), the stored SCRAM credentials and client quotas.

Handlers ask through :meth:`RequestContext.authorize <trireme.server.dispatch.RequestContext.authorize>`;
authentication asks :meth:`Security.scram_credential`; quota enforcement asks :meth:`Security.client_quota`.
Without an authorizer configured (``authorizer.class.name`` unset) every request is allowed, as in Kafka.
With one (Kafka's class names or ``trireme``), decisions are Kafka's StandardAuthorizer's
(:class:`~trireme.state.acls.Authorizer`), with ``super.users`` and ``allow.everyone.if.no.acl.found``.
"""
from __future__ import annotations

import logging

from trireme.state.acls import Authorizer, Operation, ResourceType, parse_super_users

from .startup import StartupError

log = logging.getLogger("trireme.security")

# authorizer.class.name values that turn the authorizer on: Kafka 4's, Kafka 3's (ZooKeeper-era) and ours.
AUTHORIZER_CLASS_NAMES = frozenset({"org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                                    "kafka.security.authorizer.AclAuthorizer", "trireme"})


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

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        """Whether ``principal`` connecting from ``host`` may do ``operation`` on the resource."""
        if not self.authorizer_enabled:
            return True
        return self.authorizer.authorize(principal, host, operation, resource_type, name)

    def authorize_by_resource_type(self, principal: str, host: str, operation: Operation,
                                   resource_type: ResourceType) -> bool:
        """Kafka's authorizeByResourceType: whether the principal may do ``operation`` on at least one resource of
        the type (InitProducerId's idempotence check: Write on some topic without IdempotentWrite)."""
        if not self.authorizer_enabled:
            return True
        return self.authorizer.authorize_by_resource_type(principal, host, operation, resource_type)

    def scram_credential(self, user: str, mechanism: str):
        """The stored SCRAM credential of ``user`` for ``mechanism`` (SCRAM-SHA-256/512), or None."""
        return None

    def client_quota(self, user: str | None, client_id: str | None) -> dict[str, float]:
        """The quotas that apply to this (user, client id) by Kafka's precedence: quota key → value."""
        return {}
