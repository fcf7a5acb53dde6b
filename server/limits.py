"""The broker's resource bounds: byte budgets for request and response memory, connection admission, file descriptors.

Every bound is a broker property (Kafka's name where Kafka has one, see ``server/config.py``);
``docs/operations.md`` lists them with what a client sees when one is reached.

- :class:`ByteBudget` counts bytes held broker-wide (request frames being received or handled,
  responses waiting to be written).  A holder waits for room before it takes more, unless it is
  the only holder, so a frame larger than the budget still completes when nothing else is held.
  The response budget is a hard cap: an answer is built only when it fits (:meth:`Limits.answer_fits`;
  Fetch cuts its records to the room left), records and large answers leaving a headroom to others.
- :class:`Admission` decides whether an accepted socket may stay: ``max.connections``,
  ``max.connections.per.ip`` (with ``max.connections.per.ip.overrides``), and paces accepting to
  ``max.connection.creation.rate`` per second.
- :func:`raise_open_files_limit` lifts the soft ``RLIMIT_NOFILE`` to the hard one at start-up;
  :func:`open_descriptors` counts this process's descriptors for the metrics.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import resource

import trio

from trireme.state.storage import DESCRIPTOR_ERRNOS

log = logging.getLogger("trireme.limits")


# Descriptors kept free of connections for the logs, the metrics endpoint and start-up work.
RESERVED_DESCRIPTORS = 64
# The response budget's headroom: fetched records stop 1/HEADROOM_FRACTION short of the limit, other large answers
# half of that short, and small answers (a consumer's empty fetch, a heartbeat's) may use it all; so while clients
# that read nothing hold all the records the budget allows, large requests (a SyncGroup with every assignment) are
# still handled, and small ones while large answers fill their part too.
HEADROOM_FRACTION = 8
SMALL_ANSWER = 64 * 1024        # an answer of at most this many bytes may use the whole headroom


def out_of_descriptors(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in DESCRIPTOR_ERRNOS


class ByteBudget:
    """Bytes a kind of buffer may hold broker-wide; ``acquire`` waits for room, ``release`` gives it back."""

    def __init__(self, limit: int):
        self.limit = limit if limit >= 0 else 1 << 62
        self.used = 0
        self.peak = 0
        self._freed = trio.Event()

    def has_room(self, held: int = 0) -> bool:
        """Whether a holder that holds ``held`` bytes may take more now (one holding nothing always may)."""
        return held == 0 or self.used < self.limit or self.used <= held

    async def acquire(self, n: int, held: int = 0) -> None:
        """Take ``n`` bytes for a holder already holding ``held``; waits while others fill the budget."""
        while self.used + n > self.limit and self.used > held:
            await self._freed.wait()
        self.take(n)

    def take(self, n: int) -> None:
        """Count ``n`` bytes without waiting (memory that exists already: a response just built)."""
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def release(self, n: int) -> None:
        if n:
            self.used -= n
            self._freed.set()
            self._freed = trio.Event()

    async def wait_release(self) -> None:
        """Sleep until some holder releases bytes."""
        await self._freed.wait()


class Limits:
    """The bounds one broker enforces, read from its config once, and what they refused (for the metrics)."""

    def __init__(self, config):
        self.requests = ByteBudget(config["queued.max.request.bytes"])
        self.responses = ByteBudget(config["trireme.queued.max.response.bytes"])
        self.response_headroom = self.responses.limit // HEADROOM_FRACTION
        self.request_share = config["trireme.queued.max.request.bytes.per.connection"]
        self.response_share = config["trireme.queued.max.response.bytes.per.connection"]
        self.receive_timeout = config["trireme.request.receive.timeout.ms"] / 1000
        self.send_timeout = config["trireme.response.send.timeout.ms"] / 1000
        self.idle_timeout = config["connections.max.idle.ms"] / 1000
        self.max_partitions = config["trireme.max.partitions"]
        self.soft_descriptors, self.hard_descriptors = raise_open_files_limit()
        self.max_open_files = max(16, min(config["trireme.log.max.open.files"], self.soft_descriptors // 2))
        self.admission = Admission.from_config(config, self.soft_descriptors,
                                               self.max_open_files + RESERVED_DESCRIPTORS)
        log.info("limits max.connections=%d (configured %d) log open files=%d request budget=%d "
                 "response budget=%d", self.admission.max_connections, config["max.connections"],
                 self.max_open_files, self.requests.limit, self.responses.limit)
        self.refused: dict[str, int] = {}       # reason → connections refused
        self.closed: dict[str, int] = {}        # reason (idle, receive timeout, send timeout) → connections closed
        self.response_waits: dict[str, int] = {}    # API → requests that waited for room in the response budget
        if config["message.max.bytes"] > self.responses.limit - self.response_headroom:
            log.warning("message.max.bytes=%d is over what trireme.queued.max.response.bytes=%d leaves to records "
                        "(%d): a batch that large is fetched only when no other answer is waiting to be written",
                        config["message.max.bytes"], self.responses.limit,
                        self.responses.limit - self.response_headroom)

    def answer_fits(self, size: int, held: int = 0) -> bool:
        """Whether an answer of about ``size`` bytes (records apart) may be built now for a connection holding
        ``held`` bytes of answers: it fits in the response budget (a large one short of half the headroom), or no
        other connection holds any of it (so one larger than the whole budget still goes out, alone)."""
        responses = self.responses
        if responses.used <= held:
            return True
        bound = responses.limit if size <= SMALL_ANSWER else responses.limit - self.response_headroom // 2
        return responses.used + size <= bound

    async def room_for_answer(self, size: int, held: int = 0) -> None:
        """Wait until :meth:`answer_fits`; as answers are written or their connections close."""
        while not self.answer_fits(size, held):
            await self.responses.wait_release()

    def count(self, table: dict[str, int], reason: str) -> None:
        table[reason] = table.get(reason, 0) + 1

    def write_metrics(self, out, storage) -> None:
        """Connections refused and closed by a limit, memory and descriptors against their bounds, into ``out``
        (a metrics.Exposition)."""
        out.metric("trireme_connections_refused_total", "counter", "Connections refused by a limit, per reason.",
                   [({"reason": r}, n) for r, n in sorted(self.refused.items())])
        out.metric("trireme_connections_closed_total", "counter", "Connections closed by a limit, per reason.",
                   [({"reason": r}, n) for r, n in sorted(self.closed.items())])
        out.metric("trireme_response_memory_waits_total", "counter",
                   "Requests that waited for room in the response budget (Fetch: records held back), per API.",
                   [({"api": a}, n) for a, n in sorted(self.response_waits.items())])
        for name, text, value in (
                ("trireme_connections_limit", "max.connections in effect.", self.admission.max_connections),
                ("trireme_request_memory_bytes", "Request bytes being received or queued.", self.requests.used),
                ("trireme_request_memory_peak_bytes", "Peak of trireme_request_memory_bytes.", self.requests.peak),
                ("trireme_request_memory_limit_bytes", "queued.max.request.bytes.", self.requests.limit),
                ("trireme_response_memory_bytes", "Response bytes waiting to be written.", self.responses.used),
                ("trireme_response_memory_peak_bytes", "Peak of trireme_response_memory_bytes.", self.responses.peak),
                ("trireme_response_memory_limit_bytes", "trireme.queued.max.response.bytes.", self.responses.limit),
                ("trireme_open_descriptors", "File descriptors the process has open.", open_descriptors()),
                ("trireme_open_descriptors_limit", "The soft RLIMIT_NOFILE.", self.soft_descriptors),
                ("trireme_log_open_files", "Log files holding a descriptor.", storage.open_descriptors),
                ("trireme_log_open_files_limit", "trireme.log.max.open.files in effect.", self.max_open_files)):
            out.metric(name, "gauge", text, value)

def parse_overrides(text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``host:count,host:count`` (Kafka's format)."""
    out = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        if not sep or not count.strip().isdigit():
            raise ValueError(f"max.connections.per.ip.overrides: expected HOST:COUNT, got {item!r}")
        out[host.strip().strip("[]")] = int(count)
    return out


