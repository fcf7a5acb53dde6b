"""``trireme groups``: list, describe (with lag), delete consumer groups and reset their offsets, as kafka-consumer-groups.sh does.

  trireme groups --list [--state [STATE,...]]
  trireme groups --describe (--group G ... | --all-groups) [--members | --state]
  trireme groups --delete --group G ...
  trireme groups --reset-offsets --group G (--all-topics | --topic T[:P,P...] ...)
                 (--to-earliest | --to-latest | --to-offset N | --to-datetime WHEN | --shift-by N)
                 [--dry-run | --execute]

Groups live at their coordinator (FindCoordinator): DescribeGroups for state and members (each
member's assignment decoded from the consumer protocol), OffsetFetch for committed offsets, and
ListOffsets at each partition's leader for the log end offset that lag is measured against.
--reset-offsets computes new offsets with ListOffsets (earliest, latest, by timestamp), only for
an inactive group (Empty, or Dead: one that does not exist yet), prints them, and commits them with
OffsetCommit (generation -1, no member: an admin commit) only with --execute.  --to-offset and
--shift-by are kept within the partition's earliest..latest offsets, with a warning.
"""
from __future__ import annotations

import argparse
import datetime

from trireme.state.coordinator_records import RecordError, decode, split_version
from trireme.wire import error_codes as E

from .client import GROUP, AdminError, Client, check, request, request_class
from .output import Report, Table

HELP = "list, describe (with lag), delete consumer groups and reset their offsets (kafka-consumer-groups.sh)"
EARLIEST, LATEST = -2, -1
INACTIVE = ("Empty", "Dead")


def add_arguments(parser: argparse.ArgumentParser, _nested) -> None:
    action = parser.add_mutually_exclusive_group(required=True)
    for flag, (run, text) in ACTIONS.items():
        action.add_argument(flag, action="store_const", dest="run", const=run, help=text)
    parser.add_argument("--group", action="append", default=[], help="group id (repeat for several)")
    parser.add_argument("--all-groups", action="store_true", help="--describe/--delete: every group")
    parser.add_argument("--members", action="store_true", help="--describe: members and their partition counts")
    parser.add_argument("--state", nargs="?", const="", default=None, metavar="STATE,...",
                        help="--describe: the group's state; --list: show only groups in these states")
    scope = parser.add_argument_group("--reset-offsets")
    scope.add_argument("--all-topics", action="store_true", help="every partition the group has committed offsets for")
    scope.add_argument("--topic", action="append", default=[], metavar="TOPIC[:P,P...]",
                       help="a topic (every partition) or some of its partitions")
    spec = scope.add_mutually_exclusive_group()
    spec.add_argument("--to-earliest", action="store_true", help="the earliest offset")
    spec.add_argument("--to-latest", action="store_true", help="the log end offset")
    spec.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    spec.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss[Z|+hh:mm]",
                      help="the first offset with a timestamp at or after this time (local time without a zone)")
    spec.add_argument("--shift-by", type=int, metavar="N", help="the committed offset plus N (may be negative)")
    run = scope.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="only print the new offsets (the default)")
    run.add_argument("--execute", action="store_true", help="commit the new offsets")


# --- requests ---------------------------------------------------------------------------------

def _describe_group(client: Client, node: int, group: str):
    response = client.call("DescribeGroups", request("DescribeGroups", groups=[group]), (0, 6), node)
    (described,) = response.groups
    if described.error_code == E.GROUP_ID_NOT_FOUND.code:
        described.group_state, described.error_code = "Dead", 0
    check(described.error_code, f"describing group {group!r}", described.error_message)
    return described


def _committed(client: Client, node: int, group: str) -> dict[tuple[str, int], int]:
    """Every offset the group has committed."""
    cls = request_class("OffsetFetch")
    response = client.call("OffsetFetch", cls(require_stable=False, groups=[
        cls.OffsetFetchRequestGroup(group_id=group, member_id=None, member_epoch=-1, topics=None)]), (8, 9), node)
    (fetched,) = response.groups
    check(fetched.error_code, f"fetching the offsets of group {group!r}")
    out = {}
    for t in fetched.topics:
        for p in t.partitions:
            check(p.error_code, f"fetching the offset of group {group!r} for {t.name}-{p.partition_index}")
            if p.committed_offset >= 0:
                out[(t.name, p.partition_index)] = p.committed_offset
    return out


