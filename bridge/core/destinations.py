"""Outbound safety: which IP addresses a delivery may connect to.

:class:`DestinationPolicy` is the pure decision. :class:`SafeResolver` applies it to the addresses
a host name resolves to, which are the addresses the delivery client connects to, so a DNS answer
cannot smuggle a private address in (no rebinding bypass). The configuration check uses
:meth:`DestinationPolicy.url_refusal` on literal addresses at load time.

Where the verdicts come from
----------------------------

From data shipped in the package (``bridge/core/data/``), never from the Python runtime: the tables
behind ``ipaddress``'s ``is_private`` and ``is_global`` change between patch releases (on 3.11.7
192.0.0.192 and 2002:7f00:1:: pass as global), so a verdict must not depend on which Python runs
the bridge.

- ``iana-ipv4-special-registry.csv`` and ``iana-ipv6-special-registry.csv``: IANA's IPv4 and IPv6
  Special-Purpose Address Registries (RFC 6890, RFC 8190), in IANA's own CSV layout, footnote
  marks, several blocks in one cell and blank flags on terminated rows included. An address is
  public when no row covers it, or when the MOST SPECIFIC row covering it says ``Globally
  Reachable: True``; ``False``, ``N/A`` and blank (terminated rows) make it special. Multicast
  (224.0.0.0/4, ff00::/8) is in neither registry and is refused as multicast, and an IPv6 address
  outside 2000::/3 that no row covers is refused as not global unicast.
- ``registry-dates.csv``: each registry's source and its "Last Updated" date as shown on the
  registry's page (:data:`REGISTRY_DATES`; :data:`REGISTRY_DATE` is the newer one). The rows are
  those of the IPv4 registry last updated 2020-09-04 and the IPv6 registry as of 2025-04 (its
  newest row, 100:0:0:1::/64, was allocated then).
- ``cloud-metadata-addresses.csv``: cloud metadata and host-service addresses, one a row, naming
  the cloud (:data:`METADATA_ADDRESSES`, :data:`METADATA_NETWORKS`).

**Updating.** Download the two registries' CSV files (the ``Source`` column of
``registry-dates.csv``) over the files of the same name, unchanged: the loader reads IANA's format
as published. Set ``Last Updated`` in ``registry-dates.csv`` from each registry's page, then run
``tests/unit/test_netsafety.py``, whose table test checks a verdict for every row. A block name
not in ``_LABELS`` still works and is named in refusals as ``special-purpose (<name>)``; add it
there for a shorter message. The files are read once, at import; a file that does not parse
stops the import (the bridge refuses to run rather than guess).

The decision
------------

In this order:

1. An address in ``allowed_networks`` is allowed: the operator listed it (even a metadata address).
2. An IPv6 address that embeds an IPv4 address is judged on the IPv4 address, by these same
   rules (``allowed_networks`` included), and the refusal names both: IPv4-mapped
   (``::ffff:a.b.c.d``), IPv4-compatible (``::a.b.c.d``, deprecated), 6to4 (``2002:AABB:CCDD::/48``:
   the 32 bits after 2002), Teredo (``2001:0::/32``: the client, the last 32 bits inverted, and
   the server in bits 32 to 63 must both be allowed), NAT64 with the well-known prefix
   ``64:ff9b::/96`` and the local-use prefix ``64:ff9b:1::/48`` (RFC 8215; read as an RFC 6052
   /96 prefix: the last 32 bits).
3. Cloud metadata and host-service addresses are refused, even with ``allow_private``.
4. Every link-local address (169.254.0.0/16, fe80::/10) is refused, even with ``allow_private``:
   metadata services live there (AWS, GCP, Azure, OpenStack, Tencent...) and new ones appear
   without notice, so no list of them can be complete.
5. Special-purpose (per the registries), multicast and non-global-unicast IPv6 addresses are
   refused, unless ``allow_private``.
"""

from __future__ import annotations

import csv
import io
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Final, Generic, TypeAlias, TypeVar
from urllib.parse import urlsplit

from bridge.core.errors import DestinationRefusedError

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

_T = TypeVar("_T")

_DATA: Final = resources.files("bridge.core").joinpath("data")
_REGISTRY_FILES: Final[Mapping[int, str]] = {
    4: "iana-ipv4-special-registry.csv",
    6: "iana-ipv6-special-registry.csv",
}
_REGISTRY_COLUMNS: Final = (
    "Address Block",
    "Name",
    "RFC",
    "Allocation Date",
    "Termination Date",
    "Source",
    "Destination",
    "Forwardable",
    "Globally Reachable",
    "Reserved-by-Protocol",
)
_FOOTNOTE: Final = re.compile(r"\s*\[\d+\]")
_FLAGS: Final[Mapping[str, bool | None]] = {"true": True, "false": False, "n/a": None, "": None}
_DATE: Final = re.compile(r"\d{4}-\d{2}(?:-\d{2})?")


