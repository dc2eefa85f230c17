"""Resolving a destination to the addresses the outbound policy allows: the addresses actually
connected to, so a DNS answer cannot smuggle a refused address in (no rebinding bypass)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TypeAlias

from bridge.core.destinations import DestinationPolicy
from bridge.core.errors import DestinationRefusedError

Lookup: TypeAlias = Callable[[str, int], Awaitable[list[str]]]
"""Resolves a host name and port to IP addresses (the system resolver by default)."""


async def system_lookup(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, in the resolver's order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class SafeResolver:
    """Resolves a destination host to the addresses the policy allows, which are the only ones
    connected to, so a DNS answer cannot smuggle a private address in (no rebinding bypass).

    A literal IP host is checked as it is. Answers, refusals included, are cached for ``ttl``
    seconds. When no address remains it raises DestinationRefusedError naming every refusal.
    """

    def __init__(
        self, policy: DestinationPolicy, lookup: Lookup = system_lookup, ttl: float = 10.0
    ) -> None:
        self._policy = policy
        self._lookup = lookup
        self._ttl = ttl
        self._cache: dict[tuple[str, int], tuple[float, list[str] | DestinationRefusedError]] = {}

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses of ``host`` the policy allows, or DestinationRefusedError."""
        now = time.monotonic()
        cached = self._cache.get((host, port))
        if cached is None or cached[0] <= now:
            cached = (now + self._ttl, await self._allowed(host, port))
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[(host, port)] = cached
        answer = cached[1]
        if isinstance(answer, DestinationRefusedError):
            raise answer
        return answer

    async def _allowed(self, host: str, port: int) -> list[str] | DestinationRefusedError:
        try:
            ipaddress.ip_address(host)
            addresses = [host]
        except ValueError:
            addresses = await self._lookup(host, port)
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
        detail = f"{host} resolves only to refused addresses: {'; '.join(refusals)}"
        return DestinationRefusedError("destination_refused", detail)
