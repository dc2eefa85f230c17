"""The sample receiver (``python -m devtools receive``): verifies every webhook and prints it as a
line.

It learns each path's secret and signature scheme from a bridge configuration file, checks
``x-service-secret`` and ``webhook-signature`` with :func:`bridge.core.verify.verify`, checks the
event kind, and answers 2xx. For demonstrations, a path can fail its first tries (``--flaky``) or
always (``--down``). Unknown paths and bad signatures get 401 and a red line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO
from urllib.parse import urlsplit

from aiohttp import web

from bridge.core.settings import Config
from bridge.core.verify import VerificationError, verify


@dataclass
class Endpoint:
    """What the receiver knows of one path: the webhook it belongs to and its secret."""

    webhook_id: str
    secret: bytes
    scheme: str
    standard_webhooks_secret: bytes | None = None


@dataclass
class SampleReceiver:
    """The receiver's state: endpoints, demo behaviours, counts, and where it prints."""

    endpoints: dict[str, Endpoint]
    flaky: dict[str, int] = field(default_factory=dict)  # path -> failures per webhook-id
    down: set[str] = field(default_factory=set)
    out: TextIO = sys.stdout
    color: bool = False
    seen: Counter[tuple[str, str]] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)

    @classmethod
    def from_config(cls, config: Config, **options: object) -> SampleReceiver:
        """Endpoints for every webhook of ``config``, keyed by the path of its URL."""
        endpoints = {
            urlsplit(w.url).path or "/": Endpoint(
                w.id,
                w.secret.reveal(),
                w.signature,
                w.standard_webhooks_secret.reveal() if w.standard_webhooks_secret else None,
            )
            for w in config.webhooks
        }
        return cls(endpoints, **options)  # type: ignore[arg-type]

    def _paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def _print(self, mark: str, code: str, path: str, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"{stamp} {self._paint(mark, code)} {path:20s} {text}", file=self.out, flush=True)

    async def handle(self, request: web.Request) -> web.Response:
        """Verify, print and answer one webhook request."""
        body = await request.read()
        path = request.path
        endpoint = self.endpoints.get(path)
        if endpoint is None:
            self.counts["unknown"] += 1
            self._print("?", "33", path, "no webhook is configured with this path -> 404")
            return web.Response(status=404)
        try:
            event = verify(
                request.headers,
                body,
                endpoint.secret,
                scheme=endpoint.scheme,  # type: ignore[arg-type]
                standard_webhooks_secret=endpoint.standard_webhooks_secret,
            )
        except VerificationError as exc:
            self.counts["rejected"] += 1
            self._print("✗", "31", path, f"signature rejected: {exc} -> 401")
            return web.Response(status=401)
        message_id = request.headers.get("webhook-id", "")
        tries = self.seen[(path, message_id)]
        self.seen[(path, message_id)] = tries + 1
        summary = _describe(event)
        if path in self.down or tries < self.flaky.get(path, 0):
            self.counts["failed"] += 1
            why = "always fails" if path in self.down else f"fails try {tries + 1}"
            self._print("↻", "33", path, f"{summary}  ({why} -> 503)")
            return web.Response(status=503)
        self.counts["received"] += 1
        again = f"  (try {tries + 1})" if tries else ""
        self._print("✓", "32", path, f"{summary}  signature ok{again}")
        return web.Response(status=204)


def _describe(event: dict[str, object]) -> str:
    kind = str(event.get("event", "?"))
    text = f"{kind:20s} {event.get('transactionId')}  amount={event.get('amount')}"
    if kind == "transaction.failed":
        text += f"  failure={event.get('failureCode')}"
    return text


def parse_path_count(text: str) -> tuple[str, int]:
    """``/path:N`` for ``--flaky``."""
    path, _, count = text.rpartition(":")
    if not path.startswith("/") or not count.isdigit():
        raise ValueError(f"expected /path:N, got {text!r}")
    return path, int(count)


async def serve(
    receiver: SampleReceiver, host: str, port: int, ready: Callable[[], None] | None = None
) -> None:
    """Serve until cancelled."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    if ready is not None:
        ready()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def describe_endpoints(receiver: SampleReceiver) -> str:
    """One line per endpoint, for the start-up banner."""
    lines = []
    for path, endpoint in sorted(receiver.endpoints.items()):
        mode = (
            "always fails"
            if path in receiver.down
            else (
                f"fails the first {receiver.flaky[path]} tries"
                if path in receiver.flaky
                else "answers 204"
            )
        )
        lines.append(f"  {path:24s} webhook {endpoint.webhook_id} ({endpoint.scheme}), {mode}")
    return "\n".join(lines)


def counts_json(receiver: SampleReceiver) -> str:
    """The receiver's counts as JSON (for scripts)."""
    return json.dumps(dict(receiver.counts))
