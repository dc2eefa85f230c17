"""The operator's status view: ``GET /status`` on the operator port, and ``bridge status``.

``/status`` answers JSON: the webhooks that need a look now (failing, stalled, out of unanswered
credit, or with deliveries active or waiting for one of their slots; never the idle ones), the
most pressing first and at most :data:`STATUS_LIMIT` of them (``left_out`` says how many more
there are), the totals of the process, and the configuration in force. Webhooks appear by id
only: never a URL (it may carry credentials) and never a secret. The body is built by
``Pipeline.status`` (the engine) and ``App.status`` (the configuration part); this module holds
its bounds, the order of the list, and the client side (:func:`fetch_status`,
:func:`render_status`).
"""

from __future__ import annotations

import http.client
import io
import json
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from bridge.core.errors import clipped, printable

STATUS_LIMIT = 100
"""At most this many webhooks are listed; the body says how many were left out."""

DEFAULT_URL = "http://127.0.0.1:9464"
ANSWER_LIMIT = 16 * 2**20
"""``bridge status`` refuses an answer longer than this (16 MiB; a real one is under 30 KB)."""


def pressing_first(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Sort key of the list: stalled, then out of credit, then failing (longest first), then the
    most deliveries waiting, then the most active, then by id."""
    since = row.get("failing_since")
    return (
        not row.get("stalled"),
        not row.get("out_of_credit"),
        since is None,
        since or 0.0,
        -(row.get("waiting") or 0),
        -(row.get("active") or 0),
        row["id"],
    )


def bounded(rows: list[dict[str, Any]], limit: int = STATUS_LIMIT) -> dict[str, Any]:
    """The ``webhooks`` part of the body: ``rows`` in :func:`pressing_first` order, cut at
    ``limit``, with how many there were and how many were left out."""
    rows.sort(key=pressing_first)
    listed = rows[: max(0, limit)]
    return {
        "webhooks": listed,
        "needing_attention": len(rows),
        "listed": len(listed),
        "left_out": len(rows) - len(listed),
    }


class StatusError(Exception):
    """The bridge's ``/status`` could not be read, or its answer is not a bridge status."""


def status_url(base: str) -> str:
    """``base`` (``http://host:port``, ``host:port``, or the ``/status`` URL itself) as the
    ``/status`` URL; StatusError for another scheme."""
    base = base.strip()
    if "://" not in base:
        base = f"http://{base}"
    if not base.lower().startswith(("http://", "https://")):
        raise StatusError(f"{base!r} is not an http:// or https:// URL")
    base = base.rstrip("/")
    return base if base.endswith("/status") else f"{base}/status"


class _DeadlineReader(io.RawIOBase):
    """Reads from ``sock``, each read waiting only for what is left until ``deadline``
    (monotonic): a server that trickles its answer cannot stretch the request past it."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """What :class:`http.client.HTTPResponse` takes as its socket: it only calls
    ``makefile``, given here a :class:`_DeadlineReader`."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._reader = _DeadlineReader(sock, deadline)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self._reader)


def fetch_status(base: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET ``/status`` of the bridge at ``base``: its JSON object. ``timeout`` bounds the whole
    request (connecting, the answer's head and its body, however slowly they come); no
    redirect is followed; an answer past :data:`ANSWER_LIMIT` bytes is refused. Every failure
    is a StatusError of one line."""
    url = status_url(base)  # http or https only, never a file
    try:
        return _within(timeout, _get_json, url, time.monotonic() + timeout)
    except StatusError:
        raise
    except TimeoutError:
        raise StatusError(f"cannot read {url}: no whole answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise StatusError(f"cannot read {url}: {clipped(printable(str(reason)), 200)}") from None
    except ValueError as exc:  # (not a port, not JSON, not UTF-8)
        raise StatusError(
            f"{url} did not answer JSON: {clipped(printable(str(exc)), 200)}"
        ) from None
    except RecursionError:
        raise StatusError(f"{url} did not answer a bridge status: JSON nested too deep") from None


def _within(timeout: float, call: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``call(*args)`` on a daemon thread, its result or its exception; TimeoutError when it has
    not ended within ``timeout``. What the socket timeouts do not bound (resolving the host name:
    the system's resolver has timeouts and retries of its own; a connect to each address it
    gives, each allowed the whole timeout) cannot outlast the command's deadline: the thread is
    left behind, and ends with the process."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call(*args)))
        except BaseException as exc:  # (handed to the caller's thread)
            outcome.append((False, exc))

    worker = threading.Thread(target=run, name="status-request", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        raise TimeoutError
    ok, value = outcome[0]
    if not ok:
        raise value
    return cast(dict[str, Any], value)


def _get_json(url: str, deadline: float) -> dict[str, Any]:
    """The request itself (see :func:`fetch_status`); the failures of the libraries pass."""
    parts = urllib.parse.urlsplit(url)
    host, left = parts.hostname or "", deadline - time.monotonic()
    connection = (
        http.client.HTTPSConnection(host, parts.port, timeout=left)
        if parts.scheme == "https"
        else http.client.HTTPConnection(host, parts.port, timeout=left)
    )
    try:
        connection.request("GET", parts.path or "/", headers={"Accept": "application/json"})
        if connection.sock is None:  # (request connects, or raises)
            raise StatusError(f"cannot read {url}: not connected")
        response = http.client.HTTPResponse(
            _DeadlineSocket(connection.sock, deadline),  # type: ignore[arg-type]
            method="GET",
        )
        response.begin()
        if 300 <= response.status < 400:
            raise StatusError(f"{url} answered HTTP {response.status} (a redirect: not followed)")
        if response.status != 200:
            raise StatusError(f"{url} answered HTTP {response.status}")
        if response.length is not None and response.length > ANSWER_LIMIT:
            raise StatusError(f"{url} answered more than {ANSWER_LIMIT // 2**20} MiB: refused")
        body = json.loads(_read_capped(response, url))
    finally:
        connection.close()
    if not isinstance(body, dict):
        raise StatusError(f"{url} did not answer a bridge status: not a JSON object")
    return body


def _read_capped(response: http.client.HTTPResponse, url: str) -> bytes:
    """The body of ``response``, or StatusError past :data:`ANSWER_LIMIT` bytes."""
    chunks, size = [], 0
    while chunk := response.read(65536):
        size += len(chunk)
        if size > ANSWER_LIMIT:
            raise StatusError(f"{url} answered more than {ANSWER_LIMIT // 2**20} MiB: refused")
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class WebhookRow:
    """One listed webhook as the table shows it (None: the answer did not say)."""

    id: str
    failing_since: float | None = None
    active: int | None = None
    limit: int | None = None
    waiting: int | None = None
    stalled: bool = False
    out_of_credit: bool = False
    credit: float | None = None


@dataclass(frozen=True)
class Totals:
    """The process's totals of the answer."""

    in_flight: int = 0
    max_in_flight: int = 0
    backpressure: bool = False
    paused_partitions: int = 0
    assigned_partitions: int = 0
    webhooks_configured: int = 0
    webhooks_failing: int = 0


@dataclass(frozen=True)
class ConfigView:
    """The configuration in force, as the answer gives it."""

    path: str | None = None
    webhooks: int | None = None
    generation: int | None = None
    applied_at: float | None = None
    in_force: bool = True


@dataclass(frozen=True)
class StatusView:
    """A ``/status`` answer checked and typed: what :func:`render_status` prints."""

    time: float | None
    webhooks: tuple[WebhookRow, ...]
    needing_attention: int
    left_out: int
    totals: Totals
    config: ConfigView | None


MAX_SECONDS = 1e11
"""A time in the answer (Unix seconds) is at most this (the year 5138): any later is nonsense."""


def status_view(body: Mapping[str, Any]) -> StatusView:
    """The JSON of a ``/status`` answer as a :class:`StatusView`: every field the table shows
    checked for its type and range (one absent or null is not shown); StatusError naming the
    first one that is wrong."""
    rows = _field(body, "webhooks", list, "a list")
    if rows is None:
        raise StatusError("the answer is not a bridge status: it has no webhooks list")
    totals = _field(body, "totals", dict, "an object") or {}
    config = _field(body, "config", dict, "an object")
    return StatusView(
        time=_seconds(body, "time"),
        webhooks=tuple(_row(row, f"webhooks[{n}]") for n, row in enumerate(rows)),
        needing_attention=_count(body, "needing_attention") or 0,
        left_out=_count(body, "left_out") or 0,
        totals=Totals(
            backpressure=bool(_flag(totals, "totals.backpressure")),
            **{
                name: _count(totals, name, "totals.") or 0
                for name in Totals.__dataclass_fields__
                if name != "backpressure"
            },
        ),
        config=None
        if config is None
        else ConfigView(
            path=_field(config, "path", str, "a string", "config."),
            webhooks=_count(config, "webhooks", "config."),
            generation=_count(config, "generation", "config."),
            applied_at=_seconds(config, "applied_at", "config."),
            in_force=_flag(config, "in_force", "config.") is not False,
        ),
    )


def _row(row: object, where: str) -> WebhookRow:
    if not isinstance(row, dict):
        raise StatusError(f"the answer is not a bridge status: {where} is not an object")
    prefix = f"{where}."
    webhook = _field(row, "id", str, "a string", prefix)
    if webhook is None:
        raise StatusError(f"the answer is not a bridge status: {where} has no id")
    return WebhookRow(
        id=webhook,
        failing_since=_seconds(row, "failing_since", prefix),
        active=_count(row, "active", prefix),
        limit=_count(row, "limit", prefix),
        waiting=_count(row, "waiting", prefix),
        stalled=bool(_flag(row, "stalled", prefix)),
        out_of_credit=bool(_flag(row, "out_of_credit", prefix)),
        credit=_number(row, "credit", prefix),
    )


def _wrong(where: str, value: object, wanted: str) -> StatusError:
    """The error for a field of the answer that is not what the table needs."""
    shown = type(value).__name__ if isinstance(value, dict | list) else repr(value)
    return StatusError(
        f"the answer is not a bridge status: {where} is {clipped(printable(shown), 40)}, "
        f"not {wanted}"
    )


def _field(
    body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], wanted: str, prefix: str = ""
) -> Any:
    """``body[name]`` if it is a ``kind`` (a bool is no number); None if absent or null."""
    value = body.get(name)
    if value is None or (isinstance(value, kind) and (kind is bool or not isinstance(value, bool))):
        return value
    raise _wrong(prefix + name, value, wanted)


def _flag(body: Mapping[str, Any], name: str, prefix: str = "") -> bool | None:
    flag: bool | None = _field(body, name, bool, "true or false", prefix)
    return flag


def _count(body: Mapping[str, Any], name: str, prefix: str = "") -> int | None:
    count: int | None = _field(body, name, int, "a whole number of at least 0", prefix)
    if count is not None and count < 0:
        raise _wrong(prefix + name, count, "a whole number of at least 0")
    return count


def _number(body: Mapping[str, Any], name: str, prefix: str = "") -> float | None:
    value = _field(body, name, (int, float), "a number", prefix)
    if value is not None and not math.isfinite(value):
        raise _wrong(prefix + name, value, "a finite number")
    return None if value is None else float(value)


def _seconds(body: Mapping[str, Any], name: str, prefix: str = "") -> float | None:
    seconds = _number(body, name, prefix)
    if seconds is not None and not 0 <= seconds <= MAX_SECONDS:
        raise _wrong(prefix + name, seconds, f"a time from 0 to {MAX_SECONDS:g} s")
    return seconds


def status_json(body: Mapping[str, Any]) -> str:
    """``body`` as indented JSON for ``--json``, ASCII only (every other character escaped: no
    text of the answer reaches the terminal raw); StatusError if nested too deep to write."""
    try:
        return json.dumps(body, indent=2)
    except RecursionError:
        raise StatusError("the answer is not a bridge status: JSON nested too deep") from None


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def state_of(row: WebhookRow) -> str:
    """One word for a webhook's row: stalled, no-credit, failing or busy."""
    if row.stalled:
        return "stalled"
    if row.out_of_credit:
        return "no-credit"
    if row.failing_since is not None:
        return "failing"
    return "busy"


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(cell).ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


def _shown(value: object) -> str:
    """A value of the table: ``-`` for none, else its text, :func:`printable`."""
    return "-" if value is None else printable(str(value))


def render_status(view: StatusView, now: float | None = None) -> str:
    """The status as text for a terminal: a summary, the configuration, and one row per webhook
    listed. Every text from the answer is :func:`printable`: no id or path can write a control
    sequence to the terminal."""
    now = (view.time if view.time is not None else time.time()) if now is None else now
    totals = view.totals
    lines = [
        f"{view.needing_attention} webhook(s) need attention "
        f"({totals.webhooks_failing} failing) of {totals.webhooks_configured} configured; "
        f"{totals.in_flight}/{totals.max_in_flight} deliveries in flight"
        f"{' (at the limit)' if totals.backpressure else ''}; "
        f"{totals.paused_partitions}/{totals.assigned_partitions} partitions paused"
    ]
    config = view.config
    if config is not None:
        applied = config.applied_at
        state = "in force" if config.in_force else "a newer file is REJECTED"
        lines.append(
            f"config: {_shown(config.path)}, {_shown(config.webhooks)} webhook(s), "
            f"generation {_shown(config.generation)} "
            f"(applied {_age(None if applied is None else now - applied)} ago), {state}"
        )
    rows = [
        [
            _shown(row.id),
            state_of(row),
            _age(None if row.failing_since is None else now - row.failing_since),
            _shown(row.active),
            _shown(row.limit),
            _shown(row.waiting),
            "-" if row.credit is None else f"{row.credit:.0f}",
        ]
        for row in view.webhooks
    ]
    if rows:
        lines += _table(
            rows, ["WEBHOOK", "STATE", "FAILING FOR", "ACTIVE", "LIMIT", "WAITING", "CREDIT"]
        )
    else:
        lines.append("no webhook failing, stalled or busy")
    if view.left_out:
        lines.append(f"... and {view.left_out} more not listed (the list is capped)")
    return "\n".join(lines)
