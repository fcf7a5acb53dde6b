"""The admin command line: ``trireme topics``, ``groups``, ``transactions``, ``acls``, ``users``, ``quotas`` and ``cluster`` do the jobs of Kafka's
kafka-topics.sh, kafka-consumer-groups.sh, kafka-transactions.sh, kafka-acls.sh, kafka-configs.sh (SCRAM users,
client quotas) and kafka-cluster.sh against any Kafka-protocol broker, on a secured listener too (``--command-config``, ``security.py``).

One client, ours: the ``wire`` codec over a plain socket (``client.py``), not kafka-python's admin
client.  It adds no dependency, each call names the request, version and fields it sends (so the
tool does exactly what Kafka's tools do, request by request: FindCoordinator, ListOffsets,
DescribeProducers then WriteTxnMarkers, ...), and every run exercises the same codec the broker
uses, from the other side of the socket.

Option names are the Kafka tools' (``--bootstrap-server``, ``--topic``, ``--group``,
``--reset-offsets``, ``--transactional-id``, ...); topics and groups take an action flag
(``--list``, ``--describe``, ...) as kafka-topics.sh and kafka-consumer-groups.sh do, transactions a
sub-command as kafka-transactions.sh does (and so do acls, users and quotas: ``list``, ``create``, ...).  Output is a table, or JSON with ``--json``; an error
prints ``trireme <tool>: <message>`` on stderr and exits 1 (usage errors exit 2).
"""
from __future__ import annotations

import argparse
import sys

from . import acls, cluster, groups, quotas, topics, transactions, users
from .client import AdminError, Client
from .output import render
from .security import load_command_config

TOOLS = {"topics": topics, "groups": groups, "transactions": transactions, "acls": acls, "users": users,
         "quotas": quotas, "cluster": cluster}
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def add_connection_options(parser: argparse.ArgumentParser, nested: bool = False) -> None:
    """--bootstrap-server, --json and --timeout; ``nested`` parsers (kafka-transactions.sh's sub-commands) accept
    them too, without overriding what was given before the sub-command."""
    default = (lambda value: argparse.SUPPRESS) if nested else (lambda value: value)
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT[,HOST:PORT...]", default=default(DEFAULT_BOOTSTRAP),
                        help=f"broker(s) to connect to (default {DEFAULT_BOOTSTRAP})")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print JSON instead of a table")
    parser.add_argument("--command-config", metavar="FILE", default=default(None),
                        help="client properties for a secured listener, as Kafka's tools take them "
                             "(security.protocol, ssl.*, sasl.mechanism, sasl.jaas.config, ...)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", default=default(30.0),
                        help="socket timeout, and how long to retry while a coordinator is unavailable (default 30)")


# kafka-acls.sh and kafka-configs.sh name the action with a flag anywhere on the line (--add, --list, --alter, ...):
# such a line is taken as the sub-command, so a command copied from Kafka's docs runs as it is.
KAFKA_ACTION_FLAGS = {"acls": {"--list": "list", "--add": "create", "--remove": "delete"},
                      "quotas": {"--describe": "describe", "--alter": "alter"}}


def kafka_style(argv: list[str]) -> list[str]:
    """``trireme acls --add ...`` → ``trireme acls create ...`` (and the other action flags of KAFKA_ACTION_FLAGS);
    any other command line is returned as it is."""
    if len(argv) < 2 or argv[0] not in KAFKA_ACTION_FLAGS:
        return argv
    flags = KAFKA_ACTION_FLAGS[argv[0]]
    if argv[1] in flags.values() or argv[1] in ("-h", "--help"):
        return argv
    found = [a for a in argv[1:] if a in flags]
    if len(found) != 1:
        return argv                         # none, or several: argparse says what is wrong
    rest = list(argv[1:])
    rest.remove(found[0])
    return [argv[0], flags[found[0]], *rest]


def add_parsers(sub) -> None:
    """Add the admin tools to ``trireme``'s sub-command parsers."""
    for name, module in TOOLS.items():
        parser = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
        add_connection_options(parser)
        module.add_arguments(parser, lambda p: add_connection_options(p, nested=True))


def run(args: argparse.Namespace) -> int:
    """Run the admin command ``args`` selects; → the exit status."""
    try:
        prepare = getattr(args, "prepare", None)
        if prepare is not None:                      # what needs the user before connecting (a password prompt)
            prepare(args)
        if users.runs_locally(args):                 # a PLAIN credentials file: no broker involved
            report = users.plain(args)
        else:
            security = load_command_config(args.command_config)
            with Client(args.bootstrap_server, args.timeout, security) as client:
                report = args.run(client, args)
    except AdminError as e:
        print(f"trireme {args.command}: {e}", file=sys.stderr)
        return 1
    render(report, args.json, f"trireme {args.command}")
    return 0
