"""Outbound safety: the address policy, its data, and the resolver inside the real delivery client.

The registry table test reads ``bridge/core/data/`` itself, with its own parser, and judges each
row's edges against the row's ``Globally Reachable`` column (the most specific row winning); the
IPv4 forms embedded in IPv6 are built and unwrapped here with the standard library's bit accessors
(``ipv4_mapped``, ``sixtofour``, ``teredo``), not with the module's own code.
"""

from __future__ import annotations

import asyncio
import csv
import datetime
import io
import ipaddress
import re
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import quote

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

import bridge.core.destinations as netsafety
from bridge.core.destinations import (
    METADATA_ADDRESSES,
    METADATA_NETWORKS,
    REGISTRIES,
    REGISTRY_DATE,
    REGISTRY_DATES,
    DestinationPolicy,
)
from bridge.core.errors import DestinationRefusedError
from bridge.core.urls import PATH_SAFE, UrlError, _has_userinfo, _host, _quote, ascii_host
from bridge.http.client import HttpClient, HttpError
from bridge.http.resolver import SafeResolver

IPv4 = ipaddress.IPv4Address
IPv6 = ipaddress.IPv6Address
Address = IPv4 | IPv6
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

DATA = resources.files("bridge.core").joinpath("data")
IANA_COLUMNS = [
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
]
REGISTRY_FILES = {4: "iana-ipv4-special-registry.csv", 6: "iana-ipv6-special-registry.csv"}


# --- The data, read here independently ------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One address block of a registry row, as this test reads the file."""

    network: Network
    name: str
    reachable: str  # the Globally Reachable cell without its footnote: True, False, N/A or ""

    def __str__(self) -> str:
        return f"{self.network} {self.name}"


def read_rows(file: str) -> list[Row]:
    text = DATA.joinpath(file).read_text(encoding="utf-8")
    rows: list[Row] = []
    for record in csv.DictReader(io.StringIO(text)):
        reachable = re.sub(r"\s*\[\d+\]", "", record["Globally Reachable"]).strip()
        for block in re.sub(r"\s*\[\d+\]", "", record["Address Block"]).split(","):
            rows.append(Row(ipaddress.ip_network(block.strip()), record["Name"], reachable))
    return rows


ROWS = {version: read_rows(file) for version, file in REGISTRY_FILES.items()}
ALL_ROWS = ROWS[4] + ROWS[6]

METADATA = [
    ipaddress.ip_address(row["Address"])
    for row in csv.DictReader(
        io.StringIO(DATA.joinpath("cloud-metadata-addresses.csv").read_text(encoding="utf-8"))
    )
]

# Every cloud metadata and host-service address the policy must know, whatever the file says.
REQUIRED_METADATA = [
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean instance metadata
    "169.254.169.253",  # AWS DNS
    "169.254.169.123",  # AWS NTP
    "169.254.170.2",  # AWS ECS task credentials
    "169.254.170.23",  # AWS EKS pod identity
    "169.254.0.23",  # Tencent Cloud
    "100.100.100.200",  # Alibaba Cloud
    "192.0.0.192",  # Oracle Cloud
    "168.63.129.16",  # Azure WireServer (a public address)
    "fd00:ec2::254",  # AWS IMDS over IPv6
    "fd00:ec2::253",  # AWS DNS over IPv6
    "fd00:ec2::123",  # AWS NTP over IPv6
    "fd00:ec2::23",  # AWS EKS pod identity over IPv6
    "fe80::a9fe:a9fe",  # OpenStack metadata over IPv6
    "fd20:ce::254",  # GCP metadata over IPv6
]


def most_specific(address: Address) -> Row | None:
    rows = [row for row in ROWS[address.version] if address in row.network]
    return max(rows, key=lambda row: row.network.prefixlen, default=None)


# --- IPv4 embedded in IPv6, with the standard library's bit accessors --------------------------

NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
TEREDO_SERVER = IPv4("8.8.4.4")


def embedded(address: IPv6) -> list[IPv4] | None:
    """The IPv4 addresses an IPv6 address embeds and is judged on, or None."""
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if int(address) >> 32 == 0 and int(address) > 1:
        return [IPv4(int(address))]
    if address in NAT64 or address in NAT64_LOCAL:
        return [IPv4(int(address) & 0xFFFF_FFFF)]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        server, client = address.teredo
        return [client, server]
    return None


def forms(ipv4: str) -> dict[str, IPv6]:
    """Every IPv6 form embedding ``ipv4`` (Teredo with a public server)."""
    value = int(IPv4(ipv4))
    teredo = (0x2001_0000 << 96) | (int(TEREDO_SERVER) << 64) | (value ^ 0xFFFF_FFFF)
    built = {
        "an IPv4-mapped": IPv6((0xFFFF << 32) | value),
        "an IPv4-compatible": IPv6(value),
        "a NAT64": IPv6(int(NAT64.network_address) | value),
        "a local-use NAT64": IPv6(int(NAT64_LOCAL.network_address) | value),
        "a 6to4": IPv6((0x2002 << 112) | (value << 80) | 1),
        "a Teredo": IPv6(teredo),
    }
    for address in built.values():  # the construction agrees with the standard library
        assert embedded(address) in ([IPv4(value)], [IPv4(value), TEREDO_SERVER])
    return built


def expected_public(address: Address, allow_private: bool = False) -> bool:
    """The verdict the policy must give, from the files: embedded forms on their IPv4, metadata
    and link-local refused, multicast and IPv6 outside 2000::/3 special, else the most specific
    registry row's Globally Reachable column."""
    if isinstance(address, IPv6) and (inner := embedded(address)) is not None:
        return all(expected_public(ipv4, allow_private) for ipv4 in inner)
    if address in METADATA or (address.version == 4 and address in LINK_LOCAL_4):
        return False
    if address.version == 6 and address in LINK_LOCAL_6:
        return False
    if allow_private:
        return True
    if address in MULTICAST[address.version]:
        return False
    row = most_specific(address)
    if row is None:
        return address.version == 4 or address in GLOBAL_UNICAST
    return row.reachable == "True"


LINK_LOCAL_4 = ipaddress.IPv4Network("169.254.0.0/16")
LINK_LOCAL_6 = ipaddress.IPv6Network("fe80::/10")
MULTICAST: dict[int, Network] = {
    4: ipaddress.IPv4Network("224.0.0.0/4"),
    6: ipaddress.IPv6Network("ff00::/8"),
}
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def allowed(policy: DestinationPolicy, ip: Address | str) -> bool:
    return policy.refusal(str(ip)) is None


# --- The data files -----------------------------------------------------------------------------


def test_registry_files_are_iana_csv_and_parse() -> None:
    for version, file in REGISTRY_FILES.items():
        text = DATA.joinpath(file).read_text(encoding="utf-8")
        assert next(csv.reader(io.StringIO(text))) == IANA_COLUMNS
        (registry,) = (registry for registry in REGISTRIES if registry.version == version)
        assert registry.file == file
        assert [block.network for block in registry.blocks] == [
            row.network for row in ROWS[version]
        ]
        assert registry.source.startswith("https://www.iana.org/assignments/")
    assert len(ROWS[4]) == 26 and len(ROWS[6]) == 25
    assert {row.reachable for row in ALL_ROWS} == {"True", "False", "N/A", ""}
    teredo = next(block for block in REGISTRIES[1].blocks if block.name == "TEREDO")
    assert teredo.rfc == "[RFC4380] [RFC8190]" and teredo.globally_reachable is None
    orchid = next(block for block in REGISTRIES[1].blocks if "ORCHID)" in block.name)
    assert orchid.termination_date == "2014-03" and orchid.globally_reachable is None


