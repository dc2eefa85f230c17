"""Outbound safety: which IP addresses a delivery may connect to.

:class:`DestinationPolicy` is the pure decision. :class:`SafeResolver` applies it to the addresses
a host name resolves to, which are the addresses the delivery client connects to, so a DNS answer
cannot smuggle a private address in (no rebinding bypass). The configuration check uses
:meth:`DestinationPolicy.url_refusal` on literal addresses at load time.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, TypeAlias
from urllib.parse import urlsplit

from bridge.errors import DestinationRefusedError

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_NETWORKS: Final[tuple[IPNetwork, ...]] = tuple(
    ipaddress.ip_network(network)
    for network in (
        "169.254.169.254/32",  # AWS, GCP, Azure, OpenStack instance metadata
        "169.254.170.2/32",  # AWS ECS task credentials
        "100.100.100.200/32",  # Alibaba Cloud metadata
        "fd00:ec2::254/128",  # AWS instance metadata over IPv6
    )
)
"""Cloud metadata endpoints: refused even when private networks are allowed, unless listed."""

_CARRIER_GRADE_NAT: Final = ipaddress.IPv4Network("100.64.0.0/10")
_UNIQUE_LOCAL: Final = ipaddress.IPv6Network("fc00::/7")
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")


def _embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped or NAT64 IPv6 address, else the address itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return address


def _category(address: IPAddress) -> str | None:
    """Why an address is not a public destination (``"loopback"``...), or None when it is one."""
    checks = (
        ("cloud metadata", any(address in network for network in METADATA_NETWORKS)),
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("carrier-grade NAT", address in _CARRIER_GRADE_NAT),
        ("unique-local", address in _UNIQUE_LOCAL),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("non-global", not address.is_global),
    )
    return next((name for name, matches in checks if matches), None)


class DestinationPolicy:
    """Refuses private, loopback, link-local, multicast, reserved and metadata destinations.

    ``allow_private`` lets every such address through except cloud metadata endpoints; addresses in
    ``allowed_networks`` are always allowed (list a metadata address there to reach it).
    """

    __slots__ = ("_allow_private", "_allowed_networks")

    def __init__(self, allow_private: bool = False, allowed_networks: Iterable[IPNetwork] = ()):
        self._allow_private = allow_private
        self._allowed_networks = tuple(allowed_networks)

    def refusal(self, ip: str) -> str | None:
        """Why a connection to ``ip`` is refused, or None when it is allowed."""
        try:
            address = _embedded_ipv4(ipaddress.ip_address(ip))
        except ValueError:
            return f"{ip!r} is not an IP address"
        if any(address in network for network in self._allowed_networks):
            return None
        category = _category(address)
        if category is None or (self._allow_private and category != "cloud metadata"):
            return None
        return f"{ip} is a {category} address"

    def check(self, ip: str) -> None:
        """Raise DestinationRefusedError unless a connection to ``ip`` is allowed."""
        refusal = self.refusal(ip)
        if refusal is not None:
            raise DestinationRefusedError("destination_refused", refusal)

    def url_refusal(self, url: str) -> str | None:
        """Why the URL's host is refused when it is a literal IP address; None for names."""
        host = urlsplit(url).hostname
        if host is None:
            return f"URL {url!r} has no host"
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return None
        return self.refusal(host)


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
