"""The delivery client: the request on the wire, and real exchanges with servers on loopback."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import trustme

from bridge.core.destinations import DestinationPolicy
from bridge.core.settings import DeliveryConfig
from bridge.http.client import (
    TARGET_GENERATION_S,
    HttpClient,
    HttpError,
    Target,
    _Connection,
    _Pools,
    _Targets,
    render_request,
)
from bridge.http.resolver import SafeResolver
from bridge.http.sender import HttpSender
from tests.cycles import bridge_cycles
from tests.ports import refused_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]
HEADERS = {"Content-Type": "application/json", "webhook-id": "msg_1"}


def test_request_is_rendered_byte_for_byte() -> None:
    target = Target.parse("https://hooks.example.com/in/bound?x=1&y=ä")
    assert (target.scheme, target.host, target.port) == ("https", "hooks.example.com", 443)
    assert render_request(target, HEADERS, b'{"a":1}') == (
        b"POST /in/bound?x=1&y=%C3%A4 HTTP/1.1\r\nHost: hooks.example.com\r\nAccept: */*\r\n"
        b"Content-Type: application/json\r\nwebhook-id: msg_1\r\n"
        b'Content-Length: 7\r\n\r\n{"a":1}'
    )


def test_targets_name_port_ipv6_and_international_hosts() -> None:
    assert Target.parse("http://h.example:8080").head.startswith(
        b"POST / HTTP/1.1\r\nHost: h.example:8080\r\n"
    )
    v6 = Target.parse("http://[::1]:9000/x")
    assert (v6.host, v6.port) == ("::1", 9000)
    assert b"Host: [::1]:9000\r\n" in v6.head
    idn = Target.parse("https://bücher.example/ü")
    assert idn.host == "xn--bcher-kva.example"
    assert idn.head.startswith(b"POST /%C3%BC HTTP/1.1\r\nHost: xn--bcher-kva.example\r\n")
    with pytest.raises(HttpError, match="invalid_request"):
        Target.parse("ftp://h.example/")


def test_each_url_is_parsed_once_however_many_there_are() -> None:
    """Deliveries going round 25,000 webhooks parse each URL once (a bound on the count of
    parsed URLs made every delivery parse again past 10,000 webhooks)."""
    client = HttpClient(SafeResolver(DestinationPolicy()))
    urls = [f"https://h{n % 5000}.example/hook/{n}" for n in range(25_000)] + ["ftp://x/"]
    for _ in range(3):
        for url in urls[:-1]:
            assert client.target(url).head.startswith(
                f"POST /hook/{url.rsplit('/', 1)[1]} ".encode()
            )
        with pytest.raises(HttpError, match="invalid_request"):
            client.target(urls[-1])
    assert client._targets.parsed == len(urls)


def test_urls_unused_for_a_generation_are_forgotten() -> None:
    """Reloads replace URLs: one unused for a whole generation is dropped; one used in each
    generation is kept, never parsed again."""
    targets = _Targets()
    start = targets.started
    for url in ("http://kept.example/", "http://gone.example/"):
        targets.parse(url, start)
    later = start + TARGET_GENERATION_S + 1
    new = targets.parse("http://new.example/", later)  # swaps
    assert isinstance(new, Target) and new.host == "new.example"
    assert set(targets) == {"http://new.example/"}
    targets.parse("http://kept.example/", later)  # from the previous generation, not parsed
    assert targets.parsed == 3
    targets.parse("http://other.example/", later + TARGET_GENERATION_S + 1)  # swaps again
    assert "http://gone.example/" not in {*targets, *targets.previous}
    assert "http://kept.example/" in targets.previous
    targets.parse("http://gone.example/", later + TARGET_GENERATION_S + 2)
    assert targets.parsed == 5


def test_international_hosts_are_encoded_by_idna_2008() -> None:
    """Python's IDNA 2003 codec makes faß.de fass.de, another host: the client must not."""
    target = Target.parse("https://faß.de/")
    assert target.host == "xn--fa-hia.de"
    assert target.head.startswith(b"POST / HTTP/1.1\r\nHost: xn--fa-hia.de\r\n")
    assert Target.parse("http://Straße.EXAMPLE:8080/").head.startswith(
        b"POST / HTTP/1.1\r\nHost: xn--strae-oqa.example:8080\r\n"
    )


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("http://a\x00b.example/", "contains a control character (U+0000) at position 8"),
        ("http://h.example/\x7f", "contains a control character (U+007F) at position 17"),
        ("http://h.example/a b", "contains whitespace at position 18"),
        ("http://user:pw@h.example/", "must not contain userinfo"),
        ("http://-bad.example/", "host '-bad.example' has an invalid label '-bad'"),
        ("http://xn--a.example/", "host 'xn--a.example' is not a valid internationalised name"),
        ("http://a..b/", "host 'a..b' has an empty label"),
        ("http://127.1/", "host '127.1' ends in a number"),
        ("http://h.example:99999/", "the port is not a number from 1 to 65535"),
    ],
)
def test_urls_the_shared_rules_refuse_are_invalid_requests(url: str, detail: str) -> None:
    with pytest.raises(HttpError) as caught:
        Target.parse(url)
    assert caught.value.kind == "invalid_request"
    assert caught.value.detail.startswith(detail)
    http = client()
    with pytest.raises(HttpError) as first:
        http.target(url)
    with pytest.raises(HttpError) as second:
        http.target(url)
    assert first.value is second.value  # the refusal is cached like a parsed URL