def test_registry_date_is_recorded() -> None:
    assert set(REGISTRY_DATES) == {4, 6}
    assert max(REGISTRY_DATES.values()) == REGISTRY_DATE
    for date in REGISTRY_DATES.values():
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", date)
        year, month, *day = (int(part) for part in date.split("-"))
        assert datetime.date(year, month, day[0] if day else 1) <= datetime.date.today()
    assert REGISTRY_DATE >= "2025-04"  # the newest row, 100:0:0:1::/64, is from 2025-04


def test_the_verdicts_do_not_use_the_runtimes_tables() -> None:
    source = Path(netsafety.__file__).read_text()
    assert not re.search(r"\.is_(private|global|reserved|loopback|link_local|multicast)", source)


def test_metadata_list_is_complete() -> None:
    assert [str(address) for address in METADATA] == REQUIRED_METADATA
    assert [entry.network for entry in METADATA_ADDRESSES] == list(METADATA_NETWORKS)
    assert all(entry.cloud and entry.service for entry in METADATA_ADDRESSES)
    assert all(network.num_addresses == 1 for network in METADATA_NETWORKS)


# --- Every registry row --------------------------------------------------------------------------


@pytest.mark.parametrize("row", ALL_ROWS, ids=str)
def test_every_registry_row_gives_its_verdict(row: Row) -> None:
    """The first and last address of each block get the verdict of the most specific row holding
    them; an IPv6 form that embeds IPv4 gets its IPv4 address's verdict instead."""
    for address in (row.network[0], row.network[-1]):
        expected = expected_public(address)
        assert allowed(DestinationPolicy(), address) == expected, address
        with_private = expected_public(address, allow_private=True)
        assert allowed(DestinationPolicy(allow_private=True), address) == with_private, address
        if isinstance(address, IPv6) and embedded(address) is not None:
            continue
        winner = most_specific(address)
        assert winner is not None
        assert expected == (winner.reachable == "True"), address


@pytest.mark.parametrize("row", ALL_ROWS, ids=str)
def test_refusals_name_the_most_specific_row(row: Row) -> None:
    (block,) = (
        block
        for registry in REGISTRIES
        for block in registry.blocks
        if block.network == row.network
    )
    if row.reachable != "True":
        assert not block.label.startswith("a special-purpose"), f"no short label: {row.name!r}"
    for address in (row.network[0], row.network[-1]):
        if most_specific(address) is not row or row.reachable == "True":
            continue
        if isinstance(address, IPv6) and embedded(address) is not None:
            continue  # named as a form of its IPv4 address
        assert DestinationPolicy().refusal(str(address)) == f"{address} is {block.label} address"


def test_documented_examples_of_each_registry_kind() -> None:
    policy = DestinationPolicy()
    for ip in ("192.0.0.9", "192.0.0.10", "192.31.196.1", "192.52.193.1", "192.175.48.1"):
        assert allowed(policy, ip), ip  # globally reachable rows inside special space
    for ip in ("2001:1::1", "2001:1::3", "2001:3::1", "2001:4:112::1", "2001:20::1", "2001:30::1"):
        assert allowed(policy, ip), ip
    assert allowed(policy, "2620:4f:8000::1")
    assert policy.refusal("192.0.0.8") == "192.0.0.8 is an IPv4 dummy address"
    assert policy.refusal("192.0.0.170") == "192.0.0.170 is a NAT64/DNS64 discovery address"
    assert policy.refusal("192.88.99.1") == "192.88.99.1 is a deprecated 6to4 relay anycast address"
    assert policy.refusal("255.255.255.255") == "255.255.255.255 is a broadcast address"
    assert policy.refusal("100:0:0:1::1") == "100:0:0:1::1 is an IPv6 dummy address"
    assert policy.refusal("5f00::1") == "5f00::1 is an SRv6 SID address"
    assert policy.refusal("3fff::1") == "3fff::1 is a documentation address"
    assert policy.refusal("2001:10::1") == "2001:10::1 is a deprecated ORCHID address"
    assert policy.refusal("2001:2::1") == "2001:2::1 is a benchmarking address"
    assert policy.refusal("2001:1ff::1") == "2001:1ff::1 is an IETF protocol assignment address"
    assert policy.refusal("4000::1") == "4000::1 is a non-global-unicast (outside 2000::/3) address"
    assert policy.refusal("ff0e::1") == "ff0e::1 is a multicast address"
    assert policy.refusal("239.255.255.250") == "239.255.255.250 is a multicast address"


