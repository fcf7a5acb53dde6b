"""Counters and latency summaries the broker keeps about itself, printable as Prometheus text."""
from __future__ import annotations

import collections

from trireme.state.txn_records import TxnState

from .clock import now_ms


class Metrics:
    def __init__(self):
        self.requests = collections.Counter()
        self.request_seconds = collections.Counter()
        self.phase_seconds: collections.Counter = collections.Counter()
        self.fsyncs = 0
        self.fsync_seconds = 0.0
        self.fsync_partitions = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.connections = 0

    def observe_phase(self, api: str, phase: str, seconds: float) -> None:
        """Time a request spent in one phase besides its handler (``observe_request``): receive (its frame), wait
        (the fsync, a coordinator, a long poll), respond (encode and send)."""
        self.phase_seconds[(api, phase)] += seconds

    def observe_request(self, api: str, seconds: float) -> None:
        self.requests[api] += 1
        self.request_seconds[api] += seconds

    def observe_fsync(self, seconds: float, partitions: int) -> None:
        self.fsyncs += 1
        self.fsync_seconds += seconds
        self.fsync_partitions += partitions

    def render(self) -> str:
        lines = ["# TYPE trireme_requests_total counter"]
        for api, n in sorted(self.requests.items()):
            lines.append(f'trireme_requests_total{{api="{api}"}} {n}')
        lines.append("# TYPE trireme_request_handler_seconds_total counter")
        for api, s in sorted(self.request_seconds.items()):
            lines.append(f'trireme_request_handler_seconds_total{{api="{api}"}} {s:.6f}')
        lines.append("# TYPE trireme_request_phase_seconds_total counter")
        for (api, phase), sec in sorted(self.phase_seconds.items()):
            lines.append(f'trireme_request_phase_seconds_total{{api="{api}",phase="{phase}"}} {sec:.6f}')
        lines += [f"trireme_fsyncs_total {self.fsyncs}",
                  f"trireme_fsync_seconds_total {self.fsync_seconds:.6f}",
                  f"trireme_fsync_partitions_total {self.fsync_partitions}",
                  f"trireme_bytes_in_total {self.bytes_in}",
                  f"trireme_bytes_out_total {self.bytes_out}"]
        return "\n".join(lines) + "\n"


def render_broker(broker) -> str:
    """The broker's counters plus gauges read from its state at scrape time."""
    lines = [broker.metrics.render().rstrip("\n"),
             "# TYPE trireme_partition_log_end_offset gauge",
             "# TYPE trireme_partition_high_watermark gauge",
             "# TYPE trireme_partition_lso_lag gauge",
             "# TYPE trireme_partition_producers gauge"]
    for (topic, index), p in sorted(broker.partitions.items()):
        labels = f'topic="{topic}",partition="{index}"'
        hw = p.log.high_watermark
        lines.append(f"trireme_partition_log_end_offset{{{labels}}} {p.log.log_end_offset}")
        lines.append(f"trireme_partition_high_watermark{{{labels}}} {hw}")
        # HW - LSO: how far read_committed consumers are held back by open transactions.
        lines.append(f"trireme_partition_lso_lag{{{labels}}} {hw - p.last_stable_offset()}")
        lines.append(f"trireme_partition_producers{{{labels}}} {len(p.producers)}")
        lines.append(f"trireme_partition_log_start_offset{{{labels}}} {p.log.log_start_offset}")
        lines.append(f"trireme_partition_size_bytes{{{labels}}} {p.log.size_bytes}")
    lines.append(f"trireme_groups {len(broker.groups.coordinator.groups)}")
    lines += _transaction_lines(broker.transactions.coordinator, now_ms())
    lines.append(f"trireme_connections {broker.metrics.connections}")
    lines += broker.limits.metric_lines(broker.storage)
    return "\n".join(lines) + "\n"


def _transaction_lines(coordinator, now: int) -> list[str]:
    """Transactions per coordinator state and the age of the oldest open one (what pins an LSO longest)."""
    counts = {state: 0 for state in TxnState}
    oldest = 0
    for meta in coordinator.transactions.values():
        counts[meta.state] += 1
        if meta.state is TxnState.ONGOING and meta.value.start_timestamp_ms >= 0:
            oldest = max(oldest, now - meta.value.start_timestamp_ms)
    lines = ["# TYPE trireme_transactions gauge"]
    lines += [f'trireme_transactions{{state="{state.kafka_name}"}} {n}' for state, n in counts.items()]
    lines += ["# TYPE trireme_transaction_oldest_open_age_seconds gauge",
              f"trireme_transaction_oldest_open_age_seconds {oldest / 1000:.3f}",
              f"trireme_transactions_timed_out_total {coordinator.timed_out}",
              f"trireme_transactions_fenced_total {coordinator.fenced}"]
    return lines


async def serve_metrics(broker, host: str, port: int, *, task_status) -> None:
    """A minimal HTTP endpoint: ``GET /metrics`` answers Prometheus text; anything else 404."""
    import trio

    async def handle(stream):
        try:
            with trio.move_on_after(5):
                request = b""
                while b"\r\n\r\n" not in request and len(request) < 8192:
                    data = await stream.receive_some(4096)
                    if not data:
                        return
                    request += data
                path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
                if path == b"/metrics":
                    body, status = render_broker(broker).encode(), b"200 OK"
                else:
                    body, status = b"not found\n", b"404 Not Found"
                await stream.send_all(b"HTTP/1.0 " + status + b"\r\nContent-Type: text/plain; version=0.0.4\r\n"
                                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await stream.aclose()

    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)
