"""Resolving a destination to the addresses the outbound policy allows: the addresses actually
connected to, so a DNS answer cannot smuggle a refused address in (no rebinding bypass).

Name lookups share nothing that one name can hold. The system resolver (``getaddrinfo``) runs
in a small pool of threads shared by every lookup of the process (libuv's four under uvloop),
and a lookup whose name server never answers holds a thread for the resolver's whole timeout,
however soon the delivery that asked gives up. Measured: with three such lookups pending, a
name in ``/etc/hosts`` took 2.9 s to resolve; with eight, 11.9 s. So one webhook whose host name
a silent or slow name server serves held up every other webhook's new connections. Lookups are
therefore made by c-ares (:class:`AresLookup`: ``/etc/hosts``, then DNS as ``/etc/resolv.conf``
says, search domains and ``ndots`` included), whose queries are sockets and timers, not threads:
a silent name costs its own query and nothing else. Concurrent lookups of one name share one
query, and a name that did not resolve is remembered as such for ``FAILURE_TTL_S``, so a
webhook's many deliveries ask once (:class:`SafeResolver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import pycares

from bridge.core.destinations import DestinationPolicy
from bridge.core.errors import DestinationRefusedError
from bridge.core.expiring import Expiring

log = logging.getLogger("bridge.http.resolver")

Lookup: TypeAlias = Callable[[str, int], Awaitable[list[str]]]
"""Resolves a host name and port to IP addresses, raising OSError when it cannot."""
Answer: TypeAlias = list[str] | DestinationRefusedError | OSError
"""What a resolution gave: the allowed addresses, the policy's refusal, or the lookup's failure."""

QUERY_TIMEOUT_S = 2.0
"""c-ares's first wait for a name server's answer (it doubles on each retry)."""
QUERY_TRIES = 2
"""How many times c-ares asks each name server."""
LOOKUP_DEADLINE_S = 10.0
"""The longest one lookup may take, whatever the name servers and the search domains."""
FAILURE_TTL_S = 2.0
"""How long a name that did not resolve is remembered as such (asked again after)."""
MAX_ADDRESSES = 16
"""Addresses of one name kept (in the answer's order): connecting tries them one by one anyway."""
MAX_REFUSALS_SHOWN = 3
"""Refused addresses named in an error (it is written into headers of shared topics)."""


async def system_lookup(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, in the resolver's order, by the
    system resolver (threads shared by every lookup of the process: see the module's text)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class AresLookup:
    """Name lookups by c-ares: no thread per lookup, so a name whose server never answers holds
    up no other (see the module's text). The channel, and c-ares's own event thread, are made
    on first use; its answers are handed to the event loop that asked.

    When c-ares cannot start (``pycares.Channel`` raises: no usable resolver configuration, say),
    lookups go to the system resolver instead, with a warning
    (``dns.system_resolver``), rather than every delivery failing."""

    def __init__(self, timeout: float = QUERY_TIMEOUT_S, tries: int = QUERY_TRIES) -> None:
        self._timeout = timeout
        self._tries = tries
        self._channel: pycares.Channel | None = None
        self._fallback = False

    async def __call__(self, host: str, port: int) -> list[str]:
        """The addresses ``host`` resolves to for a TCP connection; ``socket.gaierror`` naming
        what c-ares said when it does not resolve."""
        loop = asyncio.get_running_loop()
        if self._channel is None and not self._fallback:
            try:
                # Truncated UDP answers are taken as they are, never asked again over TCP: a
                # name answering 65 KB (6,433 addresses) over TCP cost 210 ms of CPU, most of it
                # on the event loop, and c-ares kept it for its TTL (a hostile review).
                flags = pycares.ARES_FLAG_IGNTC | pycares.ARES_FLAG_EDNS
                self._channel = pycares.Channel(
                    timeout=self._timeout, tries=self._tries, flags=flags
                )
            except pycares.AresError as exc:
                self._fallback = True
                log.warning("dns.system_resolver", extra={"fields": {"error": str(exc)}})
        if self._channel is None:
            return await system_lookup(host, port)
        answer: asyncio.Future[list[str]] = loop.create_future()

        def answered(result: Any, error: int | None) -> None:  # on c-ares's thread
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_settle, answer, result, error)

        try:
            self._channel.getaddrinfo(
                host, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM, callback=answered
            )
        except pycares.AresError as exc:  # refused before any query (a name c-ares cannot ask)
            raise socket.gaierror(f"cannot look up: {exc}") from None
        return await answer

    def close(self) -> None:
        """Stop c-ares's thread and cancel what is pending (a later lookup makes a new channel)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _settle(answer: asyncio.Future[list[str]], result: Any, error: int | None) -> None:
    if answer.done():
        return
    if error:
        answer.set_exception(socket.gaierror(error, pycares.errno.strerror(error)))
        return
    addresses = (node.addr[0] for node in result.nodes)  # (SafeResolver keeps MAX_ADDRESSES)
    text = (a.decode("ascii") if isinstance(a, bytes) else str(a) for a in addresses)
    answer.set_result(list(dict.fromkeys(text)))


class SafeResolver:
    """Resolves a destination host to the addresses the policy allows, which are the only ones
    connected to, so a DNS answer cannot smuggle a private address in (no rebinding bypass).

    A literal IP host is checked as it is. Answers, refusals included, are cached for ``ttl``
    seconds; a name that did not resolve (OSError from the lookup, or no answer within
    ``LOOKUP_DEADLINE_S``) for ``FAILURE_TTL_S``. Callers asking for a name while it is being
    looked up share that lookup (one caller giving up does not end it for the others). When no
    address remains it raises DestinationRefusedError naming the first refusals.
    """

    def __init__(
        self, policy: DestinationPolicy, lookup: Lookup | None = None, ttl: float = 10.0
    ) -> None:
        self._policy = policy
        self._lookup: Lookup = lookup if lookup is not None else AresLookup()
        self._ttl = ttl
        self._cache: Expiring[str, Answer] = Expiring()
        self._pending: dict[str, asyncio.Future[Answer]] = {}

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses of ``host`` the policy allows; DestinationRefusedError, or the lookup's
        OSError."""
        cached = self._cache.get(host)  # (by host: its addresses do not depend on the port)
        if cached is not None and cached[0] > time.monotonic():
            answer = cached[1]
        else:
            pending = self._pending.get(host)
            if pending is None:
                pending = self._pending[host] = asyncio.ensure_future(self._refresh(host, port))
            answer = await asyncio.shield(pending)
        if isinstance(answer, Exception):
            raise answer.with_traceback(None)
        return answer

    async def _refresh(self, host: str, port: int) -> Answer:
        """Look ``host`` up once, cache the answer (a failure more briefly) and return it."""
        ttl = self._ttl
        answer: Answer
        try:
            async with asyncio.timeout(LOOKUP_DEADLINE_S):
                answer = await self._allowed(host, port)
        except TimeoutError:
            answer, ttl = socket.gaierror(f"no answer in {LOOKUP_DEADLINE_S:g}s"), FAILURE_TTL_S
        except OSError as exc:
            answer, ttl = exc, FAILURE_TTL_S
        except Exception as exc:  # nothing unforeseen reaches the callers as anything else
            answer, ttl = socket.gaierror(f"lookup failed ({type(exc).__name__})"), FAILURE_TTL_S
        finally:
            del self._pending[host]
        now = time.monotonic()
        self._cache.put(host, now + ttl, answer, now)
        return answer

    def close(self) -> None:
        """Release the lookup's resources (c-ares's thread), if it holds any."""
        close = getattr(self._lookup, "close", None)
        if close is not None:
            close()

    async def _allowed(self, host: str, port: int) -> list[str] | DestinationRefusedError:
        try:
            ipaddress.ip_address(host)
            addresses = [host]
        except ValueError:
            addresses = (await self._lookup(host, port))[:MAX_ADDRESSES]
        allowed: list[str] = []
        refusals: dict[str, None] = {}
        for address in addresses:
            refusal = self._policy.refusal(address)
            if refusal is None:
                allowed.append(address)
            else:
                refusals[refusal] = None
        if allowed:
            return allowed
        if addresses == [host]:
            return DestinationRefusedError("destination_refused", "; ".join(refusals))
        shown = list(refusals)[:MAX_REFUSALS_SHOWN]
        more = len(refusals) - len(shown)
        listed = "; ".join(shown) + (f"; and {more} more" if more else "")
        detail = f"{host} resolves only to refused addresses: {listed}"
        return DestinationRefusedError("destination_refused", detail)
