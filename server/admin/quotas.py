"""``trireme quotas``: describe and alter client quotas (DescribeClientQuotas, AlterClientQuotas), kafka-configs.sh's job for ``--entity-type users|clients|ips``.

  trireme quotas describe [--entity-type users|clients|ips [--entity-name NAME | --entity-default]] ...
  trireme quotas alter --entity-type users (--entity-name NAME | --entity-default)
                       [--entity-type clients (--entity-name ID | --entity-default)]
                       [--add-config producer_byte_rate=N,consumer_byte_rate=N,request_percentage=P]
                       [--delete-config producer_byte_rate,...] [--validate-only]

As in kafka-configs.sh, each --entity-type pairs with the --entity-name or --entity-default that
follows it, in order; ``--user NAME``, ``--client ID``, ``--ip ADDRESS``, ``--user-defaults``,
``--client-defaults`` and ``--ip-defaults`` say the same in one option.  ``describe`` with an
entity type but no name shows every entity of that type; with no entity at all, every quota.  It
matches the entities given exactly (a user's quota, not also the user/client pairs under it:
Kafka's ``ClientQuotaFilter.containsOnly``).  ``alter`` sets the --add-config quotas and removes
the --delete-config ones in one AlterClientQuotas request.  kafka-configs.sh's ``--describe`` and
``--alter`` flags are taken in place of the sub-command (``admin.kafka_style``).
"""
from __future__ import annotations

import argparse

from .client import AdminError, Client, check, request_class
from .commands import subcommands
from .output import Report, Table

HELP = "describe and alter client quotas (kafka-configs.sh --entity-type users/clients/ips)"
ENTITY_TYPES = {"users": "user", "clients": "client-id", "ips": "ip"}
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2
DEFAULT_NAME = "<default>"
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate",
              "connection_creation_rate")


