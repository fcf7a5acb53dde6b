"""Kafka's access-control model: its vocabulary with Kafka's wire codes, ACL bindings and filters, and the authorizer's decisions (Kafka's StandardAuthorizer).

The codes are those of Kafka's ``ResourceType``, ``PatternType``, ``AclOperation`` and
``AclPermissionType`` as CreateAcls, DescribeAcls and DeleteAcls carry them.  :class:`Authorizer` is
pure: it holds the bindings the cluster metadata log replays (state/cluster_metadata.py) and answers
:meth:`Authorizer.authorize` and :meth:`Authorizer.authorize_by_resource_type` as Kafka 4 does.
"""
from __future__ import annotations

import dataclasses
import enum


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"      # the one Cluster resource's name, as Kafka names it


# --- bindings and filters --------------------------------------------------------------------

WILDCARD = "*"                      # a LITERAL resource name or a host that matches every one
WILDCARD_PRINCIPAL = "User:*"       # the principal that matches every principal
# ALLOW ACLs for these operations also allow DESCRIBE (resp. DESCRIBE_CONFIGS); DENY ACLs imply nothing.
IMPLIES_DESCRIBE = frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                              Operation.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS})


def _enum(cls, code: int):
    """Kafka's fromCode: a code the enum does not know is UNKNOWN."""
    try:
        return cls(code)
    except ValueError:
        return cls.UNKNOWN


@dataclasses.dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern (type, name, LITERAL or PREFIXED) and an entry (principal, host, operation,
    ALLOW or DENY), as Kafka's AclBinding."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, resource_type: int, name: str, pattern_type: int, principal: str, host: str, operation: int,
           permission: int) -> "AclBinding":
        """A binding from wire codes (unknown codes become UNKNOWN, which :func:`creation_error` refuses)."""
        return cls(_enum(ResourceType, resource_type), name, _enum(PatternType, pattern_type), principal, host,
                   _enum(Operation, operation), _enum(Permission, permission))

    def __str__(self) -> str:
        return (f"{self.resource_type.name}:{self.pattern_type.name}:{self.name} {self.permission.name} "
                f"{self.principal} {self.operation.name} from {self.host}")


