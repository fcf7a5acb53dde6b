"""The status page in a real headless browser (Debian's chromium, driven through chromedriver's WebDriver HTTP API), after real client traffic.

The browser test makes a hanging transaction the way one arises (the coordinator's state is lost:
``__transaction_state`` is removed while a transaction is open on a partition), then a topic
produced to, a consumer group with lag, and an open transaction; the page shows each of them,
its Abort buttons abort the open transaction through the coordinator (the producer is fenced) and
the hanging one with a marker, and a read_committed consumer then reads past both.  Set
``TRIREME_STATUS_SCREENSHOT=docs/status-page.png`` to keep the screenshot it takes.
"""
from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from compat_tests.clients import wait_until
from compat_tests.python_clients import create_topics, poll_values

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1280,1180"]
STATUS = {"trireme.status.listen": "127.0.0.1:0"}
ACTIONS = {**STATUS, "trireme.status.actions.enable": True}


def status_url(server) -> str:
    """The address the (last) broker process logged for its status page."""
    found = wait_until(lambda: re.findall(r"status page on (http://\S+/)",
                                          server.stderr_path.read_text(errors="replace")),
                       timeout=10, what="the status page address in the log")
    return found[-1]


class WebDriver:
    """The few WebDriver commands the test needs, over chromedriver's HTTP API (W3C WebDriver)."""

    def __init__(self, port: int, profile: str):
        self.base = f"http://127.0.0.1:{port}"
        caps = {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM, "args": CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]}}
        self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]

    def _call(self, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise AssertionError(f"WebDriver {method} {path}: {e.read().decode(errors='replace')}") from None

    def cmd(self, method: str, path: str, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def open(self, url: str) -> None:
        self.cmd("POST", "/url", {"url": url})

    def find_all(self, css: str) -> list[str]:
        return [next(iter(e.values())) for e in self.cmd("POST", "/elements", {"using": "css selector", "value": css})]

    def text(self, css: str) -> str:
        """The visible text of the first element ``css`` selects ("" when there is none)."""
        found = self.find_all(css)
        return self.cmd("GET", f"/element/{found[0]}/text") if found else ""

    def rows(self, css: str) -> list[str]:
        """The visible text of each table row under ``css``, cells separated by single spaces."""
        return [" ".join(self.cmd("GET", f"/element/{e}/text").split()) for e in self.find_all(css + " tbody tr")]

    def click(self, css: str) -> None:
        (first, *_) = self.find_all(css)
        self.cmd("POST", f"/element/{first}/click", {})

    def submit(self, css: str, then: str, expect: str) -> None:
        """Click the button ``css`` selects and wait until the page its form leads to shows ``expect`` in ``then``."""
        self.click(css)

        def shown():
            try:
                return expect in self.text(then)
            except AssertionError:          # the old page's element went stale while the new page loads
                return False
        wait_until(shown, timeout=30, what=f"{expect!r} in {then} after submitting {css}")

    def title(self) -> str:
        return self.cmd("GET", "/title")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.cmd("GET", "/screenshot"))

    def quit(self) -> None:
        self.cmd("DELETE", "")


@pytest.fixture
def browser():
    """A headless chromium session through chromedriver (the test fails if they are missing: `make sysdeps`)."""
    driver_path = shutil.which("chromedriver")
    if not os.path.exists(CHROMIUM) or driver_path is None:
        pytest.fail("chromium and chromedriver are missing (make sysdeps installs Debian's chromium, chromium-driver)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    profile = tempfile.mkdtemp(prefix="trireme-chromium-")
    log_path = os.path.join(profile, "chromedriver.log")
    driver = subprocess.Popen([driver_path, f"--port={port}", f"--log-path={log_path}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def ready():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
                    return json.loads(r.read())["value"]["ready"]
            except OSError:
                return False
        wait_until(ready, timeout=30, what="chromedriver")
        web = WebDriver(port, os.path.join(profile, "profile"))
        try:
            yield web
        finally:
            web.quit()
    finally:
        driver.terminate()
        driver.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)


def open_transaction(bootstrap: str, txn_id: str, topic: str, count: int) -> Producer:
    """A confluent-kafka producer with a transaction open on partition 0 of ``topic``, ``count`` records written."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 300000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(count):
        p.produce(topic, key=b"k%d" % i, value=b"v", partition=0)
    p.flush(30)
    return p


def read_committed(bootstrap: str, topic: str, end: int) -> list:
    """What a read_committed consumer of partition 0 gets until its position reaches ``end``."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 30
        while c.position([TopicPartition(topic, 0)])[0].offset < end:
            assert time.monotonic() < deadline, f"read_committed position of {topic}-0 never reached {end}"
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
        return got
    finally:
        c.close()


def row(rows: list[str], prefix: str) -> str:
    (found,) = [r for r in rows if r.startswith(prefix + " ")]
    return found


@pytest.mark.server_config(ACTIONS)
def test_status_page_shows_clients_and_aborts_transactions(server, browser):
    bootstrap = server.bootstrap
    create_topics(bootstrap, ["payments", "ledger"], 1)
    create_topics(bootstrap, ["orders"], 2)
    # A hanging transaction: open on payments-0 when the coordinator's state is lost.
    lost = open_transaction(bootstrap, "lost-coordinator", "payments", 2)
    del lost
    server.restart(between=lambda: shutil.rmtree(server.data_dir / "logs" / "__transaction_state-0"))
    bootstrap = server.bootstrap

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        producer.produce("orders", value=b"order %d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "billing", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["orders"])
    poll_values(consumer, 10, "the billing consumer")
    consumer.commit(asynchronous=False)
    for i in range(4):
        producer.produce("orders", value=b"late order", partition=0)
    assert producer.flush(30) == 0
    writer = open_transaction(bootstrap, "ledger-writer", "ledger", 3)

    url = status_url(server)
    browser.open(url)
    assert browser.title().startswith("Trireme")
    partitions = browser.rows("#partitions")
    assert row(partitions, "orders 0").split()[2:5] == ["0", "9", "9"]     # log start, high watermark, LSO
    assert row(partitions, "orders 1").split()[2:5] == ["0", "5", "5"]
    assert "ledger 0 0 3 0 ledger-writer from offset 0 (3 behind)" in row(partitions, "ledger 0")
    payments = row(partitions, "payments 0")
    assert payments.startswith("payments 0 0 2 0 hanging: producer ")
    (lost_producer,) = re.findall(r"hanging: producer (\d+)", payments)
    groups = browser.rows("#groups table:first-of-type")
    assert re.fullmatch(r"billing Stable range 1 rdkafka \S+ 4", row(groups, "billing")), groups
    offsets = browser.rows("#groups h3 + table")
    assert row(offsets, "billing orders-0") == "billing orders-0 5 9 4"
    assert row(offsets, "billing orders-1") == "billing orders-1 5 5 0"
    transactions = browser.rows("#transactions > table")
    assert re.fullmatch(r"ledger-writer \d+ 0 Ongoing \S+ m?s 5 min 0 s ledger-0 ledger-0 Abort",
                        row(transactions, "ledger-writer")), transactions
    (hanging,) = browser.rows("#hanging")
    assert hanging.startswith(f"payments-0 {lost_producer} 0 -1 0 ") and hanging.endswith("Abort with a marker")
    producers = browser.rows("#producers")
    # producer id, epoch, last sequence, last write, its open transaction's first offset, coordinator epoch
    assert re.fullmatch(rf"payments-0 {lost_producer} 0 1 \S+ m?s 0 -1", row(producers, f"payments-0 {lost_producer}"))
    shot = browser.screenshot()
    assert shot.startswith(b"\x89PNG\r\n\x1a\n") and len(shot) > 20000
    if os.environ.get("TRIREME_STATUS_SCREENSHOT"):
        with open(os.environ["TRIREME_STATUS_SCREENSHOT"], "wb") as f:
            f.write(shot)

    # Abort the open transaction: the coordinator fences the producer and writes the markers.
    browser.submit("#transactions form button", "#actions", "abort of ledger-writer: producer fenced")

    def ledger_row():
        browser.open(url)
        return row(browser.rows("#partitions"), "ledger 0")
    wait_until(lambda: ledger_row().startswith("ledger 0 0 4 4 "), timeout=20, what="ledger-0's LSO at its HW")
    assert "no open transactions" in browser.text("#transactions")
    with pytest.raises(KafkaException):
        writer.commit_transaction(30)
    assert read_committed(bootstrap, "ledger", 4) == []

    # Abort the hanging one: an ABORT marker through WriteTxnMarkers.
    browser.submit("#hanging form button", "#actions",
                   f"abort of the hanging transaction of producer {lost_producer} on payments-0: ABORT marker written")
    assert row(browser.rows("#partitions"), "payments 0").startswith("payments 0 0 3 3 ")
    assert "none:" in browser.text("#hanging")
    assert read_committed(bootstrap, "payments", 3) == []
    consumer.close()


def get(url: str, headers: dict | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(url: str, fields: dict, headers: dict | None = None) -> int:
    request = urllib.request.Request(url, data=urllib.parse.urlencode(fields).encode(), method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded", **(headers or {})})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None
    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.server_config(STATUS)
def test_actions_are_off_by_default_and_names_are_escaped(server):
    bootstrap = server.bootstrap
    writer = open_transaction(bootstrap, "<img src=x>", create_topics(bootstrap, ["t1"], 1)[0], 1)
    url = status_url(server)
    status, page = get(url)
    assert status == 200
    assert "&lt;img src=x&gt;" in page and "<img" not in page
    assert "<form" not in page and "Actions are off" in page
    fields = {"transactional_id": "<img src=x>", "producer_id": "0", "producer_epoch": "0", "token": ""}
    assert post(url + "actions/abort-transaction", fields) == 403
    assert get(url + "nothing-here")[0] == 404
    assert get(url + "metrics")[0] == 404              # trireme.metrics.listen is not set
    writer.commit_transaction(30)                      # nothing aborted it


def cluster_section(page: str) -> tuple[list[str], list[str]]:
    """The status page's Cluster section as text rows: (brokers, partition leaders), cells joined by ``|``."""
    section = re.search(r'<section id="cluster">(.*?)</section>', page, re.S).group(1)
    tables = re.findall(r"<tbody>(.*?)</tbody>", section, re.S)

    def rows(table: str) -> list[str]:
        return ["|".join(html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
                         for cell in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S))
                for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
    return rows(tables[0]), rows(tables[1])


@pytest.mark.server_config(STATUS)
def test_the_cluster_section_shows_this_broker_alone_with_the_local_engine(server):
    create_topics(server.bootstrap, ["led"], 2)
    brokers, leaders = cluster_section(get(status_url(server))[1])
    assert brokers == [f"1 this broker|PLAINTEXT 127.0.0.1:{server.port}|-|-|controller"]
    assert "led-0|1|0|1" in leaders and "led-1|1|0|1" in leaders


@pytest.mark.server_config({**ACTIONS, "trireme.metrics.listen": "127.0.0.1:0"})
def test_actions_need_the_token_the_origin_and_a_loopback_host(server):
    """Also: the same address in trireme.metrics.listen and trireme.status.listen is one listener serving both."""
    bootstrap = server.bootstrap
    create_topics(bootstrap, ["t1"], 1)
    writer = open_transaction(bootstrap, "guarded", "t1", 1)
    url = status_url(server)
    assert f"metrics on {url}metrics" in server.stderr_path.read_text()
    status, metrics = get(url + "metrics")
    assert status == 200 and 'trireme_transactions{state="Ongoing"} 1' in metrics
    page = get(url)[1]
    (token,) = set(re.findall(r'name="token" value="([^"]+)"', page))
    (producer_id,) = re.findall(r'name="producer_id" value="(\d+)"', page)
    fields = {"transactional_id": "guarded", "producer_id": producer_id, "producer_epoch": "0"}
    host = urllib.parse.urlsplit(url).netloc
    assert post(url + "actions/abort-transaction", fields) == 403                                  # no token
    assert post(url + "actions/abort-transaction", {**fields, "token": token[::-1]}) == 403       # a wrong one
    assert post(url + "actions/abort-transaction", {**fields, "token": token},
                {"Origin": "http://attacker.example"}) == 403                                    # another site
    assert post(url + "actions/abort-transaction", {**fields, "token": token},
                {"Host": "attacker.example:" + host.rpartition(":")[2]}) == 421                  # DNS rebinding
    assert get(url, {"Host": "attacker.example"})[0] == 421
    assert get(url + "actions/abort-transaction")[0] == 405
    assert post(url + "actions/abort-transaction", {**fields, "token": token}, {"Origin": f"http://{host}"}) == 303
    assert "guarded: producer fenced" in html.unescape(get(url)[1])
    with pytest.raises(KafkaException):
        writer.commit_transaction(30)
