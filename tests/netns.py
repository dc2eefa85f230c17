"""Network faults for integration tests: a network namespace of the test's own, nftables rules in
it that cut or thin traffic, and a TCP proxy that delays it.

Topology. One namespace per test module (:func:`network_namespace`), its loopback up, holding
everything that talks: the broker, the bridge processes, the receivers, the proxy and the test's
own Kafka clients. All of them use 127.0.0.1 *inside* the namespace, so no address outside the
test's own namespace is ever used, and the host's firewall and routes are never touched: the
rules live in the namespace and go with it.

How the test process gets in. Linux network namespaces belong to threads: a thread can switch
with ``setns(fd, CLONE_NEWNET)`` (through ctypes: Python 3.11 has no ``os.setns``), and whatever
it creates from then on belongs to the namespace it is in at that moment, for good:

- a socket (a listening one included) stays in the namespace it was created in;
- a thread starts in its creator's namespace: the receivers' and the proxy's event-loop threads,
  and librdkafka's threads, which a confluent-kafka client creates when it is constructed;
- a child process starts in its parent thread's namespace: the broker's JVM and
  ``python -m bridge run``.

So a test enters the namespace for its whole body (:meth:`Namespace.entered`, a context manager
that switches the calling thread in and always back out) and builds its world there with the
ordinary helpers, unchanged: ``Broker.start()``, ``BridgeSetup``, ``Receiver``, the ledger's
readers. This was chosen over running the helpers as subprocesses under ``ip netns exec``
because the helpers then keep their in-process interfaces (the receiver's recorded requests, the
bridge's metrics over HTTP) and nothing needs a second protocol to report back. The rules are
loaded with ``ip netns exec NAME nft ...``, which names the namespace explicitly whatever
namespace the calling thread is in.

Faults. nftables rules in an ``inet`` table of the namespace, on the input hook (loopback traffic
passes it once per packet, in each direction):

- :meth:`Namespace.cut`: drop every TCP segment to or from a port: a silent network cut (no RST,
  no ICMP), as a broken switch or a partitioned zone looks to both ends;
- :meth:`Namespace.loss`: drop that share of the segments to or from a port at random
  (``numgen random``);
- :class:`DelayProxy`: latency (the kernel has no ``sch_netem`` here, so ``tc netem`` cannot be
  used), a userspace proxy holding every chunk for a fixed time in each direction.

Each rule counts what it dropped (:meth:`Fault.dropped`). Clean-up always happens: rules are
removed when their context ends, and :func:`network_namespace` kills whatever still runs inside
the namespace (only processes the test started there can be in it) and deletes it, also when
the test fails. Names carry the creating pid, so a namespace left by a killed test run is
deleted by the next run.

Needs root (CAP_NET_ADMIN), ``ip`` and ``nft``: :func:`ensure_net_tools` installs the tools
(``deploy/kafka/ensure-net-tools.sh``) and fails with the reason when it cannot.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[1]
ENSURE_SCRIPT = REPO / "deploy" / "kafka" / "ensure-net-tools.sh"
PREFIX = "bridge-t"
"""Namespaces made here are named ``bridge-t-<pid>-<random>``."""
_NAME = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]+$")
CLONE_NEWNET = 0x40000000
TABLE = "inet bridge_faults"
_HANDLE = re.compile(r"# handle (\d+)")
_libc = ctypes.CDLL(None, use_errno=True)


class NetworkToolsMissing(AssertionError):
    """``ip``/``nft`` or the privileges to use them are missing; the message says what to do."""


def ensure_net_tools() -> None:
    """Install ``ip`` and ``nft`` when missing (the script); fail with the reason when they cannot
    be had, or when this process may not create network namespaces."""
    result = subprocess.run(
        ["sh", str(ENSURE_SCRIPT)], capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        raise NetworkToolsMissing(
            f"the network-fault tests need iproute2 and nftables: {result.stderr.strip()}"
        )
    if os.geteuid() != 0:
        raise NetworkToolsMissing(
            "the network-fault tests create a network namespace and load nftables rules in it: "
            "run them as root (CAP_NET_ADMIN)"
        )


def _sbin(tool: str) -> str:
    """The tool's path (root's tools live in sbin, which PATH may lack)."""
    for folder in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        if os.access(f"{folder}/{tool}", os.X_OK):
            return f"{folder}/{tool}"
    return tool


def _run(argv: list[str], stdin: str | None = None) -> str:
    """Run a command; its stdout, or an AssertionError with its stderr."""
    result = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


def _setns(fd: int) -> None:
    """Move the calling thread into the network namespace ``fd`` refers to."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns(CLONE_NEWNET) failed: {os.strerror(errno)}")


