"""``trireme transactions``: list and describe transactions, describe producers, find and abort hanging ones, as kafka-transactions.sh does; list and complete stuck ones.

  trireme transactions list [--duration-filter MS] [--transactional-id-pattern REGEX]
  trireme transactions describe --transactional-id ID
  trireme transactions describe-producers --topic T --partition P [--broker-id N]
  trireme transactions find-hanging (--broker-id N | --topic T [--partition P]) [--max-transaction-timeout MIN]
  trireme transactions abort --topic T --partition P (--start-offset N |
                             --producer-id ID --producer-epoch E --coordinator-epoch C)
  trireme transactions force-terminate --transactional-id ID
  trireme transactions stuck --status-server HOST:PORT
  trireme transactions complete --transactional-id ID --status-server HOST:PORT

list asks every broker (ListTransactions); describe asks the transactional id's coordinator
(FindCoordinator, DescribeTransactions); describe-producers asks the partition's leader
(DescribeProducers).  find-hanging follows KIP-664 as kafka-transactions.sh does: the open
transactions on the partitions searched whose last write is older than --max-transaction-timeout
are candidates; a candidate hangs when no transactional id has its producer id (ListTransactions
filtered by producer id), when that id cannot be described, or when the coordinator's transaction
does not include the partition.  abort writes an ABORT marker to the partition's leader
(WriteTxnMarkers) with the producer id, epoch and coordinator epoch found by DescribeProducers for
--start-offset (or given), as an admin client's abortTransaction does: use it for a hanging
transaction, which no coordinator will finish.  A transaction its coordinator knows is ended
through the coordinator by force-terminate (Kafka 4.1's forceTerminateTransaction): InitProducerId
for the transactional id, which aborts the open transaction as a timeout would and fences the
producer.

stuck and complete are Trireme's own (Kafka has no way to free a transaction whose marker a
partition refused for good, e.g. with TRANSACTION_COORDINATOR_FENCED: it stays prepared).  They
talk to the broker's status page (``trireme.status.listen``; complete also needs
``trireme.status.actions.enable``), the same opt-in, token-checked action its Complete button
posts, not to the Kafka port: stuck reads ``GET /stuck-transactions``, complete posts
``/actions/complete-transaction``, and the coordinator writes the refused markers again with the
coordinator epoch the partition has seen, then the COMPLETE record (docs/transactions.md).
"""
from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.parse
import urllib.request

from trireme.wire import error_codes as E

from .client import TRANSACTION, AdminError, Client, check, parse_host_port, request, request_class
from .commands import subcommands
from .output import Report, Table

HELP = "list, describe, find and abort transactions; describe producers (kafka-transactions.sh)"
FORCE_TERMINATE_TIMEOUT_MS = 60000    # the transaction timeout InitProducerId stores; the producer's next init sets its own


def add_arguments(parser: argparse.ArgumentParser, nested) -> None:
    command = subcommands(parser, nested)

    p = command("list", _list, "list transactions (every broker's coordinator)")
    p.add_argument("--duration-filter", type=int, metavar="MS",
                   help="only transactions running for longer than this (ListTransactions v1+)")
    p.add_argument("--transactional-id-pattern", metavar="REGEX",
                   help="only transactional ids matching this regular expression (ListTransactions v2+)")
    p = command("describe", _describe, "describe the state of one transactional id")
    p.add_argument("--transactional-id", required=True)
    p = command("describe-producers", _describe_producers, "the active producers of one partition")
    _partition_arguments(p, required=True)
    p.add_argument("--broker-id", type=int, help="ask this broker instead of the partition's leader")
    p = command("find-hanging", _find_hanging, "find hanging transactions (KIP-664)")
    p.add_argument("--broker-id", type=int, help="search the partitions this broker holds")
    _partition_arguments(p, required=False)
    p.add_argument("--max-transaction-timeout", type=int, default=15, metavar="MINUTES",
                   help="only transactions whose last write is older than this (default 15)")
    p = command("abort", _abort, "abort a hanging transaction on one partition (WriteTxnMarkers)")
    _partition_arguments(p, required=True)
    p.add_argument("--start-offset", type=int, help="the first offset of the transaction to abort")
    p.add_argument("--producer-id", type=int, help="instead of --start-offset: the producer id ...")
    p.add_argument("--producer-epoch", type=int, help="... its epoch ...")
    p.add_argument("--coordinator-epoch", type=int, help="... and the coordinator epoch of its last marker")
    p = command("force-terminate", _force_terminate,
                "abort a transactional id's open transaction through its coordinator and fence its producer")
    p.add_argument("--transactional-id", required=True)
    p = command("stuck", _stuck, "list transactions stuck in PrepareCommit/PrepareAbort (a marker refused for good)")
    _status_argument(p)
    p = command("complete", _complete,
                "complete a stuck transaction with its prepared result (writes its refused markers, then COMPLETE)")
    p.add_argument("--transactional-id", required=True)
    _status_argument(p)


