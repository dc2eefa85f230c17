"""The operator port against clients that try to exhaust it (raw sockets on 127.0.0.1): its
connections, their idleness, their bytes and the metrics rendering are bounded, and it goes on
answering the clients within the bounds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop
from prometheus_client import CollectorRegistry, Counter

from bridge.core.slices import Slices
from bridge.ops import health
from bridge.ops.health import health_app, start_health_server

Check = Callable[[int], Awaitable[None]]


def serve(check: Check) -> None:
    """Run ``check(port)`` against a running operator server, on asyncio's event loop and on
    uvloop's (``bridge run``'s: its transports are not asyncio's classes)."""

    async def main() -> None:
        registry = CollectorRegistry()
        Counter("bridge_example_total", "x", registry=registry).inc()
        runner = await start_health_server(
            health_app(registry, time.monotonic, lambda: {"ok": True}), "127.0.0.1", 0
        )
        try:
            await asyncio.wait_for(check(runner.addresses[0][1]), 20)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    uvloop.run(main())


async def healthz(port: int) -> bytes:
    """One GET /healthz on a new connection: the status line."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return (await reader.readline()).strip()
    finally:
        writer.close()


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server ends the connection (EOF or reset) within ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def test_connections_past_the_limit_are_closed_at_once_and_the_rest_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health, "MAX_CONNECTIONS", 8)

    async def check(port: int) -> None:
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(8)]
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_server(reader, 2.0), "the ninth is closed"
        writer.close()
        for _reader, each in idle[:2]:
            each.close()
        deadline = time.monotonic() + 5
        while (answer := await healthz(port)) != b"HTTP/1.1 200 OK":
            assert time.monotonic() < deadline, answer
            await asyncio.sleep(0.05)
        for _reader, each in idle[2:]:
            each.close()

    serve(check)


def test_a_silent_connection_is_closed_after_the_idle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "IDLE_S", 0.3)

    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        assert await closed_by_server(reader, 5.0)
        assert 0.3 <= time.monotonic() - started < 2.5
        writer.close()
        assert await healthz(port) == b"HTTP/1.1 200 OK"

    serve(check)


def test_a_connection_past_its_lifetime_is_closed_however_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health, "LIFETIME_S", 0.5)

    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        answers = 0
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            while time.monotonic() - started < 5:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                await reader.readuntil(b"}")
                answers += 1
        assert answers > 1 and time.monotonic() - started < 2.5
        writer.close()

    serve(check)


def test_a_connection_sending_past_its_byte_bound_is_closed_and_unread_answers_stay_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pipelined requests that are never read (each answer rendered for nobody): the connection
    is closed once it has sent MAX_REQUEST_BYTES, and /metrics was rendered once for them all."""
    renders = []
    real = health.render

    async def counted(registry: CollectorRegistry, slices: Slices) -> bytes:
        renders.append(1)
        return await real(registry, slices)

    monkeypatch.setattr(health, "render", counted)

    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        renders.clear()  # (each event loop's run on its own)
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        count = health.MAX_REQUEST_BYTES // len(request) + 100
        writer.write(request * count)
        assert await closed_by_server(reader, 5.0)
        writer.close()
        assert len(renders) <= 2, renders
        assert await healthz(port) == b"HTTP/1.1 200 OK"

    serve(check)


def test_metrics_are_rendered_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    renders = []
    real = health.render

    async def counted(registry: CollectorRegistry, slices: Slices) -> bytes:
        renders.append(time.monotonic())
        return await real(registry, slices)

    monkeypatch.setattr(health, "render", counted)
    monkeypatch.setattr(health, "METRICS_MAX_AGE_S", 0.2)

    async def check(port: int) -> None:
        renders.clear()  # (each event loop's run on its own)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        bodies = set()
        while time.monotonic() - started < 0.9:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            bodies.add(await reader.readexactly(length))
            await asyncio.sleep(0.01)
        writer.close()
        assert any(b"bridge_example_total 1.0" in body for body in bodies)
        assert 2 <= len(renders) <= 6, renders

    serve(check)


