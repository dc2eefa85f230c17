"""The delivery client against hostile receivers: loopback servers that script every byte.

Each receiver is a real TCP (or TLS) server on 127.0.0.1 written here; nothing is mocked. What is
checked: one exchange per connection (a connection goes back to the pool only after exactly one
complete response, and bytes staged while it is idle never become the next request's answer), a
status only for a complete response, a bounded time for every answer whatever the bytes, and no
exception but HttpError out of ``post``.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import trustme
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridge.core.destinations import DestinationPolicy
from bridge.http import client as client_module
from bridge.http.client import PARTS_PER_RESPONSE, READS_PER_RESPONSE, HttpClient, HttpError
from bridge.http.resolver import SafeResolver

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Receiver"], Awaitable[None]]
Test = Callable[[HttpClient, str, "Receiver"], Awaitable[None]]
HEADERS = {"Content-Type": "application/json", "webhook-id": "msg_1"}
EMPTY_204 = b"HTTP/1.1 204 No Content\r\n\r\n"


@dataclass
class Receiver:
    """A scripted server: ``script`` handles each connection (``connections`` is its number)."""

    script: Script
    tls: ssl.SSLContext | None = None
    connections: int = 0
    requests: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    sent: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one whole request (this client always sends a Content-Length)."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = await reader.readexactly(length)
        self.requests += 1
        return head + body

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each write its own segment
        self.connections += 1
        self.writers.append(writer)
        try:
            await self.script(reader, writer, self)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()


async def answer_each(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    r: Receiver,
    answer: bytes = EMPTY_204,
) -> None:
    """A well-behaved keep-alive receiver."""
    while True:
        await r.request(reader)
        writer.write(answer)
        await writer.drain()


async def send_segments(writer: asyncio.StreamWriter, parts: list[bytes], gap: float) -> None:
    for part in parts:
        writer.write(part)
        await writer.drain()
        await asyncio.sleep(gap)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: the peer sees a reset (RST), not an end of stream."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def client(**options: object) -> HttpClient:
    return HttpClient(SafeResolver(DestinationPolicy(allow_private=True)), **options)  # type: ignore[arg-type]


async def serve(receiver: Receiver, test: Test, **options: object) -> None:
    listener = await asyncio.start_server(receiver._accept, "127.0.0.1", 0, ssl=receiver.tls)
    receiver.port = listener.sockets[0].getsockname()[1]
    host = "localhost" if receiver.tls else "127.0.0.1"
    url = f"{'https' if receiver.tls else 'http'}://{host}:{receiver.port}/hook"
    http = client(**{"body_limit": 1024, "header_limit": 4096, **options})
    try:
        await test(http, url, receiver)
        assert_pool_sound(http)
    finally:
        await http.close()
        listener.close()
        for writer in receiver.writers:
            writer.transport.abort()
        await asyncio.sleep(0)


def run(
    script: Script, test: Test, tls: ssl.SSLContext | None = None, **options: object
) -> Receiver:
    async def scenario() -> Receiver:
        receiver = Receiver(script, tls)
        await serve(receiver, test, **options)
        return receiver

    return asyncio.run(scenario())


def assert_pool_sound(http: HttpClient) -> None:
    """Each pooled connection once, idle, with no exchange attached; no origin left empty."""
    pools = http._pools
    assert sum(len(pool) for pool in pools.by_origin.values()) == len(pools.idle)
    for pool in pools.by_origin.values():
        assert pool, "an origin with no idle connection is forgotten"
        assert len({id(connection) for connection in pool}) == len(pool)
        for connection in pool:
            assert not connection.busy and connection.waiter is None and connection.timer is None


def pooled(http: HttpClient) -> int:
    return http.idle_connections


async def failure(http: HttpClient, url: str, timeout: float = 5.0) -> HttpError:
    with pytest.raises(HttpError) as caught:
        await http.post(url, HEADERS, b"{}", timeout)
    return caught.value


async def settle() -> None:
    await asyncio.sleep(0.05)  # let close callbacks and segments in flight arrive


async def until(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Return once ``condition()`` holds; fail if it does not within ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


# ---- one exchange per connection ---------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n",  # a second response
        b"HTTP/1.1 202 Acc",  # the start of one
        b"H",  # its first byte
        b"garbage",
    ],
)
@pytest.mark.parametrize("same_segment", [True, False])
def test_bytes_after_a_response_close_the_connection(extra: bytes, same_segment: bool) -> None:
    first = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        if r.connections > 1:
            await answer_each(reader, writer, r, b"HTTP/1.1 203 Fresh\r\nContent-Length: 0\r\n\r\n")
        await r.request(reader)
        await send_segments(writer, [first + extra] if same_segment else [first, extra], 0.02)
        await answer_each(reader, writer, r, b"HTTP/1.1 299 Reused\r\nContent-Length: 0\r\n\r\n")

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        if same_segment:  # an answer followed by bytes nobody asked for is not trusted
            error = await failure(http, url)
            assert (error.kind, error.detail) == (
                "invalid_response",
                "bytes after the response (a second response?)"
                if extra.startswith(b"H")
                else error.detail,
            )
        else:
            assert await http.post(url, HEADERS, b"{}", 5) == 201  # its own complete response
        await until(lambda: pooled(http) == 0)  # not reused: the late bytes close it
        assert await http.post(url, HEADERS, b"{}", 5) == 203
        assert await http.post(url, HEADERS, b"{}", 5) == 203
        assert pooled(http) == 1

    receiver = run(script, test)
    assert receiver.connections == 2
    assert receiver.requests == 3


def test_two_responses_in_one_segment_under_concurrency() -> None:
    """The historical bug: the second response completed the exchange again, pooled the
    connection twice, and two deliveries then shared one socket (one waiting forever)."""

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        while True:
            await r.request(reader)
            writer.write(EMPTY_204 * 2)
            await writer.drain()

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        for _ in range(4):
            started = time.monotonic()
            results = await asyncio.gather(
                *(http.post(url, HEADERS, b"{}", 1) for _ in range(8)), return_exceptions=True
            )
            assert [getattr(result, "kind", result) for result in results] == [
                "invalid_response"
            ] * 8
            assert time.monotonic() - started < 1
            assert_pool_sound(http)
            await settle()
            assert pooled(http) == 0

    receiver = run(script, test)
    assert receiver.connections == 32  # each answered once, none reused


def test_bytes_staged_while_idle_are_never_the_next_answer() -> None:
    """The receiver writes a response for a request it never got while the connection sits in
    the pool; the event loop has not seen the bytes yet when the next request takes the
    connection (the check at reuse, without blocking, finds them in the socket)."""

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        fresh = b"HTTP/1.1 203 Fresh\r\nContent-Length: 0\r\n\r\n"
        await answer_each(reader, writer, r, EMPTY_204 if r.connections == 1 else fresh)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        assert await http.post(url, HEADERS, b"{}", 5) == 204
        assert pooled(http) == 1
        r.writers[0].write(b"HTTP/1.1 200 Staged\r\nContent-Length: 0\r\n\r\n")  # sent at once
        time.sleep(0.05)  # no loop turn: the bytes wait in the client's socket
        assert await http.post(url, HEADERS, b"{}", 5) == 203
        assert pooled(http) == 1

    receiver = run(script, test)
    assert receiver.connections == 2
    assert receiver.requests == 2


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        assert await http.post(url, HEADERS, b"{}", 5) == 204
        r.writers[0].get_extra_info("socket").shutdown(socket.SHUT_WR)  # FIN, synchronously
        time.sleep(0.05)  # no loop turn: the end of stream waits in the client's socket
        assert await http.post(url, HEADERS, b"{}", 5) == 204

    receiver = run(answer_each, test)
    assert receiver.connections == 2


def test_bytes_arriving_while_idle_close_the_connection() -> None:
    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        assert await http.post(url, HEADERS, b"{}", 5) == 204
        r.writers[0].write(EMPTY_204)
        await settle()  # the loop reads them: nobody asked
        assert pooled(http) == 0
        assert not http._live
        assert await http.post(url, HEADERS, b"{}", 5) == 204

    receiver = run(answer_each, test)
    assert receiver.connections == 2


def test_send_on_a_closed_or_busy_connection_fails_cleanly() -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        writer.write(EMPTY_204)
        await r.request(reader)
        await reader.read()  # the second request is never answered

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        assert await http.post(url, HEADERS, b"{}", 5) == 204
        (connection,) = http._live
        pending = asyncio.ensure_future(http.post(url, HEADERS, b"{}", 0.3))
        await asyncio.sleep(0.05)
        assert connection.busy
        deadline = asyncio.get_running_loop().time() + 1
        with pytest.raises(HttpError) as caught:
            connection.send(b"x", deadline, 1)
        assert (caught.value.kind, caught.value.detail) == (
            "connection_error",
            "the connection is busy: request not sent",
        )
        started = time.monotonic()
        with pytest.raises(HttpError) as caught:
            await pending  # its waiter and timer were not replaced: it ends at its deadline
        assert caught.value.kind == "timeout"
        assert time.monotonic() - started < 0.5
        assert connection.closed
        with pytest.raises(HttpError, match="the connection is closed: request not sent"):
            connection.send(b"x", deadline, 1)

    receiver = run(script, test)
    assert receiver.requests == 2


# ---- a status only for a complete response -----------------------------------------------------


def test_a_response_split_byte_by_byte_is_read_whole() -> None:
    answer = (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nX-Trace: abc\r\n\r\n"
        b"3\r\nabc\r\n0\r\n\r\n"
    )

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        while True:
            await r.request(reader)
            await send_segments(writer, [answer[i : i + 1] for i in range(len(answer))], 0.001)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        assert await http.post(url, HEADERS, b"{}", 5) == 201
        assert await http.post(url, HEADERS, b"{}", 5) == 201

    receiver = run(script, test)
    assert receiver.connections == 1  # reused: exactly one complete response each time


@pytest.mark.parametrize(
    ("pad", "body", "piece", "allowed"),
    [
        (150, 0, 1, True),  # under READS_PER_RESPONSE pieces
        (20_000, 0, 1, False),  # a head a byte per segment
        (0, 900_000, 1024, True),  # a large body in 880 pieces: one more allowed per KiB
    ],
)
def test_a_response_in_more_pieces_than_allowed_is_refused(
    pad: int, body: int, piece: int, allowed: bool
) -> None:
    """Each piece a response arrives in costs a turn of the loop and a parse: a head written a
    byte per segment (60 KB of it cost 0.32 s of the client's CPU, and was a status) is refused
    past READS_PER_RESPONSE pieces (and one per KiB received); one under the bound, or a large
    body in KiB pieces, is read whole."""
    answer = b"HTTP/1.1 201 Created\r\nX-Pad: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        b"p" * pad,
        body,
        b"b" * body,
    )
    pieces = [answer[i : i + piece] for i in range(0, len(answer), piece)]

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        for each in pieces:
            writer.write(each)
            await writer.drain()
            await asyncio.sleep(0)  # (the client reads between two pieces, mostly)
        await asyncio.sleep(10)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        if allowed:
            assert await http.post(url, HEADERS, b"{}", 10) == 201
            (connection,) = http._pools.idle  # (its count stays until its next request)
            if body:
                assert connection.reads > READS_PER_RESPONSE  # (the case means something)
            return
        error = await failure(http, url, 10)
        assert error.kind == "invalid_response", error
        assert re.fullmatch(r"response in \d+ pieces without its end", error.detail), error
        pieces_read = int(error.detail.split()[2])
        assert READS_PER_RESPONSE < pieces_read <= READS_PER_RESPONSE + 1 + pieces_read // 1024

    run(script, test, header_limit=65536, body_limit=1 << 20)


@pytest.mark.parametrize(
    ("head", "end"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789", "reset"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789", "close"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", "close"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", "reset"),
        (b"HTTP/1.1 200 OK\r\n\r\nbody framed by the end of the stream", "reset"),
    ],
)
def test_a_response_cut_before_its_end_is_not_a_status(head: bytes, end: str) -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        writer.write(head)
        await writer.drain()
        await asyncio.sleep(0.05)  # the client has read it
        if end == "reset":
            reset(writer)
        else:
            writer.close()

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        error = await failure(http, url)
        assert error.kind == "connection_error"
        assert error.detail.startswith("connection closed before the end of the response")

    run(script, test)


def test_a_body_framed_by_the_end_of_the_stream_ends_with_it() -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        await send_segments(writer, [b"HTTP/1.1 202 Accepted\r\n\r\n", b"queued"], 0.02)
        writer.close()

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        assert await http.post(url, HEADERS, b"{}", 5) == 202

    run(script, test)


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nhello\r\n0\r\n\r\n",  # a chunk size that is not hexadecimal
        b"5\r\nhelloXX0\r\n\r\n",  # no line break after the chunk
        b"fffffffffffffffffffff\r\n",  # a chunk size past 64 bits
    ],
)
def test_invalid_chunked_encoding_is_an_invalid_response(body: bytes) -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        await send_segments(
            writer, [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", body], 0.01
        )
        await reader.read()

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        error = await failure(http, url, 1)
        assert error.kind == "invalid_response"
        assert error.detail.startswith("malformed HTTP response: ")

    run(script, test)


def test_a_body_longer_than_the_cap_keeps_the_status_and_closes_the_connection() -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        if r.connections == 1:
            await r.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000)
        await answer_each(reader, writer, r)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        assert await http.post(url, HEADERS, b"{}", 5) == 200  # complete, but past the cap
        await settle()
        assert pooled(http) == 0 and not http._live
        assert await http.post(url, HEADERS, b"{}", 5) == 204

    receiver = run(script, test)
    assert receiver.connections == 2


CHUNKED = b"Transfer-Encoding: chunked"
ENDLESS_BODIES = {  # framing, the bytes after the head, then each piece sent, and the pace
    "fast": (b"Content-Length: 100000000", b"", b"x" * 65536, 0.0),
    "slow": (b"Content-Length: 100000000", b"", b"x" * 10, 0.05),
    "slow chunk extension": (CHUNKED, b"5", b";x" * 5, 0.05),
    # bytes that are neither head nor body, as fast as they come: never a body byte
    "chunk extension": (CHUNKED, b"5", b";x" * 5000, 0.0),
    "chunk size of zeros": (CHUNKED, b"", b"0" * 10000, 0.0),
    "trailers": (CHUNKED, b"1\r\nx\r\n0\r\n", b"X-Trailer: %s\r\n" % (b"t" * 2000), 0.0),
    "one-byte chunks": (CHUNKED, b"", b"1\r\nx\r\n" * 500, 0.0),
}


@pytest.mark.parametrize(
    ("kind", "outcome"),
    [
        ("fast", 200),
        ("slow", "timeout"),
        ("slow chunk extension", "timeout"),
        ("chunk extension", "invalid_response"),
        ("chunk size of zeros", "invalid_response"),
        ("trailers", "invalid_response"),
        ("one-byte chunks", 200),
    ],
)
def test_an_endless_body_is_the_status_past_the_cap_and_a_timeout_below_it(
    kind: str, outcome: object
) -> None:
    """A 200 head followed by a body that never ends: the status once the body passes
    ``body_limit`` (in one piece or in one-byte chunks); a timeout when it trickles (or carries
    no body bytes at all); invalid_response, at once, once the response passes its whole bound
    without a body past the cap (framing, zeros or trailers sent as fast as the socket takes
    them: before, llhttp read them at the event loop's full speed until the timeout)."""
    framing, start, piece, pace = ENDLESS_BODIES[kind]

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n%s\r\n\r\n%s" % (framing, start))
        while True:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(pace)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        started = time.monotonic()
        if outcome == "timeout":
            error = await failure(http, url, 0.3)
            assert (error.kind, error.detail) == ("timeout", "no answer in 0.3s")
        elif outcome == "invalid_response":
            error = await failure(http, url, 5.0)
            assert error.kind == "invalid_response", error
            if kind == "trailers":  # (the head's bound holds the head and trailers together)
                assert error.detail == "response head and trailers larger than 4096 bytes"
            else:
                limit = 2 * 4096 + 8 * 1024  # (the test client's limits)
                assert error.detail == f"response longer than {limit} bytes without its end"
        else:
            assert await http.post(url, HEADERS, b"{}", 0.3) == outcome
        assert time.monotonic() - started < 0.5
        await settle()
        assert not http._live  # never drained, never pooled

    run(script, test)


# ---- heads and protocols -----------------------------------------------------------------------


# Responses made of many small parts, each a call from the parser into Python, or of framing that
# makes none, sent as fast as the socket takes them, in writes of ``chunk`` bytes.
CHUNKED_200 = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
SMALL_PARTS = {  # (head, the repeated piece, the body cap, what the attempt comes to)
    "trailers of four bytes": (CHUNKED_200 + b"0\r\n", b"a:\r\n", 1024, "invalid_response"),
    "a head of four-byte fields": (b"HTTP/1.1 200 OK\r\n", b"a:\r\n", 1024, "invalid_response"),
    "interim answers": (b"", b"HTTP/1.1 103 x\r\n\r\n", 1024, "invalid_response"),
    "bare interim answers": (b"", b"HTTP/1.1 100 Continue\r\n\r\n", 1024, "invalid_response"),
    # a body past the cap in pieces keeps its status, as one past it in bytes does
    "one-byte chunks, a 1 MiB cap": (CHUNKED_200, b"1\r\nx\r\n", 1 << 20, 200),
    "two-byte chunks, a 1 MiB cap": (CHUNKED_200, b"2\r\nxy\r\n", 1 << 20, 200),
    # framing that llhttp reads without a call into Python, bounded whatever the body cap
    "chunk extensions, one segment": (CHUNKED_200 + b"5", b";x", 1024, "invalid_response"),
    "chunk extensions, a 10 MiB cap": (CHUNKED_200 + b"1", b";a=b", 10 << 20, "invalid_response"),
    "a chunk size of zeros, a 10 MiB cap": (CHUNKED_200, b"0", 10 << 20, "invalid_response"),
}


@pytest.mark.parametrize("kind", list(SMALL_PARTS))
@pytest.mark.parametrize("chunk", [1 << 18, 4096])
def test_a_response_is_parsed_within_its_bytes_and_parts_whatever_it_is_made_of(
    kind: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parser's work on one response is bounded whatever the body cap: it is never given
    more than the response's bytes bound, however much one read brings (a read may bring
    256 KiB); it calls into Python (a header field, a trailer, a body piece, an interim answer's
    three calls) at most PARTS_PER_RESPONSE times; and it reads at most ``framing_limit`` bytes
    that are not body (and one read more). Past any of them the attempt is invalid_response, at
    once, but for an answer whose body passed the bound in pieces: its status stands, as past
    the cap in bytes. (Trailers of four bytes each, 100,000 of them parsed per request, cost
    18-41 ms of CPU a request; chunk extensions within a 10 MiB cap's bytes bound 0.6 s.)"""
    head, piece, body_limit, outcome = SMALL_PARTS[kind]
    seen: list[tuple[int, int, int, int]] = []  # after each read: what is bounded, and the read
    feed = client_module._Connection.data_received

    def recorded(self: client_module._Connection, data: bytes) -> None:
        feed(self, data)
        over_bytes = self.response_bytes - self.response_limit
        over_framing = self.response_bytes - self.body_bytes - self.framing_limit
        seen.append((over_bytes, over_framing, self.parts, len(data)))

    monkeypatch.setattr(client_module._Connection, "data_received", recorded)
    flood = head + piece * (2 * (1 << 20) // len(piece))

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        for start in range(0, len(flood), chunk):
            writer.write(flood[start : start + chunk])
            await writer.drain()

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        if outcome == "invalid_response":
            error = await failure(http, url, 5.0)
            assert error.kind == "invalid_response", error
        else:
            assert await http.post(url, HEADERS, b"{}", 5.0) == outcome
            assert pooled(http) == 0  # the rest of the body is not read: never reused
        await settle()

    run(script, test, body_limit=body_limit)
    assert seen
    for over_bytes, over_framing, parts, read in seen:
        assert over_bytes <= 0
        assert over_framing <= read  # (at most the read that went past it)
        assert parts <= PARTS_PER_RESPONSE + 1  # (the one past the bound ends it)


@pytest.mark.parametrize(
    ("after", "outcome"),
    [(b"", 200), (b"\r\n", 200), (b"\r\n\r\n\n", 200), (b"H", "invalid_response")],
)
def test_a_response_ending_at_its_bound_is_read_and_only_empty_lines_may_follow(
    after: bytes, outcome: object
) -> None:
    """A response that ends exactly where its bytes bound does, in one segment with what follows:
    its status, and the connection kept, when nothing or only empty lines follow (as within the
    bound); a byte of anything else after it fails the attempt, as bytes after a response do."""
    limit = 2 * 4096 + 8 * 1024  # (the test client's limits)
    body = b"\r\n" + b"x" * 10 + b"\r\n0\r\n\r\n"  # (a chunk extension pads it to the bound)
    start = CHUNKED_200 + b"a;"
    answer = start + b"e" * (limit - len(start) - len(body)) + body
    assert len(answer) == limit

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await answer_each(reader, writer, r, answer + after)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        if outcome == 200:
            assert await http.post(url, HEADERS, b"{}", 5.0) == 200
            await settle()
            assert pooled(http) == 1
        else:
            error = await failure(http, url)
            assert error.detail == "bytes after the response (a second response?)", error

    run(script, test)


@pytest.mark.parametrize("pieces", [1, 40])
def test_a_head_larger_than_the_limit_is_an_invalid_response(pieces: int) -> None:
    header = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"a" * 200) for i in range(40))

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        size = -(-len(header) // pieces)
        parts = [header[i : i + size] for i in range(0, len(header), size)]
        await send_segments(writer, [b"HTTP/1.1 200 OK\r\n", *parts, b"\r\n"], 0.002)
        await reader.read()

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        error = await failure(http, url, 2)
        assert (error.kind, error.detail) == (
            "invalid_response",
            "response head larger than 4096 bytes",
        )

    run(script, test)


def test_endless_slow_headers_time_out_at_the_deadline() -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        while True:
            writer.write(b"X-Slow: 1\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        started = time.monotonic()
        error = await failure(http, url, 0.3)
        assert (error.kind, error.detail) == ("timeout", "no answer in 0.3s")
        assert 0.29 <= time.monotonic() - started < 0.5

    run(script, test)


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
            "the server switched protocols",
        ),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "the server switched protocols"),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
            "the server switched protocols",
        ),
        (b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n", "invalid status code 99"),
    ],
)
def test_upgrades_and_impossible_statuses_are_invalid_responses(answer: bytes, detail: str) -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        writer.write(answer + b"\x00\x01binary protocol")
        await reader.read()

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        error = await failure(http, url, 1)
        assert (error.kind, error.detail) == ("invalid_response", detail)
        await settle()
        assert not http._live

    run(script, test)