@pytest.mark.parametrize("value", ["a\r\nInjected: 1", "a\nb", "a\rb"])
def test_header_values_cannot_inject_lines(value: str) -> None:
    with pytest.raises(HttpError) as caught:
        render_request(Target.parse("http://h.example/"), {"x": value}, b"")
    assert caught.value.kind == "invalid_request"


@dataclass
class Server:
    """A scripted HTTP server on loopback: ``handler`` answers each connection as it likes."""

    handler: Handler
    tls: ssl.SSLContext | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    port: int = 0

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def serve(server: Server, test: Callable[[str], Awaitable[None]]) -> None:
    listener = await asyncio.start_server(server._client, "127.0.0.1", 0, ssl=server.tls)
    server.port = listener.sockets[0].getsockname()[1]
    scheme = "https" if server.tls else "http"
    try:
        await test(f"{scheme}://localhost:{server.port}/hook")
    finally:
        listener.close()


def client(**options: object) -> HttpClient:
    return HttpClient(SafeResolver(DestinationPolicy(allow_private=True)), **options)  # type: ignore[arg-type]


def run(handler: Handler, test: Callable[[HttpClient, str, Server], Awaitable[None]]) -> Server:
    server = Server(handler)

    async def scenario() -> None:
        http = client(body_limit=1024, header_limit=4096)

        async def with_url(url: str) -> None:
            try:
                await test(http, url, server)
            finally:
                await http.close()

        await serve(server, with_url)

    asyncio.run(scenario())
    return server


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
    while True:
        await s.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()


def test_connections_are_kept_alive_and_reused() -> None:
    async def test(http: HttpClient, url: str, server: Server) -> None:
        for _ in range(5):
            assert await http.post(url, HEADERS, b"{}", 5) == 200
        assert len(await asyncio.gather(*(http.post(url, HEADERS, b"{}", 5) for _ in range(3))))

    server = run(keep_alive, test)
    assert len(server.requests) == 8
    assert server.connections == 3  # one for the sequence, up to three side by side
    assert server.requests[0].startswith(b"POST /hook HTTP/1.1\r\nHost: localhost:")


