"""Structured logs: one JSON line per event of note, or a readable line for a terminal.

Callers log an event name as the message and the context as ``extra={"fields": {...}}``:
``log.info("delivery.failed", extra={"fields": {"webhook": "shop", "attempt": 2}})``.
Bodies and secrets are never passed in.

librdkafka's own messages come through :data:`LIBRDKAFKA` (the ``logger`` setting of every Kafka
client), so they are events like the others (``librdkafka.log``, with facility, client and
detail) and every line on stderr is JSON. A broker that is down makes librdkafka and the error
callback repeat the same line many times a second: :class:`Summarise` passes the first of a kind,
drops the repeats for :data:`SUMMARY_WINDOW_S`, and adds their count (``repeated``) to the next
one after that. A failing webhook's ``delivery.failed`` and ``delivery.dead_lettered`` lines are
summarised the same way, per webhook: the log grows with the webhooks failing, not the records.
So is every line of a library's logger (aiohttp's server, asyncio...), by logger, level, message
as written and exception type: a client sending malformed requests to the operator port as fast
as it can writes one ``http.bad_request`` line per 10 s (no traceback, an excerpt of at most 200
printable characters of what it sent), not one line with a traceback per request. The filter
is on the handler, so every logger's records pass it.

Lines are written by a thread of their own (:class:`BackgroundHandler`), never by the code that
logs: stderr is a pipe, and a reader that falls behind or stops (a log collector that is slow,
stalled or gone) makes a write wait once the pipe's 64 KiB are full. Written from the event loop,
that wait stopped every delivery of every webhook; now it delays only the log. When
:data:`QUEUE_LIMIT` lines wait, further lines are dropped, and the next line that gets through
says how many (``dropped``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import threading
import time
from typing import Any, Final

from bridge.core.errors import clipped, printable
from bridge.core.expiring import Expiring

LIBRDKAFKA: Final = logging.getLogger("bridge.kafka.librdkafka")
"""The logger given to every Kafka client (``{"logger": LIBRDKAFKA}``)."""

SUMMARY_WINDOW_S: Final = 10.0
SUMMARISED_EVENTS: Final = frozenset({"kafka.error"})
PER_WEBHOOK_EVENTS: Final = frozenset({"delivery.failed", "delivery.dead_lettered"})
"""Summarised per webhook: one line per webhook and window, whatever the records and reasons."""
KIND_MEMORY_WINDOWS: Final = 6
"""A kind is forgotten this many windows after it last passed (with the repeats of its last
window not yet reported): kinds held are those seen lately, whatever their number."""
QUEUE_LIMIT: Final = 10_000
"""Lines waiting for the writer thread at most; past it, lines are dropped and counted."""
CLOSE_WAIT_S: Final = 2.0
"""How long closing waits for the lines still queued to be written (the reader may be gone)."""
_NUMBERS: Final = re.compile(r"\d+")
EXCERPT_LIMIT: Final = 200
"""At most this many characters of what a client sent appear in a line about it."""


class Summarise(logging.Filter):
    """Passes the first record of a kind, drops its repeats for ``window`` seconds, and adds
    their count (``repeated``) to the next record of that kind after the window. A kind is the
    event with its fields, numbers aside ("after 0ms" and "after 2ms" are the same kind), for
    librdkafka's messages and :data:`SUMMARISED_EVENTS`; the event, level and webhook for
    :data:`PER_WEBHOOK_EVENTS`: a failing webhook writes one ``delivery.failed`` (and one
    ``delivery.dead_lettered``) per window, not one per record, however many records it fails.
    Every delivery is still counted in the metrics and every dead letter is in its topic.
    Every record of a library's logger (any but ``bridge`` and below: aiohttp, asyncio...) is
    summarised too, by :func:`_foreign_kind`, and aiohttp's line about a client's malformed
    request becomes a short ``http.bad_request`` (:func:`_as_bad_request`). It is a filter of
    the handler, not of a logger: every logger's records pass it."""

    def __init__(self, window: float = SUMMARY_WINDOW_S) -> None:
        super().__init__()
        self.window = window
        self._kinds: Expiring[str, tuple[float, int]] = Expiring()  # kind -> (passed at, dropped)
        self._lock = threading.Lock()  # librdkafka's threads log too (a filter runs unlocked)

    def filter(self, record: logging.LogRecord) -> bool:
        librdkafka = record.name == LIBRDKAFKA.name and bool(record.args)
        if librdkafka:
            _as_event(record)  # (its fields are read after: the summary line keeps them)
        elif record.name.startswith("aiohttp.") and (error := _client_error(record)):
            _as_bad_request(record, error)
        fields = getattr(record, "fields", {})
        event = record.getMessage()
        if event in PER_WEBHOOK_EVENTS:
            kind = f"{event} {record.levelno} {fields.get('webhook')}"  # warnings apart
        elif librdkafka or event in SUMMARISED_EVENTS:
            kind = _NUMBERS.sub("#", f"{record.name} {event} {sorted(fields.items())}")
        elif not (record.name == "bridge" or record.name.startswith("bridge.")):
            kind = _foreign_kind(record)
        else:
            return True
        now = time.monotonic()
        with self._lock:
            held = self._kinds.get(kind)
            dropped = 0
            if held is not None:
                end, (passed, dropped) = held
                if now - passed < self.window:
                    self._kinds[kind] = (end, (passed, dropped + 1))  # (keeps its place)
                    return False
            end = now + KIND_MEMORY_WINDOWS * self.window
            self._kinds.put(kind, end, (now, 0), now)
        if dropped:
            record.fields = {**fields, "repeated": dropped}
        return True