def test_interim_answers_in_separate_segments_are_skipped() -> None:
    parts = [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
        b"ok",
    ]

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        while True:
            await r.request(reader)
            await send_segments(writer, parts, 0.005)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        assert await http.post(url, HEADERS, b"{}", 5) == 200
        assert await http.post(url, HEADERS, b"{}", 5) == 200

    assert run(script, test).connections == 1


# ---- TLS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_pair() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    authority = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    return server, trusting


def test_a_real_https_receiver_answers_and_its_connection_is_reused(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server, trusting = tls_pair

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        for _ in range(3):
            assert await http.post(url, HEADERS, b"{}", 5) == 204
        assert pooled(http) == 1

    receiver = run(answer_each, test, tls=server, ssl_context=trusting)
    assert (receiver.connections, receiver.requests) == (1, 3)


def test_two_responses_in_one_tls_record_close_the_connection(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server, trusting = tls_pair

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await answer_each(reader, writer, r, EMPTY_204 * 2)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        for _ in range(2):
            assert (await failure(http, url)).kind == "invalid_response"
            await settle()
            assert pooled(http) == 0

    receiver = run(script, test, tls=server, ssl_context=trusting)
    assert receiver.connections == 2


@pytest.mark.parametrize(
    "garbage",
    [
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"\x16\x03\x01\x00\x05hello",
        b"\x15\x03\x03\x00\x02\x02\x28",
        b"",
    ],
)
def test_tls_garbage_fails_fast_and_never_hangs(garbage: bytes) -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await reader.read(1)  # the client hello has started
        writer.write(garbage)
        await writer.drain()
        if garbage:
            await reader.read()  # and say nothing more

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        started = time.monotonic()
        error = await failure(http, url.replace("http://", "https://"), 0.3)
        assert error.kind in {"tls_error", "connection_error"}
        assert time.monotonic() - started < 0.5

    run(script, test)


def test_a_silent_tls_server_is_a_timeout() -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await reader.read()

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        started = time.monotonic()
        error = await failure(http, url.replace("http://", "https://"), 0.3)
        assert error.kind == "timeout"
        assert time.monotonic() - started < 0.5

    run(script, test)


# ---- nothing but HttpError, and cancellation ---------------------------------------------------


@pytest.mark.parametrize(
    ("url", "headers", "body", "timeout"),
    [
        (None, HEADERS, b"{}", 1.0),
        (["http://127.0.0.1/"], HEADERS, b"{}", 1.0),
        ("http://127.0.0.1:1/\x00", HEADERS, b"{}", 1.0),
        ("http://fa\u00df.de\x07/", HEADERS, b"{}", 1.0),
        ("http://user:pw@127.0.0.1/", HEADERS, b"{}", 1.0),
        ("http://127.0.0.1:1/", None, b"{}", 1.0),
        ("http://127.0.0.1:1/", {"a": "\u20ac"}, b"{}", 1.0),
        ("http://127.0.0.1:1/", HEADERS, "text, not bytes", 1.0),
        ("http://127.0.0.1:1/", HEADERS, b"{}", float("nan")),
        ("http://127.0.0.1:1/", HEADERS, b"{}", "1"),
    ],
)
def test_bad_input_is_an_invalid_request(
    url: object, headers: object, body: object, timeout: object
) -> None:
    async def scenario() -> None:
        http = client()
        try:
            with pytest.raises(HttpError) as caught:
                await http.post(url, headers, body, timeout)  # type: ignore[arg-type]
        finally:
            await http.close()
        assert caught.value.kind == "invalid_request"

    asyncio.run(scenario())


def test_cancellation_propagates_and_drops_the_connection() -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        await r.request(reader)
        await reader.read()

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        task = asyncio.ensure_future(http.post(url, HEADERS, b"{}", 5))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await settle()
        assert not http._live and pooled(http) == 0

    run(script, test)


# ---- whatever the bytes ------------------------------------------------------------------------

PIECES = st.sampled_from(
    [
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 204 No Content\r\n",
        b"HTTP/1.0 200 OK\r\n",
        b"HTTP/1.1 103 Early Hints\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n",
        b"HTTP/1.1 099 x\r\n",
        b"Content-Length: 0\r\n",
        b"Content-Length: 5\r\n",
        b"Content-Length: 99999\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Connection: close\r\n",
        b"Connection: keep-alive\r\n",
        b"Upgrade: h2c\r\n",
        b"X-A: b\r\n",
        b"\r\n",
        b"hello",
        b"5\r\nhello\r\n",
        b"0\r\n\r\n",
        b"zz\r\n",
        b"\x00",
        b"x" * 1500,
    ]
)
WHOLE = st.sampled_from(
    [
        EMPTY_204,
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
        b"HTTP/1.1 500 Oops\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    ]
)
REPLIES = st.lists(st.one_of(WHOLE, PIECES, st.binary(max_size=12)), max_size=8).map(b"".join)
FRESH = b"HTTP/1.1 299 Fresh\r\nContent-Length: 0\r\n\r\n"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(reply=EMPTY_204 * 2, cuts=[], end="keep")  # two responses in one segment
@example(reply=EMPTY_204 * 2, cuts=[len(EMPTY_204)], end="keep")  # the second one while idle
@example(reply=EMPTY_204 + b"H", cuts=[], end="keep")
@example(reply=b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhalf", cuts=[], end="reset")
@given(
    reply=REPLIES,
    cuts=st.lists(st.integers(0, 4000), max_size=4),
    end=st.sampled_from(["keep", "close", "reset"]),
)
def test_any_bytes_give_a_status_or_an_http_error_in_time(
    reply: bytes, cuts: list[int], end: str
) -> None:
    """Whatever the receiver sends in reply to one request, in whatever segments: a status or an
    HttpError within timeout + 0.5 s; the pool stays sound; and the next request gets the
    answer written for it (on a new connection or a cleanly reused one), never a leftover."""
    timeout = 0.2
    bounds = sorted({0, len(reply), *(cut for cut in cuts if cut < len(reply))})
    segments = [reply[a:b] for a, b in itertools.pairwise(bounds)]

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Receiver
    ) -> None:
        if r.connections > 1:
            await answer_each(reader, writer, r, FRESH)
        await r.request(reader)
        try:
            await send_segments(writer, segments, 0.002)
        finally:
            r.sent.set()
        if end == "reset":
            reset(writer)
        elif end == "close":
            writer.close()
        else:
            await answer_each(reader, writer, r, FRESH)

    async def test(http: HttpClient, url: str, r: Receiver) -> None:
        started = time.monotonic()
        try:
            status = await http.post(url, HEADERS, b"{}", timeout)
        except HttpError:
            pass
        else:
            assert isinstance(status, int) and 200 <= status <= 999
        assert time.monotonic() - started < timeout + 0.5
        assert_pool_sound(http)
        await asyncio.wait_for(r.sent.wait(), 1)
        await asyncio.sleep(0.01)  # the last segment has reached the client's socket
        assert await http.post(url, HEADERS, b"{}", 1) == 299
        assert_pool_sound(http)

    run(script, test)
