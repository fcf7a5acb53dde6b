"""Counters and latency summaries the broker keeps about itself, printable as Prometheus text."""
from __future__ import annotations

import collections


class Metrics:
    def __init__(self):
        self.requests = collections.Counter()
        self.request_seconds = collections.Counter()
        self.fsyncs = 0
        self.fsync_seconds = 0.0
        self.fsync_partitions = 0
        self.bytes_in = 0
        self.bytes_out = 0

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
        lines += [f"trireme_fsyncs_total {self.fsyncs}",
                  f"trireme_fsync_seconds_total {self.fsync_seconds:.6f}",
                  f"trireme_fsync_partitions_total {self.fsync_partitions}",
                  f"trireme_bytes_in_total {self.bytes_in}",
                  f"trireme_bytes_out_total {self.bytes_out}"]
        return "\n".join(lines) + "\n"