# --- Python 3.11.7's misses -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ip", "refusal"),
    [
        ("192.0.0.192", "192.0.0.192 is a cloud metadata address"),
        ("2002:7f00:1::", "2002:7f00:1:: is a 6to4 form of 127.0.0.1, a loopback address"),
        (
            "2002:a9fe:a9fe::",
            "2002:a9fe:a9fe:: is a 6to4 form of 169.254.169.254, a cloud metadata address",
        ),
        ("168.63.129.16", "168.63.129.16 is a cloud metadata address"),
    ],
)
def test_runtime_misses_are_refused_by_default(ip: str, refusal: str) -> None:
    assert DestinationPolicy().refusal(ip) == refusal


@pytest.mark.parametrize("ip", ["fe80::a9fe:a9fe", "169.254.170.23", "fd00:ec2::23"])
def test_runtime_misses_are_refused_with_private_networks_allowed(ip: str) -> None:
    assert DestinationPolicy(allow_private=True).refusal(ip) == f"{ip} is a cloud metadata address"


# --- Cloud metadata and link-local --------------------------------------------------------------


@pytest.mark.parametrize("ip", REQUIRED_METADATA)
def test_metadata_is_refused_unless_listed(ip: str) -> None:
    message = f"{ip} is a cloud metadata address"
    assert DestinationPolicy().refusal(ip) == message
    assert DestinationPolicy(allow_private=True).refusal(ip) == message
    listed = DestinationPolicy(allowed_networks=[ipaddress.ip_network(ip)])
    assert listed.refusal(ip) is None
    others = [other for other in REQUIRED_METADATA if other != ip]
    assert all(listed.refusal(other) is not None for other in others)


@pytest.mark.parametrize("ip", [ip for ip in REQUIRED_METADATA if ":" not in ip])
def test_metadata_is_refused_through_every_embedded_form(ip: str) -> None:
    listed = DestinationPolicy(allowed_networks=[ipaddress.ip_network(ip)])
    for form, address in forms(ip).items():
        message = f"{address} is {form} form of {ip}, a cloud metadata address"
        assert DestinationPolicy().refusal(str(address)) == message
        assert DestinationPolicy(allow_private=True).refusal(str(address)) == message
        assert listed.refusal(str(address)) is None


@pytest.mark.parametrize(
    "ip", ["169.254.0.1", "169.254.10.20", "169.254.255.255", "fe80::1", "fe80::1%eth0", "febf::1"]
)
def test_link_local_is_refused_even_with_private_networks_allowed(ip: str) -> None:
    message = f"{ip} is a link-local address"
    assert DestinationPolicy().refusal(ip) == message
    assert DestinationPolicy(allow_private=True).refusal(ip) == message
    network = "169.254.0.0/16" if "." in ip else "fe80::/10"
    assert DestinationPolicy(allowed_networks=[ipaddress.ip_network(network)]).refusal(ip) is None


def test_link_local_is_refused_through_embedded_forms() -> None:
    for form, address in forms("169.254.1.2").items():
        assert DestinationPolicy(allow_private=True).refusal(str(address)) == (
            f"{address} is {form} form of 169.254.1.2, a link-local address"
        )


# --- IPv4 embedded in IPv6 ----------------------------------------------------------------------