def test_chunked_bodies_interim_answers_and_redirects() -> None:
    answers = iter(
        [
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0\r\n\r\n",
        ]
    )

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server
    ) -> None:
        while True:
            await s.read_request(reader)
            writer.write(next(answers))
            await writer.drain()

    async def test(http: HttpClient, url: str, server: Server) -> None:
        assert [await http.post(url, HEADERS, b"{}", 5) for _ in range(3)] == [201, 204, 302]

    server = run(handler, test)
    assert server.connections == 1


def test_a_long_body_is_cut_at_the_limit_and_the_status_stands() -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server
    ) -> None:
        while True:
            await s.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n")
            for _ in range(100):
                writer.write(b"x" * 100_000)
                await writer.drain()

    async def test(http: HttpClient, url: str, server: Server) -> None:
        assert await http.post(url, HEADERS, b"{}", 5) == 200
        assert await http.post(url, HEADERS, b"{}", 5) == 200

    server = run(handler, test)
    assert server.connections == 2  # the first connection was dropped, not drained


def test_no_answer_is_a_timeout_at_the_deadline() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(reader)
        await reader.read()  # until the client gives up

    async def test(http: HttpClient, url: str, server: Server) -> None:
        started = time.monotonic()
        with pytest.raises(HttpError) as caught:
            await http.post(url, HEADERS, b"{}", 0.3)
        assert caught.value.kind == "timeout"
        assert caught.value.detail == "no answer in 0.3s"
        assert 0.29 <= time.monotonic() - started < 2

    run(silent, test)


def test_a_connection_closed_by_the_server_after_an_answer_is_not_reused() -> None:
    async def one_per_connection(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server
    ) -> None:
        await s.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")  # keep-alive promised...
        await writer.drain()
        # ...but the connection closes after one answer, as an idle timeout on the server would.

    async def test(http: HttpClient, url: str, server: Server) -> None:
        for _ in range(3):
            assert await http.post(url, HEADERS, b"{}", 5) == 200
            await wait_for(lambda: not http._live)  # the close arrived

    server = run(one_per_connection, test)
    assert server.connections == 3


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "malformed HTTP response"),
        (b"HTTP/1.1 200 OK\r\nX-Filler: " + b"a" * 8192 + b"\r\n\r\n", "response head larger"),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
            "the server switched",
        ),
        (b"", "connection closed before a response"),
    ],
)
def test_answers_that_are_not_http_are_invalid_responses(answer: bytes, detail: str) -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server
    ) -> None:
        await s.read_request(reader)
        writer.write(answer)
        await writer.drain()
        if answer:
            await reader.read()

    async def test(http: HttpClient, url: str, server: Server) -> None:
        with pytest.raises(HttpError) as caught:
            await http.post(url, HEADERS, b"{}", 5)
        assert caught.value.kind == ("connection_error" if not answer else "invalid_response")
        assert caught.value.detail.startswith(detail)

    run(handler, test)


def test_refused_connections_are_connection_errors() -> None:
    async def scenario(port: int) -> None:
        http = client()
        with pytest.raises(HttpError) as caught:
            await http.post(f"http://127.0.0.1:{port}/", HEADERS, b"{}", 5)
        await http.close()
        assert caught.value.kind == "connection_error"
        assert "127.0.0.1: " in caught.value.detail

    with refused_port() as port:
        asyncio.run(scenario(port))


def test_tls_is_verified_against_the_host_name() -> None:
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_context)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    server = Server(keep_alive, tls=server_context)

    async def scenario() -> None:
        async def test(url: str) -> None:
            trusted = client(ssl_context=trusting)
            assert await trusted.post(url, HEADERS, b"{}", 5) == 200
            await trusted.close()
            untrusted = client()  # the system's roots do not know this authority
            with pytest.raises(HttpError) as caught:
                await untrusted.post(url, HEADERS, b"{}", 5)
            await untrusted.close()
            assert caught.value.kind == "tls_error"
            assert "certificate verify failed" in caught.value.detail
            wrong_name = client(ssl_context=trusting)
            with pytest.raises(HttpError) as caught:
                await wrong_name.post(url.replace("localhost", "127.0.0.1"), HEADERS, b"{}", 5)
            await wrong_name.close()
            assert caught.value.kind == "tls_error"

        await serve(server, test)

    asyncio.run(scenario())
    assert len(server.requests) == 1


