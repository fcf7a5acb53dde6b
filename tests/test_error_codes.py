"""Tests for wire.error_codes: completeness, Kafka's numbering, and a cross-check against kafka-python."""
from __future__ import annotations

import dataclasses
import re

import kafka.errors
import pytest

from trireme.wire import error_codes as E
from trireme.wire.error_codes import BY_CODE, KafkaError

# Where kafka-python 3.0 disagrees with Kafka's own Errors enum (Kafka is right in every case):
# it keeps older or shortened names, and marks CORRUPT_MESSAGE non-retriable although Kafka's
# CorruptRecordException is a RetriableException.
KAFKA_PYTHON_NAME_DIFFERENCES = {
    -1: ("UNKNOWN_SERVER_ERROR", "UNKNOWN"),
    0: ("NONE", "NO_ERROR"),
    6: ("NOT_LEADER_OR_FOLLOWER", "NOT_LEADER_FOR_PARTITION"),  # renamed in Kafka 2.6
    10: ("MESSAGE_TOO_LARGE", "MESSAGE_SIZE_TOO_LARGE"),
    17: ("INVALID_TOPIC_EXCEPTION", "INVALID_TOPIC"),
    39: ("INVALID_REPLICA_ASSIGNMENT", "INVALID_REPLICATION_ASSIGNMENT"),
}
KAFKA_PYTHON_RETRIABLE_DIFFERENCES = {2: (True, False)}


def test_every_code_from_minus_one_to_133():
    assert set(range(-1, 134)) <= set(BY_CODE)
    for code, error in BY_CODE.items():
        assert error.code == code
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", error.name)
        assert getattr(E, error.name) is error
    assert len({e.name for e in BY_CODE.values()}) == len(BY_CODE)


@pytest.mark.parametrize("name, code, retriable", [
    ("UNKNOWN_SERVER_ERROR", -1, False),
    ("NONE", 0, False),
    ("OFFSET_OUT_OF_RANGE", 1, False),
    ("CORRUPT_MESSAGE", 2, True),
    ("UNKNOWN_TOPIC_OR_PARTITION", 3, True),
    ("NOT_LEADER_OR_FOLLOWER", 6, True),
    ("MESSAGE_TOO_LARGE", 10, False),
    ("NOT_COORDINATOR", 16, True),
    ("REBALANCE_IN_PROGRESS", 27, False),
    ("UNSUPPORTED_VERSION", 35, False),
    ("NOT_CONTROLLER", 41, True),
    ("INVALID_REQUEST", 42, False),
    ("OUT_OF_ORDER_SEQUENCE_NUMBER", 45, False),
    ("DUPLICATE_SEQUENCE_NUMBER", 46, False),
    ("INVALID_PRODUCER_EPOCH", 47, False),
    ("CONCURRENT_TRANSACTIONS", 51, True),
    ("KAFKA_STORAGE_ERROR", 56, True),
    ("UNKNOWN_PRODUCER_ID", 59, False),
    ("FETCH_SESSION_ID_NOT_FOUND", 70, True),
    ("FENCED_LEADER_EPOCH", 74, True),
    ("INVALID_RECORD", 87, False),
    ("PRODUCER_FENCED", 90, False),
    ("UNKNOWN_TOPIC_ID", 100, True),
    ("FENCED_MEMBER_EPOCH", 110, False),
    ("STALE_MEMBER_EPOCH", 113, False),
    ("TRANSACTION_ABORTABLE", 120, False),
    ("INVALID_REGULAR_EXPRESSION", 128, False),
    ("REBOOTSTRAP_REQUIRED", 129, False),
    ("SHARE_SESSION_LIMIT_REACHED", 133, True),
])
def test_known_codes(name, code, retriable):
    assert getattr(E, name) == KafkaError(code, name, retriable)
    assert BY_CODE[code] is getattr(E, name)


def test_errors_are_frozen_and_for_code_falls_back():
    with pytest.raises(dataclasses.FrozenInstanceError):
        E.NONE.code = 5  # type: ignore[misc]
    assert E.for_code(3) is E.UNKNOWN_TOPIC_OR_PARTITION
    assert E.for_code(31000) is E.UNKNOWN_SERVER_ERROR


def _kafka_python_errors():
    return {code: cls for code, cls in kafka.errors.kafka_errors.items() if isinstance(code, int)}


def test_agrees_with_kafka_python_except_known_differences():
    theirs = _kafka_python_errors()
    assert set(theirs) <= set(BY_CODE), "kafka-python knows a code we lack"
    name_differences = {}
    retriable_differences = {}
    for code, cls in theirs.items():
        ours = BY_CODE[code]
        if ours.name != cls.message:
            name_differences[code] = (ours.name, cls.message)
        if ours.retriable != cls.retriable:
            retriable_differences[code] = (ours.retriable, cls.retriable)
    assert name_differences == KAFKA_PYTHON_NAME_DIFFERENCES
    assert retriable_differences == KAFKA_PYTHON_RETRIABLE_DIFFERENCES
