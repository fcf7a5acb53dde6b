"""Client input that drives work on the broker's event loop is bounded: no request stalls the others.

Raw requests against a real `trireme serve`: ListTransactions v2's TransactionalIdPattern (a
linear-time RE2 engine with Kafka's full-match semantics, matched off the event loop), and the
bounds on other client-given patterns, counts and sizes the audit of issue 20 found.
"""
from __future__ import annotations

import time

import pytest

from compat_tests.test_bad_input import LogWatch, RawConn, api_versions, assert_healthy, metadata, req, unique
from compat_tests.test_bad_transactions import init
from trireme.wire import error_codes as E

pytestmark = pytest.mark.trireme_only("RE2's bounds and the broker's log")


def list_transactions(conn: RawConn, pattern: str | None, version: int = 2, **fields):
    r = conn.request("ListTransactions", version, req("ListTransactions", state_filters=[], producer_id_filters=[],
                                                      duration_filter=-1, transactional_id_pattern=pattern, **fields))
    return r.error_code, sorted(t.transactional_id for t in r.transaction_states)


def test_pathological_pattern_answers_promptly_and_others_are_served(module_server):
    """`(c+)+x` against an id of 40 c's took Python's backtracking `re` hours on the event loop (30: 55 s)."""
    log = LogWatch(module_server)
    victim = "c" * 40
    with RawConn(module_server.bootstrap) as conn, RawConn(module_server.bootstrap, timeout=5) as witness:
        assert init(conn, victim)[0] == 0
        cid = conn.send_request("ListTransactions", 2, req("ListTransactions", state_filters=[],
                                                           producer_id_filters=[], duration_filter=-1,
                                                           transactional_id_pattern="(c+)+x"))
        # Meanwhile another connection is served (hang guard: it timed out after 5 s before the fix).
        assert api_versions(witness).error_code == 0
        assert metadata(witness).brokers
        r = conn.read_response("ListTransactions", 2, cid, timeout=10)
        assert (r.error_code, r.transaction_states) == (0, [])
        assert list_transactions(conn, "(c+)+") == (0, [victim])
    assert_healthy(module_server, RawConn(module_server.bootstrap))
    assert "Traceback" not in log.text()


def test_pattern_semantics_are_re2_full_match(module_server):
    """Kafka: RE2/J's ``Pattern.compile(p).matcher(id).matches()``: the whole id, RE2 syntax."""
    prefix = unique("re2")
    ids = [f"{prefix}-abc", f"{prefix}-abc-1", f"{prefix}-x9"]
    with RawConn(module_server.bootstrap) as conn:
        for tid in ids:
            assert init(conn, tid)[0] == 0
        assert list_transactions(conn, f"{prefix}-abc")[1] == [f"{prefix}-abc"]        # not a search
        assert list_transactions(conn, f"{prefix}-.*")[1] == sorted(ids)
        assert list_transactions(conn, "abc")[1] == []
        # RE2 syntax Python's re lacks: Unicode classes.
        assert list_transactions(conn, prefix + r"-\pL+")[1] == [f"{prefix}-abc"]
        assert list_transactions(conn, prefix + r"-[[:alpha:]]+")[1] == [f"{prefix}-abc"]
        # Empty (or null) pattern: no filter.
        assert set(ids) <= set(list_transactions(conn, "")[1])
        assert set(ids) <= set(list_transactions(conn, None)[1])


@pytest.mark.parametrize("pattern", [
    r"(a)\1",                # back-reference: Python's re accepts it, RE2 (and RE2/J) do not
    r"(?=a)a",               # look-ahead
    r"[",                    # syntax
    "a{1001}",               # RE2's repetition limit
    "(?s)(" + "|".join(f".*{x}.{{999}}{y}" for x in "abcd" for y in "abcd") + ")x",   # program over 1 MiB
    "a" * 32768,             # longer than any transactional id
])
def test_refused_patterns_answer_invalid_regular_expression(module_server, pattern):
    log = LogWatch(module_server)
    with RawConn(module_server.bootstrap) as conn:
        assert list_transactions(conn, pattern) == (E.INVALID_REGULAR_EXPRESSION.code, [])
        assert api_versions(conn).error_code == 0
    time.sleep(0.2)
    text = log.text()
    assert "Error parsing" not in text and "re2.cc" not in text, text[-2000:]   # RE2's own stderr logging is off


# --------------------------------------------------------------------------- strings over 32,767 bytes

@pytest.mark.parametrize("length", [32768, 40000])
def test_overlong_transactional_id_closes_the_connection(module_server, length):
    """A flexible request can carry a compact string longer than 32,767 bytes; Kafka's generated reader refuses it
    ("string field transactionalId had invalid length") and the broker closes the connection.  It used to reach
    the transaction log's encoder and raise there, once per request."""
    log = LogWatch(module_server)
    tid = "t" * length
    with RawConn(module_server.bootstrap) as conn:
        conn.send_request("InitProducerId", 4, req("InitProducerId", transactional_id=tid, transaction_timeout_ms=60000,
                                                   producer_id=-1, producer_epoch=-1))
        conn.expect_closed()
    line = log.wait_for("closing connection:", "malformed InitProducerId v4 request")
    assert f"string of {length} bytes is over the 32767-byte limit" in line, line
    with RawConn(module_server.bootstrap) as witness:
        assert_healthy(module_server, witness)
        # The longest id Kafka reads still works, and nothing of the refused one was stored.
        longest = unique("t").ljust(32767, "t")
        assert init(witness, longest)[0] == 0
        listed = list_transactions(witness, "t.*")[1]
        assert longest in listed and max(map(len, listed)) == 32767
    assert "Traceback" not in log.text(), log.text()[-4000:]