@dataclass(frozen=True, slots=True)
class SpecialBlock:
    """One address block of a row of an IANA special-purpose address registry."""

    network: IPNetwork
    name: str
    rfc: str
    termination_date: str | None
    """When the allocation ended (a terminated row has no flags), or None (``N/A``)."""
    globally_reachable: bool | None
    """The ``Globally Reachable`` column; None for ``N/A`` and blank."""

    @property
    def label(self) -> str:
        """How refusals name it, article included: ``a private``, ``an IETF protocol ...``."""
        return _LABELS.get(self.name, f"a special-purpose ({self.name})")


@dataclass(frozen=True, slots=True)
class Registry:
    """One IANA special-purpose address registry as shipped in ``bridge/core/data/``."""

    version: int
    file: str
    title: str
    source: str
    last_updated: str
    """The registry page's "Last Updated": ``YYYY-MM-DD``, or ``YYYY-MM`` if only that is known."""
    blocks: tuple[SpecialBlock, ...]


@dataclass(frozen=True, slots=True)
class MetadataAddress:
    """A cloud metadata or host-service address (or network), and whose it is."""

    network: IPNetwork
    cloud: str
    service: str


_LABELS: Final[Mapping[str, str]] = {
    # IPv4 registry names
    "This network": "a this-network",
    "This host on this network": "an unspecified",
    "Private-Use": "a private",
    "Shared Address Space": "a carrier-grade NAT",
    "Loopback": "a loopback",
    "Link Local": "a link-local",
    "IETF Protocol Assignments": "an IETF protocol assignment",
    "IPv4 Service Continuity Prefix": "an IPv4 service continuity (DS-Lite)",
    "IPv4 dummy address": "an IPv4 dummy",
    "NAT64/DNS64 Discovery": "a NAT64/DNS64 discovery",
    "Documentation (TEST-NET-1)": "a documentation",
    "Documentation (TEST-NET-2)": "a documentation",
    "Documentation (TEST-NET-3)": "a documentation",
    "Deprecated (6to4 Relay Anycast)": "a deprecated 6to4 relay anycast",
    "6a44-relay anycast address": "a 6a44 relay anycast",
    "Benchmarking": "a benchmarking",
    "Reserved": "a reserved",
    "Limited Broadcast": "a broadcast",
    # IPv6 registry names
    "Loopback Address": "a loopback",
    "Unspecified Address": "an unspecified",
    "IPv4-mapped Address": "an IPv4-mapped",
    "IPv4-IPv6 Translat.": "a NAT64",
    "Discard-Only Address Block": "a discard-only",
    "Dummy IPv6 Prefix": "an IPv6 dummy",
    "TEREDO": "a Teredo",
    "Deprecated (previously ORCHID)": "a deprecated ORCHID",
    "Documentation": "a documentation",
    "6to4": "a 6to4",
    "Segment Routing (SRv6) SIDs": "an SRv6 SID",
    "Unique-Local": "a unique-local",
    "Link-Local Unicast": "a link-local",
}
"""How refusals name each registry block (by the registry's ``Name``), article included."""

_METADATA_LABEL: Final = "a cloud metadata"
_LINK_LOCAL_LABEL: Final = "a link-local"
_MULTICAST_LABEL: Final = "a multicast"
_NOT_GLOBAL_UNICAST_LABEL: Final = "a non-global-unicast (outside 2000::/3)"