EMBEDDED_CASES = [
    ("127.0.0.1", "a loopback", False),
    ("10.0.0.1", "a private", False),
    ("172.16.5.4", "a private", False),
    ("100.64.0.1", "a carrier-grade NAT", False),
    ("192.0.2.7", "a documentation", False),
    ("169.254.169.254", "a cloud metadata", True),
    ("100.100.100.200", "a cloud metadata", True),
    ("168.63.129.16", "a cloud metadata", True),
]


@pytest.mark.parametrize(("ipv4", "label", "always"), EMBEDDED_CASES)
def test_embedded_forms_are_judged_on_their_ipv4(ipv4: str, label: str, always: bool) -> None:
    assert len(forms(ipv4)) == 6
    for form, address in forms(ipv4).items():
        refusal = f"{address} is {form} form of {ipv4}, {label} address"
        assert DestinationPolicy().refusal(str(address)) == refusal
        assert DestinationPolicy(allow_private=True).refusal(str(address)) == (
            refusal if always else None
        )
        listed = DestinationPolicy(allowed_networks=[ipaddress.ip_network(ipv4)])
        assert listed.refusal(str(address)) is None


@pytest.mark.parametrize("ipv4", ["8.8.8.8", "93.184.216.34", "1.1.1.1"])
def test_embedded_forms_of_public_addresses_are_allowed(ipv4: str) -> None:
    for address in forms(ipv4).values():
        assert allowed(DestinationPolicy(), address), address


def test_teredo_is_refused_when_its_server_is() -> None:
    client = 0x0808_0808 ^ 0xFFFF_FFFF  # 8.8.8.8, public
    for server, label in [("10.0.0.1", "a private"), ("169.254.169.254", "a cloud metadata")]:
        address = IPv6((0x2001_0000 << 96) | (int(IPv4(server)) << 64) | client)
        assert address.teredo == (IPv4(server), IPv4("8.8.8.8"))
        assert DestinationPolicy().refusal(str(address)) == (
            f"{address} is a Teredo form whose server {server} is {label} address"
        )


def test_the_embedded_forms_are_read_at_the_documented_bits() -> None:
    policy = DestinationPolicy()
    assert policy.refusal("::ffff:127.0.0.1") == (
        "::ffff:127.0.0.1 is an IPv4-mapped form of 127.0.0.1, a loopback address"
    )
    assert policy.refusal("::10.0.0.1") == (
        "::10.0.0.1 is an IPv4-compatible form of 10.0.0.1, a private address"
    )
    assert policy.refusal("64:ff9b::7f00:1") == (
        "64:ff9b::7f00:1 is a NAT64 form of 127.0.0.1, a loopback address"
    )
    assert policy.refusal("64:ff9b:1:ffff::7f00:1") == (
        "64:ff9b:1:ffff::7f00:1 is a local-use NAT64 form of 127.0.0.1, a loopback address"
    )
    assert policy.refusal("2002:c0a8:101:5::1") == (
        "2002:c0a8:101:5::1 is a 6to4 form of 192.168.1.1, a private address"
    )
    # Teredo: server 65.54.227.120, client 127.0.0.1 obfuscated (inverted) in the last 32 bits.
    assert policy.refusal("2001:0:4136:e378:8000:63bf:80ff:fffe") == (
        "2001:0:4136:e378:8000:63bf:80ff:fffe is a Teredo form of 127.0.0.1, a loopback address"
    )
    assert policy.refusal("2001:0:4136:e378:8000:63bf:f7f7:f7f7") is None  # client 8.8.8.8
    assert policy.refusal("::") == ":: is an unspecified address"  # not a compatible form
    assert policy.refusal("::1") == "::1 is a loopback address"


# --- Properties ----------------------------------------------------------------------------------

POLICIES = [
    DestinationPolicy(),
    DestinationPolicy(allow_private=True),
    DestinationPolicy(
        allowed_networks=[
            ipaddress.ip_network("10.0.0.0/8"),
            ipaddress.ip_network("169.254.169.254/32"),
            ipaddress.ip_network("fd00::/8"),
        ]
    ),
]