def _assignment(member) -> list[tuple[str, int]]:
    """The partitions in a consumer-protocol member assignment (none if it is empty or does not parse)."""
    try:
        version, body = split_version(member.member_assignment)
        assignment = decode("ConsumerProtocolAssignment", body, version)
    except RecordError:
        return []
    return [(tp.topic, p) for tp in assignment.assigned_partitions for p in tp.partitions]


def _all_groups(client: Client, states: list[str] | None = None) -> list:
    """ListGroups at every broker → the listed groups, sorted by id."""
    client.metadata([])
    listed = []
    for node in sorted(client.brokers):
        response = client.call("ListGroups", request("ListGroups", states_filter=states or []), (0, 5), node)
        check(response.error_code, f"listing the groups of broker {node}")
        listed.extend(response.groups)
    return sorted(listed, key=lambda g: g.group_id)


def _groups(client: Client, args) -> list[str]:
    if args.all_groups:
        return [g.group_id for g in _all_groups(client)]
    if not args.group:
        raise AdminError("needs --group or --all-groups")
    return args.group


# --- actions ----------------------------------------------------------------------------------

def _list(client: Client, args) -> Report:
    states = [s.strip() for s in args.state.split(",") if s.strip()] if args.state else None
    rows = [(g.group_id, g.group_state or None, g.protocol_type or None) for g in _all_groups(client, states)]
    return Report([Table(("GROUP", "STATE", "PROTOCOL-TYPE"), rows)])


def _describe(client: Client, args) -> Report:
    offsets, members, states, notes, data = [], [], [], [], []
    for group in _groups(client, args):
        node = client.coordinator(group, GROUP)
        described = client.retry(lambda: _describe_group(client, node, group))
        if described.group_state == "Dead":
            raise AdminError(f"consumer group {group!r} does not exist")
        host, port = client.brokers[node]
        states.append((group, f"{host}:{port} ({node})", described.protocol_data or None,
                       described.group_state, len(described.members)))
        owner, member_rows = {}, []
        for m in described.members:
            assigned = _assignment(m) if described.protocol_type == "consumer" else []
            owner.update((tp, m) for tp in assigned)
            member_rows.append((group, m.member_id, m.client_host, m.client_id, len(assigned)))
        members.extend(member_rows)
        committed = client.retry(lambda: _committed(client, node, group))
        partitions = sorted(set(committed) | set(owner))
        # A topic deleted since the group committed to it has no log end offset: "-", as Kafka's tool shows.
        end = client.list_offsets(partitions, LATEST, skip_unknown=True) if partitions else {}
        rows = []
        for tp in partitions:
            m, current, log_end = owner.get(tp), committed.get(tp), end.get(tp)
            rows.append((group, tp[0], tp[1], current, log_end,
                         None if current is None or log_end is None else log_end - current,
                         m and m.member_id, m and m.client_host, m and m.client_id))
        rows.extend((group, None, None, None, None, None, m_id, m_host, m_client)
                    for _, m_id, m_host, m_client, count in member_rows if count == 0)
        offsets.extend(rows)
        if not described.members:
            notes.append(f"Consumer group '{group}' has no active members.")
        data.append({"group": group, "state": described.group_state, "coordinator": node,
                     "assignment_strategy": described.protocol_data or None,
                     "members": Table(("CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"),
                                      [r[1:] for r in member_rows]).records(),
                     "offsets": Table(OFFSET_HEADERS[1:], [r[1:] for r in rows]).records()})
    if args.members:
        return Report([Table(("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"), members)], notes)
    if args.state is not None:
        return Report([Table(("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"), states)])
    return Report([Table(OFFSET_HEADERS, offsets)], notes, data=data)


OFFSET_HEADERS = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
                  "CLIENT-ID")


def _delete(client: Client, args) -> Report:
    deleted = []
    for group in _groups(client, args):
        node = client.coordinator(group, GROUP)

        def delete() -> None:
            response = client.call("DeleteGroups", request("DeleteGroups", groups_names=[group]), (0, 2), node)
            (result,) = response.results
            check(result.error_code, f"deleting group {group!r}")
        client.retry(delete)
        deleted.append(group)
    names = ", ".join(f"'{g}'" for g in deleted)
    return Report(notes=[f"Deletion of requested consumer groups ({names}) was successful."], data={"deleted": deleted})