def _status_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--status-server", required=True, metavar="HOST:PORT",
                   help="the broker's status page address (trireme.status.listen)")


def _partition_arguments(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--topic", required=required)
    p.add_argument("--partition", type=int, required=required)


# --- requests ---------------------------------------------------------------------------------

def _list_transactions(client: Client, producer_ids=(), duration_ms: int | None = None,
                       pattern: str | None = None) -> list[tuple[int, object]]:
    """ListTransactions at every broker → (coordinator node, listed transaction)."""
    client.metadata([])
    low = 2 if pattern is not None else 1 if duration_ms is not None else 0
    out = []
    for node in sorted(client.brokers):
        response = client.call("ListTransactions", request(
            "ListTransactions", state_filters=[], producer_id_filters=list(producer_ids),
            duration_filter=-1 if duration_ms is None else duration_ms, transactional_id_pattern=pattern),
            (low, 2), node)
        check(response.error_code, f"listing the transactions of broker {node}")
        out.extend((node, t) for t in response.transaction_states)
    return out


def _describe_transaction(client: Client, transactional_id: str):
    """(coordinator node, DescribeTransactions state) of one transactional id."""
    def describe():
        node = client.coordinator(transactional_id, TRANSACTION)
        response = client.call("DescribeTransactions", request("DescribeTransactions",
                                                               transactional_ids=[transactional_id]), (0, 0), node)
        (state,) = response.transaction_states
        check(state.error_code, f"describing transactional id {transactional_id!r}")
        return node, state
    return client.retry(describe)


def _producers(client: Client, partitions: list[tuple[str, int]], broker_id: int | None) -> dict:
    """DescribeProducers at each partition's leader (or at ``broker_id``) → {(topic, partition): [producer state]}."""
    by_node = {broker_id: partitions} if broker_id is not None else client.leaders(partitions)
    cls = request_class("DescribeProducers")
    out = {}
    for node, tps in by_node.items():
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        response = client.call("DescribeProducers", cls(topics=[
            cls.TopicRequest(name=t, partition_indexes=ps) for t, ps in by_topic.items()]), (0, 0), node)
        for t in response.topics:
            for p in t.partitions:
                where = f"broker {broker_id}" if broker_id is not None else "its leader"
                check(p.error_code, f"describing the producers of {t.name}-{p.partition_index} on {where}",
                      p.error_message)
                out[(t.name, p.partition_index)] = list(p.active_producers)
    return out


def _none_if_negative(value: int) -> int | None:
    return None if value < 0 else value


# --- commands ---------------------------------------------------------------------------------

def _list(client: Client, args) -> Report:
    listed = _list_transactions(client, duration_ms=args.duration_filter, pattern=args.transactional_id_pattern)
    rows = sorted((t.transactional_id, node, t.producer_id, t.transaction_state) for node, t in listed)
    return Report([Table(("TransactionalId", "Coordinator", "ProducerId", "TransactionState"), rows)])


def _describe(client: Client, args) -> Report:
    node, s = _describe_transaction(client, args.transactional_id)
    start = _none_if_negative(s.transaction_start_time_ms)
    partitions = ",".join(f"{t.topic}-{p}" for t in s.topics for p in t.partitions)
    row = (node, s.transactional_id, s.producer_id, s.producer_epoch, s.transaction_state, s.transaction_timeout_ms,
           start, None if start is None else int(time.time() * 1000) - start, partitions or None)
    return Report([Table(("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                          "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                          "TopicPartitions"), [row])])


def _describe_producers(client: Client, args) -> Report:
    tp = (args.topic, args.partition)
    rows = [(s.producer_id, s.producer_epoch, s.coordinator_epoch, s.last_sequence, s.last_timestamp,
             _none_if_negative(s.current_txn_start_offset))
            for s in _producers(client, [tp], args.broker_id)[tp]]
    return Report([Table(("ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                          "CurrentTransactionStartOffset"), rows)])


def _search_partitions(client: Client, args) -> list[tuple[str, int]]:
    if args.topic is None and args.broker_id is None:
        raise AdminError("find-hanging needs --topic or --broker-id to limit the search")
    if args.partition is not None:
        if args.topic is None:
            raise AdminError("--partition needs --topic")
        return [(args.topic, args.partition)]
    out = []
    for t in client.metadata([args.topic] if args.topic else None).topics:
        check(t.error_code, f"topic {t.name!r}")
        out.extend((t.name, p.partition_index) for p in t.partitions
                   if args.broker_id is None or args.broker_id in p.replica_nodes)
    return sorted(out)


def _find_hanging(client: Client, args) -> Report:
    partitions = _search_partitions(client, args)
    now = int(time.time() * 1000)
    limit_ms = args.max_transaction_timeout * 60000
    candidates = [(tp, s) for tp, states in (_producers(client, partitions, args.broker_id) if partitions else {}).items()
                  for s in states if s.current_txn_start_offset >= 0 and now - s.last_timestamp > limit_ms]
    hanging = []
    if candidates:
        ids = {t.producer_id: t.transactional_id
               for _, t in _list_transactions(client, producer_ids=sorted({s.producer_id for _, s in candidates}))}
        described = {}
        for transactional_id in set(ids.values()):
            try:
                described[transactional_id] = _describe_transaction(client, transactional_id)[1]
            except AdminError as e:
                if getattr(e, "error", None) != E.TRANSACTIONAL_ID_NOT_FOUND:
                    raise
        for tp, s in candidates:
            description = described.get(ids.get(s.producer_id))
            # The coordinator lists a transaction's partitions while it is ongoing and, when it is being
            # completed, those still waiting for their marker: a partition among them will get its marker.
            if description is None or tp not in {(t.topic, p) for t in description.topics for p in t.partitions}:
                hanging.append((tp, s))
    rows = [(t, p, s.producer_id, s.producer_epoch, s.coordinator_epoch, s.current_txn_start_offset,
             s.last_timestamp, (now - s.last_timestamp) // 60000) for (t, p), s in sorted(hanging, key=lambda h: h[0])]
    return Report([Table(("Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                          "LastTimestamp", "Duration(min)"), rows)])


def _abort_spec(client: Client, args) -> tuple[int, int, int]:
    """(producer id, producer epoch, coordinator epoch) of the transaction to abort."""
    tp = (args.topic, args.partition)
    if args.start_offset is not None:
        found = [s for s in _producers(client, [tp], None)[tp] if s.current_txn_start_offset == args.start_offset]
        if not found:
            raise AdminError(f"no open transaction starts at offset {args.start_offset} on {tp[0]}-{tp[1]}")
        return found[0].producer_id, found[0].producer_epoch, found[0].coordinator_epoch
    if args.producer_id is None:
        raise AdminError("abort needs --start-offset, or --producer-id, --producer-epoch and --coordinator-epoch")
    if args.producer_epoch is None or args.coordinator_epoch is None:
        raise AdminError("--producer-id needs --producer-epoch and --coordinator-epoch")
    return args.producer_id, args.producer_epoch, args.coordinator_epoch


def _abort(client: Client, args) -> Report:
    producer_id, producer_epoch, coordinator_epoch = _abort_spec(client, args)
    # A producer whose transaction hangs before its first marker has coordinator epoch -1; 0 is at most any
    # coordinator epoch a partition can have seen.
    coordinator_epoch = max(coordinator_epoch, 0)
    tp = (args.topic, args.partition)
    (node,) = client.leaders([tp])
    cls = request_class("WriteTxnMarkers")
    mcls = cls.WritableTxnMarker
    response = client.call("WriteTxnMarkers", cls(markers=[mcls(
        producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=False,
        coordinator_epoch=coordinator_epoch, transaction_version=0,
        topics=[mcls.WritableTxnMarkerTopic(name=tp[0], partition_indexes=[tp[1]])])]), (1, 2), node)
    for marker in response.markers:
        for t in marker.topics:
            for p in t.partitions:
                check(p.error_code, f"writing the abort marker on {t.name}-{p.partition_index}")
    done = {"topic": tp[0], "partition": tp[1], "producer_id": producer_id, "producer_epoch": producer_epoch,
            "coordinator_epoch": coordinator_epoch}
    return Report(notes=[f"Aborted the transaction of producer {producer_id} (epoch {producer_epoch}) on "
                         f"{tp[0]}-{tp[1]}."], data={"aborted": done})


def _force_terminate(client: Client, args) -> Report:
    transactional_id = args.transactional_id
    _describe_transaction(client, transactional_id)          # an unknown id is an error, not a new producer

    def init():
        node = client.coordinator(transactional_id, TRANSACTION)
        response = client.call("InitProducerId", request(
            "InitProducerId", transactional_id=transactional_id, transaction_timeout_ms=FORCE_TERMINATE_TIMEOUT_MS,
            producer_id=-1, producer_epoch=-1), (0, 6), node)
        check(response.error_code, f"terminating the transaction of {transactional_id!r}")
        return response
    # While the abort this starts is completing the coordinator answers CONCURRENT_TRANSACTIONS: ask again.
    response = client.retry(init, also=(E.CONCURRENT_TRANSACTIONS,))
    return Report(notes=[f"Terminated the transaction of {transactional_id!r}: producer {response.producer_id} is "
                         f"now at epoch {response.producer_epoch}."],
                  data={"transactional_id": transactional_id, "producer_id": response.producer_id,
                        "producer_epoch": response.producer_epoch})


# --- stuck transactions (the status page) -------------------------------------------------------

def _status_call(args, path: str, form: dict | None = None) -> tuple[int, bytes]:
    """GET (or with ``form``, POST) ``path`` on the status page → (HTTP status, body)."""
    host, port = parse_host_port(args.status_server)
    url = f"http://{host}:{port}{path}"
    data = None if form is None else urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(url, data=data, headers={"Accept": "text/plain, application/json"})
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        raise AdminError(f"cannot reach the status page at {url}: {getattr(e, 'reason', e)}") from None


def _stuck_document(args) -> dict:
    from trireme.server.status_page import STUCK_PATH
    status, body = _status_call(args, STUCK_PATH)
    if status != 200:
        raise AdminError(f"the status page answered {status} to {STUCK_PATH}: {body.decode(errors='replace').strip()}")
    return json.loads(body)


def _stuck(client: Client, args) -> Report:
    rows = [(t["transactional_id"], t["producer_id"], t["producer_epoch"], t["transaction_state"], t["partitions"],
             t["stuck_since_ms"]) for t in _stuck_document(args)["stuck"]]
    return Report([Table(("TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState", "Partitions",
                          "StuckSinceMs"), rows)])


def _complete(client: Client, args) -> Report:
    from trireme.server.status_page import COMPLETE_PATH
    token = _stuck_document(args)["token"]
    if token is None:
        raise AdminError("the broker's status page actions are off: set trireme.status.actions.enable=true")
    status, body = _status_call(args, COMPLETE_PATH, {"token": token, "transactional_id": args.transactional_id})
    text = body.decode(errors="replace").strip()
    if status != 200:
        raise AdminError(text or f"the status page answered {status}")
    return Report(notes=[text], data={"transactional_id": args.transactional_id, "completed": True})