@given(st.integers(min_value=0, max_value=2**128 - 1))
def test_refusal_never_raises_for_any_ipv6_address(value: int) -> None:
    for policy in POLICIES:
        refusal = policy.refusal(str(IPv6(value)))
        assert refusal is None or refusal.startswith(f"{IPv6(value)} is ")


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_an_ipv4_address_and_its_embedded_forms_agree(value: int) -> None:
    ipv4 = IPv4(value)
    for policy in POLICIES:
        refusal = policy.refusal(str(ipv4))
        assert refusal is None or refusal.startswith(f"{ipv4} is ")
        assert allowed(policy, IPv6((0xFFFF << 32) | value)) == (refusal is None)
        assert allowed(policy, IPv6(int(NAT64.network_address) | value)) == (refusal is None)
    assert allowed(DestinationPolicy(), ipv4) == expected_public(ipv4)


@given(st.integers(min_value=0, max_value=2**128 - 1))
def test_ipv6_verdicts_match_the_files(value: int) -> None:
    address = IPv6(value)
    assert allowed(DestinationPolicy(), address) == expected_public(address)
    assert allowed(DestinationPolicy(allow_private=True), address) == expected_public(address, True)


# --- The policy's API, as used by the configuration check and the resolver ---------------------

REFUSED = [
    ("10.1.2.3", "a private"),
    ("172.16.0.1", "a private"),
    ("192.168.1.10", "a private"),
    ("127.0.0.1", "a loopback"),
    ("::1", "a loopback"),
    ("224.0.0.251", "a multicast"),
    ("ff02::1", "a multicast"),
    ("0.0.0.0", "an unspecified"),
    ("::", "an unspecified"),
    ("240.0.0.1", "a reserved"),
    ("100.64.0.1", "a carrier-grade NAT"),
    ("fd12:3456::1", "a unique-local"),
    ("192.0.2.1", "a documentation"),
]
ALWAYS_REFUSED = [
    ("169.254.10.20", "a link-local"),
    ("fe80::1", "a link-local"),
    ("fe80::1%eth0", "a link-local"),
    ("169.254.169.254", "a cloud metadata"),
    ("169.254.170.2", "a cloud metadata"),
    ("100.100.100.200", "a cloud metadata"),
    ("fd00:ec2::254", "a cloud metadata"),
]
PUBLIC = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize(("ip", "label"), REFUSED + ALWAYS_REFUSED)
def test_non_public_addresses_are_refused_by_default(ip: str, label: str) -> None:
    policy = DestinationPolicy()
    assert policy.refusal(ip) == f"{ip} is {label} address"
    with pytest.raises(DestinationRefusedError) as caught:
        policy.check(ip)
    assert caught.value.reason == "destination_refused"
    assert caught.value.detail == f"{ip} is {label} address"


@pytest.mark.parametrize("ip", PUBLIC)
def test_public_addresses_are_allowed(ip: str) -> None:
    DestinationPolicy().check(ip)


@pytest.mark.parametrize(("ip", "label"), REFUSED + ALWAYS_REFUSED)
def test_allow_private_allows_all_but_metadata_and_link_local(ip: str, label: str) -> None:
    refusal = DestinationPolicy(allow_private=True).refusal(ip)
    assert refusal == (f"{ip} is {label} address" if (ip, label) in ALWAYS_REFUSED else None)


def test_allowed_networks_open_exactly_what_they_list() -> None:
    networks = [ipaddress.ip_network("10.20.0.0/16"), ipaddress.ip_network("169.254.169.254/32")]
    policy = DestinationPolicy(allowed_networks=networks)
    for ip in ("10.20.5.6", "::ffff:10.20.5.6", "169.254.169.254"):
        policy.check(ip)
    for ip in ("10.21.0.1", "127.0.0.1", "169.254.170.2"):
        assert policy.refusal(ip) is not None