def test_a_metrics_answer_says_when_its_figures_were_read() -> None:
    async def check(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        before = time.time()
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
        writer.close()
        rendered = float(head.split(f"{health.RENDERED_HEADER.lower()}: ")[1].split("\r\n")[0])
        assert before - 0.002 <= rendered <= time.time() + 0.002

    serve(check)


async def get_metrics(port: int) -> bytes:
    """One GET /metrics on a new connection: its body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return (await reader.read()).split(b"\r\n\r\n", 1)[1]
    finally:
        writer.close()


def test_requests_during_a_render_share_it_and_a_client_leaving_does_not_end_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ten scrapes arrive while a render is under way (it waits on an event the test sets) and
    the first of them goes away: one render, and the other nine get its bytes."""
    renders = []

    async def check(port: int) -> None:
        renders.clear()  # (each event loop's run on its own)
        go = asyncio.Event()

        async def slow(_registry: CollectorRegistry, _slices: Slices) -> bytes:
            renders.append(1)
            await go.wait()
            return b"figures %d\n" % len(renders)

        monkeypatch.setattr(health, "render", slow)
        leaving = asyncio.create_task(get_metrics(port))
        while not renders:
            await asyncio.sleep(0.01)
        leaving.cancel()
        others = [asyncio.create_task(get_metrics(port)) for _ in range(9)]
        await asyncio.sleep(0.2)  # (they are all waiting on the render)
        go.set()
        assert await asyncio.gather(*others) == [b"figures 1\n"] * 9
        assert len(renders) == 1

    serve(check)


def test_renders_take_at_most_their_share_of_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A render that held the loop for 0.1 s is not started again within 0.1 / RENDER_SHARE = 1
    s, however often the clients ask; once that time has passed, the next request renders."""
    renders: list[float] = []

    async def held(_registry: CollectorRegistry, slices: Slices) -> bytes:
        renders.append(time.monotonic())
        slices._held = 0.1  # (what it held the loop for)
        return b"figures %d\n" % len(renders)

    monkeypatch.setattr(health, "render", held)
    monkeypatch.setattr(health, "METRICS_MAX_AGE_S", 0.05)

    async def check(port: int) -> None:
        renders.clear()  # (each event loop's run on its own)
        started = time.monotonic()
        while time.monotonic() - started < 0.6:
            assert await get_metrics(port) == b"figures 1\n"
            await asyncio.sleep(0.02)
        assert len(renders) == 1
        while time.monotonic() - renders[0] < 1.0 + 0.1:  # (and ten times the rest it held)
            await asyncio.sleep(0.05)
        assert await get_metrics(port) == b"figures 2\n"
        assert renders[1] - renders[0] >= 0.1 / health.RENDER_SHARE

    serve(check)


def test_a_failed_render_answers_an_error_until_the_next_render_and_counts_in_the_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A render that fails after holding the loop for 0.1 s: every request until the next render
    is answered 500 (never an empty or older answer), the next render starts no sooner than 0.1
    / RENDER_SHARE = 1 s later (failing renders take no more of the loop than good ones), and
    it is answered then."""
    calls: list[float] = []

    async def flaky(_registry: CollectorRegistry, slices: Slices) -> bytes:
        calls.append(time.monotonic())
        if len(calls) == 1:
            slices._held = 0.1  # (what the failed render held the loop for)
            raise RuntimeError("a collector failed")
        return b"figures\n"

    monkeypatch.setattr(health, "render", flaky)
    monkeypatch.setattr(health, "METRICS_MAX_AGE_S", 0.01)

    async def check(port: int) -> None:
        calls.clear()  # (each event loop's run on its own)
        statuses = []
        while not calls or time.monotonic() - calls[0] < 0.5:  # (half a second to spare)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            statuses.append((await reader.readline()).split(b" ")[1])
            writer.close()
            await asyncio.sleep(0.01)
        assert set(statuses) == {b"500"} and len(calls) == 1
        while time.monotonic() - calls[0] < 1.0 + 0.1:  # (and ten times the rest it held)
            await asyncio.sleep(0.01)
        assert await get_metrics(port) == b"figures\n"
        assert len(calls) == 2 and calls[1] - calls[0] >= 1.0
        assert await healthz(port) == b"HTTP/1.1 200 OK"

    serve(check)


def test_a_render_that_held_the_loop_very_long_delays_the_next_no_more_than_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Wall time held is inflated by a pause of the whole process: the next render comes no later
    than MAX_SPACING_S after the last one started, whatever it held."""
    renders: list[float] = []

    async def held(_registry: CollectorRegistry, slices: Slices) -> bytes:
        renders.append(time.monotonic())
        slices._held = 3600.0  # (what it held the loop for, a pause of the process included)
        return b"figures %d\n" % len(renders)

    monkeypatch.setattr(health, "render", held)
    monkeypatch.setattr(health, "MAX_SPACING_S", 1.0)

    async def check(port: int) -> None:
        renders.clear()  # (each event loop's run on its own)
        assert await get_metrics(port) == b"figures 1\n"
        await asyncio.sleep(0.1)
        assert await get_metrics(port) == b"figures 1\n"
        while time.monotonic() - renders[0] < 1.0 + 0.02:
            await asyncio.sleep(0.01)
        assert await get_metrics(port) == b"figures 2\n"
        assert len(renders) == 2

    serve(check)
