"""``trireme acls``: list, create and delete ACLs (DescribeAcls, CreateAcls, DeleteAcls), with kafka-acls.sh's options.

  trireme acls list [--topic T | --group G | --transactional-id ID | --cluster ...]
                    [--resource-pattern-type literal|prefixed|any|match] [--principal User:NAME ...]
  trireme acls create (--allow-principal User:NAME | --deny-principal User:NAME) ... [--allow-host H] [--deny-host H]
                      [--operation OP ...] (--topic T | --group G | --transactional-id ID | --cluster ...)
                      [--resource-pattern-type literal|prefixed] [--producer [--idempotent] | --consumer]
  trireme acls delete (--topic T | ...) [--allow-principal ... --operation OP ...] [--resource-pattern-type ...]

As in kafka-acls.sh: each principal given with --allow-principal gets an ALLOW entry from each
--allow-host (``*``, any host, when none is given) for each --operation (``All`` when none is
given), and likewise for --deny-principal/--deny-host with DENY; one resource option may be repeated
(``--topic a --topic b``) and several kinds combined; ``--topic '*'`` is every topic; operations
are Kafka's names in any case (``Read``, ``ClusterAction``, ``IdempotentWrite``, …) and must be
ones the resource type has.  ``--producer`` stands for Write, Describe and Create on the topics
(Write and Describe on the transactional ids; IdempotentWrite on the cluster with --idempotent),
``--consumer`` for Read and Describe on the topics and Read on the groups.  ``delete`` without a
principal deletes every ACL of the resources named; with --resource-pattern-type match, every ACL
that applies to them (literal, wildcard and prefixed), so use that with care.  ``list`` without a
resource lists every ACL; --principal keeps only those of that principal.  ``add`` and ``remove``
are accepted for ``create`` and ``delete``, and so are kafka-acls.sh's ``--add``, ``--list`` and
``--remove`` anywhere on the line (``admin.kafka_style``); ``--force`` is accepted (nothing asks for
confirmation).
"""
from __future__ import annotations

import argparse
import itertools

from trireme.state.acls import CLUSTER_NAME, Operation, PatternType, Permission, ResourceType

from .client import AdminError, Client, check, request_class
from .commands import subcommands
from .output import Report, Table

HELP = "list, create and delete ACLs (kafka-acls.sh)"
COLUMNS = ("RESOURCE-TYPE", "RESOURCE-NAME", "PATTERN-TYPE", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION")
VERSIONS = (1, 3)

O = Operation
# The operations kafka-acls.sh lets each resource type have (AclCommand's validation).
OPERATIONS = {
    ResourceType.TOPIC: {O.READ, O.WRITE, O.CREATE, O.DESCRIBE, O.DELETE, O.ALTER, O.DESCRIBE_CONFIGS,
                         O.ALTER_CONFIGS, O.ALL},
    ResourceType.GROUP: {O.READ, O.DESCRIBE, O.DELETE, O.ALL},
    ResourceType.CLUSTER: {O.CREATE, O.CLUSTER_ACTION, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS, O.IDEMPOTENT_WRITE,
                           O.ALTER, O.DESCRIBE, O.ALL},
    ResourceType.TRANSACTIONAL_ID: {O.DESCRIBE, O.WRITE, O.ALL},
    ResourceType.DELEGATION_TOKEN: {O.DESCRIBE, O.ALL},
    ResourceType.USER: {O.CREATE_TOKENS, O.DESCRIBE_TOKENS, O.ALL},
}


def _enum_name(value: str, enum, allowed, what: str):
    """``Read`` / ``read`` / ``CLUSTER_ACTION`` / ``ClusterAction`` → the member of ``enum``."""
    key = value.strip().replace("_", "").replace("-", "").upper()
    for member in allowed:
        if member.name.replace("_", "") == key:
            return member
    names = ", ".join(_camel(m.name) for m in allowed)
    raise AdminError(f"{what} {value!r} is not one of {names}")


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def add_arguments(parser: argparse.ArgumentParser, nested) -> None:
    command = subcommands(parser, nested)
    for name, aliases, run, text in (("list", [], _list, "list ACLs (DescribeAcls)"),
                                     ("create", ["add"], _create, "create ACLs (CreateAcls)"),
                                     ("delete", ["remove"], _delete, "delete ACLs (DeleteAcls)")):
        p = command(name, run, text, aliases)
        _resource_arguments(p)
        p.add_argument("--resource-pattern-type", default="literal", metavar="TYPE",
                       help="literal or prefixed (create); also any or match (list, delete); default literal")
        if name == "list":
            p.add_argument("--principal", action="append", default=[], metavar="TYPE:NAME",
                           help="only the ACLs of this principal (repeatable)")
            continue
        p.add_argument("--allow-principal", action="append", default=[], metavar="TYPE:NAME",
                       help="principal (User:NAME, User:* for everyone) the ALLOW entries are for (repeatable)")
        p.add_argument("--deny-principal", action="append", default=[], metavar="TYPE:NAME",
                       help="principal the DENY entries are for (repeatable)")
        p.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                       help="host (IP address) the ALLOW entries apply from (default *, any)")
        p.add_argument("--deny-host", action="append", default=[], metavar="HOST",
                       help="host the DENY entries apply from (default *, any)")
        p.add_argument("--operation", action="append", default=[], metavar="OP",
                       help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
                            "AlterConfigs, IdempotentWrite, CreateTokens, DescribeTokens or All (default All; "
                            "repeatable)")
        p.add_argument("--producer", action="store_true", help="the ACLs a producer needs (see above)")
        p.add_argument("--consumer", action="store_true", help="the ACLs a consumer needs (needs --group)")
        p.add_argument("--idempotent", action="store_true", help="with --producer: IdempotentWrite on the cluster")
        p.add_argument("--force", action="store_true", help="accepted for kafka-acls.sh's sake; nothing asks")


