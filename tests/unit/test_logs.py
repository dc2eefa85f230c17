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
    assert summary["event"] == "librdkafka.log" and summary["facility"] == "FAIL"
    assert "Connection refused" in str(summary["detail"]), "the summary line keeps its fields"


def test_kafka_errors_are_summarised_but_other_events_never_are(stream: io.StringIO) -> None:
    log = logging.getLogger("bridge.app")
    for _ in range(5):
        log.warning("kafka.error", extra={"fields": {"error": "all brokers down", "code": -187}})
        log.info("partitions.assigned", extra={"fields": {"partitions": ["t/0"]}})
    log.warning("kafka.error", extra={"fields": {"error": "other", "code": -195}})
    events = [line["event"] for line in lines(stream)]
    assert events.count("kafka.error") == 2  # one per kind
    assert events.count("partitions.assigned") == 5


def test_a_failing_webhook_writes_one_line_per_window_not_one_per_record(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of records failing at one webhook: one delivery.failed per window (and one
    delivery.dead_lettered, and the warnings apart from the infos), each webhook its own; the
    next line after the window says how many were folded into it."""
    clock = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    log = logging.getLogger("bridge.engine")
    for n in range(1000):
        for hook in ("shop", "shop-2"):
            fields = {"webhook": hook, "message_id": f"msg_{n}", "attempt": n % 5}
            log.info("delivery.failed", extra={"fields": {**fields, "next": "retry 1"}})
            log.warning("delivery.failed", extra={"fields": {**fields, "next": "dead_letter"}})
            log.warning("delivery.dead_lettered", extra={"fields": {**fields, "reason": "x"}})
    assert len(lines(stream)) == 6  # 3 kinds x 2 webhooks
    clock[0] += 61
    log.info("delivery.failed", extra={"fields": {"webhook": "shop", "message_id": "msg_late"}})
    late = lines(stream)[-1]
    assert late["message_id"] == "msg_late" and late["repeated"] == 999
