"""A stand-in authorizer and a table-driven ACL matrix: each API, lacking each permission it needs, answers Kafka's code and changes nothing; with all of them it succeeds.

Reusable by any API's tests (data, transactions, groups, admin).  A :class:`Case` names an API call, the grants it
needs, what a refusal for each missing grant must answer and what success must answer; :func:`run_case` runs it
once per missing grant and once with every grant, each on a fresh in-memory broker whose ``security`` is a
:class:`GrantSecurity`, and compares :func:`broker_state` before and after every refused call.  Set-up steps run
as the broker itself (``cluster_action``) or with :func:`call_as` under every grant.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Awaitable, Callable, Iterable

import trio

from broker_runner import run_with_broker
from trireme.server.broker import Broker
from trireme.server.config import Config
from trireme.server.deferred import Deferred
from trireme.server.dispatch import API_KEYS, HANDLERS, NOT_HANDLED, Encoded, RequestContext, load_handlers
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.state.storage import MemoryStorage

load_handlers()

PRINCIPAL = "User:alice"
ANY_NAME = "*"           # a grant's name matching every resource of its type (Kafka's wildcard resource)


@dataclasses.dataclass(frozen=True)
class Grant:
    """One allowed (operation, resource): to :data:`PRINCIPAL` unless ``principal`` says otherwise."""

    operation: Operation
    resource_type: ResourceType
    name: str = CLUSTER_NAME
    principal: str = PRINCIPAL

    def __str__(self) -> str:
        return f"{self.operation.name}:{self.resource_type.name}:{self.name}"


def topic(name: str, operation: Operation) -> Grant:
    return Grant(operation, ResourceType.TOPIC, name)


def group(name: str, operation: Operation) -> Grant:
    return Grant(operation, ResourceType.GROUP, name)


def txn(name: str, operation: Operation) -> Grant:
    return Grant(operation, ResourceType.TRANSACTIONAL_ID, name)


def cluster(operation: Operation) -> Grant:
    return Grant(operation, ResourceType.CLUSTER, CLUSTER_NAME)


class GrantSecurity:
    """A stand-in for server.security.Security: allows exactly the grants given (no implied operations, so a test
    shows which operation a handler asks for), records every question, and leaves everything else (credentials,
    quotas) to the broker's own Security."""

    def __init__(self, grants: Iterable[Grant] = (), fallback=None, *, allow_all: bool = False):
        self.grants = set(grants)
        self.allow_all = allow_all
        self.fallback = fallback
        self.asked: list[tuple[str, Operation, ResourceType, str]] = []
        self.authorizer_enabled = True

    def authorize(self, principal, host, operation, resource_type, name) -> bool:
        self.asked.append((principal, operation, resource_type, name))
        return self.allow_all or any(Grant(operation, resource_type, n, principal) in self.grants
                                     for n in (name, ANY_NAME))

    def authorize_by_resource_type(self, principal, host, operation, resource_type) -> bool:
        return self.allow_all or any(g.operation == operation and g.resource_type == resource_type
                                     and g.principal == principal for g in self.grants)

    def __getattr__(self, name):
        return getattr(self.fallback, name)


def make_broker(**props) -> Broker:
    """A fresh broker on in-memory storage (topics are made by each case's set-up)."""
    config = Config(data_dir="/acl-matrix")
    for name, value in props.items():
        config.set(name, value)
    broker = Broker(config, MemoryStorage())
    broker.security = GrantSecurity(allow_all=True, fallback=broker.security)
    return broker


def grant(broker: Broker, grants: Iterable[Grant] = (), *, allow_all: bool = False) -> GrantSecurity:
    """Give the broker a stand-in authorizer allowing ``grants`` (or everything) from now on."""
    security = broker.security
    fallback = security.fallback if isinstance(security, GrantSecurity) else security
    broker.security = GrantSecurity(grants, fallback, allow_all=allow_all)
    return broker.security


