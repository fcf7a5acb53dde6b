"""``trireme dump-log``: prints a partition's log segment files batch by batch, as Kafka's kafka-dump-log does, so an
operator can see what compaction (or anything else) left in a log.

Reads the files only (safe beside a running broker: it may show a segment that is being appended to, or one the
cleaner is about to replace).  Per batch: offsets, record count, producer id/epoch and sequences, the transactional
and control flags, the delete horizon (set by the cleaner on batches holding tombstones or markers), file position,
size, codec and whether its CRC holds; with ``--deep-iteration`` each record's offset, timestamp, key and value
sizes and header keys; with ``--print-data-log`` the keys and values too (UTF-8, as Kafka's default decoder shows
them) and the markers' kind and coordinator epoch.
"""
from __future__ import annotations

import argparse
import os
import sys

import crc32c

from trireme.wire.compression import CODEC_NAMES
from trireme.wire.primitives import CodecError
from trireme.wire.records import (ATTRIBUTES_OFFSET, BATCH_HEADER_SIZE, CONTROL_COMMIT, LOG_OVERHEAD, LOG_APPEND_TIME,
                                  decode_records, parse_batch_header, parse_control_record)

HELP = "print a partition's log segments batch by batch (as kafka-dump-log)"
# The largest batch read into memory: past it the rest of the file is reported as invalid (Kafka's tool reads
# at most Int.MaxValue; message.max.bytes is far lower).
MAX_BATCH_BYTES = 1 << 30
# Bytes a decompressed batch may grow to when records are printed.
MAX_UNCOMPRESSED = 1 << 30


def add_parser(sub) -> None:
    parser = sub.add_parser("dump-log", help=HELP, description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", required=True, action="append", metavar="PATH[,PATH...]",
                        help="segment files (.log) to dump, comma separated (repeatable); a partition's directory "
                             "(DATA_DIR/logs/TOPIC-PARTITION) dumps all its segments in offset order")
    parser.add_argument("--deep-iteration", action="store_true", help="print every record, not only the batches")
    parser.add_argument("--print-data-log", action="store_true",
                        help="print the records' keys and values (implies --deep-iteration)")


def run(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    status = 0
    for path in _expand([p for item in args.files for p in item.split(",") if p]):
        if not path.endswith(".log"):
            print(f"Ignoring {path}: only log segments (.log) are dumped", file=out)
            continue
        try:
            dump_segment(path, out, deep=args.deep_iteration or args.print_data_log, data=args.print_data_log)
        except OSError as e:
            print(f"trireme dump-log: {path}: {e.strerror or e}", file=sys.stderr)
            status = 1
    return status


def _expand(paths: list[str]) -> list[str]:
    out = []
    for path in paths:
        if os.path.isdir(path):
            out += [os.path.join(path, name) for name in sorted(os.listdir(path)) if name.endswith(".log")]
        else:
            out.append(path)
    return out


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", "replace")


def dump_segment(path: str, out, *, deep: bool = False, data: bool = False) -> None:
    with open(path, "rb") as f:
        print(f"Dumping {path}", file=out)
        stem = os.path.basename(path).split(".")[0]
        if stem.isdigit():
            print(f"Log starting offset: {int(stem)}", file=out)
        size = os.fstat(f.fileno()).st_size
        position = 0
        while position < size:
            head = f.read(BATCH_HEADER_SIZE)
            try:
                header = parse_batch_header(head) if len(head) == BATCH_HEADER_SIZE else None
            except CodecError:
                header = None
            total = header.batch_length + LOG_OVERHEAD if header is not None else 0
            if header is None or total > MAX_BATCH_BYTES or position + total > size:
                print(f"Found {size - position} invalid bytes at the end of {os.path.basename(path)}", file=out)
                return
            batch = head + f.read(total - BATCH_HEADER_SIZE)
            print(_batch_line(header, batch, position), file=out)
            if deep:
                _print_records(header, batch, out, data)
            position += total


def _batch_line(h, batch: bytes, position: int) -> str:
    last_sequence = -1 if h.base_sequence < 0 else (h.base_sequence + h.last_offset_delta) % (1 << 31)
    horizon = f"OptionalLong[{h.base_timestamp}]" if h.has_delete_horizon else "OptionalLong.empty"
    time_kind = "LogAppendTime" if h.timestamp_type == LOG_APPEND_TIME else "CreateTime"
    valid = crc32c.crc32c(batch[ATTRIBUTES_OFFSET:]) == h.crc
    return (f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
            f"baseSequence: {h.base_sequence} lastSequence: {last_sequence} producerId: {h.producer_id} "
            f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
            f"isTransactional: {str(h.is_transactional).lower()} isControl: {str(h.is_control).lower()} "
            f"deleteHorizonMs: {horizon} position: {position} {time_kind}: {h.max_timestamp} size: {len(batch)} "
            f"magic: {h.magic} compresscodec: {CODEC_NAMES.get(h.compression, h.compression)} crc: {h.crc} "
            f"isvalid: {str(valid).lower()}")


def _print_records(h, batch: bytes, out, data: bool) -> None:
    try:
        records = decode_records(batch, 0, MAX_UNCOMPRESSED)
    except CodecError as e:
        print(f"| records not readable: {e}", file=out)
        return
    time_kind = "LogAppendTime" if h.timestamp_type == LOG_APPEND_TIME else "CreateTime"
    for r in records:
        sequence = -1 if h.base_sequence < 0 else (h.base_sequence + r.offset - h.base_offset) % (1 << 31)
        line = (f"| offset: {r.offset} {time_kind}: {r.timestamp} "
                f"keySize: {-1 if r.key is None else len(r.key)} valueSize: {-1 if r.value is None else len(r.value)} "
                f"sequence: {sequence} headerKeys: [{','.join(k for k, _ in r.headers)}]")
        if data:
            if h.is_control:
                try:
                    kind, epoch = parse_control_record(r)
                    line += f" endTxnMarker: {'COMMIT' if kind == CONTROL_COMMIT else 'ABORT'} coordinatorEpoch: {epoch}"
                except CodecError:
                    line += " endTxnMarker: unknown"
            else:
                line += f" key: {_text(r.key)} payload: {_text(r.value)}"
        print(line, file=out)