class _Entity(argparse.Action):
    """Keep --entity-type / --entity-name / --entity-default (and their one-option forms) in the order given."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, "entity_items", None) or [])
        kind = self.const
        if kind == "type":
            if values not in ENTITY_TYPES:
                parser.error(f"--entity-type must be one of {', '.join(ENTITY_TYPES)}, got {values!r}")
            items.append(("type", values))
        elif kind == "name":
            items.append(("name", values))
        elif kind == "default":
            items.append(("name", None))
        else:                                          # --user NAME, --client-defaults, ...
            entity_type, default = kind
            items += [("type", entity_type), ("name", None if default else values)]
        setattr(namespace, "entity_items", items)


def add_arguments(parser: argparse.ArgumentParser, nested) -> None:
    command = subcommands(parser, nested)
    for name, run, text in (("describe", _describe, "show client quotas (DescribeClientQuotas)"),
                            ("alter", _alter, "set or remove client quotas (AlterClientQuotas)")):
        p = command(name, run, text, entity_items=[])
        p.add_argument("--entity-type", action=_Entity, const="type", metavar="users|clients|ips")
        p.add_argument("--entity-name", action=_Entity, const="name", metavar="NAME")
        p.add_argument("--entity-default", action=_Entity, const="default", nargs=0,
                       help="the default entity of the --entity-type before it")
        for option, entity_type in (("user", "users"), ("client", "clients"), ("ip", "ips")):
            p.add_argument(f"--{option}", action=_Entity, const=(entity_type, False), metavar="NAME",
                           help=f"the same as --entity-type {entity_type} --entity-name NAME")
            p.add_argument(f"--{option}-defaults", action=_Entity, const=(entity_type, True), nargs=0,
                           help=f"the same as --entity-type {entity_type} --entity-default")
        if name == "alter":
            p.add_argument("--add-config", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE...]",
                           help="quotas to set: " + ", ".join(QUOTA_KEYS))
            p.add_argument("--delete-config", action="append", default=[], metavar="KEY[,KEY...]",
                           help="quotas to remove")
            p.add_argument("--validate-only", action="store_true", help="check the change, do not make it")


def _entities(args, need_names: bool) -> list[tuple[str, str | None, bool]]:
    """The entities named, in order: (wire entity type, name or None for the default, named: a name or default
    was given)."""
    out: list[list] = []
    for kind, value in args.entity_items:
        if kind == "type":
            out.append([ENTITY_TYPES[value], None, False])
        elif not out or out[-1][2]:
            raise AdminError("--entity-name/--entity-default must follow the --entity-type it names")
        else:
            out[-1][1], out[-1][2] = value, True
    types = [t for t, _, _ in out]
    if len(set(types)) != len(types):
        raise AdminError("each entity type may be given once")
    if need_names and any(not named for _, _, named in out):
        raise AdminError("alter needs --entity-name or --entity-default after each --entity-type")
    return [tuple(e) for e in out]


def _show(entity_type: str, name: str | None) -> str:
    return f"{entity_type}={DEFAULT_NAME if name is None else name}"


def _describe(client: Client, args) -> Report:
    cls = request_class("DescribeClientQuotas")
    components = [cls.ComponentData(entity_type=t, match_type=(MATCH_ANY if not named else
                                                                MATCH_DEFAULT if name is None else MATCH_EXACT),
                                    match=name if named else None)
                  for t, name, named in _entities(args, need_names=False)]
    response = client.call("DescribeClientQuotas", cls(components=components, strict=bool(components)), (0, 1))
    check(response.error_code, "describing client quotas", response.error_message)
    rows, data = [], []
    for entry in sorted(response.entries or [], key=lambda e: [(d.entity_type, d.entity_name or "")
                                                                for d in e.entity]):
        entity = ",".join(_show(d.entity_type, d.entity_name) for d in entry.entity)
        values = {v.key: v.value for v in entry.values}
        rows += [(entity, key, value) for key, value in sorted(values.items())]
        data.append({"entity": {d.entity_type: d.entity_name for d in entry.entity}, "quotas": values})
    return Report([Table(("ENTITY", "QUOTA", "VALUE"), rows)], data=data)


def _parse_add(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, sep, value = pair.partition("=")
            if not sep:
                raise AdminError(f"--add-config expects KEY=VALUE, got {pair!r}")
            try:
                out[key.strip()] = float(value)
            except ValueError:
                raise AdminError(f"--add-config {key.strip()}: {value!r} is not a number") from None
    return out


def _alter(client: Client, args) -> Report:
    entities = _entities(args, need_names=True)
    if not entities:
        raise AdminError("alter needs an entity: --entity-type users|clients|ips with --entity-name or "
                         "--entity-default")
    added = _parse_add(args.add_config)
    deleted = [k.strip() for item in args.delete_config for k in item.split(",") if k.strip()]
    if not added and not deleted:
        raise AdminError("alter needs --add-config or --delete-config")
    both = set(added) & set(deleted)
    if both:
        raise AdminError(f"{', '.join(sorted(both))} is both added and deleted")
    cls = request_class("AlterClientQuotas")
    ecls = cls.EntryData
    entry = ecls(entity=[ecls.EntityData(entity_type=t, entity_name=name) for t, name, _ in entities],
                 ops=[ecls.OpData(key=k, value=v, remove=False) for k, v in added.items()]
                 + [ecls.OpData(key=k, value=0.0, remove=True) for k in deleted])
    response = client.call("AlterClientQuotas", cls(entries=[entry], validate_only=args.validate_only), (0, 1))
    shown = ",".join(_show(t, name) for t, name, _ in entities)
    for result in response.entries:
        check(result.error_code, f"altering the quotas of {shown}", result.error_message)
    verb = "Validated" if args.validate_only else "Altered"
    rows = [(shown, k, v) for k, v in added.items()] + [(shown, k, None) for k in deleted]
    table = Table(("ENTITY", "QUOTA", "VALUE"), rows)
    removed = " (no value: removed)" if deleted else ""
    return Report([table], notes=[f"{verb} the client quotas of {shown}{removed}:"],
                  data={"validated" if args.validate_only else "altered": table.records()})