class Client:
    """What a handler reads of the connection a request came on (server/connection.py's Connection)."""

    def __init__(self, principal: str = PRINCIPAL, host: str = "127.0.0.1"):
        self.principal = principal
        self.host = host
        self.peer = f"{host}:40000"
        self.response_bytes = 0
        self.unstable_api_versions = False

    def start_soon(self, fn) -> None:
        """Connection.start_soon; here a trio system task (a test's request has no connection task group)."""
        trio.lowlevel.spawn_system_task(fn)


def context(broker, api: str, version: int, frame, principal: str = PRINCIPAL) -> RequestContext:
    return RequestContext(broker=broker, api_key=API_KEYS[api], api_version=version, correlation_id=7,
                          client_id="acl-matrix", principal=principal, connection=Client(principal), frame=frame)


async def _resolved(result):
    if isinstance(result, Deferred):
        result = await result.wait()
    return result


def _decoded_response(handler, version: int, result):
    if result is None:
        return None
    data = result.body if type(result) is Encoded else handler.response.encode_bytes(result, version)
    out, end = handler.response.decode(data, version)
    assert end == len(data)
    return out


async def call_as(broker, api: str, version: int, request, principal: str = PRINCIPAL):
    """Send ``request`` at ``version`` as a network client authenticated as ``principal`` would (no ClusterAction),
    through the codec both ways; → the decoded response (None when the API answers nothing, as acks=0)."""
    handler = HANDLERS[API_KEYS[api]]
    frame = bytearray(handler.request.encode_bytes(request, version))
    decoded, end = handler.request.decode(frame, version)
    assert end == len(frame)
    result = await _resolved(handler.fn(context(broker, api, version, frame, principal), decoded))
    return _decoded_response(handler, version, result)


async def call_fast(broker, api: str, version: int, request, principal: str = PRINCIPAL):
    """Like :func:`call_as` through the API's fast path, falling back to the handler as the connection does."""
    handler = HANDLERS[API_KEYS[api]]
    head = b"HDR"
    frame = bytearray(head + handler.request.encode_bytes(request, version))
    result = handler.fast(context(broker, api, version, frame, principal), frame, len(head))
    if result is NOT_HANDLED:
        body = bytearray(frame[len(head):])
        decoded, _ = handler.request.decode(body, version)
        result = handler.fn(context(broker, api, version, body, principal), decoded)
    return _decoded_response(handler, version, await _resolved(result))


def error_codes(obj, *, top: bool = True) -> list[int]:
    """Every error code in a response, depth first (fields named ``error_code`` or ``*_error_code``); without
    ``top``, only those of its nested structs (the partitions', topics', keys')."""
    out: list[int] = []
    if isinstance(obj, list):
        for item in obj:
            out += error_codes(item)
    elif dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            if field.name == "error_code" or field.name.endswith("_error_code"):
                if top:
                    out.append(value)
            elif isinstance(value, list) or dataclasses.is_dataclass(value):
                out += error_codes(value)
    return out


def only(code: int):
    """A refusal check for :class:`Case`: every error code in the response is ``code`` — its nested structs' when it
    has any (a response-wide code beside them stays NONE), else its own."""
    def check(response, missing):
        nested = error_codes(response, top=False)
        codes = nested or error_codes(response)
        assert codes and set(codes) == {code}, f"without {missing}: {codes}"
        assert not nested or set(error_codes(response)) - set(nested) <= {0}, f"without {missing}: {response}"
    return check


def succeeded(response, broker) -> None:
    """A success check for :class:`Case`: every error code in the response is NONE."""
    codes = error_codes(response)
    assert codes and set(codes) == {0}, codes


