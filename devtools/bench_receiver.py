"""A fast webhook receiver for the benchmark, run in its own process.

It answers by path prefix: ``/ok`` 200, ``/close`` 200 and closes the connection (``Connection:
close``, as a receiver that keeps no connection open), ``/fail`` 500, ``/retry`` 500 to the first
``--fail-first`` requests of each ``webhook-id`` then 200, ``/slow`` 200 after ``--slow-seconds``
(1 s by default), ``/hang`` never answers. It logs every request as (arrival time, path,
webhook-id, status) in memory (``/slow`` at its answer); ``GET /__stats`` returns counts and
``POST /__dump`` writes the log as JSON lines to ``--out`` and clears it. ``POST /__drain`` (the
soak's, ``devtools.soak``) answers the log so far as a JSON list and clears only the log, keeping
the counts and the ``/retry`` attempts seen.

With ``--tls-port`` and ``--tls-cert`` (a PEM file holding the key and the certificate chain) the
same application is also served over TLS on that port (``devtools.bench_https`` makes the
certificate, from a private CA made for the run). TLS session tickets are on (OpenSSL's default):
a client may resume its sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import time
from collections import Counter

from aiohttp import web

from bridge.ops.collector import settle

BACKLOG = 4096


class BenchReceiver:
    """The receiver's state: behaviour settings, per-id attempt counts and the request log."""

    def __init__(self, fail_first: int, out: str, slow_seconds: float = 1.0) -> None:
        self.fail_first = fail_first
        self.out = out
        self.slow_seconds = slow_seconds
        self.log: list[tuple[float, str, str, int]] = []
        self.seen: Counter[str] = Counter()
        self.received = 0

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        path = request.path
        message_id = request.headers.get("webhook-id", "")
        if path.startswith("/hang"):
            self.log.append((time.time(), path, message_id, 0))
            await asyncio.sleep(3600)
        if path.startswith("/slow"):
            await asyncio.sleep(self.slow_seconds)
        status = 200
        if path.startswith("/fail"):
            status = 500
        elif path.startswith("/retry"):
            seen = self.seen[message_id]
            self.seen[message_id] = seen + 1
            status = 500 if seen < self.fail_first else 200
        if status == 200:
            self.received += 1
        self.log.append((time.time(), path, message_id, status))
        response = web.Response(status=status)
        if path.startswith("/close"):
            response.force_close()  # answers with Connection: close, then closes
        return response

    async def stats(self, _request: web.Request) -> web.Response:
        return web.json_response({"received": self.received, "requests": len(self.log)})

    async def dump(self, _request: web.Request) -> web.Response:
        with open(self.out, "w") as out:
            for entry in self.log:
                out.write(json.dumps(entry) + "\n")
        count = len(self.log)
        self.log.clear()
        self.seen.clear()
        self.received = 0
        return web.json_response({"written": count})

    async def drain(self, _request: web.Request) -> web.Response:
        entries, self.log = self.log, []
        return web.json_response(entries)


def make_app(receiver: BenchReceiver) -> web.Application:
    """The receiver's routes: statistics, the log dump, and every other path answered."""
    app = web.Application()
    app.router.add_get("/__stats", receiver.stats)
    app.router.add_post("/__dump", receiver.dump)
    app.router.add_post("/__drain", receiver.drain)
    app.router.add_route("*", "/{tail:.*}", receiver.handle)
    return app


def server_context(cert_file: str) -> ssl.SSLContext:
    """The TLS server context: the key and chain from ``cert_file`` (one PEM file)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file)
    return context


async def serve(
    app: web.Application, port: int, tls_port: int = 0, tls_cert: str | None = None
) -> None:
    """Serve ``app`` over HTTP on ``port``, and over TLS with ``tls_cert`` on ``tls_port`` when
    both are given, until cancelled."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    # A backlog of 4,096 (the kernel's somaxconn here; aiohttp's default is 128): a bridge
    # opening connections to 500 host names at once overflowed 128, and connections waited
    # for SYN retransmissions (1 s, 3 s), timing out on the stand-in, not on the bridge.
    await web.TCPSite(runner, "127.0.0.1", port, backlog=BACKLOG).start()
    if tls_port and tls_cert:
        context = server_context(tls_cert)
        site = web.TCPSite(runner, "127.0.0.1", tls_port, ssl_context=context, backlog=BACKLOG)
        await site.start()
    # The bridge's collector settings: with 2,000 requests in flight (``--only many``) each
    # waits long enough to be promoted, and CPython's thresholds then ran full collections
    # often enough to cost the stand-in 0.134 ms of CPU per request against 0.118 ms with these
    # (0.056 with one webhook's 64 in flight), on the cores the bridge shares with it.
    settle()
    try:
        await asyncio.Event().wait()  # until killed
    finally:
        await runner.cleanup()


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-first", type=int, default=1)
    parser.add_argument("--slow-seconds", type=float, default=1.0, help="how long /slow waits")
    parser.add_argument("--tls-port", type=int, default=0, help="also serve over TLS here")
    parser.add_argument("--tls-cert", help="PEM file: the key and the certificate chain")
    args = parser.parse_args()
    if args.tls_port and not args.tls_cert:
        parser.error("--tls-port needs --tls-cert")
    app = make_app(BenchReceiver(args.fail_first, args.out, args.slow_seconds))
    import uvloop

    uvloop.run(serve(app, args.port, args.tls_port, args.tls_cert))


if __name__ == "__main__":
    main()
