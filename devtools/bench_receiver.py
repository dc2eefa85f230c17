"""A fast webhook receiver for the benchmark, run in its own process.

It answers by path prefix: ``/ok`` 200, ``/fail`` 500, ``/retry`` 500 to the first ``--fail-first``
requests of each ``webhook-id`` then 200, ``/hang`` never answers. It logs every request as
(arrival time, path, webhook-id, status) in memory; ``GET /__stats`` returns counts and
``POST /__dump`` writes the log as JSON lines to ``--out`` and clears it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

from aiohttp import web


class BenchReceiver:
    """The receiver's state: behaviour settings, per-id attempt counts and the request log."""

    def __init__(self, fail_first: int, out: str) -> None:
        self.fail_first = fail_first
        self.out = out
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
        return web.Response(status=status)

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


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-first", type=int, default=1)
    args = parser.parse_args()
    receiver = BenchReceiver(args.fail_first, args.out)
    app = web.Application()
    app.router.add_get("/__stats", receiver.stats)
    app.router.add_post("/__dump", receiver.dump)
    app.router.add_route("*", "/{tail:.*}", receiver.handle)
    import uvloop

    web.run_app(
        app,
        loop=uvloop.new_event_loop(),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()
