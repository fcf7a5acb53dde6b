"""DescribeLogDirs: the one log directory, with each partition's size on disk, as `kafka-log-dirs.sh` shows it.

Behaviour / version notes:
- v1-5.  One result: LogDir = the absolute path of DATA_DIR/logs (where the partition
  directories live), TotalBytes/UsableBytes (v4+) of its file system (-1 when it cannot be
  read, e.g. with in-memory storage), IsCordoned (v5) false: a single directory is never
  cordoned.  Top-level ErrorCode (v3+) 0.
- Topics null means every partition; otherwise the named partitions that exist (others are
  left out, as Kafka does).  A topic appears only with at least one partition.  The
  coordinators' internal topics are partitions in the directory like any other; the hidden
  `__cluster_metadata` is not listed (Kafka keeps its metadata log outside the log manager).
- Per partition: PartitionSize = the bytes of its segment files (what is written, durable or
  not); OffsetLag = max(high watermark - log end offset, 0), which is 0 on a leader, as Kafka
  reports it; IsFutureKey false (no AlterReplicaLogDirs moves).
- ACLs (as Kafka's KafkaApis): Describe on the cluster, else no results and (v3+) top-level
  CLUSTER_AUTHORIZATION_FAILED; nothing is read.
"""
from __future__ import annotations

import os

from trireme.server.dispatch import handles
from trireme.state.acls import CLUSTER_NAME, Operation, ResourceType
from trireme.wire import error_codes as E


def _volume(path: str) -> tuple[int, int]:
    """(total, usable) bytes of the file system holding ``path``; (-1, -1) when unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1, -1
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def log_dir(broker) -> str:
    """The one log directory's absolute path, as DescribeLogDirs reports it."""
    return os.path.abspath(os.path.join(broker.config.data_dir, "logs"))


@handles("DescribeLogDirs", 1, 5)
def describe_log_dirs(ctx, request):
    broker = ctx.broker
    response = ctx.response()
    if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        response.error_code = E.CLUSTER_AUTHORIZATION_FAILED.code
        response.results = []
        return response
    rcls = type(response).DescribeLogDirsResult
    tcls = rcls.DescribeLogDirsTopic
    pcls = tcls.DescribeLogDirsPartition
    if request.topics is None:
        wanted = sorted(tp for tp in broker.partitions if broker.partition(*tp) is not None)
    else:
        wanted = sorted(tp for tp in {(t.topic, i) for t in request.topics for i in t.partitions}
                        if broker.partition(*tp) is not None)
    topics: dict[str, list] = {}
    for name, index in wanted:
        log = broker.partitions[(name, index)].log
        topics.setdefault(name, []).append(pcls(
            partition_index=index, partition_size=log.size_bytes,
            offset_lag=max(log.high_watermark - log.log_end_offset, 0), is_future_key=False))
    path = log_dir(broker)
    total, usable = _volume(path if os.path.isdir(path) else broker.config.data_dir)
    response.results = [rcls(error_code=0, log_dir=path, total_bytes=total, usable_bytes=usable,
                             is_cordoned=False,
                             topics=[tcls(name=name, partitions=parts) for name, parts in topics.items()])]
    return response