def _foreign_kind(record: logging.LogRecord) -> str:
    """The kind of a library's record: its logger, level, message as written (before its
    arguments, which may be a client's address or bytes: a client cannot make a kind of its
    own), numbers aside, and the type of its exception."""
    error = record.exc_info[1] if record.exc_info else None
    named = (
        type(error).__name__ if error is not None else getattr(record, "fields", {}).get("error")
    )
    return _NUMBERS.sub("#", f"{record.name} {record.levelno} {record.msg} {named}")


def _client_error(record: logging.LogRecord) -> BaseException | None:
    """The exception of an aiohttp record about a client's malformed request (aiohttp's
    ``HttpProcessingError``: a bad request line, header or body framing), else None."""
    error = record.exc_info[1] if record.exc_info else None
    if error is None:
        return None
    from aiohttp.http_exceptions import HttpProcessingError  # (aiohttp is logging: loaded)

    return error if isinstance(error, HttpProcessingError) else None


def _as_bad_request(record: logging.LogRecord, error: BaseException) -> None:
    """aiohttp's ``Error handling request from %s`` with a client's malformed request as an
    ``http.bad_request`` warning: the client's address, the error's type and at most
    :data:`EXCERPT_LIMIT` characters of what aiohttp says of it (which quotes the client's
    bytes), printable; no traceback (it is aiohttp's parser, the same every time)."""
    client = record.args[0] if isinstance(record.args, tuple) and record.args else None
    message = str(getattr(error, "message", "") or error)
    record.msg, record.args = "http.bad_request", ()
    record.levelno, record.levelname = logging.WARNING, "WARNING"
    record.fields = {
        "client": printable(clipped(str(client), EXCERPT_LIMIT)),
        "error": type(error).__name__,
        "detail": clipped(printable(message[: EXCERPT_LIMIT * 2]), EXCERPT_LIMIT),
    }
    record.exc_info, record.exc_text = None, None