def _own_namespace() -> int:
    """A descriptor of the calling thread's network namespace (``/proc/self`` would be the main
    thread's)."""
    return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Namespace:
    """A network namespace of this test run, with its loopback up; see the module docstring."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._table = False

    @property
    def path(self) -> Path:
        return Path("/run/netns") / self.name

    @classmethod
    def create(cls) -> Namespace:
        """A new, uniquely named namespace (stale ones of dead test runs are deleted first)."""
        ip = _sbin("ip")
        for line in _run([ip, "netns", "list"]).splitlines():
            name = line.split()[0] if line.split() else ""
            match = _NAME.match(name)
            if match and not _alive(int(match.group(1))):
                subprocess.run([ip, "netns", "delete", name], capture_output=True, check=False)
        namespace = cls(f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}")
        result = subprocess.run(
            [ip, "netns", "add", namespace.name], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise NetworkToolsMissing(
                f"cannot create a network namespace ({result.stderr.strip()}): the network-fault "
                "tests need root (CAP_NET_ADMIN)"
            )
        try:
            namespace.run(ip, "link", "set", "lo", "up")
        except BaseException:
            namespace.delete()
            raise
        return namespace

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec``)."""
        return [_sbin("ip"), "netns", "exec", self.name, *argv]

    def run(self, *argv: str, stdin: str | None = None) -> str:
        """Run a command inside the namespace; its stdout (AssertionError when it fails)."""
        return _run(self.command(*argv), stdin)

    @contextmanager
    def entered(self) -> Iterator[Namespace]:
        """Switch the calling thread into the namespace, and back out at the end, whatever
        happens. Sockets, threads, Kafka clients and processes made meanwhile stay inside."""
        own = _own_namespace()
        try:
            target = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                yield self
            finally:
                _setns(own)
        finally:
            os.close(own)

    def pids(self) -> list[int]:
        """The processes inside the namespace."""
        return [int(pid) for pid in _run([_sbin("ip"), "netns", "pids", self.name]).split()]

    def delete(self) -> None:
        """Kill what still runs inside (only what the test started can be there), then delete
        the namespace; its rules go with it."""
        for pid in self.pids():
            if pid != os.getpid():
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _run([_sbin("ip"), "netns", "delete", self.name])

    # ---- nftables ---------------------------------------------------------------------------

    def nft(self, command: str) -> str:
        """One nft command inside the namespace; its echoed output."""
        return self.run(_sbin("nft"), "--echo", "--handle", command)

    def _ensure_table(self) -> None:
        if not self._table:
            script = (
                f"add table {TABLE}\n"
                f"add chain {TABLE} input {{ type filter hook input priority 0; policy accept; }}\n"
            )
            self.run(_sbin("nft"), "-f", "-", stdin=script)
            self._table = True

    def add_rule(self, rule: str) -> int:
        """Add a rule to the input chain of the namespace's table; its handle."""
        self._ensure_table()
        echoed = self.nft(f"add rule {TABLE} input {rule}")
        match = _HANDLE.search(echoed)
        if match is None:
            raise AssertionError(f"nft did not report the handle of {rule!r}: {echoed!r}")
        return int(match.group(1))

    def delete_rule(self, handle: int) -> None:
        self.run(_sbin("nft"), "delete", "rule", *TABLE.split(), "input", "handle", str(handle))

    def rule_counters(self) -> dict[int, int]:
        """Packets counted by each rule of the input chain, by handle."""
        if not self._table:
            return {}
        listing = self.run(_sbin("nft"), "--handle", "list", "chain", *TABLE.split(), "input")
        counted = re.compile(r"counter packets (\d+) bytes \d+ .*# handle (\d+)")
        return {int(m.group(2)): int(m.group(1)) for m in counted.finditer(listing)}

    def cut(self, port: int) -> Fault:
        """Drop every TCP segment to and from ``port``: a silent cut (enter the result)."""
        return Fault(self, [f"tcp dport {port} counter drop", f"tcp sport {port} counter drop"])

    def loss(self, port: int, percent: int) -> Fault:
        """Drop ``percent`` % of the TCP segments to and from ``port`` at random."""
        assert 0 < percent < 100
        chance = f"numgen random mod 100 < {percent}"
        return Fault(
            self,
            [f"tcp dport {port} {chance} counter drop", f"tcp sport {port} {chance} counter drop"],
        )