def broker_state(broker: Broker) -> dict[str, Any]:
    """What a refused request must leave as it was: topics, every partition's offsets and producer state, the
    transaction coordinator's state, the producer ids handed out, the groups' committed offsets and the client
    quotas."""
    partitions = {}
    for key, p in sorted(broker.partitions.items()):
        partitions[key] = (p.log.log_start_offset, p.log.log_end_offset, sorted(
            (e.producer_id, e.producer_epoch, e.last_seq, e.current_txn_first_offset, e.coordinator_epoch)
            for e in p.producers.entries()))
    coordinator = broker.transactions.coordinator
    groups = broker.groups.coordinator
    return {
        "topics": sorted((t.name, t.partitions) for t in broker.topics.all()),
        "partitions": partitions,
        "transactions": sorted((tid, repr(m.value)) for tid, m in coordinator.transactions.items()),
        "pending transactions": sorted(coordinator.pending),
        "producer ids": (broker.producer_ids.block_end, [tuple(b) for b in broker.producer_ids._blocks]),
        "groups": sorted(groups.groups),
        "committed offsets": repr(sorted(groups.offsets.items())),
        "pending offsets": repr(sorted(groups.pending.items())),
        "client quotas": sorted(map(repr, broker.security.client_quotas.quotas.items())),
    }


class Changes(enum.Enum):
    """Whether a successful call is expected to change broker state (a check that the state snapshot sees it)."""

    SOMETHING = "something"
    NOTHING = "nothing"


@dataclasses.dataclass
class Case:
    """One API call for the matrix.

    ``request(broker, setup)`` builds the request from what ``setup(broker)`` returned (set-up runs with every
    permission); ``needs`` is every grant the call needs; ``refused(response, missing)`` asserts the answer to a
    call lacking the grant ``missing``; ``allowed(response, broker)`` asserts the answer with every grant.
    ``changes`` says whether success changes :func:`broker_state` (so the snapshot is shown to see it)."""

    id: str
    api: str
    version: int
    request: Callable[[Broker, Any], Any]
    needs: tuple[Grant, ...]
    refused: Callable[[Any, Grant], None]
    allowed: Callable[[Any, Broker], None]
    setup: Callable[[Broker], Awaitable[Any]] | None = None
    changes: Changes = Changes.SOMETHING
    props: dict = dataclasses.field(default_factory=dict)
    fast: bool = False            # send through the API's fast path (Produce)

    def __str__(self) -> str:
        return self.id


def run_case(case: Case, *, snapshot=None, props: dict | None = None, send=None) -> None:
    """Run ``case`` once without each grant it needs (Kafka's refusal, broker state unchanged) and once with all.
    ``snapshot``: the broker state compared around the call (default broker_state); ``props``: broker properties
    under the case's own; ``send``: how the request is sent, as :func:`call_as` (the default) is called."""
    for missing in case.needs:
        _run(case, [g for g in case.needs if g != missing], missing, snapshot or broker_state, props or {}, send)
    _run(case, list(case.needs), None, snapshot or broker_state, props or {}, send)


async def settled(broker: Broker) -> None:
    """Wait until what set-up staged in the coordinators (an add answered once staged) is durable and replayed, so
    the state snapshot does not move under the call."""
    await broker.transactions.wait_replayed()
    await broker.groups.wait_replayed()


def _run(case: Case, grants: list[Grant], missing: Grant | None, snapshot, props: dict, send=None) -> None:
    broker = make_broker(**{**props, **case.props})
    send = send or (call_fast if case.fast else call_as)

    async def body(b):
        prepared = await case.setup(b) if case.setup is not None else None
        await settled(b)
        request = case.request(b, prepared)
        before = snapshot(b)
        grant(b, grants)
        response = await send(b, case.api, case.version, request)
        grant(b, allow_all=True)
        after = snapshot(b)
        if missing is not None:
            case.refused(response, missing)
            assert after == before, f"{case}: refused for lack of {missing} but the broker's state changed"
        else:
            case.allowed(response, b)
            if case.changes is Changes.SOMETHING:
                assert after != before, f"{case}: succeeded but the state snapshot saw no change"
            else:
                assert after == before, f"{case}: a read changed the broker's state"
    try:
        run_with_broker(broker, body)
    finally:
        broker.close()
