"""Log lines: librdkafka's messages as JSON events, repeats summarised per interval."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
import threading
import time

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


# --- Lines are written by a thread of their own ------------------------------------------------


def _record(event: str, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord("bridge.test", logging.WARNING, __file__, 1, event, None, None)
    record.fields = fields
    return record


def test_a_stalled_reader_of_the_log_never_holds_up_the_code_that_logs() -> None:
    """The writer's stream is a pipe nobody reads: once full, its writes wait for ever. Logging
    still returns at once, past the queue's limit the lines are dropped and counted, and the next
    line queued says how many."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ: a pipe of one page fills at once
    stream = logging.StreamHandler(os.fdopen(write_end, "w"))
    stream.setFormatter(JsonFormatter())
    handler = logs.BackgroundHandler(stream, limit=50)
    try:
        started = time.monotonic()
        for n in range(2_000):
            handler.handle(_record("delivery.failed", webhook=f"w{n}", padding="x" * 200))
        assert time.monotonic() - started < 1.0
        assert handler._dropped > 0  # the writer is stuck on the full pipe, the queue full
        # The reader comes back: what was queued is written, then a line saying what was dropped.
        drained: list[bytes] = []
        reader = threading.Thread(target=lambda: drained.append(_read_all(read_end)))
        reader.start()
        dropped = handler._dropped
        deadline = time.monotonic() + 10
        while handler._dropped and time.monotonic() < deadline:  # until a line gets through
            handler.handle(_record("delivery.failed", webhook="after"))
            time.sleep(0.01)
        handler.close()
        stream.stream.close()
        reader.join(10)
        written = [json.loads(line) for line in drained[0].decode().splitlines()]
        assert written[0]["webhook"] == "w0"
        assert any(line.get("dropped", 0) >= dropped for line in written), written[-3:]
    finally:
        with contextlib.suppress(OSError):
            os.close(read_end)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_closing_writes_what_is_queued_and_gives_up_on_a_reader_that_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    stream = logging.StreamHandler(out)
    stream.setFormatter(JsonFormatter())
    handler = logs.BackgroundHandler(stream)
    for n in range(100):
        handler.handle(_record("event", n=n))
    handler.close()
    assert [json.loads(line)["n"] for line in out.getvalue().splitlines()] == list(range(100))

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 4096)
    stuck = logging.StreamHandler(os.fdopen(write_end, "w"))
    stuck.setFormatter(JsonFormatter())
    handler = logs.BackgroundHandler(stuck)
    for _ in range(200):
        handler.handle(_record("event", padding="x" * 200))
    started = time.monotonic()
    handler.flush()
    handler.close()  # the reader never comes: close returns after its waits, not never
    assert time.monotonic() - started < 3 * logs.CLOSE_WAIT_S + 1
    # Clean-up: the reader goes for good; the stuck writer's writes fail, and it ends.
    monkeypatch.setattr(logging, "raiseExceptions", False)  # (no traceback per failed line)
    os.close(read_end)
    handler._writer.join(10)
    assert not handler._writer.is_alive()
    with contextlib.suppress(OSError):
        stuck.stream.close()
