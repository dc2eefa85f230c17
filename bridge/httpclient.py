"""A lean HTTP/1.1 client for webhook POSTs: keep-alive connections per origin, one timer each.

The delivery path is the bottleneck of the whole service, and a general-purpose client spends most
of its time on what a webhook POST never needs (cookies, redirects, tracing, streaming bodies,
per-request objects by the dozen). This client does one thing: send a small body with fixed
headers and report the status. Requests are written as one buffer on a reused connection and
responses are parsed by llhttp (through ``httptools``), the parser Node.js uses.

Behaviour a receiver and an operator can rely on:

- The status is returned as soon as the response head arrives; the body is then read in the
  background up to ``body_limit`` bytes and discarded. A longer body closes the connection, a body
  that does not end before the request's deadline closes it too; either way the status stands.
- One deadline per request covers connecting, TLS, sending and the response head.
- Redirects are never followed: a 3xx is a status like any other.
- TLS is verified against the host name. Every address connected to is checked by the outbound
  policy after resolution (:class:`bridge.netsafety.SafeResolver`), literal addresses included.
- A connection idle for more than ``idle_timeout`` seconds (4 s, below the keep-alive timeout of
  common servers: Node.js 5 s, nginx 75 s) is not reused, so a request rarely meets a connection
  the server is closing. Nothing is ever sent twice here: each attempt is one request, and a
  failure is reported for the retry ladder to handle.
- Response heads larger than ``header_limit`` bytes, malformed responses and protocol upgrades are
  ``invalid_response``.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import quote, urlsplit

import httptools

from bridge.errors import DestinationRefusedError
from bridge.netsafety import SafeResolver

DEFAULT_PORTS: Final = {"http": 80, "https": 443}
PATH_SAFE: Final = "/%:@!$&'()*+,;=-._~?"


class HttpError(Exception):
    """No status was received: ``kind`` is timeout, connection_error, tls_error,
    invalid_response, invalid_request or destination_refused; ``detail`` says what happened."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind}: {detail}")


@dataclass(frozen=True, slots=True)
class Target:
    """A webhook URL taken apart once: where to connect and the fixed start of each request."""

    scheme: str
    host: str
    port: int
    head: bytes

    @classmethod
    def parse(cls, url: str) -> Target:
        """Parse an absolute http(s) URL; raises HttpError(invalid_request) when it is not one."""
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError as exc:
            raise HttpError("invalid_request", f"invalid port in {url!r}: {exc}") from None
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            raise HttpError("invalid_request", f"not an absolute http(s) URL: {url!r}")
        host = parts.hostname
        port = port or DEFAULT_PORTS[parts.scheme]
        try:
            ascii_host = host.encode("idna").decode("ascii") if not host.isascii() else host
        except UnicodeError as exc:
            raise HttpError("invalid_request", f"invalid host name {host!r}: {exc}") from None
        authority = f"[{ascii_host}]" if ":" in ascii_host else ascii_host
        if port != DEFAULT_PORTS[parts.scheme]:
            authority = f"{authority}:{port}"
        path = quote(parts.path or "/", safe=PATH_SAFE)
        if parts.query:
            path = f"{path}?{quote(parts.query, safe=PATH_SAFE)}"
        head = f"POST {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: */*\r\n".encode("ascii")
        return cls(parts.scheme, ascii_host, port, head)