def _read_csv(name: str, columns: Iterable[str]) -> list[dict[str, str]]:
    """The rows of ``bridge/core/data/<name>`` with the named columns (which must all be there)."""
    text = _DATA.joinpath(name).read_text(encoding="utf-8-sig")
    reader = csv.DictReader(io.StringIO(text))
    missing = [column for column in columns if column not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(
            f"bridge/core/data/{name}: no column {missing[0]!r}: has the format changed?"
        )
    rows = [
        {key: (value or "").strip() for key, value in row.items() if key is not None}
        for row in reader
    ]
    return [row for row in rows if any(row.values())]


def _flag(cell: str, where: str) -> bool | None:
    text = _FOOTNOTE.sub("", cell).strip().lower()
    if text not in _FLAGS:
        raise ValueError(f"{where}: Globally Reachable is {cell!r}, not True, False or N/A")
    return _FLAGS[text]


def _load_registry(version: int, file: str, dates: Mapping[str, dict[str, str]]) -> Registry:
    about = dates.get(file)
    if about is None or not _DATE.fullmatch(about["Last Updated"]):
        raise ValueError(f"bridge/core/data/registry-dates.csv: no valid Last Updated for {file}")
    blocks: list[SpecialBlock] = []
    for row in _read_csv(file, _REGISTRY_COLUMNS):
        where = f"bridge/core/data/{file}: {row['Address Block']!r}"
        name = " ".join(row["Name"].replace('"', "").split())
        termination = _FOOTNOTE.sub("", row["Termination Date"]).strip()
        reachable = _flag(row["Globally Reachable"], where)
        for cell in _FOOTNOTE.sub("", row["Address Block"]).split(","):
            network = ipaddress.ip_network(cell.strip())
            if network.version != version:
                raise ValueError(f"{where}: {network} is not an IPv{version} block")
            blocks.append(
                SpecialBlock(
                    network=network,
                    name=name,
                    rfc=" ".join(row["RFC"].split()),
                    termination_date=None if termination in ("", "N/A") else termination,
                    globally_reachable=reachable,
                )
            )
    if len(blocks) < 10:
        raise ValueError(f"bridge/core/data/{file}: only {len(blocks)} blocks: truncated?")
    return Registry(
        version, file, about["Registry"], about["Source"], about["Last Updated"], tuple(blocks)
    )


def _load_registries() -> tuple[Registry, ...]:
    columns = ("File", "Registry", "Source", "Last Updated")
    dates = {row["File"]: row for row in _read_csv("registry-dates.csv", columns)}
    return tuple(_load_registry(version, file, dates) for version, file in _REGISTRY_FILES.items())


def _load_metadata() -> tuple[MetadataAddress, ...]:
    return tuple(
        MetadataAddress(ipaddress.ip_network(row["Address"]), row["Cloud"], row["Service"])
        for row in _read_csv("cloud-metadata-addresses.csv", ("Address", "Cloud", "Service"))
    )


REGISTRIES: Final[tuple[Registry, ...]] = _load_registries()
"""The IANA IPv4 and IPv6 special-purpose address registries, in that order."""

REGISTRY_DATES: Final[Mapping[int, str]] = {
    registry.version: registry.last_updated for registry in REGISTRIES
}
"""Each registry's "Last Updated" date, by IP version."""

REGISTRY_DATE: Final[str] = max(REGISTRY_DATES.values())
"""The newer of the two registries' "Last Updated" dates: how current the verdicts are."""

METADATA_ADDRESSES: Final[tuple[MetadataAddress, ...]] = _load_metadata()
"""Cloud metadata and host-service addresses, refused even with ``allow_private`` unless listed in
``allowed_networks``."""

METADATA_NETWORKS: Final[tuple[IPNetwork, ...]] = tuple(
    entry.network for entry in METADATA_ADDRESSES
)
"""The networks of :data:`METADATA_ADDRESSES`."""


class _PrefixTable(Generic[_T]):
    """Most-specific match of an address (as an integer) against networks: one dict of network
    integers per prefix length, longest first, so a lookup is one dict probe per length in use."""

    __slots__ = ("_levels",)

    def __init__(self, bits: int, entries: Iterable[tuple[IPNetwork, _T]]) -> None:
        by_length: dict[int, dict[int, _T]] = {}
        for network, value in entries:
            level = by_length.setdefault(network.prefixlen, {})
            key = int(network.network_address)
            if level.get(key, value) != value:
                raise ValueError(f"{network} is listed twice, differently")
            level[key] = value
        every = (1 << bits) - 1
        self._levels = tuple(
            (every ^ (every >> length), by_length[length])
            for length in sorted(by_length, reverse=True)
        )

    def get(self, value: int) -> _T | None:
        """What the most specific network holding ``value`` maps to, or None."""
        for mask, level in self._levels:
            found = level.get(value & mask)
            if found is not None:
                return found
        return None


def _special_table(bits: int, version: int, multicast: str) -> _PrefixTable[str]:
    """Refusal label of the most specific registry block, ``""`` for a globally reachable one."""
    (registry,) = (registry for registry in REGISTRIES if registry.version == version)
    entries: list[tuple[IPNetwork, str]] = [
        (block.network, "" if block.globally_reachable is True else block.label)
        for block in registry.blocks
    ]
    entries.append((ipaddress.ip_network(multicast), _MULTICAST_LABEL))
    return _PrefixTable(bits, entries)


def _metadata_table(bits: int, version: int) -> _PrefixTable[bool]:
    return _PrefixTable(
        bits, ((network, True) for network in METADATA_NETWORKS if network.version == version)
    )


_SPECIAL_4: Final = _special_table(32, 4, "224.0.0.0/4")
_SPECIAL_6: Final = _special_table(128, 6, "ff00::/8")
_METADATA_4: Final = _metadata_table(32, 4)
_METADATA_6: Final = _metadata_table(128, 6)

_ALL_32: Final = 0xFFFF_FFFF
_LINK_LOCAL_4: Final = 0xA9FE  # 169.254.0.0/16: the top 16 bits
_LINK_LOCAL_6: Final = 0xFE80 >> 6  # fe80::/10: the top 10 bits
_GLOBAL_UNICAST_6: Final = 0b001  # 2000::/3: the top 3 bits
_NAT64_WELL_KNOWN: Final = 0x0064_FF9B_0000_0000_0000_0000  # 64:ff9b::/96: the top 96 bits
_NAT64_LOCAL_USE: Final = 0x0064_FF9B_0001  # 64:ff9b:1::/48: the top 48 bits
_SIX_TO_FOUR: Final = 0x2002  # 2002::/16: the top 16 bits
_TEREDO: Final = 0x2001_0000  # 2001::/32: the top 32 bits


def _embedded_ipv4(value: int) -> tuple[str, int, int | None] | None:
    """For an IPv6 address (as an integer) that embeds an IPv4 address: the form (article
    included), the IPv4 address, and for Teredo the server's IPv4 address; None otherwise."""
    high = value >> 32
    if high == 0xFFFF:
        return "an IPv4-mapped", value & _ALL_32, None
    if high == 0:
        # :: and ::1 are the unspecified and loopback addresses, judged as such.
        return None if value <= 1 else ("an IPv4-compatible", value & _ALL_32, None)
    if high == _NAT64_WELL_KNOWN:
        return "a NAT64", value & _ALL_32, None
    if value >> 80 == _NAT64_LOCAL_USE:
        return "a local-use NAT64", value & _ALL_32, None
    if value >> 112 == _SIX_TO_FOUR:
        return "a 6to4", (value >> 80) & _ALL_32, None
    if value >> 96 == _TEREDO:
        return "a Teredo", (value & _ALL_32) ^ _ALL_32, (value >> 64) & _ALL_32
    return None


def _ipv4_text(value: int) -> str:
    return str(ipaddress.IPv4Address(value))


class DestinationPolicy:
    """Refuses every destination but public unicast addresses, by the rules in the module
    docstring: IANA's special-purpose registries, multicast, non-global-unicast IPv6, the IPv4
    forms embedded in IPv6, cloud metadata and host-service addresses, and link-local addresses.

    ``allow_private`` lets special-purpose, multicast and non-global-unicast addresses through,
    but never cloud metadata or host-service addresses nor link-local ones (metadata services live
    there). Addresses in ``allowed_networks`` are always allowed: list a metadata address there to
    reach it on purpose.
    """

    __slots__ = ("_allow_private", "_allowed_4", "_allowed_6", "_allowed_networks")

    def __init__(self, allow_private: bool = False, allowed_networks: Iterable[IPNetwork] = ()):
        self._allow_private = allow_private
        self._allowed_networks = tuple(allowed_networks)
        self._allowed_4 = _PrefixTable(
            32, ((network, True) for network in self._allowed_networks if network.version == 4)
        )
        self._allowed_6 = _PrefixTable(
            128, ((network, True) for network in self._allowed_networks if network.version == 6)
        )

    def refusal(self, ip: str) -> str | None:
        """Why a connection to ``ip`` is refused, or None when it is allowed."""
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return f"{ip!r} is not an IP address"
        value = int(address)
        if address.version == 4:
            label = self._ipv4_refusal(value)
            return None if label is None else f"{ip} is {label} address"
        if self._allowed_6.get(value):
            return None
        embedded = _embedded_ipv4(value)
        if embedded is None:
            label = self._ipv6_refusal(value)
            return None if label is None else f"{ip} is {label} address"
        form, ipv4, server = embedded
        label = self._ipv4_refusal(ipv4)
        if label is not None:
            return f"{ip} is {form} form of {_ipv4_text(ipv4)}, {label} address"
        if server is not None:
            label = self._ipv4_refusal(server)
            if label is not None:
                return f"{ip} is {form} form whose server {_ipv4_text(server)} is {label} address"
        return None

    def _ipv4_refusal(self, value: int) -> str | None:
        """The refusal label of an IPv4 address (as an integer), or None when it is allowed."""
        if self._allowed_4.get(value):
            return None
        if _METADATA_4.get(value):
            return _METADATA_LABEL
        if value >> 16 == _LINK_LOCAL_4:
            return _LINK_LOCAL_LABEL
        label = _SPECIAL_4.get(value)
        if not label or self._allow_private:
            return None
        return label

    def _ipv6_refusal(self, value: int) -> str | None:
        """The refusal label of an IPv6 address (as an integer) that embeds no IPv4 address and
        is not in ``allowed_networks``, or None when it is allowed."""
        if _METADATA_6.get(value):
            return _METADATA_LABEL
        if value >> 118 == _LINK_LOCAL_6:
            return _LINK_LOCAL_LABEL
        label = _SPECIAL_6.get(value)
        if label is None and value >> 125 != _GLOBAL_UNICAST_6:
            label = _NOT_GLOBAL_UNICAST_LABEL
        if not label or self._allow_private:
            return None
        return label

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
