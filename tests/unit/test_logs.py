"""Log lines: librdkafka's messages as JSON events, repeats summarised per interval."""

from __future__ import annotations

import io
import json
import logging

import pytest

from bridge.ops import logs
from bridge.ops.logs import LIBRDKAFKA, JsonFormatter, Summarise


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(Summarise(window=60))
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)
    return out


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def refused(ms: int) -> tuple[str, str, str]:
    detail = f"127.0.0.1:1/bootstrap: Connect failed: Connection refused (after {ms}ms)"
    return ("FAIL", "rdkafka#consumer-1", detail)


def test_librdkafka_messages_become_one_json_event_then_a_summary(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    for ms in range(50):  # the same failure, numbers aside, many times a second
        LIBRDKAFKA.error("%s [%s] %s", *refused(ms))
    clock[0] += 61
    LIBRDKAFKA.error("%s [%s] %s", *refused(7))
    first, summary = lines(stream)
    assert first["event"] == "librdkafka.log" and first["level"] == "error"
    assert first["facility"] == "FAIL" and first["client"] == "rdkafka#consumer-1"
    assert "Connection refused" in str(first["detail"]) and "repeated" not in first
    assert summary["repeated"] == 49


def test_kafka_errors_are_summarised_but_other_events_never_are(stream: io.StringIO) -> None:
    log = logging.getLogger("bridge.app")
    for _ in range(5):
        log.warning("kafka.error", extra={"fields": {"error": "all brokers down", "code": -187}})
        log.info("delivery.failed", extra={"fields": {"webhook": "shop", "attempt": 1}})
    log.warning("kafka.error", extra={"fields": {"error": "other", "code": -195}})
    events = [line["event"] for line in lines(stream)]
    assert events.count("kafka.error") == 2  # one per kind
    assert events.count("delivery.failed") == 5