class Fault:
    """Rules in force from :meth:`apply` (or entering) to :meth:`remove` (or leaving)."""

    def __init__(self, namespace: Namespace, rules: list[str]) -> None:
        self.namespace = namespace
        self.rules = rules
        self.handles: list[int] = []
        self.applied_at: float | None = None
        self.removed_at: float | None = None
        self._dropped = 0

    @property
    def active(self) -> bool:
        return bool(self.handles)

    def apply(self) -> Fault:
        assert not self.handles, "the fault is in force already"
        try:
            for rule in self.rules:
                self.handles.append(self.namespace.add_rule(rule))
        except BaseException:
            self.remove()
            raise
        self.applied_at = time.time()
        return self

    def remove(self) -> None:
        """Lift the rules (their counts are kept for :meth:`dropped`)."""
        if self.handles:
            self._dropped = self.dropped()
        while self.handles:
            self.namespace.delete_rule(self.handles.pop())
        self.removed_at = time.time()

    def dropped(self) -> int:
        """Packets dropped by the rules so far."""
        if not self.handles:
            return self._dropped
        counters = self.namespace.rule_counters()
        return sum(counters.get(handle, 0) for handle in self.handles)

    def __enter__(self) -> Fault:
        return self.apply()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.remove()


@contextmanager
def network_namespace() -> Iterator[Namespace]:
    """A new namespace (the tools installed first), deleted at the end whatever happens."""
    ensure_net_tools()
    namespace = Namespace.create()
    try:
        yield namespace
    finally:
        namespace.delete()


Observer = Callable[[int, bytes, float], None]
"""Called with (connection number, bytes, time.time()) for each chunk a client sends."""


class DelayProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream_port`` that holds every chunk ``delay``
    seconds in each direction (order kept), as a long network path would.

    The listening socket is made in the calling thread's namespace; the proxy's thread moves into
    the namespace of the thread that calls :meth:`start` before it connects upstream. Ends of
    stream are passed on (after the same delay); a reset or a refused upstream connection ends
    both sides. ``observe`` sees the client's bytes the moment they reach the proxy.
    """

    def __init__(self, upstream_port: int, delay: float, observe: Observer | None = None) -> None:
        self.upstream_port = upstream_port
        self.delay = delay
        self.observe = observe
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._numbers = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._transports: set[asyncio.WriteTransport] = set()
        self._namespace_fd: int | None = None
        self._thread = threading.Thread(target=self._serve, name="delay-proxy", daemon=True)

    def start(self) -> DelayProxy:
        self._namespace_fd = _own_namespace()
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")
        return self

    def stop(self) -> None:
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)
        if self._namespace_fd is not None:
            os.close(self._namespace_fd)
            self._namespace_fd = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def _serve(self) -> None:
        assert self._namespace_fd is not None
        _setns(self._namespace_fd)
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._accepted, sock=self._listener)
        self._ready.set()
        await self._stopping.wait()
        server.close()
        for transport in list(self._transports):
            transport.abort()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._connection(reader, writer))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = next(self._numbers)
        self.connections += 1
        self._transports.add(writer.transport)
        connecting = asyncio.ensure_future(asyncio.open_connection("127.0.0.1", self.upstream_port))

        async def client_reader() -> asyncio.StreamReader:
            return reader

        async def client_writer() -> asyncio.StreamWriter:
            return writer

        async def upstream_reader() -> asyncio.StreamReader:
            return (await connecting)[0]

        async def upstream_writer() -> asyncio.StreamWriter:
            upstream = (await connecting)[1]
            self._transports.add(upstream.transport)
            return upstream

        pipes = [
            asyncio.ensure_future(self._pipe(client_reader, upstream_writer, number)),
            asyncio.ensure_future(self._pipe(upstream_reader, client_writer, None)),
        ]
        clean = False
        try:
            await asyncio.gather(*pipes)
            clean = True
        except (OSError, EOFError):
            pass  # a reset, or the upstream refused: end both sides
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            ends = [writer]
            if not connecting.done():
                connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
            if not connecting.cancelled() and connecting.exception() is None:
                ends.append(connecting.result()[1])
            for end in ends:
                self._transports.discard(end.transport)
                if clean:
                    end.close()
                else:
                    end.transport.abort()

    async def _pipe(
        self,
        source: Callable[[], Awaitable[asyncio.StreamReader]],
        sink: Callable[[], Awaitable[asyncio.StreamWriter]],
        number: int | None,
    ) -> None:
        """Copy one direction, each chunk ``delay`` seconds after it arrived."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            reader = await source()
            while True:
                data = await reader.read(65_536)
                if data and number is not None and self.observe is not None:
                    self.observe(number, data, time.time())
                queue.put_nowait((loop.time() + self.delay, data))
                if not data:
                    return

        async def write() -> None:
            writer = await sink()
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        await asyncio.gather(read(), write())
