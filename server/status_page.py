"""The status page: one server-rendered HTML page showing partitions, groups, transactions, producers and security (listeners, the authorizer, failed logins, denied requests, throttled clients), with opt-in actions that abort or complete transactions.

Served on ``trireme.status.listen`` by :mod:`trireme.server.web`.  What it shows is read from the
broker's state when the page is asked for (:mod:`trireme.server.overview`).  Actions are off
unless ``trireme.status.actions.enable`` is set; they are POSTs that must carry this process's
random token (written into the page's forms, so another site cannot forge them) and, when the
browser sends an Origin, come from the page's own origin.  Aborting follows Kafka's rules:

- a transaction the coordinator knows (Ongoing) is aborted by the coordinator exactly as its
  timeout would: the producer's epoch is bumped (fencing it), PREPARE_ABORT is written and the
  coordinator writes the markers;
- a *hanging* transaction (KIP-664: open on a partition, no open transaction of that producer with
  that partition at the coordinator) gets an ABORT marker through WriteTxnMarkers, sent through
  :class:`~trireme.server.local_peer.LocalPeer` as an admin client's abort would send it, with the
  producer epoch and coordinator epoch of the partition's producer state.

A *stuck* transaction (prepared, but a partition refused its marker for good, e.g. with
TRANSACTION_COORDINATOR_FENCED) is completed with its prepared result by the coordinator
(:meth:`~trireme.server.transactions.TransactionService.complete_stuck`).  ``trireme transactions
stuck`` and ``complete`` use this page too: ``GET /stuck-transactions`` (JSON: the stuck
transactions, and the actions token when actions are on) and the same POST with
``Accept: text/plain``, which answers with a line of text (200 done, 409 not done) instead of a redirect.
"""
from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import html
import json
import logging
import secrets
import time
import urllib.parse

from trireme.state.txn_records import TxnState
from trireme.wire import error_codes as E
from trireme.wire.codec import message

from . import overview
from .clock import now_ms
from .transactions import NotStuck
from .web import Request, Response, Routes

log = logging.getLogger("trireme.status")

