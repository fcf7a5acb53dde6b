"""The broker's security facade: who may do what (the authorizer), the stored SCRAM credentials and client quotas.

Handlers ask through :meth:`RequestContext.authorize <trireme.server.dispatch.RequestContext.authorize>`;
authentication asks :meth:`Security.scram_credential`; quota enforcement asks :meth:`Security.client_quota`.
Without an authorizer configured (``authorizer.class.name`` unset) every request is allowed, as in Kafka.
"""
from __future__ import annotations

import logging

from trireme.state.acls import Operation, ResourceType
from trireme.state.client_quotas import ClientQuotas

log = logging.getLogger("trireme.security")


class Security:
    def __init__(self, config):
        self.config = config
        self.authorizer_enabled = False
        # the "client quotas" section of the security metadata
        self.client_quotas = ClientQuotas(config["trireme.max.client.quota.entities"])

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        """Whether ``principal`` connecting from ``host`` may do ``operation`` on the resource."""
        return True

    def scram_credential(self, user: str, mechanism: str):
        """The stored SCRAM credential of ``user`` for ``mechanism`` (SCRAM-SHA-256/512), or None."""
        return None

    async def update(self, decide):
        """Change security metadata: ``decide()`` → (records, answer) on the current state, its records replayed;
        → the answer.  (Until the durable ``__cluster_metadata`` log lands, the records are replayed in memory
        only; the acls branch replaces this with the write to that log.)"""
        records, answer = decide()
        for key, value in records:
            self.client_quotas.replay(key, value)
        return answer

    def client_quota(self, user: str | None, client_id: str | None) -> dict[str, float]:
        """The quotas that apply to this (user, client id) by Kafka's precedence: quota key → value."""
        return self.client_quotas.client_quota(user or "", client_id or "")
