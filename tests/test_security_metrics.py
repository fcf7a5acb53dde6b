"""The security counters as the metrics endpoint and the status page show them: names, labels, bounded label sets
(a client choosing resource names or client ids cannot grow them), listeners and the authorizer's state."""
from __future__ import annotations

import re

import pytest

from test_admin_handlers import make_broker
from trireme.server import metrics as metrics_module
from trireme.server.metrics import OTHER, Metrics, render_broker
from trireme.server.status_page import StatusPage

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')


@pytest.fixture
def broker(tmp_path):
    b = make_broker(tmp_path / "data", trireme_metrics_security_max_series=3)
    yield b
    b.close()


def samples(text: str, name: str) -> dict[tuple, float]:
    """{sorted label pairs: value} of one metric family."""
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) == name:
            labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
            out[labels] = float(m.group(3))
    return out


def test_security_metrics_have_help_type_and_kafka_names(broker):
    m = broker.metrics
    m.authentication("SASL_SSL", "SCRAM-SHA-512", True)
    m.authentication("SASL_SSL", "SCRAM-SHA-512", False)
    m.authentication("SASL_SSL", "SCRAM-SHA-512", False)
    m.authentication("SSL", "SSL", True)
    m.authentication("SASL_SSL", "X-MADE-UP-%d" % 7, False)          # a name a client sent: not a label value
    m.request_denied("User:bob", "Produce", "TOPIC", "orders")
    m.client_throttled("alice", "app-1", "Produce", 250)
    text = render_broker(broker)
    for family in ("trireme_authentications_total", "trireme_authorization_denials_total",
                   "trireme_authorization_denials_by_principal_total",
                   "trireme_authorization_denials_by_resource_total", "trireme_client_throttles_total",
                   "trireme_client_throttle_seconds_total"):
        assert f"# HELP {family} " in text and f"# TYPE {family} counter" in text
    assert samples(text, "trireme_authentications_total") == {
        (("listener", "SASL_SSL"), ("mechanism", "SCRAM-SHA-512"), ("outcome", "success")): 1,
        (("listener", "SASL_SSL"), ("mechanism", "SCRAM-SHA-512"), ("outcome", "failure")): 2,
        (("listener", "SSL"), ("mechanism", "SSL"), ("outcome", "success")): 1,
        (("listener", "SASL_SSL"), ("mechanism", OTHER), ("outcome", "failure")): 1}
    assert samples(text, "trireme_authorization_denials_total") == {(): 1}
    assert samples(text, "trireme_authorization_denials_by_principal_total") == {
        (("api", "Produce"), ("principal", "User:bob"), ("resource_type", "TOPIC")): 1}
    assert samples(text, "trireme_authorization_denials_by_resource_total") == {
        (("resource", "orders"), ("resource_type", "TOPIC")): 1}
    key = (("client_id", "app-1"), ("quota_type", "Produce"), ("user", "alice"))
    assert samples(text, "trireme_client_throttles_total") == {key: 1}
    assert samples(text, "trireme_client_throttle_seconds_total") == {key: 0.25}
    for line in text.splitlines():                  # the whole exposition still parses
        assert line.startswith("# ") or SAMPLE.match(line), line


def test_label_sets_are_bounded_to_the_largest_series(broker):
    """Thousands of resource names and client ids: each labelled family keeps the 3 largest series
    (trireme.metrics.security.max.series=3); the unlabelled total still counts everything."""
    m = broker.metrics
    for i in range(2000):
        m.request_denied("User:mallory", "Metadata", "TOPIC", f"probe-{i}")
        m.client_throttled("mallory", f"client-{i}", "Fetch", 10)
    for _ in range(5):
        m.request_denied("User:bob", "Fetch", "TOPIC", "payroll")
        m.client_throttled("bob", "etl", "Produce", 1000)
    text = render_broker(broker)
    by_resource = samples(text, "trireme_authorization_denials_by_resource_total")
    assert len(by_resource) == 3
    assert by_resource[(("resource", "payroll"), ("resource_type", "TOPIC"))] == 5
    assert len(samples(text, "trireme_authorization_denials_by_principal_total")) == 2
    assert samples(text, "trireme_authorization_denials_total") == {(): 2005}
    throttles = samples(text, "trireme_client_throttle_seconds_total")
    assert len(throttles) == 3
    assert throttles[(("client_id", "etl"), ("quota_type", "Produce"), ("user", "bob"))] == 5.0
    assert len(samples(text, "trireme_client_throttles_total")) == 3


def test_counters_stop_growing_new_keys_past_their_bound(monkeypatch):
    """Memory: past MAX_SECURITY_KEYS distinct keys, new ones are counted under (other), nothing is lost."""
    monkeypatch.setattr(metrics_module, "MAX_SECURITY_KEYS", 10)
    m = Metrics()
    for i in range(1000):
        m.request_denied(f"User:u{i}", "Produce", "TOPIC", f"t{i}")
        m.client_throttled(f"u{i}", f"c{i}", "Produce", 1)
    assert len(m.denied) == 11 and m.denied[(OTHER, "Produce", "TOPIC", OTHER)] == 990
    assert sum(m.denied.values()) == 1000
    assert len(m.throttled) == 11 and m.throttle_ms[(OTHER, OTHER, "Produce")] == 990
    m.request_denied("User:u3", "Produce", "TOPIC", "t3")           # a key already counted keeps its own count
    assert m.denied[("User:u3", "Produce", "TOPIC", "t3")] == 2


def test_denial_keys_hold_names_cut_to_a_bound():
    """A resource name (up to 32,767 bytes in a request) or principal (an OAUTHBEARER sub) longer than
    MAX_LABEL_CHARS is kept cut, so 10,000 keys stay a few MiB; names sharing that prefix share the count."""
    m = Metrics()
    m.request_denied("User:" + "p" * 40_000, "Produce", "TOPIC", "t" * 32_767)
    m.request_denied("User:" + "p" * 40_000, "Produce", "TOPIC", "t" * 32_766)
    [(key, count)] = m.denied.items()
    assert count == 2 and all(len(part) <= metrics_module.MAX_LABEL_CHARS + 3 for part in key)


def test_status_page_security_section(tmp_path):
    broker = make_broker(tmp_path / "data")
    try:
        broker.metrics.authentication("PLAINTEXT", "PLAIN", False)
        broker.metrics.request_denied("User:<script>x</script>", "CreateTopics", "TOPIC", "new")
        broker.metrics.client_throttled("alice", "app", "Produce", 1500)
        html = StatusPage(broker).render()
    finally:
        broker.close()
    section = html[html.index('<section id="security">'):]
    section = section[:section.index("</section>")]
    assert "<td>PLAINTEXT</td><td>PLAINTEXT</td>" in section
    assert "Authorizer: <span class=\"tag warn\">off</span>" in section
    assert "<script>" not in section and "User:&lt;script&gt;x&lt;/script&gt;" in section
    assert "<td>CreateTopics</td><td>TOPIC</td><td>new</td>" in section
    assert "<td>alice</td><td>app</td><td>Produce</td>" in section and "1 s" in section
    cards = html[html.index('<div class="cards">'):html.index("</div>")]
    assert re.search(r'class="card bad" href="#security"><b>1</b>failed authentications', cards)
    assert re.search(r'class="card bad" href="#security"><b>1</b>denied requests', cards)


def test_status_page_lists_configured_listeners_and_the_authorizer(tmp_path, monkeypatch):
    broker = make_broker(tmp_path / "data")
    try:
        config = broker.config
        config.set("listeners", "INTERNAL://127.0.0.1:9092,EXTERNAL://127.0.0.1:9094,CONTROLLER://:9093,"
                                "SSL://127.0.0.1:9095,PARTNER://127.0.0.1:9096")
        config.set("listener.security.protocol.map", "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL,CONTROLLER:PLAINTEXT,"
                                                     "SSL:SSL,PARTNER:SASL_SSL")
        config.set("controller.listener.names", "CONTROLLER")
        config.set("sasl.enabled.mechanisms", "SCRAM-SHA-256")
        config.set("listener.name.external.sasl.enabled.mechanisms", "SCRAM-SHA-512,PLAIN")
        config.set("listener.name.external.ssl.client.auth", "requested")
        config.set("ssl.client.auth", "required")
        config.resolve_listeners(None, None)
        config.set("authorizer.class.name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer")
        config.set("super.users", "User:admin;User:broker")
        monkeypatch.setattr(broker.security, "authorizer_enabled", True)
        html = StatusPage(broker).render()
    finally:
        broker.close()
    section = html[html.index('<section id="security">'):]
    assert "<td>INTERNAL</td><td>PLAINTEXT</td><td>127.0.0.1:9092</td>" in section
    assert ("<td>EXTERNAL</td><td>SASL_SSL</td><td>127.0.0.1:9094</td><td>SCRAM-SHA-512, PLAIN</td>"
            "<td>requested</td>") in section
    assert "<td>SSL</td><td>SSL</td><td>127.0.0.1:9095</td><td></td><td>required</td>" in section
    # KIP-684: the broker-wide ssl.client.auth is for SSL listeners; a SASL_SSL one asks only with its own setting
    assert "<td>PARTNER</td><td>SASL_SSL</td><td>127.0.0.1:9096</td><td>SCRAM-SHA-256</td><td>none</td>" in section
    assert "CONTROLLER" not in section
    assert "org.apache.kafka.metadata.authorizer.StandardAuthorizer" in section
    assert "super users: User:admin, User:broker" in section