ABORT_PATH = "/actions/abort-transaction"
ABORT_HANGING_PATH = "/actions/abort-hanging-transaction"
COMPLETE_PATH = "/actions/complete-transaction"
STUCK_PATH = "/stuck-transactions"
MAX_PRODUCER_ROWS = 500
MAX_LEADER_ROWS = 2000
MAX_MEMBERS_SHOWN = 6
MAX_SECURITY_ROWS = 50              # denied-request and throttled-client rows shown (the largest counts)
_MARKERS = message("WriteTxnMarkersRequest").cls

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:12px 24px;display:flex;gap:24px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:20px;margin:0}header span{color:#c5cad6}
main{padding:8px 24px 32px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.card{color:inherit;text-decoration:none;background:#fff;border:1px solid #dde1e8;border-radius:6px;
padding:8px 16px;min-width:110px}
.card b{display:block;font-size:22px}.card.bad{border-color:#c62828;background:#fdecea}
section{margin-top:22px}h2{font-size:16px;margin:0 0 6px}h3{font-size:14px;margin:12px 0 6px}
table{border-collapse:collapse;background:#fff;border:1px solid #dde1e8;min-width:50%}
th,td{padding:4px 10px;border-bottom:1px solid #eceff3;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600;white-space:nowrap}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafbfc}
.tag{display:inline-block;padding:0 6px;border-radius:4px;font-size:12px;background:#e3e7ee}
.warn{background:#fff3cd;color:#6b4e00}.bad{background:#fdecea;color:#8e1b1b}.ok{background:#e6f4ea;color:#1e5631}
.empty{color:#69707d;font-style:italic}
form{margin:0}button{font:inherit;padding:1px 10px;border:1px solid #c62828;color:#c62828;background:#fff;
border-radius:4px;cursor:pointer}button:hover{background:#fdecea}
.actions li{margin:2px 0}footer{margin-top:28px;color:#69707d}code{font-size:13px}
"""
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
HEADERS = {
    "Content-Security-Policy": f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",            # no-referrer would make the browser send Origin: null
    "Cache-Control": "no-store",
}


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _age(ms: int) -> str:
    """A duration for people: ``850 ms``, ``42 s``, ``3 min 5 s``, ``2 h 10 min``, ``4 d 3 h``."""
    if ms < 1000:
        return f"{max(ms, 0)} ms"
    s = ms // 1000
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if s >= size:
            return f"{s // size} {unit} {s % size // sub_size} {sub}"
    return f"{s} s"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _table(columns, rows, empty: str) -> str:
    """``columns``: names, a trailing ``#`` marks a numeric one; ``rows``: lists of HTML cells."""
    if not rows:
        return f'<p class="empty">{_e(empty)}</p>'
    head = "".join(f'<th class="n">{_e(c[:-1])}</th>' if c.endswith("#") else f"<th>{_e(c)}</th>" for c in columns)
    numeric = [c.endswith("#") for c in columns]
    body = "".join("<tr>" + "".join(f'<td class="n">{cell}</td>' if num else f"<td>{cell}</td>"
                                    for cell, num in zip(row, numeric)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _tp(topic: str, partition: int) -> str:
    return _e(f"{topic}-{partition}")


class StatusPage:
    def __init__(self, broker):
        self.broker = broker
        self.token = secrets.token_urlsafe(32)          # per process: forms carry it, other sites cannot read it
        self.actions_enabled = bool(broker.config["trireme.status.actions.enable"])
        self.recent: collections.deque[tuple[int, str]] = collections.deque(maxlen=20)
        self.started_ms = now_ms()

    def routes(self) -> Routes:
        return {("GET", "/"): self.page, ("POST", ABORT_PATH): self.abort,
                ("POST", ABORT_HANGING_PATH): self.abort_hanging, ("POST", COMPLETE_PATH): self.complete,
                ("GET", STUCK_PATH): self.stuck_json}

    # --- the page ------------------------------------------------------------------------------

    def page(self, request: Request) -> Response:
        return Response(200, self.render().encode(), "text/html; charset=utf-8", dict(HEADERS))

    def render(self) -> str:
        broker = self.broker
        now = now_ms()
        open_txns = overview.open_transactions(broker)
        pins = overview.lso_pins(open_txns)
        groups = overview.groups(broker)
        coordinator = broker.transactions.coordinator
        ongoing = sorted((m for m in coordinator.transactions.values() if m.state in overview.OPEN_STATES),
                         key=lambda m: (m.value.start_timestamp_ms, m.transactional_id))
        hanging = [t for t in open_txns if t.hanging]
        stuck = overview.stuck_transactions(broker)
        security = overview.security(broker, MAX_SECURITY_ROWS)
        failed_logins = sum(failed for _, _, _, failed in security.authentications)
        cards = [("topics", len(broker.topics.all()), "partitions"),
                 ("partitions", len(broker.partitions), "partitions"),
                 ("consumer groups", len(groups), "groups"), ("open transactions", len(ongoing), "transactions"),
                 ("hanging transactions", len(hanging), "hanging"), ("stuck transactions", len(stuck), "stuck"),
                 ("connections", broker.limits.admission.count, ""),
                 ("failed authentications", failed_logins, "security"),
                 ("denied requests", security.denied_total, "security")]
        parts = [
            "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>Trireme · node {_e(broker.node_id)}</title>",
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<style>{STYLE}</style></head><body>",
            f"<header><h1>Trireme</h1><span>node {_e(broker.node_id)}</span>"
            f"<span>cluster {_e(broker.cluster_id)}</span>"
            f"<span>Kafka listener {_e(broker.advertised_host)}:{_e(broker.advertised_port)}</span>"
            f"<span>up {_e(_age(now - self.started_ms))}</span>"
            f"<span>as of {_e(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(now / 1000)))}</span></header>",
            "<main>",
            '<div class="cards">' + "".join(
                f'<a class="card{" bad" if anchor in ("hanging", "stuck", "security") and n else ""}" '
                f'href="#{anchor}"><b>{n}</b>'
                f'{_e(label)}</a>' for label, n, anchor in cards) + "</div>",
            self._actions_section(),
            self._cluster_section(now),
            self._partitions_section(pins),
            self._groups_section(groups),
            self._transactions_section(ongoing, pins, now),
            self._hanging_section(hanging, now),
            self._stuck_section(stuck, now),
            self._security_section(security),
            self._producers_section(now),
            "<footer>" + ("Actions are <b>on</b> (<code>trireme.status.actions.enable</code>)." if self.actions_enabled
                          else "Actions are off; set <code>trireme.status.actions.enable=true</code> to abort "
                               "transactions from this page.") + " Reload the page to see changes.</footer>",
            "</main></body></html>",
        ]
        return "\n".join(p for p in parts if p)

    def _actions_section(self) -> str:
        if not self.recent:
            return ""
        items = "".join(f"<li>{_e(time.strftime('%H:%M:%S', time.gmtime(at / 1000)))} {_e(text)}</li>"
                        for at, text in reversed(self.recent))
        return f'<section id="actions"><h2>Recent actions</h2><ul class="actions">{items}</ul></section>'

    def _cluster_section(self, now: int) -> str:
        """The live brokers (the local engine: this one alone) and who leads each partition at which leader epoch."""
        broker = self.broker
        cluster = broker.cluster
        view = getattr(cluster, "view", None)               # the PostgreSQL engine's last poll (server/cluster.py)
        leases = view.lease_expires_ms if view is not None else {}
        brokers = []
        for b in cluster.brokers():
            lease = leases.get(b.node_id)
            brokers.append([
                _e(b.node_id) + (' <span class="tag">this broker</span>' if b.node_id == broker.node_id else ""),
                _e(", ".join(f"{name} {host}:{port}" for name, (host, port) in sorted(b.endpoints.items()))),
                _e(b.rack or "-"), "-" if lease is None else _e(_age(lease - now)),
                '<span class="tag ok">controller</span>' if b.node_id == cluster.controller_id else ""])
        leaders = []
        topics = sorted([*broker.topics.all(), *broker.internal_topics.values()], key=lambda t: (t.is_internal, t.name))
        for topic in topics:
            for index in range(topic.partitions):
                if len(leaders) == MAX_LEADER_ROWS:
                    break
                found = cluster.leadership(topic, index)
                leaders.append([_tp(topic.name, index),
                                '<span class="tag bad">no live leader</span>' if found is None else _e(found.leader_id),
                                "-" if found is None else _e(found.leader_epoch),
                                "-" if found is None else _e(",".join(map(str, found.replicas)))])
        total = sum(t.partitions for t in topics)
        more = f'<p class="empty">{_e(total - len(leaders))} more partitions not shown</p>' if total > len(leaders) else ""
        return ('<section id="cluster"><h2>Cluster</h2>'
                + _table(["node id#", "endpoints", "rack", "lease left", "role"], brokers, "no live brokers")
                + "<h3>Partition leaders</h3>"
                + _table(["partition", "leader#", "leader epoch#", "replicas"], leaders, "no partitions") + more
                + "</section>")

    def _partitions_section(self, pins) -> str:
        broker = self.broker
        rows = []
        ordered = sorted(broker.partitions.items(), key=lambda kv: (kv[1].topic.is_internal, kv[0]))
        now = now_ms()
        ratios = broker.log_cleaner.dirty_ratios(now)
        for (topic, index), p in ordered:
            hw, lso = p.log.high_watermark, p.last_stable_offset()
            pin = pins.get((topic, index))
            if pin is None or lso >= hw:
                held = ""
            elif pin.hanging:
                held = f'<span class="tag bad">hanging: producer {_e(pin.producer_id)}</span>'
            else:
                held = (f'<span class="tag warn">{_e(pin.transactional_id)}</span> '
                        f"from offset {_e(pin.first_offset)} ({_e(hw - lso)} behind)")
            name = _e(topic) + (' <span class="tag">internal</span>' if p.topic.is_internal else "")
            if p.storage_error:
                name += f' <span class="tag bad" title="{_e(p.storage_error)}">' \
                        f'{"offline: retrying" if p.storage_retrying else "offline"}</span>'
            rows.append([name, _e(index), _e(p.log.log_start_offset), _e(hw), _e(lso), held,
                         f'<span title="{_e(p.log.size_bytes)} bytes">{_e(_size(p.log.size_bytes))}</span>',
                         _e(len(p.producers)), self._compaction(p, ratios.get((topic, index)), now)])
        return ('<section id="partitions"><h2>Topics and partitions</h2>'
                + _table(["topic", "partition#", "log start#", "high watermark#", "last stable offset#",
                          "LSO held back by", "size#", "producers#", "compaction"], rows, "no topics") + "</section>")

    def _compaction(self, p, ratio: float | None, now: int) -> str:
        """A compacted partition's cleaning: dirty ratio, being cleaned, last cleaning, a failure."""
        if not p.config.compacted:
            return ""
        cleaner = self.broker.log_cleaner
        stats = cleaner.partitions.get((p.topic.name, p.index))
        parts = []
        if ratio is not None:
            parts.append(f"dirty {ratio:.0%}")
        if cleaner.busy(p):
            parts.append('<span class="tag warn">cleaning</span>')
        if stats is not None and stats.last_cleaning_ms >= 0:
            parts.append(f'<span title="read {_e(stats.bytes_read)} bytes, wrote {_e(stats.bytes_written)} in '
                         f'{stats.cleanings} cleaning(s)">cleaned {_e(_age(now - stats.last_cleaning_ms))} ago</span>')
        if stats is not None and stats.uncleanable_until_ms > now:
            parts.append(f'<span class="tag bad" title="{_e(stats.last_error)}">cleaning failed</span>')
        return ", ".join(parts)

    def _groups_section(self, groups) -> str:
        rows, offsets = [], []
        for g in groups:
            members = [f"{_e(m.client_id)} <span class=\"tag\">{_e(m.client_host)}</span>"
                       for m in g.members[:MAX_MEMBERS_SHOWN]]
            if len(g.members) > MAX_MEMBERS_SHOWN:
                members.append(f"and {len(g.members) - MAX_MEMBERS_SHOWN} more")
            state = _e(g.state)
            if g.state == "Stable":
                state = f'<span class="tag ok">{state}</span>'
            rows.append([_e(g.group_id), state, _e(g.protocol or g.protocol_type), _e(len(g.members)),
                         "<br>".join(members), _e(g.lag)])
            offsets += [[_e(g.group_id), _tp(o.topic, o.partition), _e(o.committed), _e(o.high_watermark),
                         _e(o.lag)] for o in g.offsets]
        return ('<section id="groups"><h2>Consumer groups</h2>'
                + _table(["group", "state", "protocol", "members#", "clients", "lag#"], rows, "no consumer groups")
                + ("<h3>Committed offsets and lag</h3>"
                   + _table(["group", "partition", "committed#", "high watermark#", "lag#"], offsets, "")
                   if offsets else "")
                + "</section>")

    def _transactions_section(self, ongoing, pins, now: int) -> str:
        pinned: dict[str, list[str]] = {}
        for (topic, index), txn in pins.items():
            if txn.transactional_id is not None:
                pinned.setdefault(txn.transactional_id, []).append(f"{topic}-{index}")
        rows = []
        for m in ongoing:
            v = m.value
            age = _age(now - v.start_timestamp_ms) if v.start_timestamp_ms >= 0 else ""
            state = m.state.kafka_name
            state_html = f'<span class="tag warn">{_e(state)}</span>' if m.state is TxnState.ONGOING else _e(state)
            row = [_e(m.transactional_id), _e(m.producer_id), _e(m.producer_epoch), state_html, _e(age),
                   _e(_age(v.transaction_timeout_ms)) if v.transaction_timeout_ms else "none",
                   ", ".join(_tp(t, p) for t, p in sorted(v.partitions)),
                   ", ".join(_e(tp) for tp in sorted(pinned.get(m.transactional_id, [])))]
            if self.actions_enabled:
                row.append(self._form(ABORT_PATH, "Abort", transactional_id=m.transactional_id,
                                      producer_id=m.producer_id, producer_epoch=m.producer_epoch)
                           if m.state is TxnState.ONGOING else "")
            rows.append(row)
        columns = ["transactional id", "producer id#", "epoch#", "state", "age#", "timeout#", "partitions",
                   "holds the LSO of"] + (["action"] if self.actions_enabled else [])
        return ('<section id="transactions"><h2>Open transactions</h2>'
                + _table(columns, rows, "no open transactions") + self._transactional_ids() + "</section>")

    def _transactional_ids(self) -> str:
        metas = sorted(self.broker.transactions.coordinator.transactions.values(), key=lambda m: m.transactional_id)
        if not metas:
            return ""
        rows = [[_e(m.transactional_id), _e(m.producer_id), _e(m.producer_epoch), _e(m.state.kafka_name),
                 _e(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m.value.last_update_timestamp_ms / 1000)))]
                for m in metas]
        return (f"<details><summary>All transactional ids ({len(metas)})</summary>"
                + _table(["transactional id", "producer id#", "epoch#", "state", "last update (UTC)"], rows, "")
                + "</details>")

    def _hanging_section(self, hanging, now: int) -> str:
        rows = []
        for t in hanging:
            row = [_tp(t.topic, t.partition), _e(t.producer_id), _e(t.producer_epoch), _e(t.coordinator_epoch),
                   _e(t.first_offset), _e(_age(now - t.last_timestamp)) if t.last_timestamp >= 0 else ""]
            if self.actions_enabled:
                row.append(self._form(ABORT_HANGING_PATH, "Abort with a marker", topic=t.topic,
                                      partition=t.partition, producer_id=t.producer_id, first_offset=t.first_offset))
            rows.append(row)
        columns = ["partition", "producer id#", "epoch#", "coordinator epoch#", "first offset#", "last write#"]
        return ('<section id="hanging"><h2>Hanging transactions</h2>'
                + _table(columns + (["action"] if self.actions_enabled else []), rows,
                         "none: every transaction open on a partition is known to the coordinator")
                + "</section>")

    def _stuck_section(self, stuck, now: int) -> str:
        rows = []
        for t in stuck:
            row = [_e(t.transactional_id), _e(t.producer_id), _e(t.producer_epoch), _e(t.state),
                   ", ".join(f'{_tp(topic, p)} <span class="tag bad">{_e(error)}</span>' for topic, p, error in t.refused),
                   _e(_age(now - t.since_ms))]
            if self.actions_enabled:
                row.append(self._form(COMPLETE_PATH, "Complete", transactional_id=t.transactional_id))
            rows.append(row)
        columns = ["transactional id", "producer id#", "epoch#", "state", "refused by", "stuck for#"]
        return ('<section id="stuck"><h2>Stuck transactions</h2>'
                + _table(columns + (["action"] if self.actions_enabled else []), rows,
                         "none: no partition refused a marker for good")
                + "</section>")

    def _security_section(self, view) -> str:
        listeners = [[_e(lv.name), _e(lv.protocol), _e(lv.address), _e(", ".join(lv.mechanisms)),
                      _e(lv.client_auth)] for lv in view.listeners]
        if view.authorizer is None:
            authorizer = ('<p>Authorizer: <span class="tag warn">off</span> (every request is allowed; set '
                          "<code>authorizer.class.name</code>)</p>")
        else:
            supers = ", ".join(_e(u) for u in view.super_users) or "none"
            authorizer = (f'<p>Authorizer: <span class="tag ok">on</span> <code>{_e(view.authorizer)}</code>; '
                          f"super users: {supers}; allow everyone if no ACL is found: "
                          f"{'yes' if view.allow_everyone_if_no_acl else 'no'}</p>")
        auth = [[_e(listener), _e(mechanism), _e(ok), f'<span class="tag bad">{_e(failed)}</span>' if failed else "0"]
                for listener, mechanism, ok, failed in view.authentications]
        denied = [[_e(principal), _e(api), _e(kind), _e(name), _e(n)] for principal, api, kind, name, n in view.denied]
        throttled = [[_e(user), _e(client), _e(kind), _e(n), _e(_age(ms))]
                     for user, client, kind, n, ms in view.throttled]

        def more(shown: int, total: int) -> str:
            return f'<p class="empty">and {total - shown} more</p>' if total > shown else ""
        return ('<section id="security"><h2>Security</h2>'
                + _table(["listener", "security protocol", "address", "SASL mechanisms", "client certificates"],
                         listeners, "no listeners") + authorizer
                + "<h3>Authentications</h3>"
                + _table(["listener", "mechanism", "succeeded#", "failed#"], auth, "no authentications")
                + f"<h3>Denied requests ({_e(view.denied_total)})</h3>"
                + _table(["principal", "API", "resource type", "resource", "denied#"], denied, "none denied")
                + more(len(view.denied), view.denied_series)
                + "<h3>Throttled clients</h3>"
                + _table(["user", "client id", "quota", "throttled responses#", "throttle time#"], throttled,
                         "no client throttled")
                + more(len(view.throttled), view.throttled_series)
                + "</section>")

    def _producers_section(self, now: int) -> str:
        rows = []
        total = 0
        for (topic, index), p in sorted(self.broker.partitions.items()):
            for entry in sorted(p.producers.entries(), key=lambda e: e.producer_id):
                total += 1
                if len(rows) < MAX_PRODUCER_ROWS:
                    rows.append([_tp(topic, index), _e(entry.producer_id), _e(entry.producer_epoch),
                                 _e(entry.last_seq), _e(_age(now - entry.last_timestamp))
                                 if entry.last_timestamp >= 0 else "",
                                 _e("" if entry.current_txn_first_offset is None else entry.current_txn_first_offset),
                                 _e(entry.coordinator_epoch)])
        more = f'<p class="empty">and {total - len(rows)} more</p>' if total > len(rows) else ""
        return ('<section id="producers"><h2>Producer ids</h2>'
                + _table(["partition", "producer id#", "epoch#", "last sequence#", "last write#",
                          "open transaction from#", "coordinator epoch#"], rows,
                         "no idempotent or transactional producers")
                + more + "</section>")

    def _form(self, action: str, label: str, **fields) -> str:
        hidden = "".join(f'<input type="hidden" name="{_e(k)}" value="{_e(v)}">'
                         for k, v in {"token": self.token, **fields}.items())
        return f'<form method="post" action="{_e(action)}">{hidden}<button type="submit">{_e(label)}</button></form>'

    # --- actions -------------------------------------------------------------------------------

    def _refused(self, request: Request) -> Response | None:
        """Why this POST may not act (a 403), or None."""
        if not self.actions_enabled:
            return Response.text(403, "actions are off (trireme.status.actions.enable)\n")
        origin = request.headers.get("origin")
        if origin is not None and urllib.parse.urlsplit(origin).netloc != request.headers.get("host"):
            return Response.text(403, "refused: the request comes from another origin\n")
        token = request.form().get("token", "")
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return Response.text(403, "refused: missing or wrong token (reload the page)\n")
        return None

    def _done(self, text: str, request: Request | None = None, ok: bool = True) -> Response:
        """Note an action's result; a browser is sent back to the page, a client asking for text gets the result."""
        self.recent.append((now_ms(), text))
        if request is not None and "text/html" not in request.headers.get("accept", "text/html"):
            return Response(200 if ok else 409, (text + "\n").encode(), headers=dict(HEADERS))
        return Response(303, b"", headers={"Location": "/#actions", **HEADERS})

    def stuck_json(self, request: Request) -> Response:
        body = {"stuck": [t.as_json() for t in overview.stuck_transactions(self.broker)],
                "token": self.token if self.actions_enabled else None}
        return Response(200, json.dumps(body).encode(), "application/json", dict(HEADERS))

    async def complete(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        txn_id = request.form().get("transactional_id", "")
        log.warning("status page: completing stuck transaction %s", txn_id)
        try:
            done = await self.broker.transactions.complete_stuck(txn_id)
        except NotStuck as e:
            return self._done(f"completion of {txn_id}: not done, {e}", request, ok=False)
        return self._done(done, request)

    async def abort(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        form = request.form()
        txn_id = form.get("transactional_id", "")
        service = self.broker.transactions
        await service.wait_replayed()
        meta = service.coordinator.transactions.get(txn_id)
        if meta is None or (str(meta.producer_id), str(meta.producer_epoch)) != (form.get("producer_id"),
                                                                                 form.get("producer_epoch")):
            return self._done(f"abort of {txn_id}: not done, its producer changed since the page was shown")
        outcome = service.coordinator.abort_ongoing(txn_id, now_ms())
        if outcome.error == 0:
            log.warning("status page: aborting transaction %s, producer id %d fenced at epoch %d", txn_id,
                        outcome.producer_id, outcome.producer_epoch)
            outcome = await service.run_operation(outcome)
        if outcome.error:
            return self._done(f"abort of {txn_id}: refused, {E.for_code(outcome.error).name}")
        return self._done(f"abort of {txn_id}: producer fenced (epoch {outcome.producer_epoch}), PrepareAbort "
                          "written, the coordinator is writing the markers")

    async def abort_hanging(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        form = request.form()
        key = (form.get("topic"), form.get("partition"), form.get("producer_id"), form.get("first_offset"))
        what = f"hanging transaction of producer {key[2]} on {key[0]}-{key[1]}"
        await self.broker.transactions.wait_replayed()
        match = [t for t in overview.open_transactions(self.broker)
                 if t.hanging and (t.topic, str(t.partition), str(t.producer_id), str(t.first_offset)) == key]
        if not match:
            return self._done(f"abort of the {what}: not done, it is no longer hanging there")
        txn = match[0]
        log.warning("status page: aborting the %s (epoch %d) with a marker", what, txn.producer_epoch)
        markers = _MARKERS(markers=[_MARKERS.WritableTxnMarker(
            producer_id=txn.producer_id, producer_epoch=txn.producer_epoch, transaction_result=False,
            topics=[_MARKERS.WritableTxnMarker.WritableTxnMarkerTopic(name=txn.topic,
                                                                      partition_indexes=[txn.partition])],
            coordinator_epoch=max(txn.coordinator_epoch, 0))])
        response = await self.broker.local_peer.call("WriteTxnMarkers", 1, markers)
        error = response.markers[0].topics[0].partitions[0].error_code
        if error:
            return self._done(f"abort of the {what}: the marker was refused, {E.for_code(error).name}")
        return self._done(f"abort of the {what}: ABORT marker written")
