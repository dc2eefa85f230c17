"""A hostile webhook receiver for the benchmark's isolation scenario, run in its own process.

``python -m devtools.bench_hostile --port P [--early-port Q]`` listens on 127.0.0.1 only. It reads
each request (head and body) and answers by the path's prefix, as a receiver that tries to slow,
stall or fool its client:

- ``/double``: two complete responses (a 200, then a 204) in one write.
- ``/stage``: a 204 with keep-alive to every request; then, once the connection has been idle for
  20 ms, an unsolicited 204 that nobody asked for (once per idle spell).
- ``/trickle``: a 200 head, then a chunked body of one byte every 50 ms that never ends.
- ``/huge-headers``: a 200 whose one header line is 256 KB.
- ``/slow-headers``: a status line, then one header byte every 50 ms, never finished.
- ``/reset``: a head promising 100 bytes, 10 of them, then an abort with SO_LINGER 0 (a reset).
- ``/bad-chunked``: a chunked 200 whose first chunk size is ``zz``.
- ``/garbage``: an SSH greeting instead of HTTP.
- ``/early``: a 204 written as soon as the connection is accepted, before the request is read; the
  request, and anything sent after it, is then read and ignored. A server cannot know a path
  before it reads the request, so this one has a port of its own (``--early-port``, any free port
  by default); every connection to it behaves so whatever the path.
- anything else: a 404 with keep-alive. ``GET /__stats`` is answered normally with
  ``{"connections": n, "early_port": q}`` (connections accepted on both ports), then closed.

After its act a connection is held until the client closes it, and every connection is closed
after 30 s at most (``--max-connection-s``). Whatever a client sends or does, it ends that
connection only: the server keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
from collections.abc import Awaitable, Callable

HOSTILE_PATHS = (
    "/double",
    "/stage",
    "/trickle",
    "/huge-headers",
    "/slow-headers",
    "/reset",
    "/bad-chunked",
    "/garbage",
    "/early",
)
MAX_CONNECTION_S = 30.0
STAGE_IDLE_S = 0.02
DRIP_S = 0.05
MAX_BODY = 1 << 20
NO_CONTENT = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str] | None:
    """Read one request, head and body: its method and path; None when the client closed first.

    Raises ``ValueError`` (or a stream error) for anything that is not a request."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise
        return None
    lines = head.decode("latin-1").lstrip("\r\n").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if not 0 <= length <= MAX_BODY:
        raise ValueError(f"Content-Length {length}")
    await reader.readexactly(length)
    return method, path


async def until_closed(reader: asyncio.StreamReader) -> None:
    """Read and ignore everything until the client closes its side (or resets)."""
    try:
        while await reader.read(65_536):
            pass
    except OSError:
        pass


async def drip(writer: asyncio.StreamWriter, let_go: asyncio.Future[None], data: bytes) -> None:
    """Write ``data`` every ``DRIP_S`` until the client lets go."""
    while not let_go.done():
        writer.write(data)
        await writer.drain()
        await asyncio.wait([let_go], timeout=DRIP_S)


class HostileServer:
    """The acts, and how many connections were accepted."""

    def __init__(self, max_connection_s: float = MAX_CONNECTION_S) -> None:
        self.max_connection_s = max_connection_s
        self.connections = 0
        self.early_port = 0

    async def _guarded(
        self,
        handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Run one connection's handler for at most ``max_connection_s``; any failure ends only
        this connection."""
        self.connections += 1
        try:
            async with asyncio.timeout(self.max_connection_s):
                await handler(reader, writer)
                writer.close()
                await writer.wait_closed()
        except Exception:  # a hostile exchange may end in any way; the server lives on
            pass
        finally:
            writer.transport.abort()  # nothing if closed already; at once after a timeout

    async def serve_main(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._guarded(self._main, reader, writer)

    async def serve_early(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._guarded(self._early, reader, writer)

    async def _early(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(NO_CONTENT)  # before a byte of the request was read
        await writer.drain()
        await until_closed(reader)

    async def _main(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        staging = False  # the last request was a /stage one: stage a 204 once the line is idle
        while True:
            if staging:
                try:
                    request = await asyncio.wait_for(read_request(reader), STAGE_IDLE_S)
                except TimeoutError:
                    writer.write(NO_CONTENT)  # nobody asked for this one
                    await writer.drain()
                    request = await read_request(reader)
            else:
                request = await read_request(reader)
            if request is None:
                return
            method, path = request
            if method == "GET" and path == "/__stats":
                body = json.dumps(
                    {"connections": self.connections, "early_port": self.early_port}
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
                return
            staging = path.startswith("/stage")
            if staging:
                writer.write(NO_CONTENT)
                await writer.drain()
            elif path.startswith(HOSTILE_PATHS):
                await self._act(path, reader, writer)
                return
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()

    async def _act(
        self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Answer a one-shot hostile path, then hold the connection until the client lets go."""
        let_go = asyncio.ensure_future(until_closed(reader))
        try:
            if path.startswith("/double"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" + NO_CONTENT)
            elif path.startswith("/trickle"):
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                await drip(writer, let_go, b"1\r\nx\r\n")
            elif path.startswith("/huge-headers"):
                writer.write(b"HTTP/1.1 200 OK\r\nX-Filler: " + b"a" * 262_144 + b"\r\n")
                writer.write(b"Content-Length: 0\r\n\r\n")
            elif path.startswith("/slow-headers"):
                writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                await drip(writer, let_go, b"a")
            elif path.startswith("/reset"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
                await writer.drain()
                await asyncio.sleep(0.05)  # let the ten bytes arrive before the reset
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            elif path.startswith("/bad-chunked"):
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
            elif path.startswith("/garbage"):
                writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
            await writer.drain()
            await let_go
        finally:
            let_go.cancel()


async def serve(port: int, early_port: int, max_connection_s: float) -> None:
    """Serve both ports until cancelled."""
    hostile = HostileServer(max_connection_s)
    main = await asyncio.start_server(hostile.serve_main, "127.0.0.1", port, backlog=1024)
    early = await asyncio.start_server(hostile.serve_early, "127.0.0.1", early_port, backlog=1024)
    hostile.early_port = early.sockets[0].getsockname()[1]
    async with main, early:
        await asyncio.gather(main.serve_forever(), early.serve_forever())


def main(argv: list[str] | None = None) -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--early-port", type=int, default=0, help="for /early; 0: any free port")
    parser.add_argument(
        "--max-connection-s", type=float, default=MAX_CONNECTION_S, help="close after this long"
    )
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(args.port, args.early_port, args.max_connection_s))


if __name__ == "__main__":
    main()
