"""A real HTTP webhook receiver on loopback for integration tests.

Runs an aiohttp server on its own thread and event loop. Each path has a behaviour deciding the
answer from how many times that ``webhook-id`` was seen on that path; every request is recorded.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from devtools.devkafka import free_port


@dataclass(frozen=True)
class Answer:
    """How to answer one request: a status, optionally after a delay, or hang / reset."""

    status: int = 200
    delay: float = 0.0
    hang: bool = False
    reset: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


Behaviour = Callable[[int], Answer]  # seen-before count of this webhook-id on this path -> answer


def always(status: int) -> Behaviour:
    """Answer every request with ``status``."""
    return lambda _seen: Answer(status)


def fail_first(times: int, status: int = 500) -> Behaviour:
    """Fail the first ``times`` requests of each webhook-id with ``status``, then answer 200."""
    return lambda seen: Answer(status) if seen < times else Answer(200)


def warmed_then(answer: Answer) -> Behaviour:
    """Answer 200 at once to the path's very first request (it shows the bridge that the webhook
    answers, which opens its whole concurrency limit), then ``answer`` to every request."""
    calls = itertools.count()
    return lambda _seen: Answer(200) if next(calls) == 0 else answer


@dataclass(frozen=True)
class Received:
    """One request as the receiver saw it."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() on arrival
    status: int  # what we answered (0 for hang/reset)

    @property
    def message_id(self) -> str:
        return self.headers.get("webhook-id", "")


class Receiver:
    """The receiver: ``url(path)`` to point webhooks at it, ``requests`` to read what arrived."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.port = free_port()
        self.ssl_context = ssl_context  # served over TLS with it (https URLs) when given
        self.behaviours: dict[str, Behaviour] = {}
        self.requests: list[Received] = []
        self._seen: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, name="test-receiver", daemon=True)

    def url(self, path: str) -> str:
        """The URL of ``path`` on this receiver."""
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def start(self) -> Receiver:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("test receiver did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=self.ssl_context).start()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
        # The connections cleanup closed close their sockets in callbacks of the loop's next
        # turn: let it come before the loop is closed (else they are closed by the collector,
        # in whichever test runs then, with a ResourceWarning).
        await asyncio.sleep(0)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        key = (request.path, headers.get("webhook-id", ""))
        with self._lock:
            seen = self._seen.get(key, 0)
            self._seen[key] = seen + 1
        behaviour = self.behaviours.get(request.path, always(200))
        answer = behaviour(seen)
        status = 0 if (answer.hang or answer.reset) else answer.status
        with self._lock:
            self.requests.append(Received(request.path, headers, body, time.time(), status))
        if answer.delay:
            await asyncio.sleep(answer.delay)
        if answer.hang:
            await asyncio.sleep(3600)
        if answer.reset:
            transport = request.transport
            if transport is not None:
                transport.abort()
            return web.Response(status=500)
        return web.Response(status=answer.status, headers=answer.headers, body=answer.body)

    def on(self, path: str) -> list[Received]:
        """Requests received on ``path`` so far."""
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def received_ids(self, path: str) -> set[str]:
        """The webhook-ids answered with a 2xx on ``path``."""
        return {r.message_id for r in self.on(path) if 200 <= r.status < 300}