def _resource_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", action="append", default=[], help="topic name, * for every topic (repeatable)")
    p.add_argument("--group", action="append", default=[], help="consumer group id, * for every group")
    p.add_argument("--transactional-id", action="append", default=[], help="transactional id, * for every one")
    p.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    p.add_argument("--delegation-token", action="append", default=[], help="delegation token id")
    p.add_argument("--user-principal", action="append", default=[], metavar="NAME",
                   help="user resource (CreateTokens, DescribeTokens)")


def _resources(args) -> list[tuple[ResourceType, str]]:
    out = [(ResourceType.TOPIC, t) for t in args.topic]
    out += [(ResourceType.GROUP, g) for g in args.group]
    out += [(ResourceType.TRANSACTIONAL_ID, t) for t in args.transactional_id]
    out += [(ResourceType.CLUSTER, CLUSTER_NAME)] if args.cluster else []
    out += [(ResourceType.DELEGATION_TOKEN, t) for t in args.delegation_token]
    out += [(ResourceType.USER, u) for u in args.user_principal]
    for kind, name in out:
        if not name:
            raise AdminError(f"an empty {_camel(kind.name)} name")
    return out


def _principal(text: str) -> str:
    kind, sep, name = text.partition(":")
    if not sep or not kind.strip() or not name:
        raise AdminError(f"a principal is TYPE:NAME (User:alice, User:*), got {text!r}")
    return text


def _pattern(args, allowed) -> PatternType:
    return _enum_name(args.resource_pattern_type, PatternType, allowed, "--resource-pattern-type")


def _entries(args, default_operations) -> dict[tuple[ResourceType, str], set[tuple[str, str, Operation, Permission]]]:
    """resource → the (principal, host, operation, permission) entries the options ask for."""
    resources = _resources(args)
    operations = [_enum_name(o, Operation, [m for m in Operation if m > Operation.ANY], "--operation")
                  for o in args.operation] or list(default_operations)
    out: dict = {}
    allow = [(_principal(p), h, Permission.ALLOW) for p, h in itertools.product(args.allow_principal,
                                                                                   args.allow_host or ["*"])]
    deny = [(_principal(p), h, Permission.DENY) for p, h in itertools.product(args.deny_principal,
                                                                                 args.deny_host or ["*"])]
    principals = allow + deny
    if args.producer or args.consumer:
        if args.producer and args.consumer:
            raise AdminError("--producer and --consumer are separate commands")
        if args.operation:
            raise AdminError("--producer and --consumer choose the operations; leave out --operation")
        if args.consumer and not args.group:
            raise AdminError("--consumer needs --group")
        for kind, name in resources:
            ops = {(True, ResourceType.TOPIC): (O.WRITE, O.DESCRIBE, O.CREATE),
                   (True, ResourceType.TRANSACTIONAL_ID): (O.WRITE, O.DESCRIBE),
                   (False, ResourceType.TOPIC): (O.READ, O.DESCRIBE),
                   (False, ResourceType.GROUP): (O.READ,)}.get((args.producer, kind), ())
            out.setdefault((kind, name), set()).update((p, h, op, perm) for p, h, perm in principals for op in ops)
        if args.producer and args.idempotent:
            out.setdefault((ResourceType.CLUSTER, CLUSTER_NAME), set()).update(
                (p, h, O.IDEMPOTENT_WRITE, perm) for p, h, perm in principals)
        return {k: v for k, v in out.items() if v}
    for kind, name in resources:
        bad = [op for op in operations if op not in OPERATIONS[kind]]
        if bad:
            raise AdminError(f"ResourceType {_camel(kind.name)} only supports operations "
                             + ", ".join(_camel(o.name) for o in sorted(OPERATIONS[kind])))
        out[(kind, name)] = {(p, h, op, perm) for p, h, perm in principals for op in operations}
    return out