def test_not_an_address_is_refused() -> None:
    assert DestinationPolicy(allow_private=True).refusal("example.com") == (
        "'example.com' is not an IP address"
    )


def test_url_hosts_are_checked_only_when_they_are_literal_addresses() -> None:
    policy = DestinationPolicy()
    assert policy.url_refusal("http://127.0.0.1:8080/x") == "127.0.0.1 is a loopback address"
    assert (
        policy.url_refusal("https://[fd00:ec2::254]/")
        == "fd00:ec2::254 is a cloud metadata address"
    )
    assert policy.url_refusal("https://localhost/") is None  # names are checked at resolution
    assert policy.url_refusal("https://93.184.216.34/") is None


def fixed_lookup(*addresses: str) -> Callable[[str, int], Awaitable[list[str]]]:
    """Answers every name with fixed addresses, as a DNS server under someone else's control."""
    calls: list[str] = []

    async def lookup(host: str, port: int) -> list[str]:
        calls.append(host)
        return list(addresses)

    lookup.calls = calls  # type: ignore[attr-defined]
    return lookup


def test_resolver_drops_refused_addresses() -> None:
    async def scenario() -> None:
        lookup = fixed_lookup("10.0.0.7", "93.184.216.34")
        resolver = SafeResolver(DestinationPolicy(), lookup)
        assert await resolver.resolve("rebind.example", 443) == ["93.184.216.34"]
        only_private = SafeResolver(DestinationPolicy(), fixed_lookup("10.0.0.7", "127.0.0.1"))
        with pytest.raises(DestinationRefusedError) as caught:
            await only_private.resolve("rebind.example", 443)
        assert caught.value.detail == (
            "rebind.example resolves only to refused addresses: "
            "10.0.0.7 is a private address; 127.0.0.1 is a loopback address"
        )

    asyncio.run(scenario())


def test_resolver_checks_literal_addresses_without_a_lookup_and_caches_answers() -> None:
    async def scenario() -> None:
        lookup = fixed_lookup("93.184.216.34")
        resolver = SafeResolver(DestinationPolicy(), lookup, ttl=60)
        with pytest.raises(DestinationRefusedError, match=r"^destination_refused: 127\.0\.0\.1 is"):
            await resolver.resolve("127.0.0.1", 80)
        assert await resolver.resolve("shop.example", 443) == ["93.184.216.34"]
        assert await resolver.resolve("shop.example", 443) == ["93.184.216.34"]
        assert lookup.calls == ["shop.example"]  # type: ignore[attr-defined]

    asyncio.run(scenario())


