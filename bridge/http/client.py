"""A lean HTTP/1.1 client for webhook POSTs: keep-alive connections per origin, one timer each.

The delivery path is the bottleneck of the whole service, and a general-purpose client spends most
of its time on what a webhook POST never needs (cookies, redirects, tracing, streaming bodies,
per-request objects by the dozen). This client does one thing: send a small body with fixed
headers and report the status. Requests are written as one buffer on a reused connection and
responses are parsed by llhttp (through ``httptools``), the parser Node.js uses.

Behaviour a receiver and an operator can rely on:

- The status is returned only for a complete response: once the response message has ended (by
  its ``Content-Length``, its last chunk, or the server closing the connection after a body
  framed by neither), or once its body has passed ``body_limit`` bytes (the receiver clearly
  answered; the status stands and the connection is closed rather than drained). A response cut
  by a reset or an end of stream before its end, invalid chunked encoding or any other malformed
  byte, and a body that does not end before the deadline give no status: they fail with
  ``connection_error``, ``invalid_response`` and ``timeout``. So a ``200`` head followed by a
  body that never ends is a ``timeout`` when the body trickles, and ``200`` when it passes
  ``body_limit`` before the deadline.
- One deadline per request covers connecting, TLS, sending, the response head and its body.
- Interim answers (``100 Continue``, ``103 Early Hints``...) are skipped; ``101 Switching
  Protocols`` (an upgrade) is ``invalid_response``.
- Redirects are never followed: a 3xx is a status like any other.
- One exchange per connection at a time, strictly: a connection goes back to the pool only when
  the bytes received on it were exactly one complete response to the request it carried (empty
  lines between messages aside, which llhttp skips and which cannot form an answer). Bytes after
  the response in the segment that completes it (a second response, garbage) fail the attempt
  (``invalid_response``: an answer followed by bytes nobody asked for is not trusted) and close
  the connection. Bytes that arrive later while it is idle, and data or an end of stream waiting
  in the socket when it is taken from the pool (checked without blocking before each reuse),
  close it. The residual that no client can close: a server that answers
  before it has read the request it answers (a fresh connection's first request, or bytes still
  in flight when a pooled connection is checked) is indistinguishable from a fast answer; only
  that receiver's own deliveries can be affected.
- TLS is verified against the host name. Every address connected to is checked by the outbound
  policy after resolution (:class:`bridge.http.resolver.SafeResolver`), literal addresses
  included. URLs are judged by :func:`bridge.core.urls.parse_webhook_url` (IDNA 2008 host names,
  no userinfo, no control characters).
- Through a context of :mod:`bridge.http.tls` (the default), the TLS records of each exchange
  are bounded, those that carry no data (session tickets, key updates: the HTTP parser never
  sees them) most: past either bound the connection ends (``tls_error``).
- Through a context of :mod:`bridge.http.tls` (the default), a new connection resumes the TLS
  session of an earlier full handshake with the same host name through the same context, for a
  few minutes (see that module): a receiver closing after each answer costs an abbreviated
  handshake.
- A closed connection holds nothing: its transport (and with it the TLS state, a 256 KB read
  buffer and OpenSSL's objects) and its parser are released when the connection is lost, not left
  for the cyclic garbage collector. A receiver closing after each answer thus leaves no pile of
  dead TLS connections, whose memory the C allocator kept once they were collected (issue 22).
  Every :data:`TRIM_EVERY` TLS connections closed, glibc is asked to give back the free memory
  of its heaps (:class:`_Trimmer`).
- A connection idle for more than ``idle_timeout`` seconds (4 s, below the keep-alive timeout of
  common servers: Node.js 5 s, nginx 75 s) is not reused, so a request rarely meets a connection
  the server is closing; a timer closes it then, whether or not its origin is used again. At most
  ``max_idle`` connections are idle at once, across every origin (the bridge gives it
  ``delivery.max_idle_connections``); past it the one idle longest is closed. So the sockets
  held between deliveries stay bounded however many hosts the webhooks name (:class:`_Pools`).
  The bound is not the in-flight limit: hosts' busy moments do not coincide, so the idle
  connections that many hosts need between them add up to more than are ever busy at once.
  Nothing is ever sent twice here: each attempt is one request, and a failure is reported for
  the retry ladder to handle.
- Response heads larger than ``header_limit`` bytes and malformed responses are
  ``invalid_response``; so is a response still without its end after ``2 * header_limit + 8 *
  body_limit`` bytes (chunk extensions, chunk sizes padded with zeros and trailers count, which
  neither limit sees), or in more pieces than :data:`READS_PER_RESPONSE` and one per KiB (a
  head sent a byte per segment), or in more parts than :data:`PARTS_PER_RESPONSE` (header
  fields, trailers, body pieces, interim answers: each a call into Python), or with more than
  ``header_limit`` bytes of head and trailers, or more than ``2 * header_limit + 16 *
  PARTS_PER_RESPONSE`` bytes that are not body (chunk framing, which llhttp reads without a
  call into Python), unless its body already passed ``body_limit``, in bytes or in pieces (the
  status stands). The parser is never given more than the response's bytes bound.
- A connection taken from the pool carries a request only if nothing waits for it, in its
  socket or, over TLS, in its TLS layer (the start of a record: :meth:`_Connection.quiet`).
- :meth:`HttpClient.post` returns a status or raises :class:`HttpError`, whatever the input and
  whatever the server sends; only cancellation passes through as ``asyncio.CancelledError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import select
import ssl
import time
from dataclasses import dataclass
from typing import Final, cast

import httptools

from bridge.core.errors import DestinationRefusedError
from bridge.core.urls import UrlError, parse_webhook_url
from bridge.core.webhook import TlsSettings
from bridge.http.resolver import SafeResolver
from bridge.http.tls import BoundedSSLObject, ResumingContext, make_context

# poll() says without blocking whether a socket holds unread bytes or an end of stream: one
# system call (the sockets transports expose have no recv() in asyncio 3.11+ or uvloop, and a
# MSG_PEEK recv() on an idle socket raises, which costs four times as much). Absent on Windows.
_POLL: Final = getattr(select, "poll", None)

READS_PER_RESPONSE: Final = 256
"""Pieces (reads from the socket) a response may come in before its end, one more for each KiB
received. Each costs a turn of the event loop and a parse, about 5 µs: a head of 60 KB sent a
byte per segment cost 0.32 s of CPU, and was a status. An answer comes in a few pieces, a large
body (``response_body_limit_bytes`` goes to 10 MB) in about one per read buffer."""

PARTS_PER_RESPONSE: Final = 8192
"""Header fields, trailers, body pieces and interim answers an exchange may bring in all. Each
costs a call from the parser into Python, 0.2-0.4 µs: trailers of four bytes each (``a:``), as
many as the byte bound let through, cost 18-41 ms per request, and 127 ms with a body cap of
1 MiB sent in one-byte chunks (docs/PERFORMANCE.md). A real answer has tens of them; a body
under the default 4 KiB cap fits even in one-byte chunks."""

TRIM_EVERY = 1000
"""TLS connections closed between two requests to glibc to give back the memory they freed."""


def _glibc() -> ctypes.CDLL | None:
    """The C library of the process when it is glibc (whose heaps can be trimmed), else None."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):  # None, or an error, on another C library
            return None
        return ctypes.CDLL(None)  # the C library the process already uses
    except (ValueError, OSError, AttributeError):
        return None