def _row(kind, name, pattern, principal, host, operation, permission) -> tuple:
    return (ResourceType(kind).name, name, PatternType(pattern).name, principal, host, Operation(operation).name,
            Permission(permission).name)


def _sorted(rows) -> list[tuple]:
    return sorted(set(rows))


# --- actions ----------------------------------------------------------------------------------

def _list(client: Client, args) -> Report:
    cls = request_class("DescribeAcls")
    resources = _resources(args)
    pattern = _pattern(args, [PatternType.ANY, PatternType.MATCH, PatternType.LITERAL, PatternType.PREFIXED])
    filters = ([(kind, name, pattern) for kind, name in resources] if resources
               else [(ResourceType.ANY, None, PatternType.ANY)])
    principals = [_principal(p) for p in args.principal] or [None]
    rows = []
    for (kind, name, pattern_filter), principal in itertools.product(filters, principals):
        response = client.call("DescribeAcls", cls(
            resource_type_filter=kind, resource_name_filter=name, pattern_type_filter=pattern_filter,
            principal_filter=principal, host_filter=None, operation=Operation.ANY,
            permission_type=Permission.ANY), VERSIONS)
        check(response.error_code, "describing ACLs", response.error_message)
        rows += [_row(r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation,
                      a.permission_type) for r in response.resources for a in r.acls]
    return Report([Table(COLUMNS, _sorted(rows))])


def _need_resource(args, what: str) -> None:
    if not _resources(args):
        raise AdminError(f"{what} needs a resource: --topic, --group, --transactional-id, --cluster, "
                         "--delegation-token or --user-principal")


def _create(client: Client, args) -> Report:
    _need_resource(args, "create")
    if not (args.allow_principal or args.deny_principal):
        raise AdminError("create needs --allow-principal or --deny-principal")
    pattern = _pattern(args, [PatternType.LITERAL, PatternType.PREFIXED])
    cls = request_class("CreateAcls")
    creations = [cls.AclCreation(resource_type=kind, resource_name=name, resource_pattern_type=pattern,
                                 principal=p, host=h, operation=op, permission_type=perm)
                 for (kind, name), entries in _entries(args, [O.ALL]).items() for p, h, op, perm in sorted(entries)]
    response = client.call("CreateAcls", cls(creations=creations), VERSIONS)
    for creation, result in zip(creations, response.results):
        check(result.error_code, f"creating the ACL {_describe_entry(creation)}", result.error_message)
    rows = [_row(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host, c.operation,
                 c.permission_type) for c in creations]
    table = Table(COLUMNS, rows)
    return Report([table], notes=[f"Created {len(rows)} ACL{'s' if len(rows) != 1 else ''}:"],
                  data={"created": table.records()})


def _describe_entry(c) -> str:
    return (f"({c.principal} {Permission(c.permission_type).name} {Operation(c.operation).name} from {c.host} on "
            f"{ResourceType(c.resource_type).name} {c.resource_name!r} {PatternType(c.resource_pattern_type).name})")


def _delete(client: Client, args) -> Report:
    _need_resource(args, "delete")
    pattern = _pattern(args, [PatternType.ANY, PatternType.MATCH, PatternType.LITERAL, PatternType.PREFIXED])
    cls = request_class("DeleteAcls")
    fcls = cls.DeleteAclsFilter
    if args.allow_principal or args.deny_principal:
        filters = [fcls(resource_type_filter=kind, resource_name_filter=name, pattern_type_filter=pattern,
                        principal_filter=p, host_filter=h, operation=op, permission_type=perm)
                   for (kind, name), entries in _entries(args, [O.ALL]).items() for p, h, op, perm in sorted(entries)]
    else:
        if args.operation or args.producer or args.consumer:
            raise AdminError("--operation, --producer and --consumer need a principal: --allow-principal or "
                             "--deny-principal")
        filters = [fcls(resource_type_filter=kind, resource_name_filter=name, pattern_type_filter=pattern,
                        principal_filter=None, host_filter=None, operation=Operation.ANY,
                        permission_type=Permission.ANY) for kind, name in _resources(args)]
    response = client.call("DeleteAcls", cls(filters=filters), VERSIONS)
    rows = []
    for result in response.filter_results:
        check(result.error_code, "deleting ACLs", result.error_message)
        for m in result.matching_acls:
            check(m.error_code, "deleting an ACL", m.error_message)
            rows.append(_row(m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host, m.operation,
                             m.permission_type))
    table = Table(COLUMNS, _sorted(rows))
    note = f"Deleted {len(table.rows)} ACL{'s' if len(table.rows) != 1 else ''}" + (":" if table.rows else ".")
    return Report([table] if table.rows else [], notes=[note], data={"deleted": table.records()})