@dataclasses.dataclass
class Admission:
    """Who may connect: the connection caps and the creation-rate pacing of the accept loop."""

    max_connections: int
    per_ip: int
    per_ip_overrides: dict[str, int]
    creation_rate: int
    by_ip: dict[str, int] = dataclasses.field(default_factory=dict)   # the one record of open connections
    _tokens: float = 0.0
    _refilled: float = 0.0

    @classmethod
    def from_config(cls, config, descriptor_limit: int, reserved: int) -> "Admission":
        cap = config["max.connections"]
        if descriptor_limit > 0:     # connections may never take the descriptors the logs need
            cap = max(1, min(cap, descriptor_limit - reserved))
        return cls(cap, config["max.connections.per.ip"], parse_overrides(config["max.connections.per.ip.overrides"]),
                   config["max.connection.creation.rate"])

    def refusal(self, ip: str) -> str | None:
        """Why a new connection from ``ip`` is refused, or None (then :meth:`opened` counts it)."""
        if self.count >= self.max_connections:
            return "max.connections"
        if self.by_ip.get(ip, 0) >= self.per_ip_overrides.get(ip, self.per_ip):
            return "max.connections.per.ip"
        return None

    @property
    def count(self) -> int:
        """Open connections (what the metrics and the status page show)."""
        return sum(self.by_ip.values())

    def opened(self, ip: str) -> None:
        self.by_ip[ip] = self.by_ip.get(ip, 0) + 1

    def closed(self, ip: str) -> None:
        left = self.by_ip[ip] - 1
        if left:
            self.by_ip[ip] = left
        else:
            del self.by_ip[ip]

    async def pace(self) -> None:
        """Sleep as long as accepting one more connection now would pass max.connection.creation.rate."""
        rate = self.creation_rate
        now = trio.current_time()
        self._tokens = min(float(rate), self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        if self._tokens < 1:
            await trio.sleep((1 - self._tokens) / rate)
            self._tokens, self._refilled = 1.0, trio.current_time()
        self._tokens -= 1


def raise_open_files_limit() -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard limit; → (soft, hard) afterwards (logged)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise the open files limit from %d to %d: %r", soft, target, e)
    log.info("open files limit soft=%d (was %d) hard=%s", soft, before,
             "unlimited" if hard == resource.RLIM_INFINITY else hard)
    return soft, hard


def open_descriptors() -> int:
    """How many descriptors this process holds (-1 where /proc is missing)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1     # less the one listdir itself used
    except OSError:
        return -1