async def with_server(test: Callable[[int], Awaitable[None]]) -> None:
    """Run ``test(port)`` against a real aiohttp server on 127.0.0.1 that answers 204."""

    async def hook(request: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        await test(runner.addresses[0][1])
    finally:
        await runner.cleanup()


async def post(url: str, policy: DestinationPolicy) -> int:
    """POST through the delivery client, which connects only where SafeResolver allows."""
    client = HttpClient(SafeResolver(policy))
    try:
        return await client.post(url, {"Content-Type": "application/json"}, b"{}", 5.0)
    finally:
        await client.close()


def test_localhost_is_refused_by_resolution_in_a_real_client() -> None:
    async def scenario(port: int) -> None:
        with pytest.raises(HttpError) as caught:
            await post(f"http://localhost:{port}/hook", DestinationPolicy())
        assert caught.value.kind == "destination_refused"
        assert caught.value.detail.startswith("localhost resolves only to refused addresses: ")
        assert "127.0.0.1 is a loopback address" in caught.value.detail

    asyncio.run(with_server(scenario))


def test_localhost_is_reached_when_private_networks_are_allowed() -> None:
    async def scenario(port: int) -> None:
        assert await post(f"http://localhost:{port}/hook", DestinationPolicy(True)) == 204
        allowed = DestinationPolicy(allowed_networks=[ipaddress.ip_network("127.0.0.0/8")])
        assert await post(f"http://localhost:{port}/hook", allowed) == 204

    asyncio.run(with_server(scenario))


def test_literal_addresses_are_checked_by_the_policy_too() -> None:
    async def scenario(port: int) -> None:
        url = f"http://127.0.0.1:{port}/hook"
        assert await post(url, DestinationPolicy(True)) == 204
        with pytest.raises(HttpError, match=r"127\.0\.0\.1 is a loopback address"):
            await post(url, DestinationPolicy())

    asyncio.run(with_server(scenario))


# ---- the URL checks' shortcuts (bridge.core.urls) judge as the long way does ------------------

HOST_CHARS = st.sampled_from(
    [*"0123456789.", *"abcxz-_", "xn--", "ß", "ü", "\u0661", "\u0663", "\uff21", "@"]
)


@given(st.text(max_size=30))
def test_quoting_shortcut_matches_quote(text: str) -> None:
    assert _quote(text) == quote(text, safe=PATH_SAFE)


@given(st.text(max_size=30), st.sampled_from(["http://", "https://", "http:", "x"]))
def test_userinfo_shortcut_matches_the_normalised_check(text: str, scheme: str) -> None:
    url = scheme + text
    rest = url.partition(":")[2]
    authority = re.split(r"[/?#]", rest[2:], maxsplit=1)[0]
    expected = rest.startswith("//") and "@" in unicodedata.normalize("NFKC", authority)
    assert _has_userinfo(url) == expected


def judged(judge: Callable[[], object]) -> object:
    try:
        return judge()
    except UrlError as exc:
        return ("refused", str(exc))


@given(st.lists(HOST_CHARS, min_size=1, max_size=12).map("".join))
def test_host_shortcuts_match_the_long_way(hostname: str) -> None:
    def long_way() -> tuple[str, bool]:
        try:
            return str(ipaddress.IPv4Address(hostname)), True
        except ValueError:
            return ascii_host.__wrapped__(hostname), False

    assert judged(lambda: _host(hostname, False)) == judged(long_way)
    assert judged(lambda: _host(hostname, False)) == judged(long_way)  # remembered alike


def test_a_refused_host_name_is_refused_every_time() -> None:
    for _ in range(3):
        with pytest.raises(UrlError, match="has an empty label"):
            ascii_host("a..example")
    assert ascii_host("Bücher.Example") == ascii_host("bücher.example") == "xn--bcher-kva.example"


@pytest.mark.parametrize(
    "host",
    [
        "ü" * 50 + ".é" + "." + "x..y",  # labels encoded, then an empty one
        "bücher.exa\u0000mple",  # a control character
        "straße." + "ü" * 70 + ".de",  # a label too long once encoded
        "\u0667\u0661.\u0661a",  # bidi rule
        "a\u3002\u3002b",  # mapped to an empty label
    ],
)
def test_a_refused_host_is_judged_once_however_many_webhooks_name_it(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of webhooks may share one refused host (a YAML alias): IDNA, the slow part,
    runs for its first judgement only, and every later one raises the same message anew."""
    import idna

    calls = {"encode": 0, "uts46_remap": 0}
    for name in calls:
        real = getattr(idna, name)

        def counted(
            *args: object, _real: Callable[..., str] = real, _name: str = name, **kw: object
        ) -> str:
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(idna, name, counted)
    unique = f"{host}.n{id(calls)}"  # (not remembered from an earlier test)
    messages = set()
    for _ in range(50):
        with pytest.raises(UrlError) as refused:
            _host(unique, False)
        assert refused.value.__traceback__ is not None and refused.value.reason == "invalid"
        messages.add(str(refused.value))
    assert len(messages) == 1, messages
    assert calls["encode"] <= 4 and calls["uts46_remap"] <= 2, calls
