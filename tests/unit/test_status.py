"""The operator's status view: which webhooks it lists, in what order, bounded, without URLs or
secrets; the lane snapshot it reads; ``/status`` on the operator port; the text rendering."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from bridge.cli import main
from bridge.core.settings import Config, DeliveryConfig
from bridge.core.webhook import Secret, Webhook
from bridge.engine.budget import UNANSWERED_BURST, Lane
from bridge.engine.pipeline import Pipeline
from bridge.ops.health import health_app
from bridge.ops.metrics import Metrics
from bridge.ops.status import (
    STATUS_LIMIT,
    StatusError,
    fetch_status,
    render_status,
    status_url,
    status_view,
)

SECRET = b"hunter2-secret-of-the-webhook-0123456789"


def hooks(count: int) -> tuple[Webhook, ...]:
    return tuple(
        Webhook(
            id=f"hook-{n:05d}",
            account=f"acct_{n}",
            url=f"https://user:hunter2-password@h{n}.example/hook?token=hunter2",
            events=frozenset({"transaction.success"}),
            secret=Secret(SECRET),
        )
        for n in range(count)
    )


def pipeline(count: int = 10_000) -> Pipeline:
    config = Config(
        path=Path("status.yaml"), delivery=DeliveryConfig(max_in_flight=500), webhooks=hooks(count)
    )
    return Pipeline(
        config,
        consumer=None,  # type: ignore[arg-type]
        producer=None,  # type: ignore[arg-type]
        sender=None,  # type: ignore[arg-type]
        decoder=None,  # type: ignore[arg-type]
        metrics=Metrics(CollectorRegistry()),
    )


def lane(**state: Any) -> Lane:
    """A lane of limit 4 with attributes set as given."""
    result = Lane(4, 5.0)
    for name, value in state.items():
        setattr(result, name, value)
    return result


def waiting(loop: asyncio.AbstractEventLoop, count: int, done: int = 0) -> Any:
    """A waiters deque: ``count`` futures waiting, ``done`` already settled (they do not count)."""
    from collections import deque

    futures = [loop.create_future() for _ in range(count + done)]
    for future in futures[:done]:
        future.set_result(False)
    return deque((future, time.monotonic()) for future in futures)


def test_the_view_lists_the_webhooks_that_need_attention_most_pressing_first() -> None:
    loop = asyncio.new_event_loop()
    try:
        engine = pipeline()
        for n in range(10_000):  # every webhook has had traffic: idle lanes are not listed
            engine.lanes[f"hook-{n:05d}"] = lane()
        engine.lanes["hook-00001"] = lane(active=2)
        engine.lanes["hook-00002"] = lane(
            active=4, waiters=waiting(loop, 3, done=2), answering=True
        )
        engine.lanes["hook-00003"] = lane(active=4, is_stalled=True)
        engine.lanes["hook-00004"] = lane(credit=-50.0, credit_at=time.monotonic())
        engine.lanes["hook-00005"] = lane(credit=50.0, credit_at=time.monotonic())  # some spent
        failing = engine.metrics.webhooks.failing
        failing["hook-00006"] = 1000.0
        failing["hook-00007"] = 2000.0
        body = engine.status()
    finally:
        loop.close()
    listed = [row["id"] for row in body["webhooks"]]
    assert listed == [
        "hook-00003",  # stalled
        "hook-00004",  # out of unanswered credit
        "hook-00006",  # failing longest
        "hook-00007",
        "hook-00002",  # deliveries waiting
        "hook-00001",  # deliveries active
    ]
    rows = {row["id"]: row for row in body["webhooks"]}
    assert rows["hook-00002"] == {
        "id": "hook-00002",
        "failing_since": None,
        "active": 4,
        "limit": 4,
        "probing": False,
        "waiting": 3,
        "stalled": False,
        "credit": UNANSWERED_BURST,
        "account_credit": UNANSWERED_BURST,
        "out_of_credit": False,
    }
    assert rows["hook-00004"]["out_of_credit"] is True and rows["hook-00004"]["credit"] < 1.0
    assert rows["hook-00006"]["failing_since"] == 1000.0
    assert (body["needing_attention"], body["listed"], body["left_out"]) == (6, 6, 0)
    assert body["totals"] == {
        "in_flight": 0,
        "max_in_flight": 500,
        "backpressure": False,
        "paused_partitions": 0,
        "assigned_partitions": 0,
        "webhooks_configured": 10_000,
        "webhooks_failing": 2,
    }


def test_the_list_is_capped_and_says_how_many_were_left_out() -> None:
    engine = pipeline(1_000)
    for n in range(250):
        engine.lanes[f"hook-{n:05d}"] = lane(active=1 + n % 4)
    engine.metrics.webhooks.failing["hook-00999"] = 5.0  # failing: before the busy ones
    body = engine.status()
    assert len(body["webhooks"]) == STATUS_LIMIT == body["listed"]
    assert body["needing_attention"] == 251 and body["left_out"] == 151
    assert body["webhooks"][0]["id"] == "hook-00999"
    assert "active" not in body["webhooks"][0], "failing without a lane: no lane detail"
    assert all(row["active"] == 4 for row in body["webhooks"][1:63])
    assert len(json.dumps(body)) < 30_000
    assert engine.status(limit=3)["listed"] == 3


def test_the_view_never_shows_a_url_or_a_secret() -> None:
    engine = pipeline(50)
    for n in range(50):
        engine.lanes[f"hook-{n:05d}"] = lane(active=1)
        engine.metrics.webhooks.failing[f"hook-{n:05d}"] = float(n)
    text = json.dumps(engine.status())
    assert "hunter2" not in text and "example" not in text and "http" not in text


def test_a_lane_snapshot_changes_nothing() -> None:
    subject = lane(active=3, credit=10.0, credit_at=time.monotonic() - 2.0)
    before = (subject.credit, subject.credit_at, subject.active, subject.is_stalled)
    snapshot = subject.snapshot()
    assert 29.0 <= float(snapshot["credit"]) <= UNANSWERED_BURST, "refilled in the copy"
    assert (subject.credit, subject.credit_at, subject.active, subject.is_stalled) == before
    assert snapshot["active"] == 3 and snapshot["limit"] == 4 and snapshot["waiting"] == 0


def test_status_is_served_as_json_on_the_operator_port() -> None:
    body: dict[str, object] = {
        "webhooks": [],
        "totals": {"in_flight": 0},
        "config": {"generation": 1},
    }

    async def scenario() -> tuple[int, str, Any, int]:
        app = health_app(CollectorRegistry(), time.monotonic, dict, dict, lambda: body)
        async with TestClient(TestServer(app)) as client:
            answer = await client.get("/status")
            plain = await client.get("/status")
            without = health_app(CollectorRegistry(), time.monotonic, dict)
            async with TestClient(TestServer(without)) as other:
                missing = (await other.get("/status")).status
            return answer.status, answer.content_type, await plain.json(), missing

    status, content_type, served, missing = asyncio.run(scenario())
    assert (status, content_type, served) == (200, "application/json", body)
    assert missing == 404


def test_the_text_rendering_names_each_webhook_and_what_was_left_out() -> None:
    body = {
        "time": 1000.0,
        "webhooks": [
            {"id": "down", "failing_since": 700.0, "active": 4, "limit": 4, "waiting": 12,
             "stalled": True, "credit": 0.0, "out_of_credit": True},
            {"id": "flaky", "failing_since": 990.0, "active": 1, "limit": 32, "waiting": 0,
             "stalled": False, "credit": 100.0, "out_of_credit": False},
            {"id": "busy", "failing_since": None, "active": 7, "limit": 32, "waiting": 0,
             "stalled": False, "credit": 100.0, "out_of_credit": False},
            {"id": "gone", "failing_since": 100.0},
        ],
        "needing_attention": 104,
        "listed": 4,
        "left_out": 100,
        "totals": {"in_flight": 12, "max_in_flight": 1000, "webhooks_failing": 3,
                   "webhooks_configured": 10_000, "paused_partitions": 1,
                   "assigned_partitions": 21, "backpressure": False},
        "config": {"path": "/etc/bridge.yaml", "webhooks": 10_000, "generation": 3,
                   "applied_at": 880.0, "in_force": False, "rejected_problems": 2},
    }  # fmt: skip
    text = render_status(status_view(body))
    lines = text.splitlines()
    assert lines[0].startswith("104 webhook(s) need attention (3 failing) of 10000 configured")
    assert "12/1000 deliveries in flight" in lines[0] and "1/21 partitions paused" in lines[0]
    assert "generation 3 (applied 2m00s ago), a newer file is REJECTED" in lines[1]
    assert lines[2].split() == [
        "WEBHOOK", "STATE", "FAILING", "FOR", "ACTIVE", "LIMIT", "WAITING", "CREDIT"
    ]  # fmt: skip
    assert lines[3].split() == ["down", "stalled", "5m00s", "4", "4", "12", "0"]
    assert lines[4].split() == ["flaky", "failing", "10s", "1", "32", "0", "100"]
    assert lines[5].split() == ["busy", "busy", "-", "7", "32", "0", "100"]
    assert lines[6].split() == ["gone", "failing", "15m00s", "-", "-", "-", "-"]
    assert lines[7] == "... and 100 more not listed (the list is capped)"
    quiet = render_status(status_view({"webhooks": [], "totals": {}, "time": 0.0}))
    assert "no webhook failing, stalled or busy" in quiet


def test_status_urls() -> None:
    assert status_url("http://127.0.0.1:9464") == "http://127.0.0.1:9464/status"
    assert status_url("127.0.0.1:9464/") == "http://127.0.0.1:9464/status"
    assert status_url("https://bridge:9464/status") == "https://bridge:9464/status"
    from bridge.ops.status import StatusError

    try:
        status_url("file:///etc/passwd")
    except StatusError as exc:
        assert "http" in str(exc)
    else:
        raise AssertionError("a file URL was accepted")


# --- `bridge status` against an operator port that answers badly ---------------------------------

ESC = "\x1b"


def _answer(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


def _json(body: object) -> Callable[[socket.socket], None]:
    return lambda conn: conn.sendall(_answer(json.dumps(body).encode()))


def _redirect(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: ftp://127.0.0.1:1/status\r\n\r\n")


def _many_headers(conn: socket.socket) -> None:
    fields = b"".join(b"X-%d: y\r\n" % n for n in range(200))
    conn.sendall(b"HTTP/1.1 200 OK\r\n" + fields + b"Content-Length: 2\r\n\r\n{}")


def _nested(conn: socket.socket) -> None:
    conn.sendall(_answer(b'{"webhooks": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"))


def _endless(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + b'{"webhooks": [], "pad": "')
    chunk = b"a" * 2**20
    for _ in range(64):  # 64 MiB, four times the cap (the client closes long before)
        conn.sendall(chunk)


def _trickle(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
    for byte in b'{"webhooks": []' + b" " * 100 + b"}":
        conn.sendall(bytes([byte]))
        time.sleep(0.2)


@contextmanager
def _raw_server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A server on 127.0.0.1 that reads a request and sends ``answer`` (raw bytes, as a hostile
    or broken operator port would): its base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                answer(conn)
            except OSError:
                pass  # the client gave up, as it should

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _printable(text: str) -> bool:
    return all(line.isprintable() for line in text.splitlines())


HOSTILE_ANSWERS = {
    "totals a list": _json({"webhooks": [], "totals": []}),
    "a row not an object": _json({"webhooks": [1, 2]}),
    "credit a string": _json({"webhooks": [{"id": "a", "credit": "x"}]}),
    "failing_since a string": _json({"webhooks": [{"id": "a", "failing_since": "yesterday"}]}),
    "time -1e308": _json({"webhooks": [{"id": "a", "failing_since": 1e308}], "time": -1e308}),
    "an id not a string": _json({"webhooks": [{"id": ["a"]}]}),
    "a count negative": _json({"webhooks": [], "left_out": -1}),
    "a control character in a wrong value": _json({"webhooks": [], "time": ESC + "[2J"}),
    "JSON nested 100,000 deep": _nested,
    "more than 100 headers": _many_headers,
    "a redirect to ftp://": _redirect,
    "an answer past 16 MiB": _endless,
}


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS.values(), ids=HOSTILE_ANSWERS.keys())
def test_status_of_a_hostile_answer_is_one_error_line_and_exit_1(
    answer: Callable[[socket.socket], None], capsys: pytest.CaptureFixture[str]
) -> None:
    with _raw_server(answer) as url:
        assert main(["status", "--url", url, "--timeout", "5"]) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and "Traceback" not in err
    assert len(lines) in (1, 2) and lines[0].startswith("error: "), err
    assert lines[1:] == [] or lines[1].startswith("hint: ")
    assert _printable(err) and ESC not in err


def test_a_redirect_is_not_followed_and_named(capsys: pytest.CaptureFixture[str]) -> None:
    with _raw_server(_redirect) as url:
        assert main(["status", "--url", url]) == 1
    assert "HTTP 302" in capsys.readouterr().err


def test_an_answer_past_the_cap_is_refused_saying_the_cap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _raw_server(_endless) as url:
        assert main(["status", "--url", url]) == 1
    assert "16 MiB" in capsys.readouterr().err


def test_the_timeout_bounds_the_whole_request_of_a_trickling_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every read brings a byte within the timeout: urllib's timeout, per read, never fired. The
    request itself is timed (the command around it imports and parses, slower on a busy host)."""
    with _raw_server(_trickle) as url:
        started = time.monotonic()
        with pytest.raises(StatusError, match="within 1 s"):
            fetch_status(url, timeout=1)
        took = time.monotonic() - started
        assert took < 1 + 0.5, f"a timeout of 1 s took {took:.1f} s"
        assert main(["status", "--url", url, "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "within 1 s" in err


def _timed_out(url: str) -> float:
    """How long ``fetch_status(url, timeout=1)`` took to fail, saying the timeout."""
    started = time.monotonic()
    with pytest.raises(StatusError, match="within 1 s"):
        fetch_status(url, timeout=1)
    return time.monotonic() - started


def test_the_timeout_bounds_a_host_name_that_never_resolves(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Name resolution has no timeout of its own (the system's resolver decides): a resolver
    that never answers still ends the command at its timeout, with one line."""
    released = threading.Event()

    def never(*_args: Any, **_kwargs: Any) -> Any:
        released.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", never)
    try:
        took = _timed_out("http://status.bridge.internal:8080")
        assert took < 1 + 0.5, f"a timeout of 1 s took {took:.1f} s"
        assert (
            main(["status", "--url", "http://status.bridge.internal:8080", "--timeout", "1"]) == 1
        )
    finally:
        released.set()
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "within 1 s" in err and len(err.splitlines()) <= 2


def test_a_failure_inside_the_request_reaches_the_caller_as_one_line() -> None:
    """The request runs on a thread of its own: what fails there is the caller's error, as
    before (a port nobody listens on)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(StatusError, match="cannot read"):
        fetch_status(f"http://127.0.0.1:{port}", timeout=5)


def test_ids_and_the_path_of_the_answer_write_no_control_sequence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    body = {
        "webhooks": [{"id": ESC + "]0;pwned\x07" + ESC + "[2J" + ESC + "[31mFAKE-OK", "active": 1}],
        "config": {"path": "/etc/x" + ESC + "[1A" + ESC + "[2K\rconfig: all good"},
        "totals": {},
    }
    with _raw_server(_json(body)) as url:
        assert main(["status", "--url", url]) == 0
        table = capsys.readouterr().out
        assert main(["status", "--url", url, "--json"]) == 0
        raw = capsys.readouterr().out
    for shown in (table, raw):
        assert ESC not in shown and "\r" not in shown and "\x07" not in shown
        assert _printable(shown)
    assert "\\x1b[31mFAKE-OK" in table and "/etc/x\\x1b[1A" in table
    assert json.loads(raw) == body
