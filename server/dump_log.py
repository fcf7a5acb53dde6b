"""``trireme dump-log``: prints a partition's log segment files batch by batch, and its index files entry by entry, as
Kafka's kafka-dump-log does, so an operator can see what compaction (or anything else) left in a log.

Reads the files only (safe beside a running broker: it may show a segment that is being appended to, or one the
cleaner is about to replace).  Per batch: offsets, record count, producer id/epoch and sequences, the transactional
and control flags, the delete horizon (set by the cleaner on batches holding tombstones or markers), file position,
size, codec and whether its CRC holds; with ``--deep-iteration`` each record's offset, timestamp, key and value
sizes and header keys; with ``--print-data-log`` the keys and values too (UTF-8, as Kafka's default decoder shows
them) and the markers' kind and coordinator epoch.

Index files (written for a segment once it is rolled; the active segment's live in memory only): ``.index`` prints
``offset: O position: P`` per entry, ``.timeindex`` ``timestamp: T offset: O``, ``.txnindex`` one aborted
transaction per line (``version: 0 producerId: … firstOffset: … lastOffset: … lastStableOffset: …``; Trireme's
entries carry no version field, so 0, the only version Kafka's have).  As Kafka's tool does, an index's entries are
checked against the segment's ``.log`` beside it and what does not match is listed on stderr after all files (a
Trireme offset or time index entry names the *base* offset of the batch at that position, where Kafka's names its
last offset); ``--verify-index-only`` checks without printing the entries.  Any other file is ignored, saying so.
"""
from __future__ import annotations

import argparse
import bisect
import os
import struct
import sys

import crc32c

from trireme.state.log import TIME_INDEX_ENTRY, TXN_INDEX_ENTRY, unpack_txn_entry
from trireme.wire.compression import CODEC_NAMES
from trireme.wire.primitives import CodecError
from trireme.wire.records import (ATTRIBUTES_OFFSET, BATCH_HEADER_SIZE, CONTROL_COMMIT, LOG_OVERHEAD, LOG_APPEND_TIME,
                                  decode_records, parse_batch_header, parse_control_record)

HELP = "print a partition's log segments and index files (as kafka-dump-log)"
# The largest batch read into memory: past it the rest of the file is reported as invalid (Kafka's tool reads
# at most Int.MaxValue; message.max.bytes is far lower).
MAX_BATCH_BYTES = 1 << 30
# Bytes a decompressed batch may grow to when records are printed.
MAX_UNCOMPRESSED = 1 << 30


def add_parser(sub) -> None:
    parser = sub.add_parser("dump-log", help=HELP, description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", required=True, action="append", metavar="PATH[,PATH...]",
                        help="segment (.log) and index (.index, .timeindex, .txnindex) files to dump, comma separated "
                             "(repeatable); a partition's directory (DATA_DIR/logs/TOPIC-PARTITION) dumps all its "
                             "segments (.log) in offset order")
    parser.add_argument("--deep-iteration", action="store_true", help="print every record, not only the batches")
    parser.add_argument("--print-data-log", action="store_true",
                        help="print the records' keys and values (implies --deep-iteration)")
    parser.add_argument("--verify-index-only", action="store_true",
                        help="check index files against their segments without printing their entries")