_LIBC: Final = _glibc()


class _Trimmer:
    """Every :data:`TRIM_EVERY` TLS connections closed (in the whole process), asks glibc to give
    back to the system the free memory of its heaps (``malloc_trim(0)``, a few milliseconds).

    Each TLS connection allocates and frees some 300 KB of C memory (OpenSSL's objects, the
    transport's buffers). A free block in the middle of a heap is only given back by a trim, so
    under connection churn the heaps held more and more free memory (issue 22)."""

    def __init__(self) -> None:
        self.closed = 0
        self.trims = 0  # how many times memory was trimmed

    def tls_closed(self) -> None:
        self.closed += 1
        if self.closed >= TRIM_EVERY:
            self.closed = 0
            if _LIBC is not None:
                _LIBC.malloc_trim(ctypes.c_size_t(0))
                self.trims += 1


TRIMMER: Final = _Trimmer()


class HttpError(Exception):
    """No status was received: ``kind`` is timeout, connection_error, tls_error,
    invalid_response, invalid_request or destination_refused; ``detail`` says what happened."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind}: {detail}")


class _Stop(Exception):
    """Raised by a parser callback to stop parsing; the reason is in ``_Connection.problem``."""


def _unexpected(exc: BaseException) -> str:
    return f"unexpected {type(exc).__name__}: {exc}"[:200]


@dataclass(frozen=True, slots=True)
class Target:
    """A webhook URL taken apart once: where to connect and the fixed start of each request."""

    scheme: str
    host: str
    port: int
    head: bytes

    @classmethod
    def parse(cls, url: str) -> Target:
        """Parse an absolute http(s) URL (:func:`bridge.core.urls.parse_webhook_url`); raises
        HttpError(invalid_request) when it is not a webhook URL."""
        try:
            parts = parse_webhook_url(url)
        except UrlError as exc:
            raise HttpError("invalid_request", str(exc)) from None
        head = f"POST {parts.target} HTTP/1.1\r\nHost: {parts.authority}\r\nAccept: */*\r\n"
        return cls(parts.scheme, parts.host, parts.port, head.encode("ascii"))


TARGET_GENERATION_S: Final = 600.0
"""How long a parsed URL is kept unused (at least; at most twice as long)."""


class _Targets(dict[str, "Target | HttpError"]):
    """Parsed URLs by URL (a parse is 10-50 µs, IDNA names the most; a delivery's whole CPU is
    about 150 µs), in two generations: a URL is parsed once however many webhooks there are,
    and one unused for :data:`TARGET_GENERATION_S` is forgotten (reloads replace URLs).

    The current generation is this dict itself, so a hit is one ``dict.get``. A URL missing
    from it is taken from the previous generation, or parsed; on such a miss, once the current
    generation is older than :data:`TARGET_GENERATION_S`, it becomes the previous one and the
    previous is dropped. (A bound on the count instead, 10,000 until 2026-11-27, was a cliff:
    with more webhooks than that, every delivery parsed its URL again.)"""

    def __init__(self) -> None:
        super().__init__()
        self.previous: dict[str, Target | HttpError] = {}
        self.started = time.monotonic()
        self.parsed = 0  # URLs parsed (misses of both generations)

    def parse(self, url: str, now: float) -> Target | HttpError:
        """The target of ``url`` after a miss of the current generation (an HttpError for a URL
        that is not a webhook URL, kept as a target is)."""
        if now - self.started > TARGET_GENERATION_S:
            self.previous = dict(self)
            self.clear()
            self.started = now
        target = self.previous.pop(url, None)
        if target is None:
            self.parsed += 1
            try:
                target = Target.parse(url)
            except HttpError as exc:
                target = exc
        self[url] = target
        return target


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
    """One keep-alive connection carrying at most one exchange at a time, parsed as bytes arrive.

    ``busy`` is True from :meth:`send` until the exchange is settled: by a complete response
    (the status), by a body past the cap (the status), or by a failure (timeout, malformed bytes,
    connection lost). Parser callbacks only record what they see (``complete``, ``problem``);
    :meth:`data_received` decides once llhttp has consumed the whole segment, and only then may
    the connection go back to the pool, so a segment holding more than one response can neither
    settle an exchange twice nor pool a connection twice. Bytes received while not busy close it.
    """

    def __init__(
        self,
        pools: _Pools,
        key: _Origin,
        live: set[_Connection],
        header_limit: int,
        body_limit: int,
        tls: bool = False,
        sessions: ResumingContext | None = None,
        host: str = "",
    ) -> None:
        self.tls = tls
        self.sessions = sessions  # where to keep this connection's TLS session, until it is kept
        self.host = host
        self.exchanges = 0  # requests sent on this connection
        self.pools = pools
        self.key = key  # the pool it goes back to
        self.live = live  # every open connection of the client, for close()
        self.header_limit = header_limit
        self.body_limit = body_limit
        # Every byte of a response counts, not only its head and body: chunk extensions, chunk
        # sizes written with endless zeros and trailers reach neither limit, and llhttp reads
        # them as fast as they come (a receiver sending them kept the event loop busy for the
        # whole timeout). A head, as many trailers, and a body sent in one-byte chunks (six bytes
        # of framing for each) fit.
        self.response_limit = 2 * header_limit + 8 * body_limit
        # The bytes that are not body (the head, chunk sizes and their extensions, trailers,
        # interim answers) are bounded on their own, whatever the body cap: llhttp reads a chunk
        # size padded with zeros or an endless extension without a call into Python, and within
        # the bytes bound of a 10 MiB cap (84 MiB) that was 0.4-0.7 s of CPU per request. Every
        # part may have its framing (16 bytes), and the head and trailers their limit.
        self.framing_limit = 2 * header_limit + 16 * PARTS_PER_RESPONSE
        self.response_bytes = 0
        self.reads = 0  # the pieces this response came in: each costs a turn of the loop
        self.parts = 0  # header fields, trailers, body pieces and messages parsed (each a call)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.poller: select.poll | None = None  # this socket, for reading without reading
        self.tls_object: BoundedSSLObject | None = None  # its TLS layer, for the same
        # Made in connection_made: its callbacks hold this connection (a reference cycle that
        # connection_lost breaks), and a connection never made is never lost.
        self.parser: httptools.HttpResponseParser
        self.waiter: asyncio.Future[int] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timeout = 0.0
        self.status = 0
        self.header_bytes = 0
        self.body_bytes = 0
        self.framed = False  # the response has a Content-Length or Transfer-Encoding header
        self.complete = False  # the status stands (complete response, or body past the cap)
        self.capped = False  # the body went past the cap: the status stands, the rest is unread
        self.keep_alive = False
        self.problem = ""
        self.busy = False
        self.closed = False
        self.eof = False
        self.idle_since = 0.0

    # ---- the exchange ----------------------------------------------------------------------

    def send(self, data: bytes, deadline: float, timeout: float) -> asyncio.Future[int]:
        """Write one request; the future resolves with the status of the complete response.
        HttpError(connection_error) when the connection is closed or already carries one."""
        transport = self.transport
        if self.busy or self.closed or transport is None:
            state = "busy" if self.busy and not self.closed else "closed"
            raise HttpError("connection_error", f"the connection is {state}: request not sent")
        self.waiter = waiter = self.loop.create_future()
        self.timeout = timeout
        self.timer = self.loop.call_at(deadline, self._expire)
        self.status = self.header_bytes = self.body_bytes = self.response_bytes = self.reads = 0
        self.parts = 0
        self.complete = self.capped = False
        self.busy = True
        self.exchanges += 1
        transport.write(data)
        return waiter

    def quiet(self) -> bool:
        """Whether the idle connection can carry a request: still open, and nothing (no byte, no
        end of stream, no error) waiting in its socket, checked without blocking, nor in its TLS
        layer (the start of a record whose end has not come: an answer staged before the
        request, all but its last byte)."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            return False
        if self.poller is not None and self.poller.poll(0):
            return False
        tls = self.tls_object
        return tls is None or not tls.holds_bytes()

    def _expire(self) -> None:
        self.timer = None
        self._fail(HttpError("timeout", f"no answer in {self.timeout:g}s"))
        self.abort()

    def _settle(self) -> None:
        """The exchange ends with the status (the caller decides the connection's fate)."""
        self.busy = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        waiter = self.waiter
        self.waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(self.status)

    def _fail(self, error: HttpError) -> None:
        self.busy = False
        waiter = self.waiter
        self.waiter = None
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
        self.parser = httptools.HttpResponseParser(self)
        self.live.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and _POLL is not None:
            self.poller = _POLL()
            self.poller.register(sock.fileno(), select.POLLIN)
        tls = transport.get_extra_info("ssl_object")
        if isinstance(tls, BoundedSSLObject):
            self.tls_object = tls

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self.abort()  # bytes nobody asked for: the connection cannot be trusted any more
            return
        # Never parse past the bound, whatever one read brings (up to 256 KiB): what the
        # response may still bring is parsed, the rest ends it below.
        room = self.response_limit - self.response_bytes
        over = len(data) > room
        blank = False  # what is past the bound is empty lines (after a response, let through)
        if over:
            blank = not data[room:].strip(b"\r\n")
            data = data[:room]
        self.response_bytes += len(data)  # (while the status is unknown: all of them the head's)
        self.reads += 1
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            problem = "the server switched protocols"
        except Exception as exc:  # llhttp's errors, our _Stop (wrapped by httptools), any bug
            problem = self.problem or f"malformed HTTP response: {exc}"[:200]
        else:
            if self.complete and (blank or not over):  # one complete response, nothing after
                self._settle()
                if self.sessions is not None:
                    self._keep_session()
                if self.keep_alive and not self.closed:
                    self.pools.put(self)
                else:
                    self.abort()
                return
            if self.complete:  # and bytes after it, past what it could be
                problem = "bytes after the response (a second response?)"
            elif self.status == 0 and self.response_bytes > self.header_limit:
                problem = f"response head larger than {self.header_limit} bytes"
            elif over:
                problem = f"response longer than {self.response_limit} bytes without its end"
            elif self.response_bytes - self.body_bytes > self.framing_limit:
                problem = (
                    f"response with more than {self.framing_limit} bytes of head, chunk framing "
                    "and trailers"
                )
            elif self.reads > READS_PER_RESPONSE + (self.response_bytes >> 10):
                problem = f"response in {self.reads} pieces without its end"
            else:
                return  # more to come
        if self.capped:
            self._settle()  # the receiver answered; the rest of its body is not read
        else:  # incomplete, malformed, or followed by bytes nobody asked for in the same segment
            self._fail(HttpError("invalid_response", problem))
        self.abort()

    def eof_received(self) -> bool | None:
        self.eof = True
        return None  # the transport closes itself

    def _keep_session(self) -> None:
        """After the first complete exchange, hand this connection's TLS session to its context
        for new connections to resume, when the context has none for this host (once)."""
        sessions = self.sessions
        self.sessions = None
        transport = self.transport
        if sessions is None or transport is None or not sessions.wants_session(self.host):
            return
        try:
            ssl_object = transport.get_extra_info("ssl_object")
            if isinstance(ssl_object, ssl.SSLObject):
                sessions.keep_session(self.host, ssl_object)
        except Exception:  # resumption saves time; a session that cannot be read is not kept
            pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        # Release everything now: the transport (and uvloop's or asyncio's TLS protocol behind
        # it, with its read buffer and OpenSSL state), and the parser, whose callbacks hold this
        # connection (a reference cycle, which only the cyclic garbage collector would free, late:
        # under connection churn, hundreds of dead TLS connections at a time). The transport
        # calls nothing on its protocol after this.
        self.transport = None
        self.poller = self.tls_object = None
        self.sessions = None
        with contextlib.suppress(AttributeError):  # (made in connection_made, which the
            del self.parser  # transports always call first: kept safe should one not)
        if self.tls:
            TRIMMER.tls_closed()
        self.live.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.busy:
            if self.eof and self.status != 0 and not self.framed:
                self._settle()  # a body framed by the end of the stream: it ended
                return
            reason = f": {exc}" if exc is not None else ""
            where = "before a response" if self.status == 0 else "before the end of the response"
            kind = "tls_error" if isinstance(exc, ssl.SSLError) else "connection_error"
            if self.tls and self.exchanges == 1 and self.response_bytes == 0 and exc is None:
                # In TLS 1.3 a server refuses a client certificate (or its absence) after the
                # handshake, and the transport reports only the end of the stream.
                kind = "tls_error"
                reason = " (a TLS connection closed unanswered: client certificate refused?)"
            self._fail(HttpError(kind, f"connection closed {where}{reason}"[:200]))
        else:
            self.pools.discard(self)

    # ---- httptools callbacks ---------------------------------------------------------------

    def _part(self, body: bool = False) -> None:
        """One more part parsed: past :data:`PARTS_PER_RESPONSE` the response is refused, but
        for a ``body`` piece of an answer, whose status stands as past the body cap."""
        self.parts += 1
        if self.parts <= PARTS_PER_RESPONSE:
            return
        if body and self.status:  # the receiver answered: its body passed the cap in pieces
            self.complete = self.capped = True
            self.keep_alive = False
            self.problem = f"response body in more than {PARTS_PER_RESPONSE} parts"
        else:
            self.problem = (
                f"response in more than {PARTS_PER_RESPONSE} parts (header fields, trailers, "
                "body pieces, interim answers)"
            )
        raise _Stop

    def on_message_begin(self) -> None:
        if self.complete:
            self.problem = "bytes after the response (a second response?)"
            raise _Stop
        self._part()
        self.framed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self._part()
        # (a field's name and value, and at least its colon and line end: the bytes it took)
        self.header_bytes += len(name) + len(value) + 3
        if self.header_bytes > self.header_limit:  # the head, and its trailers after the body
            what = "head and trailers" if self.status else "head"
            self.problem = f"response {what} larger than {self.header_limit} bytes"
            raise _Stop
        if len(name) == 14 or len(name) == 17:
            lowered = name.lower()
            if lowered == b"content-length" or lowered == b"transfer-encoding":
                # A body not framed by either ends with the stream. (A Transfer-Encoding other
                # than chunked does too, for llhttp; it is treated as cut here, conservatively.)
                self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()  # (the head's size: checked in on_header)
        if status == 101:
            self.problem = "the server switched protocols"
            raise _Stop
        if status < 100:
            self.problem = f"invalid status code {status}"
            raise _Stop
        if status >= 200:
            self.status = status  # an interim answer (103 Early Hints...) is skipped
        else:
            self._part()  # (an interim answer's three calls count: it is all parts)

    def on_body(self, body: bytes) -> None:
        self._part(body=True)
        self.body_bytes += len(body)
        if self.body_bytes > self.body_limit and self.status != 0:
            self.complete = self.capped = True  # the receiver answered: the status stands
            self.keep_alive = False
            self.problem = f"response body longer than {self.body_limit} bytes"
            raise _Stop

    def on_message_complete(self) -> None:
        if self.status == 0:
            self._part()
            return  # the end of an interim answer
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()