def _as_event(record: logging.LogRecord) -> None:
    """librdkafka's ``"%s [%s] %s" % (facility, client, message)`` as a ``librdkafka.log``
    event with those three fields."""
    facility, client, detail = (str(arg) for arg in (*record.args, "", "", "")[:3])  # type: ignore[misc]
    record.msg, record.args = "librdkafka.log", ()
    record.fields = {"facility": facility, "client": client, "detail": detail}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted before it was queued (BackgroundHandler)
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """Formats a record as ``time level event key=value ...`` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items())
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
        line += f"{record.levelname.lower():7s} {record.getMessage()} {fields}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:  # formatted before it was queued (BackgroundHandler)
            line += "\n" + record.exc_text
        return line


class BackgroundHandler(logging.Handler):
    """Hands each record to a thread that formats it and writes it to file descriptor ``fd``:
    the caller never waits for the output (see the module's text).

    The writer uses ``os.write`` on the descriptor, holding no lock of Python's: a writer stuck on
    a stalled reader must not hold anything that exiting needs (``logging.shutdown`` takes every
    handler's lock, and ``sys.stderr``'s buffer has a lock of its own). At most ``limit`` records
    wait; past that a record is dropped, and the next one queued carries the count in its fields
    (``dropped``), as does a last ``log.dropped`` line at close. A record is made self-contained
    before it is queued (its message rendered, its traceback formatted): it keeps no frame, and
    no frame's locals, alive while it waits."""

    def __init__(self, formatter: logging.Formatter, fd: int = 2, limit: int = QUEUE_LIMIT) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self._fd = fd
        self._queue: queue.Queue[logging.LogRecord | None] = queue.Queue(limit)
        self._dropped = 0
        self._closed = False
        self._writer = threading.Thread(target=self._write, name="log-writer", daemon=True)
        self._writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        if self._dropped:
            record.fields = {**getattr(record, "fields", {}), "dropped": self._dropped}
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._dropped += 1
            return
        self._dropped = 0

    def _write(self) -> None:
        while True:
            record = self._queue.get()
            try:
                if record is None:
                    return
                self._write_line(record)
            finally:
                self._queue.task_done()

    def _write_line(self, record: logging.LogRecord) -> None:
        """Format ``record`` and write it whole; a line that cannot be formatted is replaced by
        one saying so, and a write that fails (the reader is gone) is given up: nothing ends
        the writer but closing."""
        try:
            line = self.format(record)
        except Exception as exc:  # (RecursionError included) the record's fields, say
            said = logging.LogRecord(
                record.name, logging.ERROR, __file__, 0, "log.unformattable", None, None
            )
            said.fields = {"error": type(exc).__name__}
            line = self.format(said)  # (in the configured format, like every other line)
        data = memoryview((line + "\n").encode("utf-8", "replace"))
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError:
            pass

    def flush(self) -> None:
        """Wait (at most :data:`CLOSE_WAIT_S`) for the queued lines to be written."""
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        """Write what is queued, and a last ``log.dropped`` line if lines were dropped since
        the last one written (waiting :data:`CLOSE_WAIT_S` for each: the reader may be gone),
        then stop the writer."""
        if not self._closed:
            self._closed = True
            if self._dropped:
                last = logging.LogRecord(
                    "bridge.ops.logs", logging.WARNING, __file__, 0, "log.dropped", None, None
                )
                last.fields = {"dropped": self._dropped}
                with contextlib.suppress(queue.Full):
                    self._queue.put(last, timeout=CLOSE_WAIT_S)
            with contextlib.suppress(queue.Full):  # (the writer is stuck: the join says so)
                self._queue.put(None, timeout=CLOSE_WAIT_S)
            self._writer.join(CLOSE_WAIT_S)
        super().close()


def configure(fmt: str = "json", level: str = "info") -> None:
    """Send the bridge's logs to stderr in ``fmt`` (json or text) at ``level``, written by a
    thread of their own (:class:`BackgroundHandler`)."""
    handler = BackgroundHandler(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(Summarise())
    root = logging.getLogger()
    old, root.handlers[:] = list(root.handlers), [handler]  # swapped first: no line is lost
    for previous in old:
        if isinstance(previous, BackgroundHandler):
            previous.close()
    root.setLevel(level.upper())
