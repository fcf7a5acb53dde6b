"""The pytest plugin (entry point ``trireme``): fixtures that hand a test a running Trireme broker.

Fixtures:

- ``trireme_broker`` — a fresh broker for one test (new storage, nothing left from other tests), a
  :class:`trireme.testing.TriremeBroker`: ``.bootstrap``, ``.restart()``, ``.kill()`` (subprocess mode),
  ``.log_text()``.  Per test: ``@pytest.mark.trireme(topics={"orders": 3}, config={...},
  mode="subprocess", storage="disk")``.
- ``trireme_bootstrap`` — that broker's "HOST:PORT".
- ``trireme_session_broker`` / ``trireme_session_bootstrap`` — one broker for the whole session (one per
  worker under pytest-xdist: each worker is its own process with its own free port).  Set up with the ini
  options ``trireme_topics`` (lines ``NAME[:PARTITIONS]``), ``trireme_config`` (lines ``name=value``) and
  ``trireme_mode``.

When a test fails, its report carries the log of every broker it used (what was logged during the test,
for a session broker): an in-process broker logs on the ``trireme`` logger at ``trireme.log.level``, which
pytest's "Captured log" sections show; a subprocess broker's stderr is added as a section "trireme broker
log" (for in-process brokers too when pytest's logging plugin is off).  Installing the package is enough:
pytest finds the plugin through the ``pytest11`` entry point.  The broker's modules are imported only
when a fixture is used.
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest

_MARKS = "_trireme_log_marks"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("trireme_topics", "topics of the session broker: lines NAME[:PARTITIONS]", type="linelist",
                  default=[])
    parser.addini("trireme_config", "broker properties of the session broker: lines name=value", type="linelist",
                  default=[])
    parser.addini("trireme_mode", "thread (default) or subprocess, for the session broker", default="thread")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "trireme(topics=None, config=None, mode='thread', storage='memory'): options of the "
                   "trireme_broker fixture for this test")


def _session_options(config: pytest.Config) -> dict[str, Any]:
    topics = {}
    for line in config.getini("trireme_topics"):
        name, _, partitions = line.strip().partition(":")
        topics[name] = int(partitions) if partitions else -1
    properties = {}
    for line in config.getini("trireme_config"):
        name, sep, value = line.partition("=")
        if not sep:
            raise pytest.UsageError(f"trireme_config: expected name=value, got {line!r}")
        properties[name.strip()] = value.strip()
    return {"topics": topics, "config": properties, "mode": config.getini("trireme_mode") or "thread"}


def _marked_options(node: pytest.Item) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers("trireme"))):    # the closest mark wins
        options.update(mark.kwargs)
    return options


def _run(options: dict[str, Any]) -> Iterator[Any]:
    from trireme.testing import TriremeBroker
    broker = TriremeBroker(**options)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def trireme_broker(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh broker for this test (options from ``@pytest.mark.trireme``)."""
    yield from _run(_marked_options(request.node))


@pytest.fixture
def trireme_bootstrap(trireme_broker) -> str:
    """"HOST:PORT" of this test's fresh broker."""
    return trireme_broker.bootstrap


@pytest.fixture(scope="session")
def trireme_session_broker(pytestconfig: pytest.Config) -> Iterator[Any]:
    """One broker shared by the session (ini options trireme_topics, trireme_config, trireme_mode)."""
    yield from _run(_session_options(pytestconfig))


@pytest.fixture
def trireme_session_bootstrap(trireme_session_broker) -> str:
    """"HOST:PORT" of the session's broker."""
    return trireme_session_broker.bootstrap


def _brokers(item: pytest.Item) -> list[Any]:
    from trireme.testing import TriremeBroker
    funcargs = getattr(item, "funcargs", None) or {}
    seen, out = set(), []
    for value in funcargs.values():
        if isinstance(value, TriremeBroker) and id(value) not in seen:
            seen.add(id(value))
            out.append(value)
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    setattr(item, _MARKS, {id(b): b.log_position() for b in _brokers(item)})
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    marks = getattr(item, _MARKS, {})
    for broker in _brokers(item):
        if broker.mode == "thread" and item.config.pluginmanager.has_plugin("logging-plugin"):
            continue        # pytest's own "Captured log" sections already hold an in-process broker's records
        text = broker.log_text(marks.get(id(broker), 0))
        report.sections.append((f"trireme broker log ({broker.name}, {broker.mode})", text or "(empty)"))