_Origin = tuple[str, str, int, int]
"""Scheme, host, port and the TLS context's id: a connection made with one client certificate
or trust store never carries a request meant for another."""


class _Pools:
    """The idle keep-alive connections, by origin, bounded whatever the number of origins: at
    most ``limit`` in all (past it, the one idle longest is closed) and none idle longer than
    ``idle_timeout``: a timer closes those even when their origin is never used again, and an
    origin with no idle connection is forgotten. So 10,000 webhooks on 500 hosts, each used
    now and then, hold no more than ``limit`` sockets between their deliveries."""

    def __init__(self, idle_timeout: float, limit: int) -> None:
        self.idle_timeout = idle_timeout
        self.limit = limit
        self.by_origin: dict[_Origin, list[_Connection]] = {}  # most recently idle last
        self.idle: dict[_Connection, None] = {}  # all of them, idle longest first
        self.sweeper: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self.idle)

    def put(self, connection: _Connection) -> None:
        """A connection whose exchange ended cleanly goes back to its origin's pool."""
        loop = connection.loop
        connection.idle_since = loop.time()
        self.by_origin.setdefault(connection.key, []).append(connection)
        self.idle[connection] = None
        if len(self.idle) > self.limit:
            self._close(next(iter(self.idle)))
        if self.sweeper is None:
            self.sweeper = loop.call_at(connection.idle_since + self.idle_timeout, self.sweep)

    def take(self, key: _Origin, now: float) -> _Connection | None:
        """An idle connection of ``key`` fit to carry a request (the most recently used), or
        None; those found too old or not quiet on the way are closed."""
        pool = self.by_origin.get(key)
        while pool:
            connection = pool.pop()
            del self.idle[connection]
            if not pool:
                del self.by_origin[key]
            if now - connection.idle_since < self.idle_timeout and connection.quiet():
                return connection
            connection.abort()
        return None

    def discard(self, connection: _Connection) -> None:
        """Forget an idle connection (closed by its server, or closed here)."""
        if connection not in self.idle:
            return
        del self.idle[connection]
        pool = self.by_origin[connection.key]
        pool.remove(connection)
        if not pool:
            del self.by_origin[connection.key]

    def _close(self, connection: _Connection) -> None:
        self.discard(connection)
        connection.abort()

    def sweep(self) -> None:
        """Close the connections idle for ``idle_timeout`` or more; come back when the next
        one will be."""
        self.sweeper = None
        if not self.idle:
            return
        loop = asyncio.get_running_loop()
        # (1 ms of slack: uvloop's clock counts whole milliseconds, and a timer due at the
        # expiry could otherwise find nothing expired and come back at once, again and again)
        oldest_allowed = loop.time() - self.idle_timeout + 0.001
        stale = []
        for connection in self.idle:
            if connection.idle_since > oldest_allowed:
                break
            stale.append(connection)
        for connection in stale:
            self._close(connection)
        if self.idle:
            first = next(iter(self.idle))
            self.sweeper = loop.call_at(first.idle_since + self.idle_timeout, self.sweep)

    def clear(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
            self.sweeper = None
        self.idle.clear()
        self.by_origin.clear()


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
        max_idle: int = 1000,
    ) -> None:
        self._resolver = resolver
        self._ssl = ssl_context or make_context(TlsSettings())  # the system store
        self._connect_timeout = connect_timeout
        self._body_limit = body_limit
        self._header_limit = header_limit
        self._targets = _Targets()
        self._pools = _Pools(idle_timeout, max_idle)
        self._live: set[_Connection] = set()

    @property
    def idle_connections(self) -> int:
        """Open connections waiting in the pools for a request."""
        return len(self._pools)

    def target(self, url: str) -> Target:
        """The parsed URL, from :class:`_Targets` (a URL is parsed once, not per delivery)."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets.parse(url, time.monotonic())
        if isinstance(target, HttpError):
            raise target.with_traceback(None)  # (the one kept must not collect every raise's)
        return target

    async def post(
        self,
        url: str,
        headers: dict[str, str],
        body: bytes,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> int:
        """POST ``body`` and return the status of the complete response; raises HttpError when
        none arrived (and for nothing else but cancellation). ``tls`` is the context of an
        https destination (default: the client's, the system store)."""
        context = tls or self._ssl
        loop = asyncio.get_running_loop()
        try:
            target = self.target(url)
            data = render_request(target, headers, body)
            deadline = loop.time() + timeout
            if deadline != deadline:
                raise HttpError("invalid_request", f"timeout {timeout!r} is not a number")
        except HttpError:
            raise
        except Exception as exc:  # a URL, header or body of the wrong type, and the like
            raise HttpError("invalid_request", _unexpected(exc)) from None
        connection: _Connection | None = None
        waiter: asyncio.Future[int] | None = None
        try:
            connection = self._idle(target, context) or await self._connect(
                target, context, deadline, timeout
            )
            waiter = connection.send(data, deadline, timeout)
            return await waiter
        except HttpError:
            raise
        except asyncio.CancelledError:
            # Given up mid-exchange: drop the connection, unless the exchange had already ended
            # (the connection may then be back in the pool, or carrying another request).
            if connection is not None and waiter is not None and connection.waiter is waiter:
                connection.abort()
            raise
        except Exception as exc:  # nothing unforeseen may reach the caller as anything else
            if connection is not None:
                connection.abort()
            raise HttpError("connection_error", _unexpected(exc)) from None
        finally:
            # The error raised holds this frame (its traceback), the frame the waiter, and the
            # waiter the error: a cycle only the cyclic collector would free, for every failed
            # exchange. Dropped here, a failure leaves nothing behind (tests/unit/test_httpclient).
            connection = waiter = None

    def _idle(self, target: Target, context: ssl.SSLContext) -> _Connection | None:
        key = (target.scheme, target.host, target.port, id(context))
        return self._pools.take(key, asyncio.get_running_loop().time())

    async def _connect(
        self, target: Target, context: ssl.SSLContext, deadline: float, timeout: float
    ) -> _Connection:
        loop = asyncio.get_running_loop()
        key = (target.scheme, target.host, target.port, id(context))
        tls = target.scheme == "https"
        sessions = context if tls and isinstance(context, ResumingContext) else None
        try:
            async with asyncio.timeout_at(min(deadline, loop.time() + self._connect_timeout)):
                addresses = await self._resolver.resolve(target.host, target.port)
                errors: list[str] = []
                for address in addresses:
                    try:
                        _transport, connection = await loop.create_connection(
                            lambda: _Connection(
                                self._pools,
                                key,
                                self._live,
                                self._header_limit,
                                self._body_limit,
                                tls,
                                sessions,
                                target.host,
                            ),
                            address,
                            target.port,
                            ssl=context if tls else None,
                            server_hostname=target.host if tls else None,
                        )
                    except ssl.SSLError as exc:
                        # (its traceback holds the TLS layer's frames, and the TLS layer holds
                        # the error: a cycle, left for the cyclic collector unless cut here)
                        exc.__traceback__ = None
                        raise HttpError("tls_error", f"{target.host}: {exc}"[:200]) from None
                    except OSError as exc:
                        exc.__traceback__ = None  # (as above)
                        if tls and isinstance(exc, ConnectionResetError):  # mid-handshake
                            detail = f"{target.host}: TLS handshake cut (version refused?)"
                            raise HttpError("tls_error", detail) from None
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

    async def close(self) -> None:
        """Close every connection."""
        for connection in list(self._live):
            connection.abort()
        self._live.clear()
        self._pools.clear()
        self._resolver.close()
        await asyncio.sleep(0)  # let the transports run their close callbacks