def test_a_connection_idle_longer_than_the_idle_timeout_is_not_reused() -> None:
    server = Server(keep_alive)

    async def scenario() -> None:
        async def test(url: str) -> None:
            http = client(idle_timeout=0.2)
            assert await http.post(url, HEADERS, b"{}", 5) == 200
            assert await http.post(url, HEADERS, b"{}", 5) == 200  # reused at once
            await asyncio.sleep(0.3)  # the condition under test: more idle time than allowed
            assert await http.post(url, HEADERS, b"{}", 5) == 200
            await http.close()

        await serve(server, test)

    asyncio.run(scenario())
    assert server.connections == 2


async def many_origins(
    count: int, test: Callable[[list[str], list[Server]], Awaitable[None]]
) -> None:
    """Run ``test`` with ``count`` keep-alive servers, each its own origin (its own port)."""
    servers = [Server(keep_alive) for _ in range(count)]
    listeners = [await asyncio.start_server(s._client, "127.0.0.1", 0) for s in servers]
    urls = [f"http://127.0.0.1:{ln.sockets[0].getsockname()[1]}/hook" for ln in listeners]
    try:
        await test(urls, servers)
    finally:
        for listener in listeners:
            listener.close()


def test_idle_connections_across_origins_are_bounded_the_longest_idle_closed_first() -> None:
    async def test(urls: list[str], servers: list[Server]) -> None:
        http = client(max_idle=5)
        try:
            for url in urls:  # one delivery to each of 12 hosts, each leaving its connection idle
                assert await http.post(url, HEADERS, b"{}", 5) == 200
            assert http.idle_connections == 5
            await wait_for(lambda: len(http._live) == 5)  # the other seven are closed
            kept = {origin[2] for origin in http._pools.by_origin}
            assert kept == {int(url.split(":")[2].split("/")[0]) for url in urls[-5:]}
            assert await http.post(urls[-1], HEADERS, b"{}", 5) == 200  # reused, not a new one
            assert servers[-1].connections == 1
        finally:
            await http.close()

    asyncio.run(many_origins(12, test))


def test_a_bound_of_zero_keeps_no_connection_idle() -> None:
    async def test(urls: list[str], servers: list[Server]) -> None:
        http = client(max_idle=0)
        try:
            for _ in range(3):
                assert await http.post(urls[0], HEADERS, b"{}", 5) == 200
                assert http.idle_connections == 0
            await wait_for(lambda: not http._live)
            assert servers[0].connections == 3  # a new connection per request
        finally:
            await http.close()

    asyncio.run(many_origins(1, test))


def test_the_sender_keeps_idle_what_max_idle_connections_allows_not_what_max_in_flight_does() -> (
    None
):
    """Between deliveries the connections idle across hosts outnumber those ever busy at once;
    the in-flight limit does not bound them (it once did, and 45 % of the deliveries to 10,000
    webhooks on 500 hosts opened a connection)."""
    delivery = DeliveryConfig(max_in_flight=2, max_idle_connections=6, allow_private_networks=True)

    async def test(urls: list[str], servers: list[Server]) -> None:
        http = HttpSender.from_settings(delivery)._client
        try:
            for url in urls:  # one at a time: never more than one busy
                assert await http.post(url, HEADERS, b"{}", 5) == 200
            assert http.idle_connections == 6
            for url in urls[-6:]:  # each reused
                assert await http.post(url, HEADERS, b"{}", 5) == 200
            assert [server.connections for server in servers[-6:]] == [1] * 6
        finally:
            await http.close()

    asyncio.run(many_origins(8, test))