def _parse_datetime(text: str) -> int:
    """Milliseconds since the epoch; a time without a zone is local time, as kafka-consumer-groups.sh reads it."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise AdminError(f"--to-datetime expects YYYY-MM-DDTHH:mm:SS.sss with an optional zone, got {text!r}") from None
    return int(when.timestamp() * 1000)


def _reset_partitions(client: Client, args, committed: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
    if args.all_topics == bool(args.topic):
        raise AdminError("--reset-offsets needs one of --all-topics and --topic")
    if args.all_topics:
        return sorted(committed)
    whole, chosen = [], []
    for item in args.topic:
        topic, sep, partitions = item.partition(":")
        if not sep:
            whole.append(topic)
            continue
        try:
            chosen.extend((topic, int(p)) for p in partitions.split(","))
        except ValueError:
            raise AdminError(f"--topic expects TOPIC or TOPIC:P,P..., got {item!r}") from None
    if whole:
        for t in client.metadata(whole).topics:
            check(t.error_code, f"topic {t.name!r}")
            chosen.extend((t.name, p.partition_index) for p in t.partitions)
    return sorted(set(chosen))


def _new_offsets(client: Client, args, committed, partitions, warnings) -> dict[tuple[str, int], int]:
    if args.to_earliest:
        return client.list_offsets(partitions, EARLIEST)
    if args.to_latest:
        return client.list_offsets(partitions, LATEST)
    if args.to_datetime is not None:
        found = client.list_offsets(partitions, _parse_datetime(args.to_datetime))
        missing = [tp for tp, offset in found.items() if offset < 0]       # nothing that late: the log end
        return found | (client.list_offsets(missing, LATEST) if missing else {})
    if args.to_offset is not None:
        wanted = dict.fromkeys(partitions, args.to_offset)
    elif args.shift_by is not None:
        absent = [tp for tp in partitions if tp not in committed]
        if absent:
            raise AdminError(f"cannot shift the offset of {absent[0][0]}-{absent[0][1]}: the group has no committed "
                             f"offset for it")
        wanted = {tp: committed[tp] + args.shift_by for tp in partitions}
    else:
        raise AdminError("--reset-offsets needs one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
                         "--shift-by")
    earliest, latest = client.list_offsets(partitions, EARLIEST), client.list_offsets(partitions, LATEST)
    out = {}
    for tp, offset in wanted.items():
        out[tp] = min(max(offset, earliest[tp]), latest[tp])
        if out[tp] != offset:
            bound = "earliest" if offset < earliest[tp] else "latest"
            warnings.append(f"new offset {offset} for {tp[0]}-{tp[1]} is beyond its {bound} offset; "
                            f"it will be {out[tp]}")
    return out


def _commit(client: Client, node: int, group: str, offsets: dict[tuple[str, int], int]) -> None:
    cls = request_class("OffsetCommit")
    tcls = cls.OffsetCommitRequestTopic
    by_topic: dict[str, list] = {}
    for (t, p), offset in sorted(offsets.items()):
        by_topic.setdefault(t, []).append(tcls.OffsetCommitRequestPartition(
            partition_index=p, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""))
    response = client.call("OffsetCommit", cls(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                               group_instance_id=None, retention_time_ms=-1,
                                               topics=[tcls(name=t, partitions=ps) for t, ps in by_topic.items()]),
                           (2, 9), node)
    for t in response.topics:
        for p in t.partitions:
            check(p.error_code, f"committing the offset of group {group!r} for {t.name}-{p.partition_index}")


def _reset_offsets(client: Client, args) -> Report:
    if args.all_groups or not args.group:
        raise AdminError("--reset-offsets needs --group")
    rows, warnings = [], []
    if not args.execute and not args.dry_run:
        warnings.append("nothing is changed without --execute: this is a dry run")
    for group in args.group:
        node = client.coordinator(group, GROUP)
        state = client.retry(lambda: _describe_group(client, node, group)).group_state
        if state not in INACTIVE:
            raise AdminError(f"offsets can only be reset while group {group!r} is inactive (Empty), "
                             f"but it is {state}")
        committed = client.retry(lambda: _committed(client, node, group))
        partitions = _reset_partitions(client, args, committed)
        offsets = _new_offsets(client, args, committed, partitions, warnings) if partitions else {}
        if args.execute and offsets:
            client.retry(lambda: _commit(client, node, group, offsets))
        rows.extend((group, t, p, offsets[(t, p)]) for t, p in partitions)
    return Report([Table(("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"), rows)], warnings=warnings)


ACTIONS = {"--list": (_list, "list groups"),
           "--describe": (_describe, "offsets and lag per partition (or --members, or --state)"),
           "--delete": (_delete, "delete inactive groups"),
           "--reset-offsets": (_reset_offsets, "compute (and with --execute commit) new offsets for an inactive group")}