def render_request(target: Target, headers: dict[str, str], body: bytes) -> bytes:
    """The request as written on the wire (pure); HttpError(invalid_request) for a header value
    that would break the message (a line break) or is not Latin-1."""
    block = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if block.count("\n") != len(headers) or block.count("\r") != len(headers):
        raise HttpError("invalid_request", "a header name or value contains a line break")
    try:
        encoded = block.encode("latin-1")
    except UnicodeEncodeError:
        raise HttpError("invalid_request", "a header value is not Latin-1 text") from None
    return b"%s%sContent-Length: %d\r\n\r\n%s" % (target.head, encoded, len(body), body)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one exchange at a time, parsed as bytes arrive."""

    def __init__(
        self,
        pool: list[_Connection],
        live: set[_Connection],
        header_limit: int,
        body_limit: int,
    ) -> None:
        self.pool = pool
        self.live = live  # every open connection of the client, for close()
        self.header_limit = header_limit
        self.body_limit = body_limit
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[int] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timeout = 0.0
        self.status = 0
        self.head_bytes = 0
        self.header_bytes = 0
        self.body_bytes = 0
        self.busy = False
        self.closed = False
        self.idle_since = 0.0

    # ---- the exchange ----------------------------------------------------------------------

    def send(self, data: bytes, deadline: float, timeout: float) -> asyncio.Future[int]:
        """Write one request; the future resolves with the status when the head arrives."""
        assert self.transport is not None
        self.waiter = waiter = self.loop.create_future()
        self.timeout = timeout
        self.timer = self.loop.call_at(deadline, self._expire)
        self.status = self.head_bytes = self.header_bytes = self.body_bytes = 0
        self.busy = True
        self.transport.write(data)
        return waiter

    def _expire(self) -> None:
        self.timer = None
        self._fail(HttpError("timeout", f"no answer in {self.timeout:g}s"))
        self.abort()

    def _fail(self, error: HttpError) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def abort(self) -> None:
        """Drop the connection now (its exchange, if any, is given up)."""
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.abort()

    # ---- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.live.add(self)

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self.abort()  # bytes nobody asked for: the connection cannot be trusted any more
            return
        if self.status == 0:
            self.head_bytes += len(data)  # bytes of a head not yet complete, body perhaps
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.header_bytes = -1
        except httptools.HttpParserError as exc:
            self._fail(HttpError("invalid_response", f"malformed HTTP response: {exc}"[:200]))
            self.abort()
            return
        if self.header_bytes < 0:
            self._fail(HttpError("invalid_response", "the server switched protocols"))
            self.abort()
        elif self.status == 0 and max(self.head_bytes, self.header_bytes) > self.header_limit:
            detail = f"response head larger than {self.header_limit} bytes"
            self._fail(HttpError("invalid_response", detail))
            self.abort()
        elif self.body_bytes > self.body_limit:
            self.abort()  # the status is known; the rest of the body is not worth reading

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.live.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        reason = f": {exc}" if exc is not None else ""
        self._fail(HttpError("connection_error", f"connection closed before a response{reason}"))

    # ---- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)

    def on_headers_complete(self) -> None:
        if self.header_bytes > self.header_limit:
            return  # refused once feeding stops
        status = self.parser.get_status_code()
        if status == 101:
            self.header_bytes = -1  # refused once feeding stops: another protocol follows
            return
        if 100 <= status < 200:
            return  # an interim answer (103 Early Hints...): the real one follows
        self.status = status
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(status)

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)

    def on_message_complete(self) -> None:
        if self.status == 0:
            return  # the end of an interim answer
        self.busy = False
        self.waiter = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.closed or not self.parser.should_keep_alive():
            self.abort()
        else:
            self.idle_since = self.loop.time()
            self.pool.append(self)


class HttpClient:
    """POSTs over pooled keep-alive connections; see the module docstring for the behaviour."""

    def __init__(
        self,
        resolver: SafeResolver,
        *,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 3.0,
        body_limit: int = 4096,
        header_limit: int = 65536,
        idle_timeout: float = 4.0,
    ) -> None:
        self._resolver = resolver
        self._ssl = ssl_context or ssl.create_default_context()
        self._connect_timeout = connect_timeout
        self._body_limit = body_limit
        self._header_limit = header_limit
        self._idle_timeout = idle_timeout
        self._targets: dict[str, Target | HttpError] = {}
        self._pools: dict[tuple[str, str, int], list[_Connection]] = {}
        self._live: set[_Connection] = set()

    def target(self, url: str) -> Target:
        """The parsed URL (cached: webhook URLs are few and used again and again)."""
        target = self._targets.get(url)
        if target is None:
            try:
                target = Target.parse(url)
            except HttpError as exc:
                target = exc
            if len(self._targets) > 10_000:
                self._targets.clear()
            self._targets[url] = target
        if isinstance(target, HttpError):
            raise target
        return target

    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float) -> int:
        """POST ``body`` and return the response status; raises HttpError when none arrived."""
        target = self.target(url)
        data = render_request(target, headers, body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        connection = self._idle(target) or await self._connect(target, deadline, timeout)
        try:
            return await connection.send(data, deadline, timeout)
        except asyncio.CancelledError:
            connection.abort()
            raise

    def _idle(self, target: Target) -> _Connection | None:
        pool = self._pools.get((target.scheme, target.host, target.port))
        if not pool:
            return None
        oldest_allowed = asyncio.get_running_loop().time() - self._idle_timeout
        while pool:
            connection = pool.pop()
            if not connection.closed and connection.idle_since >= oldest_allowed:
                return connection
            connection.abort()
        return None

    async def _connect(self, target: Target, deadline: float, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        key = (target.scheme, target.host, target.port)
        pool = self._pools.setdefault(key, [])
        self._prune(pool, loop.time())
        tls = target.scheme == "https"
        try:
            async with asyncio.timeout_at(min(deadline, loop.time() + self._connect_timeout)):
                addresses = await self._resolver.resolve(target.host, target.port)
                errors: list[str] = []
                for address in addresses:
                    try:
                        _transport, connection = await loop.create_connection(
                            lambda: _Connection(
                                pool, self._live, self._header_limit, self._body_limit
                            ),
                            address,
                            target.port,
                            ssl=self._ssl if tls else None,
                            server_hostname=target.host if tls else None,
                        )
                    except ssl.SSLError as exc:
                        raise HttpError("tls_error", f"{target.host}: {exc}"[:200]) from None
                    except OSError as exc:
                        errors.append(f"{address}: {exc.strerror or exc}")
                        continue
                    return connection
        except TimeoutError:
            limit = min(timeout, self._connect_timeout)
            detail = f"could not connect to {target.host}:{target.port} in {limit:g}s"
            raise HttpError("timeout", detail) from None
        except DestinationRefusedError as exc:
            raise HttpError("destination_refused", exc.detail) from None
        except OSError as exc:  # name resolution
            detail = f"cannot resolve {target.host}: {exc.strerror or exc}"
            raise HttpError("connection_error", detail) from None
        raise HttpError("connection_error", "; ".join(errors)[:200] or "no address to connect to")

    def _prune(self, pool: list[_Connection], now: float) -> None:
        """Close idle connections that are too old to reuse (the oldest sit at the front)."""
        stale = 0
        for connection in pool:
            if not connection.closed and now - connection.idle_since < self._idle_timeout:
                break
            connection.abort()
            stale += 1
        del pool[:stale]

    async def close(self) -> None:
        """Close every connection."""
        for connection in list(self._live):
            connection.abort()
        self._live.clear()
        self._pools.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks
