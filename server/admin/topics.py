"""``trireme topics``: list, describe, create, delete and alter topics, as kafka-topics.sh does.

  trireme topics --list [--exclude-internal]
  trireme topics --describe [--topic T ...]
  trireme topics --create --topic T [--partitions N] [--replication-factor R] [--config K=V ...] [--if-not-exists]
  trireme topics --delete --topic T ... [--if-exists]
  trireme topics --alter --topic T [--partitions N] [--config K=V ...] [--delete-config K ...]

--list and --describe read Metadata (and DescribeConfigs for the configs set on a topic); --create
is CreateTopics, --delete DeleteTopics; --alter grows partitions with CreatePartitions and sets or
deletes topic configs with IncrementalAlterConfigs (kafka-configs.sh's job in Kafka 4).
"""
from __future__ import annotations

import argparse

from trireme.wire import error_codes as E

from .client import AdminError, Client, check, request_class
from .output import Report, Table

HELP = "list, describe, create, delete and alter topics (kafka-topics.sh)"
RESOURCE_TOPIC = 2
SET, DELETE = 0, 1                  # IncrementalAlterConfigs operations
TOPIC_CONFIG = 1                    # DescribeConfigs source of a config set on the topic


def add_arguments(parser: argparse.ArgumentParser, _nested) -> None:
    action = parser.add_mutually_exclusive_group(required=True)
    for flag, (run, text) in ACTIONS.items():
        action.add_argument(flag, action="store_const", dest="run", const=run, help=text)
    parser.add_argument("--topic", action="append", default=[], help="topic name (repeat for several)")
    parser.add_argument("--partitions", type=int, help="partition count (--create, --alter)")
    parser.add_argument("--replication-factor", type=int, help="replication factor (--create)")
    parser.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                        help="a topic config to set (--create, --alter)")
    parser.add_argument("--delete-config", action="append", default=[], metavar="NAME",
                        help="a topic config to remove, back to the broker's default (--alter)")
    parser.add_argument("--if-not-exists", action="store_true", help="--create: no error if the topic exists")
    parser.add_argument("--if-exists", action="store_true", help="--delete/--alter: no error if it does not")
    parser.add_argument("--exclude-internal", action="store_true", help="--list/--describe: skip internal topics")


def _configs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise AdminError(f"--config expects NAME=VALUE, got {item!r}")
        out[name.strip()] = value
    return out


def _topics(args, what: str) -> list[str]:
    if not args.topic:
        raise AdminError(f"{what} needs --topic")
    return args.topic


def _list(client: Client, args) -> Report:
    metadata = client.metadata(None)
    rows = sorted((t.name, len(t.partitions), t.is_internal) for t in metadata.topics
                  if not (args.exclude_internal and t.is_internal))
    return Report([Table(("TOPIC", "PARTITIONS", "INTERNAL"), rows)])


def _set_configs(client: Client, names: list[str]) -> dict[str, dict[str, str]]:
    """The configs set on each topic (not broker defaults), as ``--describe`` shows them."""
    cls = request_class("DescribeConfigs")
    response = client.call("DescribeConfigs", cls(resources=[
        cls.DescribeConfigsResource(resource_type=RESOURCE_TOPIC, resource_name=n, configuration_keys=None)
        for n in names]), (1, 4))
    out = {}
    for r in response.results:
        check(r.error_code, f"describing the configs of {r.resource_name!r}", r.error_message)
        out[r.resource_name] = {c.name: c.value for c in r.configs if c.config_source == TOPIC_CONFIG}
    return out


def _describe(client: Client, args) -> Report:
    metadata = client.metadata(args.topic or None)
    described = []
    for t in metadata.topics:
        check(t.error_code, f"topic {t.name!r}")
        if not (args.exclude_internal and t.is_internal):
            described.append(t)
    described.sort(key=lambda t: t.name)
    configs = _set_configs(client, [t.name for t in described]) if described else {}
    data, summary, partitions = [], [], []
    for t in described:
        parts = sorted(t.partitions, key=lambda p: p.partition_index)
        replication = max((len(p.replica_nodes) for p in parts), default=0)
        topic_id = str(t.topic_id)
        summary.append((t.name, topic_id, len(parts), replication,
                        ",".join(f"{k}={v}" for k, v in sorted(configs[t.name].items())) or None))
        rows = [(t.name, p.partition_index, p.leader_id, ",".join(map(str, p.replica_nodes)),
                 ",".join(map(str, p.isr_nodes))) for p in parts]
        partitions.extend(rows)
        data.append({"topic": t.name, "topic_id": topic_id, "partition_count": len(parts),
                     "replication_factor": replication, "internal": t.is_internal, "configs": configs[t.name],
                     "partitions": [{"partition": p.partition_index, "leader": p.leader_id,
                                     "replicas": list(p.replica_nodes), "isr": list(p.isr_nodes)} for p in parts]})
    return Report([Table(("TOPIC", "TOPIC-ID", "PARTITIONS", "REPLICATION-FACTOR", "CONFIGS"), summary),
                   Table(("TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR"), partitions)], data=data)


def _create(client: Client, args) -> Report:
    names = _topics(args, "--create")
    configs = _configs(args.config)
    cls = request_class("CreateTopics")
    tcls = cls.CreatableTopic
    response = client.call("CreateTopics", cls(timeout_ms=int(args.timeout * 1000), topics=[
        tcls(name=n, num_partitions=-1 if args.partitions is None else args.partitions,
             replication_factor=-1 if args.replication_factor is None else args.replication_factor,
             configs=[tcls.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()]) for n in names]),
        (2, 7))
    return _outcome(response.topics, "creating", "created", E.TOPIC_ALREADY_EXISTS if args.if_not_exists else None)


def _delete(client: Client, args) -> Report:
    names = _topics(args, "--delete")
    cls = request_class("DeleteTopics")
    response = client.call("DeleteTopics", cls(
        topic_names=names, topics=[cls.DeleteTopicState(name=n) for n in names],
        timeout_ms=int(args.timeout * 1000)), (1, 6))
    return _outcome(response.responses, "deleting", "deleted", E.UNKNOWN_TOPIC_OR_PARTITION if args.if_exists else None)


def _outcome(results, doing: str, done: str, tolerated: E.KafkaError | None) -> Report:
    """Per-topic results checked (an error ``tolerated`` skips its topic) → "Created topic T." and {"created": [T]}."""
    names = []
    for t in results:
        if tolerated is None or t.error_code != tolerated.code:
            check(t.error_code, f"{doing} topic {t.name!r}", t.error_message)
            names.append(t.name)
    return Report(notes=[f"{done.capitalize()} topic {n}." for n in names], data={done: names})


def _alter(client: Client, args) -> Report:
    names = _topics(args, "--alter")
    configs = _configs(args.config)
    if args.partitions is None and not configs and not args.delete_config:
        raise AdminError("--alter needs --partitions, --config or --delete-config")
    if args.if_exists:
        known = {t.name for t in client.metadata(None).topics}
        names = [n for n in names if n in known]
    notes = []
    if names and args.partitions is not None:
        cls = request_class("CreatePartitions")
        response = client.call("CreatePartitions", cls(timeout_ms=int(args.timeout * 1000), validate_only=False, topics=[
            cls.CreatePartitionsTopic(name=n, count=args.partitions, assignments=None) for n in names]), (0, 3))
        for r in response.results:
            check(r.error_code, f"adding partitions to {r.name!r}", r.error_message)
            notes.append(f"Topic {r.name} has {args.partitions} partitions.")
    if names and (configs or args.delete_config):
        cls = request_class("IncrementalAlterConfigs")
        rcls = cls.AlterConfigsResource
        changes = [rcls.AlterableConfig(name=k, config_operation=SET, value=v) for k, v in configs.items()] + \
            [rcls.AlterableConfig(name=k, config_operation=DELETE, value=None) for k in args.delete_config]
        response = client.call("IncrementalAlterConfigs", cls(validate_only=False, resources=[
            rcls(resource_type=RESOURCE_TOPIC, resource_name=n, configs=changes) for n in names]), (0, 1))
        for r in response.responses:
            check(r.error_code, f"altering the configs of {r.resource_name!r}", r.error_message)
            notes.append(f"Altered the configs of topic {r.resource_name}.")
    return Report(notes=notes, data={"altered": names})


ACTIONS = {"--list": (_list, "list topics"), "--describe": (_describe, "describe topics (all, or each --topic)"),
           "--create": (_create, "create --topic"), "--delete": (_delete, "delete each --topic"),
           "--alter": (_alter, "add partitions to --topic, or set/delete its configs")}