def run(args: argparse.Namespace, out=None, err=None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    status = 0
    problems: list[str] = []
    for path in _expand([p for item in args.files for p in item.split(",") if p]):
        kind = path.rsplit(".", 1)[-1] if "." in os.path.basename(path) else ""
        try:
            if kind == "log":
                dump_segment(path, out, deep=args.deep_iteration or args.print_data_log, data=args.print_data_log)
            elif kind in ("index", "timeindex", "txnindex"):
                with open(path, "rb") as f:
                    content = f.read()
                print(f"Dumping {path}", file=out)
                if kind == "txnindex":
                    dump_txn_index(path, content, out)
                else:
                    dump = dump_index if kind == "index" else dump_time_index
                    problems += dump(path, content, out, verify_only=args.verify_index_only)
            else:
                print(f"Dumping {path}", file=out)
                print(f"Ignoring unknown file {path}", file=err)
        except OSError as e:
            print(f"trireme dump-log: {path}: {e.strerror or e}", file=err)
            status = 1
    for line in problems:
        print(line, file=err)
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
                what = "bytes of zeros (written ahead for appends)" if _zeros_to_end(f, head) else "invalid bytes"
                print(f"Found {size - position} {what} at the end of {os.path.basename(path)}", file=out)
                return
            batch = head + f.read(total - BATCH_HEADER_SIZE)
            print(_batch_line(header, batch, position), file=out)
            if deep:
                _print_records(header, batch, out, data)
            position += total


def _zeros_to_end(f, head: bytes) -> bool:
    """Whether `head` and the rest of `f` are all zeros (read a MiB at a time, up to the first byte that is not)."""
    chunk = head
    while chunk:
        if chunk.count(0) != len(chunk):
            return False
        chunk = f.read(1 << 20)
    return True


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


# --- index files ------------------------------------------------------------------------------------------------

_INDEX_ENTRY_SIZE = 8  # relative offset, file position: two big-endian int32, as Kafka's


def _base_offset(path: str) -> int | None:
    stem = os.path.basename(path).split(".")[0]
    return int(stem) if stem.isdigit() else None


def _segment_batches(index_path: str) -> dict[int, tuple[int, int, int]] | None:
    """position → (base offset, last offset, max timestamp) of each batch in the segment beside an index file, read
    header by header; None if there is no such segment."""
    path = index_path.rsplit(".", 1)[0] + ".log"
    try:
        f = open(path, "rb")
    except OSError:
        return None
    batches = {}
    with f:
        size = os.fstat(f.fileno()).st_size
        position = 0
        while position + BATCH_HEADER_SIZE <= size:
            f.seek(position)
            try:
                h = parse_batch_header(f.read(BATCH_HEADER_SIZE))
            except CodecError:
                break
            batches[position] = (h.base_offset, h.last_offset, h.max_timestamp)
            position += h.batch_length + LOG_OVERHEAD
    return batches


def _whole_entries(content: bytes, entry_size: int) -> bytes:
    return content[: len(content) - len(content) % entry_size]


def _say_trailing(path: str, content: bytes, entry_size: int, out) -> None:
    """Bytes after an index file's last whole entry are not an entry: say how many."""
    if len(content) % entry_size:
        print(f"Found {len(content) % entry_size} invalid bytes at the end of {os.path.basename(path)}", file=out)


def dump_index(path: str, content: bytes, out, *, verify_only: bool = False) -> list[str]:
    """Print an offset index; return what does not match its segment (lines for stderr)."""
    if not content:
        print(f"{path} is empty.", file=out)
        return []
    base = _base_offset(path) or 0
    batches = _segment_batches(path)
    mismatches = []
    for rel, position in struct.iter_unpack(">ii", _whole_entries(content, _INDEX_ENTRY_SIZE)):
        offset = base + rel
        if batches is not None:
            found = batches.get(position, (-1,))[0]
            if found != offset:
                mismatches.append(f"  Index offset: {offset}, log offset: {found}")
        if not verify_only:
            print(f"offset: {offset} position: {position}", file=out)
    _say_trailing(path, content, _INDEX_ENTRY_SIZE, out)
    return [f"Mismatches in :{path}", *mismatches] if mismatches else []


def dump_time_index(path: str, content: bytes, out, *, verify_only: bool = False) -> list[str]:
    """Print a time index; return what does not match its segment or is out of order (lines for stderr)."""
    base = _base_offset(path) or 0
    batches = _segment_batches(path)
    in_order = sorted(batches.values()) if batches is not None else []
    last_offsets = [b[1] for b in in_order]
    mismatched, out_of_order, not_found = [], [], []
    previous = -1
    for timestamp, rel in TIME_INDEX_ENTRY.iter_unpack(_whole_entries(content, TIME_INDEX_ENTRY.size)):
        offset = base + rel
        if batches is not None:
            i = bisect.bisect_left(last_offsets, offset)          # the batch holding the offset, or the next one
            found = in_order[i][0] if i < len(in_order) else -1
            if found != offset:
                not_found.append(f"Indexed offset: {offset}, found log offset: {found}")
            else:
                if in_order[i][2] != timestamp:
                    mismatched.append(f"  Index timestamp: {timestamp}, log timestamp: {in_order[i][2]}")
                if previous >= timestamp:
                    out_of_order.append(f"  Index timestamp: {timestamp}, Previously indexed timestamp: {previous}")
        if not verify_only:
            print(f"timestamp: {timestamp} offset: {offset}", file=out)
        previous = timestamp
    _say_trailing(path, content, TIME_INDEX_ENTRY.size, out)
    problems = []
    if mismatched:
        problems += [f"Found timestamp mismatch in :{path}", *mismatched]
    if out_of_order:
        problems += [f"Found out of order timestamp in :{path}", *out_of_order]
    if not_found:
        problems += ["The following indexed offsets are not found in the log.", *not_found]
    return problems


def dump_txn_index(path: str, content: bytes, out) -> None:
    """Print an aborted-transaction index, up to the first entry whose checksum fails."""
    position = 0
    while position + TXN_INDEX_ENTRY.size <= len(content):
        entry = unpack_txn_entry(content, position)
        if entry is None:
            break
        txn = entry[0]
        print(f"version: 0 producerId: {txn.producer_id} firstOffset: {txn.first_offset} "
              f"lastOffset: {txn.last_offset} lastStableOffset: {txn.last_stable_offset}", file=out)
        position += TXN_INDEX_ENTRY.size
    if position < len(content):
        print(f"Found {len(content) - position} invalid bytes at the end of {os.path.basename(path)}", file=out)