def creation_error(b: AclBinding) -> str | None:
    """Why CreateAcls refuses ``b`` (INVALID_REQUEST with this message), or None: Kafka's checks (the broker's
    cluster-name and empty-name checks, then the controller's validateNewAcl), plus ours: DelegationToken
    resources are refused (this broker has no delegation tokens)."""
    if b.resource_type == ResourceType.CLUSTER and b.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not b.name:
        return "Invalid empty resource name"
    if b.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {b.resource_type.name}"
    if b.resource_type == ResourceType.DELEGATION_TOKEN:
        return "DELEGATION_TOKEN ACLs are refused: this broker has no delegation tokens"
    if b.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {b.pattern_type.name}"
    if b.operation in (Operation.UNKNOWN, Operation.ANY):
        return f"Invalid operation {b.operation.name}"
    if b.permission not in (Permission.ALLOW, Permission.DENY):
        return f"Invalid permissionType {b.permission.name}"
    if ":" not in b.principal:
        return (f"Could not parse principal from `{b.principal}` (no colon is present separating the principal "
                f"type from the principal name)")
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings DescribeAcls and DeleteAcls mean, as Kafka's AclBindingFilter: ANY (or None for a string)
    matches everything; pattern type MATCH matches the LITERAL and PREFIXED patterns that apply to the name
    (the name itself, the wildcard ``*``, and prefixes of it); principal and host compare exactly."""

    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, resource_type: int, name: str | None, pattern_type: int, principal: str | None, host: str | None,
           operation: int, permission: int) -> "AclFilter":
        return cls(_enum(ResourceType, resource_type), name, _enum(PatternType, pattern_type), principal, host,
                   _enum(Operation, operation), _enum(Permission, permission))

    def error(self) -> str | None:
        """Why this filter cannot be used (INVALID_REQUEST): a field Kafka reads as UNKNOWN."""
        for value in (self.resource_type, self.pattern_type, self.operation, self.permission):
            if value == 0:
                return f"Filter has an UNKNOWN {type(value).__name__}"
        return None

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != b.pattern_type:
            return False
        if self.name is not None:
            if self.pattern_type != PatternType.MATCH or self.pattern_type == b.pattern_type:
                if self.name != b.name:
                    return False
            elif b.pattern_type == PatternType.LITERAL:
                if b.name not in (self.name, WILDCARD):
                    return False
            elif not self.name.startswith(b.name):          # PREFIXED
                return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != Operation.ANY and self.operation != b.operation:
            return False
        return self.permission == Permission.ANY or self.permission == b.permission


# --- the authorizer --------------------------------------------------------------------------

def parse_super_users(value: str) -> frozenset[str]:
    """``super.users``: principals separated by semicolons (``User:admin;User:broker``), spaces trimmed."""
    return frozenset(p.strip() for p in value.split(";") if p.strip())


def _grants(b: AclBinding, principal: str, host: str, operation: Operation) -> Permission | None:
    """What ``b`` says about this request (its resource already matched): ALLOW, DENY, or None (it does not
    apply).  Implied operations count for ALLOW bindings only: DENY READ does not deny DESCRIBE."""
    if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
        return None
    if b.host != WILDCARD and b.host != host:
        return None
    if b.operation != Operation.ALL and b.operation != operation:
        if b.permission != Permission.ALLOW:
            return None
        if operation == Operation.DESCRIBE:
            if b.operation not in IMPLIES_DESCRIBE:
                return None
        elif operation == Operation.DESCRIBE_CONFIGS:
            if b.operation not in IMPLIES_DESCRIBE_CONFIGS:
                return None
        else:
            return None
    return b.permission


class Authorizer:
    """Kafka's StandardAuthorizer decisions over a set of :class:`AclBinding`.

    A request is allowed when its principal is a super user; else when a binding on the resource (LITERAL on
    its name, LITERAL ``*``, or PREFIXED on a prefix of its name) for the principal (or ``User:*``) and host
    (or ``*``) allows the operation (or one implying it, or ALL) and none denies it (DENY wins); when no binding
    at all is on the resource, ``allow.everyone.if.no.acl.found`` decides.

    Bindings are indexed by resource type and name (literal names in a dict, prefixed ones by name and the set
    of prefix lengths in use), so a decision looks at the bindings of its resource only; decisions are cached
    (bounded) and the cache is dropped whenever a binding is added or removed.
    """

    CACHE_ENTRIES = 65536

    def __init__(self, super_users: frozenset[str] = frozenset(), allow_if_no_acl: bool = False):
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        self._bindings: set[AclBinding] = set()
        # resource type → name → bindings; one map for LITERAL, one for PREFIXED
        self._literal: dict[ResourceType, dict[str, set[AclBinding]]] = {}
        self._prefixed: dict[ResourceType, dict[str, set[AclBinding]]] = {}
        self._prefix_lengths: dict[ResourceType, dict[int, int]] = {}     # length → prefixed names of that length
        self._cache: dict[tuple, bool] = {}

    def __len__(self) -> int:
        return len(self._bindings)

    def __contains__(self, b: AclBinding) -> bool:
        return b in self._bindings

    def bindings(self) -> list[AclBinding]:
        return list(self._bindings)

    # --- changes (replayed records) ---------------------------------------------------------

    def add(self, b: AclBinding) -> bool:
        """Add ``b`` (→ False if present already).  The bound on their number is CreateAcls' to keep
        (:meth:`~trireme.state.cluster_metadata.AclRecords.create`): what the log holds is replayed whatever it is."""
        if b in self._bindings:
            return False
        self._bindings.add(b)
        index = self._literal if b.pattern_type == PatternType.LITERAL else self._prefixed
        names = index.setdefault(b.resource_type, {})
        if b.pattern_type == PatternType.PREFIXED and b.name not in names:
            lengths = self._prefix_lengths.setdefault(b.resource_type, {})
            lengths[len(b.name)] = lengths.get(len(b.name), 0) + 1
        names.setdefault(b.name, set()).add(b)
        self._cache.clear()
        return True

    def remove(self, b: AclBinding) -> bool:
        """Remove ``b`` (→ False if it was not there)."""
        if b not in self._bindings:
            return False
        self._bindings.discard(b)
        index = self._literal if b.pattern_type == PatternType.LITERAL else self._prefixed
        names = index[b.resource_type]
        same = names[b.name]
        same.discard(b)
        if not same:
            del names[b.name]
            if b.pattern_type == PatternType.PREFIXED:
                lengths = self._prefix_lengths[b.resource_type]
                lengths[len(b.name)] -= 1
                if not lengths[len(b.name)]:
                    del lengths[len(b.name)]
        self._cache.clear()
        return True

    # --- decisions ----------------------------------------------------------------------------

    def _on_resource(self, resource_type: ResourceType, name: str):
        """Every binding whose pattern applies to the resource ``name`` of ``resource_type``."""
        literal = self._literal.get(resource_type)
        if literal:
            yield from literal.get(name, ())
            if name != WILDCARD:
                yield from literal.get(WILDCARD, ())
        prefixed = self._prefixed.get(resource_type)
        if prefixed:
            for length in self._prefix_lengths[resource_type]:
                if length <= len(name):
                    yield from prefixed.get(name[:length], ())

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        key = (principal, host, operation, resource_type, name)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        allowed = self._decide(principal, host, operation, resource_type, name)
        if len(self._cache) >= self.CACHE_ENTRIES:
            self._cache.clear()
        self._cache[key] = allowed
        return allowed

    def _decide(self, principal, host, operation, resource_type, name) -> bool:
        if principal in self.super_users:
            return True
        found = allowed = False
        for b in self._on_resource(resource_type, name):
            found = True
            grant = _grants(b, principal, host, operation)
            if grant == Permission.DENY:
                return False
            if grant == Permission.ALLOW:
                allowed = True
        return allowed or (not found and self.allow_if_no_acl)

    def authorize_by_resource_type(self, principal: str, host: str, operation: Operation,
                                   resource_type: ResourceType) -> bool:
        """Kafka's authorizeByResourceType: may the principal do ``operation`` on at least one resource of the
        type?  Yes when it may on a resource named ``hardcode`` (so super users, and the no-ACL default, pass
        whatever DENY bindings say); else when an ALLOW binding (exactly this operation or ALL, for the principal
        or ``User:*`` and the host or ``*``) is LITERAL ``*``, or is a LITERAL name with no DENY LITERAL on the
        same name, or a name no DENY PREFIXED binding is a prefix of; a DENY LITERAL ``*`` refuses outright."""
        if operation in (Operation.ANY, Operation.UNKNOWN) or resource_type in (ResourceType.ANY,
                                                                               ResourceType.UNKNOWN):
            raise ValueError(f"authorize_by_resource_type needs a real operation and resource type, not "
                             f"{operation.name} on {resource_type.name}")
        key = (principal, host, operation, resource_type, None)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        allowed = self._decide_by_type(principal, host, operation, resource_type)
        if len(self._cache) >= self.CACHE_ENTRIES:
            self._cache.clear()
        self._cache[key] = allowed
        return allowed

    def _decide_by_type(self, principal, host, operation, resource_type) -> bool:
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True
        deny = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        allow = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        for index in (self._literal, self._prefixed):
            for bindings in index.get(resource_type, {}).values():
                for b in bindings:
                    if b.host != WILDCARD and b.host != host:
                        continue
                    if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
                        continue
                    if b.operation != operation and b.operation != Operation.ALL:
                        continue
                    if b.permission == Permission.DENY:
                        if b.pattern_type == PatternType.LITERAL and b.name == WILDCARD:
                            return False
                        deny[b.pattern_type].add(b.name)
                    else:
                        allow[b.pattern_type].add(b.name)
        if WILDCARD in allow[PatternType.LITERAL]:
            return True
        for pattern_type, names in allow.items():
            for name in names:
                if pattern_type == PatternType.LITERAL and name in deny[PatternType.LITERAL]:
                    continue
                if not any(name[:i] in deny[PatternType.PREFIXED] for i in range(1, len(name) + 1)):
                    return True
        return False

    # --- DescribeAcls / DeleteAcls ------------------------------------------------------------

    def acls(self, flt: AclFilter) -> list[AclBinding]:
        """The bindings ``flt`` matches."""
        if flt.resource_type != ResourceType.ANY and flt.pattern_type != PatternType.MATCH and flt.name is not None:
            # one name: only its own entries in the index can match
            found = []
            for index in (self._literal, self._prefixed):
                found.extend(b for b in index.get(flt.resource_type, {}).get(flt.name, ()) if flt.matches(b))
            return found
        return [b for b in self._bindings if flt.matches(b)]
