"""The operator HTTP port: ``/metrics``, ``/healthz``, ``/readyz`` and ``/status``.

- ``/healthz`` (liveness): 200 while the consume loop has turned within ``LOOP_STALL_S``; a stuck
  process answers 503 and Kubernetes restarts it.
- ``/readyz`` (readiness): 200 when the configuration is loaded, a broker is reachable, and the
  consumer is assigned partitions or waiting for an assignment in a healthy group; 503 otherwise,
  with the failing checks in the body. The body's ``config`` part says whether the file on disk
  is in force and, while a changed file is rejected, its problems (the bridge stays ready: it
  keeps delivering with the configuration in force).
- ``/status``: per-webhook detail outside Prometheus, as JSON (:mod:`bridge.ops.status`): the
  webhooks failing, stalled, out of credit or busy now (ids only, bounded), the totals, and the
  configuration in force.

The port shares the event loop, and the process's file descriptors, with every delivery, and
whoever can reach it is not trusted (a hostile review: 21,000 idle connections used every
descriptor, so deliveries failed with "Too many open files"; 100 connections pipelining
unread ``/metrics`` requests held the loop for seconds). So what clients can make it do is
bounded (:class:`_Guard`): at most :data:`MAX_CONNECTIONS` connections at once (more are closed
as they come), each closed after :data:`IDLE_S` without a byte from its client, after
:data:`LIFETIME_S` in all, or once it has sent :data:`MAX_REQUEST_BYTES`.

``/metrics`` is written in slices of at most about 2 ms, the loop given back between them
(:mod:`bridge.ops.exposition`: with ``webhook_series: 1000`` one piece held every delivery for
0.2 s). It is rendered at most once per :data:`METRICS_MAX_AGE_S`, and at most
:data:`RENDER_SHARE` of the time (a render that held the loop for 0.2 s is not started again
within 2 s; never more than :data:`MAX_SPACING_S` apart); every request in between, or while a
render is under way, is answered with the bytes of one render (the ``Bridge-Rendered-At`` header
says when its figures were read), or a 500 if it failed (logged as ``metrics.render_failed``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Final, cast

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from bridge.core.slices import Slices
from bridge.ops.exposition import render

log = logging.getLogger("bridge.ops.health")

LOOP_STALL_S = 60.0
MAX_CONNECTIONS: Final = 64
"""Connections the port holds at once (Prometheus, kubelet probes, an operator): well within
the descriptors kept for everything but deliveries (:data:`bridge.ops.limits.OTHER_FILES`)."""
IDLE_S: Final = 10.0
"""A connection whose client sent nothing for this long is closed (a keep-alive scraper
reconnects at its next scrape)."""
LIFETIME_S: Final = 120.0
MAX_REQUEST_BYTES: Final = 64 * 1024
"""The most bytes one connection may send (its requests' heads: a few hundred bytes each)."""
METRICS_MAX_AGE_S: Final = 1.0
RENDER_SHARE: Final = 0.1
"""The most of the loop's time ``/metrics`` renders take, however often it is asked: the next
render starts no sooner than the last one held the loop, divided by this, whether it succeeded
or failed (a failed render's answer, a 500, stands until then)..."""
MAX_SPACING_S: Final = 10.0
"""...but no later than this after the last one started: the time held is wall time, which a
pause of the whole process (a stopped container, a throttled CPU) inflates."""
RENDERED_HEADER: Final = "Bridge-Rendered-At"
"""The header of a ``/metrics`` answer saying when its figures were read (Unix time, seconds)."""


def health_app(
    registry: CollectorRegistry,
    last_loop: Callable[[], float],
    readiness: Callable[[], dict[str, bool]],
    config_state: Callable[[], dict[str, object]] = dict,
    status: Callable[[], dict[str, object]] | None = None,
) -> web.Application:
    """The aiohttp application serving the endpoints (``/status`` only when ``status`` is given)."""

    next_render_at, rendered, rendered_wall = float("-inf"), b"", ""
    rendering: asyncio.Task[None] | None = None
    failed = False  # the last render failed: its answer stands until the next one

    async def render_now() -> None:
        nonlocal next_render_at, rendered, rendered_wall, failed
        started, wall = time.monotonic(), f"{time.time():.3f}"
        slices = Slices()
        failed = True
        try:
            rendered = await render(registry, slices)
            rendered_wall, failed = wall, False
        except Exception:
            log.exception("metrics.render_failed")
        finally:  # (a render that fails counts too)
            spacing = min(max(METRICS_MAX_AGE_S, slices.held / RENDER_SHARE), MAX_SPACING_S)
            next_render_at = started + spacing

    async def metrics(_request: web.Request) -> web.Response:
        nonlocal rendering
        if (rendering is None or rendering.done()) and time.monotonic() >= next_render_at:
            rendering = asyncio.get_running_loop().create_task(render_now())
        if rendering is not None and not rendering.done():
            await asyncio.shield(rendering)  # (a client leaving does not end it for the others)
        if failed:
            raise web.HTTPInternalServerError(text="the metrics could not be rendered\n")
        # (RENDERED_HEADER: when the figures were read, for a reader that needs them fresher)
        headers = {"Content-Type": CONTENT_TYPE_LATEST, RENDERED_HEADER: rendered_wall}
        return web.Response(body=rendered, headers=headers)

    async def stop_rendering(_app: web.Application) -> None:
        if rendering is not None:
            rendering.cancel()

    async def healthz(_request: web.Request) -> web.Response:
        stalled = time.monotonic() - last_loop()
        ok = stalled < LOOP_STALL_S
        body = {"status": "ok" if ok else "stalled", "loop_age_seconds": round(stalled, 3)}
        return web.json_response(body, status=200 if ok else 503)

    async def readyz(_request: web.Request) -> web.Response:
        checks = readiness()
        ok = all(checks.values())
        return web.Response(
            text=json.dumps({"ready": ok, "checks": checks, "config": config_state()}),
            status=200 if ok else 503,
            content_type="application/json",
        )

    async def status_view(_request: web.Request) -> web.Response:
        assert status is not None
        return web.Response(
            text=json.dumps(status(), separators=(",", ":")),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    app = web.Application()
    app.on_cleanup.append(stop_rendering)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if status is not None:
        app.router.add_get("/status", status_view)
    return app


async def start_health_server(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve ``app`` on host:port, its connections bounded (:class:`_Guard`); returns the runner
    to clean up at shutdown."""
    runner = _GuardedRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


class _GuardedRunner(web.AppRunner):
    """aiohttp's runner whose server (the protocol factory every site listens with) is wrapped
    in a :class:`_Guard`."""

    async def _make_server(self) -> Any:
        return _Guard(await super()._make_server())


class _Guard:
    """aiohttp's ``web.Server`` (a protocol factory) with its connections bounded: at most
    :data:`MAX_CONNECTIONS` at once, each closed after :data:`IDLE_S` without a byte from its
    client, :data:`LIFETIME_S` in all, or :data:`MAX_REQUEST_BYTES` received. Everything else is
    the server's own (its shutdown closes the connections it was given)."""

    def __init__(self, server: Any) -> None:
        self._server = server
        self.open: dict[_Guarded, None] = {}
        self._sweeper: asyncio.TimerHandle | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    def __call__(self) -> asyncio.Protocol:
        return _Guarded(self, self._server())

    def admit(self, connection: _Guarded) -> bool:
        if len(self.open) >= MAX_CONNECTIONS:
            return False
        self.open[connection] = None
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(1.0, self._sweep)
        return True

    def _sweep(self) -> None:
        self._sweeper = None
        now = time.monotonic()
        for connection in list(self.open):
            if now - connection.heard >= IDLE_S or now - connection.since >= LIFETIME_S:
                connection.close()
        if self.open:
            self._sweeper = asyncio.get_running_loop().call_later(1.0, self._sweep)


class _Guarded(asyncio.Protocol):
    """One connection of a :class:`_Guard`: aiohttp's protocol for it, refused (closed at
    once) when the guard is full, closed when it breaks a bound."""

    def __init__(self, guard: _Guard, inner: Any) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self.since = self.heard = time.monotonic()
        self.received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        if not self._guard.admit(self):
            self._transport.abort()
            return
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self not in self._guard.open:
            return
        self.heard = time.monotonic()
        self.received += len(data)
        if self.received > MAX_REQUEST_BYTES:
            self.close()
            return
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self not in self._guard.open:
            return None
        return self._inner.eof_received()  # type: ignore[no-any-return]

    def pause_writing(self) -> None:
        if self in self._guard.open:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self in self._guard.open:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._guard.open.pop(self, 0) is None:  # (admitted: the protocol has it)
            self._inner.connection_lost(exc)

    def close(self) -> None:
        """Close the connection now, whatever it was doing (its protocol is told)."""
        if self._transport is not None:
            self._transport.abort()