def test_idle_connections_are_closed_on_time_even_when_their_origin_is_never_used_again() -> None:
    async def test(urls: list[str], servers: list[Server]) -> None:
        http = client(idle_timeout=0.2)
        try:
            for url in urls:
                assert await http.post(url, HEADERS, b"{}", 5) == 200
            assert http.idle_connections == len(urls)
            await wait_for(lambda: not http._live, 3)  # no request needed to close them
            assert http.idle_connections == 0 and not http._pools.by_origin
            assert http._pools.sweeper is None, "nothing idle: no timer left behind"
            assert await http.post(urls[0], HEADERS, b"{}", 5) == 200  # a new connection
            assert servers[0].connections == 2
        finally:
            await http.close()

    asyncio.run(many_origins(4, test))


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_the_idle_timer_comes_back_only_when_something_expires(event_loop: str) -> None:
    """uvloop's clock counts whole milliseconds: a timer due at an expiry once found nothing
    expired (by a rounding) and came back at once, hundreds of times (262 calls for 25
    connections closed). Each call now closes something, or is rescheduled by a reuse."""
    import uvloop

    async def test(urls: list[str], servers: list[Server]) -> None:
        http = client(idle_timeout=0.02)
        pools = http._pools
        calls, closed = [0], [0]
        sweep = pools.sweep

        def counted() -> None:
            before = len(pools.idle)
            calls[0] += 1
            sweep()
            closed[0] += before - len(pools.idle)

        pools.sweep = counted  # type: ignore[method-assign]
        try:
            for _ in range(5):
                for url in urls:
                    assert await http.post(url, HEADERS, b"{}", 5) == 200
                    await asyncio.sleep(0.007)
            await wait_for(lambda: not pools.idle, 2)
            assert closed[0] >= 5 and calls[0] <= 2 * closed[0], (calls, closed)
        finally:
            await http.close()

    (uvloop.run if event_loop == "uvloop" else asyncio.run)(many_origins(5, test))


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_a_closed_tls_connection_is_freed_at_once_not_by_the_garbage_collector(
    event_loop: str,
) -> None:
    """Issue 22: a receiver closing after each answer over TLS. Each dead connection must be
    freed by reference counting when it is lost, its TLS state with it (a read buffer of 256 KB
    and OpenSSL's objects), not wait in a reference cycle for the cyclic garbage collector: under
    churn hundreds waited at a time, and the C allocator kept the memory they had used."""
    import gc
    import weakref

    import uvloop

    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_context)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    http = client(ssl_context=trusting)
    watched: list[weakref.ref[object]] = []

    async def one_answer(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server
    ) -> None:
        await s.read_request(reader)
        for connection in http._live:  # the client's end of this exchange, and its TLS object
            watched.append(weakref.ref(connection))
            assert connection.transport is not None
            watched.append(weakref.ref(connection.transport.get_extra_info("ssl_object")))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()

    server = Server(one_answer, tls=server_context)

    async def scenario() -> None:
        async def test(url: str) -> None:
            for _ in range(3):
                assert await http.post(url, HEADERS, b"{}", 5) == 200
                await wait_for(lambda: not http._live)
            await asyncio.sleep(0.05)  # the transports finish closing
            await http.close()

        await serve(server, test)

    gc.collect()
    gc.disable()  # only reference counting may free them
    try:
        (uvloop.run if event_loop == "uvloop" else asyncio.run)(scenario())
        assert len(watched) == 6
        assert [ref() for ref in watched] == [None] * 6
    finally:
        gc.enable()
    assert server.connections == 3


