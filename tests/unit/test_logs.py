"""Log lines: librdkafka's messages as JSON events, repeats summarised per interval."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

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


def test_every_failing_webhook_is_summarised_however_many_fail(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30,000 webhooks failing at once (a shared receiver platform down): one line per webhook
    and window still. The kinds were once held up to a count, 20,000, then all forgotten, so
    past about 6,700 failing webhooks most failed deliveries wrote a line of their own."""
    clock = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    log = logging.getLogger("bridge.engine")
    for _ in range(2):
        for n in range(30_000):
            log.info("delivery.failed", extra={"fields": {"webhook": f"w{n}", "next": "retry 1"}})
        clock[0] += 1
    assert len(lines(stream)) == 30_000
    clock[0] += 61  # the window is 60 s here
    log.info("delivery.failed", extra={"fields": {"webhook": "w7", "next": "retry 1"}})
    assert lines(stream)[-1]["repeated"] == 1


# --- Lines are written by a thread of their own ------------------------------------------------


def _record(event: str, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord("bridge.test", logging.WARNING, __file__, 1, event, None, None)
    record.fields = fields
    return record


def _one_page_pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ: a pipe of one page fills at once
    return read_end, write_end


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_stalled_reader_of_the_log_never_holds_up_the_code_that_logs() -> None:
    """The writer's descriptor is a pipe nobody reads: once full, its writes wait for ever.
    Logging still returns at once; past the queue's limit lines are dropped and counted, and
    when the reader comes back the next line says how many."""
    read_end, write_end = _one_page_pipe()
    # The pipe full, and the writer stuck on the first line before the others are logged: no
    # slot of the queue frees meanwhile. (Otherwise the writer took lines while they were
    # logged, and on a busy machine the last one could find a slot so freed, which resets the
    # count of those dropped.)
    os.write(write_end, b"\n" * 4096)
    handler = logs.BackgroundHandler(JsonFormatter(), fd=write_end, limit=50)
    handler.handle(_record("delivery.failed", webhook="w0", padding="x" * 200))
    deadline = time.monotonic() + 10
    while handler._queue.qsize() and time.monotonic() < deadline:  # the writer takes it
        time.sleep(0.001)
    started = time.monotonic()
    for n in range(1, 2_000):
        handler.handle(_record("delivery.failed", webhook=f"w{n}", padding="x" * 200))
    assert time.monotonic() - started < 1.0
    dropped = handler._dropped
    assert dropped == 2_000 - 1 - 50  # the writer is stuck on the full pipe, the queue full
    drained: list[bytes] = []
    reader = threading.Thread(target=lambda: drained.append(_read_all(read_end)))
    reader.start()  # the reader comes back
    deadline = time.monotonic() + 10
    while handler._dropped and time.monotonic() < deadline:  # until a line gets through
        handler.handle(_record("delivery.failed", webhook="after"))
        time.sleep(0.01)
    handler.close()
    os.close(write_end)
    reader.join(10)
    os.close(read_end)
    written = [json.loads(line) for line in drained[0].decode().splitlines() if line]
    assert written[0]["webhook"] == "w0"
    assert any(line.get("dropped", 0) >= dropped for line in written), written[-3:]


EXIT_WITH_A_STALLED_READER = """
import logging, sys, time
from bridge.ops import logs
logs.configure("json", "info")
for n in range(500):
    logging.getLogger("bridge.test").warning("event", extra={"fields": {"n": n, "pad": "x" * 200}})
started = time.monotonic()
logging.shutdown()
open(sys.argv[1], "w").write(str(time.monotonic() - started))
"""


def test_the_process_exits_when_nobody_reads_its_log(tmp_path: Path) -> None:
    """A writer stuck on stderr holds nothing that exiting needs: ``logging.shutdown`` returns
    after its bounded waits (it once waited for ever on the stuck writer's stream lock)."""
    read_end, write_end = _one_page_pipe()
    took = tmp_path / "took"
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", EXIT_WITH_A_STALLED_READER, str(took)],
            stderr=write_end,
            cwd=Path(__file__).resolve().parents[2],
        )
        os.close(write_end)
        assert child.wait(timeout=30) == 0
        assert float(took.read_text()) < 3 * logs.CLOSE_WAIT_S + 1
    finally:
        os.close(read_end)


def test_closing_writes_what_is_queued_then_what_was_dropped() -> None:
    read_end, write_end = os.pipe()
    handler = logs.BackgroundHandler(JsonFormatter(), fd=write_end, limit=100_000)
    for n in range(100):
        handler.handle(_record("event", n=n))
    handler._dropped = 7  # as if seven lines had found the queue full since the last one
    handler.close()
    os.close(write_end)
    written = [json.loads(line) for line in _read_all(read_end).decode().splitlines()]
    os.close(read_end)
    assert [line["n"] for line in written[:100]] == list(range(100))
    assert (written[-1]["event"], written[-1]["dropped"]) == ("log.dropped", 7)


def test_a_record_that_cannot_be_formatted_does_not_end_the_writer() -> None:
    read_end, write_end = os.pipe()
    handler = logs.BackgroundHandler(JsonFormatter(), fd=write_end)
    nested: list[object] = []
    for _ in range(100_000):
        nested = [nested]
    handler.handle(_record("deep", value=nested))  # json.dumps: RecursionError
    handler.handle(_record("after"))
    handler.close()
    os.close(write_end)
    written = [json.loads(line) for line in _read_all(read_end).decode().splitlines()]
    os.close(read_end)
    assert [line["event"] for line in written] == ["log.unformattable", "after"]
    assert written[0]["error"] == "RecursionError"


def test_a_queued_record_keeps_no_frame_alive() -> None:
    """Its traceback is formatted before it is queued: a stalled reader does not keep the
    frames (and their locals, a delivery's body say) of 10,000 queued exceptions alive."""
    read_end, write_end = os.pipe()
    handler = logs.BackgroundHandler(JsonFormatter(), fd=write_end)
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("crashed")
        record.exc_info = sys.exc_info()
    handler.handle(record)
    assert record.exc_info is None and "ValueError: boom" in (record.exc_text or "")
    handler.close()
    os.close(write_end)
    (line,) = [json.loads(line) for line in _read_all(read_end).decode().splitlines()]
    os.close(read_end)
    assert "ValueError: boom" in line["exception"]


def test_repeats_counted_from_several_threads_are_all_counted() -> None:
    """librdkafka's threads and the event loop log through the same filter at once."""
    summarise = Summarise(window=3600)
    threads, per_thread = 4, 20_000

    def repeat() -> None:
        for _ in range(per_thread):
            summarise.filter(_record("kafka.error", error="same"))

    workers = [threading.Thread(target=repeat) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    ((_end, (_passed, dropped)),) = summarise._kinds.values()
    assert dropped == threads * per_thread - 1  # every repeat but the first one passed


# --- Every logger's lines pass the summary; a client's bad request is one short line ------------


@pytest.fixture
def configured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """``configure`` the process's logging as ``bridge run`` does (restored after)."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    yield logs.configure
    for handler in root.handlers:
        handler.close()


def _bad_request(client: str, sent: str) -> None:
    """What aiohttp's server logs for a malformed request (``handle_error``)."""
    from aiohttp.http_exceptions import BadHttpMessage

    error = BadHttpMessage(f"Transfer-Encoding can't be present with Content-Length:\n\n  {sent}")
    logging.getLogger("aiohttp.server").exception(
        "Error handling request from %s", client, exc_info=error
    )


def _written(capfd: pytest.CaptureFixture[str]) -> list[str]:
    for handler in logging.getLogger().handlers:
        handler.flush()
    return capfd.readouterr().err.splitlines()


def test_a_flood_of_bad_requests_writes_a_few_lines_and_a_count(
    configured: Callable[[str], None],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """15,383 lines with a traceback each, 10.5 MB in 10 s, before: aiohttp's logger was not
    summarised, only the bridge's Kafka and delivery events were."""
    clock = [1000.0]
    configured("json")
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    for n in range(10_000):
        _bad_request(f"10.0.{n // 256}.{n % 256}", f"b'Transfer-Encoding: chunked{n}'")
    clock[0] += logs.SUMMARY_WINDOW_S + 1
    _bad_request("10.9.9.9", "b'Transfer-Encoding: chunked'")
    written = [json.loads(line) for line in _written(capfd)]
    assert len(written) == 2, written[:5]
    assert "repeated" not in written[0] and written[1]["repeated"] == 9_999
    assert written[1]["event"] == "http.bad_request" and written[1]["client"] == "10.9.9.9"


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_bad_request_is_written_without_a_traceback_and_with_a_short_printable_excerpt(
    fmt: str, configured: Callable[[str], None], capfd: pytest.CaptureFixture[str]
) -> None:
    configured(fmt)
    _bad_request("127.0.0.1", "b'" + "\x1b[2J\u202e" + "A" * 100_000 + "'")
    (line,) = _written(capfd)
    assert "Traceback" not in line and "web_protocol" not in line and "exception" not in line
    assert line.isprintable() and "\x1b" not in line and len(line) < 600
    assert "http.bad_request" in line and "BadHttpMessage" in line and "127.0.0.1" in line
    if fmt == "json":
        entry = json.loads(line)
        assert entry["level"] == "warning" and len(entry["detail"]) <= logs.EXCERPT_LIMIT
        assert "Transfer-Encoding" in entry["detail"]


def test_a_library_error_with_a_traceback_keeps_it_and_is_summarised(
    configured: Callable[[str], None],
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Not a client's bad request (a handler's bug, say): its traceback is the clue, kept; its
    repeats are summarised like any library's line."""
    configured("json")
    for n in range(100):
        try:
            raise KeyError(n)
        except KeyError:
            logging.getLogger("aiohttp.server").exception("Error handling request from %s", n)
    (line,) = _written(capfd)
    assert "KeyError" in json.loads(line)["exception"]