def test_glibc_is_asked_to_give_memory_back_every_so_many_tls_connections_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 22: a free block in the middle of a heap goes back to the system only when glibc
    trims its heaps; under TLS connection churn the client has it trim every TRIM_EVERY TLS
    connections closed (here every 2), and never for plain HTTP ones."""
    from bridge.http import client as module

    if module._LIBC is None:
        pytest.skip("not glibc")
    monkeypatch.setattr(module, "TRIM_EVERY", 2)
    monkeypatch.setattr(module.TRIMMER, "closed", 0)
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_context)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)

    async def one_answer(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server
    ) -> None:
        await s.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()

    def trims_after(connections: int, tls: ssl.SSLContext | None) -> int:
        before = module.TRIMMER.trims
        http = client(ssl_context=trusting)

        async def scenario() -> None:
            async def test(url: str) -> None:
                for _ in range(connections):
                    assert await http.post(url, HEADERS, b"{}", 5) == 200
                    await wait_for(lambda: not http._live)  # closed
                await http.close()

            await serve(Server(one_answer, tls=tls), test)

        asyncio.run(scenario())
        return module.TRIMMER.trims - before

    assert trims_after(5, None) == 0  # plain HTTP connections are not counted
    assert trims_after(5, server_context) == 2  # the 2nd and the 4th TLS connection closed
    assert module.TRIMMER.closed == 1


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
    await s.read_request(reader)
    writer.transport.abort()


async def _not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
    await s.read_request(reader)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    await writer.drain()


async def _not_tls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
    writer.write(b"HTTP/1.1 400 Not TLS\r\n\r\n" * 4)
    await writer.drain()
    await asyncio.sleep(5)


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
    await s.read_request(reader)
    await asyncio.sleep(5)


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize(
    "kind", ["answered", "reset", "not_http", "timeout", "refused", "tls", "not_tls"]
)
def test_an_exchange_leaves_nothing_for_the_cyclic_collector(kind: str, event_loop: str) -> None:
    """Whatever happened to an exchange, what it made is freed when its last reference goes, never
    left in a reference cycle (a connection and its parser, an error and the frame holding it):
    with many deliveries failing at once, such cycles reach the oldest generation, which the
    bridge collects rarely (bridge.ops.collector)."""
    authority = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(tls)
    handlers: dict[str, Handler] = {"answered": keep_alive, "reset": _hang_up}
    handlers |= {
        "not_http": _not_http,
        "timeout": _silent,
        "refused": keep_alive,
        "tls": keep_alive,
        "not_tls": _not_tls,
    }
    server = Server(handlers[kind], tls=tls if kind == "tls" else None)

    async def scenario() -> None:
        async def test(url: str) -> None:
            if kind == "refused":
                url = f"http://127.0.0.1:{refused}/hook"
            if kind == "not_tls":
                url = url.replace("http:", "https:")
            http = client()  # the system's roots: the test authority is not trusted

            async def post() -> str:
                try:
                    return str(await http.post(url, HEADERS, b"{}", 0.2))
                except HttpError as exc:
                    return exc.kind

            outcome = await post()  # a first exchange fills what is kept for the next ones
            try:
                with bridge_cycles() as left:
                    outcomes = {await post() for _ in range(10)}
                    await asyncio.sleep(0.05)  # connections aborted are lost on the next turns
            finally:
                await http.close()
            expected = {
                "answered": "200",
                "reset": "connection_error",
                "not_http": "invalid_response",
                "timeout": "timeout",
                "refused": "connection_error",
                "tls": "tls_error",
                "not_tls": "tls_error",
            }
            assert outcomes == {outcome} == {expected[kind]}
            assert left == [], "\n".join(left)

        await serve(server, test)

    import uvloop

    with refused_port() as refused:
        (uvloop.run if event_loop == "uvloop" else asyncio.run)(scenario())


def test_a_connection_lost_before_it_was_made_ends_quietly() -> None:
    """The parser is made when the connection is: a transport that reported a loss without a
    connection first (none does) would still find everything released, and nothing raised."""

    async def scenario() -> None:
        live: set[_Connection] = set()
        connection = _Connection(_Pools(4.0, 10), ("http", "h", 80, 0), live, 4096, 1024)
        assert not hasattr(connection, "parser")
        connection.connection_lost(None)
        assert connection.closed and connection.transport is None and not live

    asyncio.run(scenario())
