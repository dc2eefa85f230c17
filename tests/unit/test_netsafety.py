"""Outbound safety: the address policy, and the resolver inside the real delivery client."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from bridge.errors import DestinationRefusedError
from bridge.httpclient import HttpClient, HttpError
from bridge.netsafety import DestinationPolicy, SafeResolver

REFUSED = [
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.10", "private"),
    ("127.0.0.1", "loopback"),
    ("::1", "loopback"),
    ("169.254.10.20", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("224.0.0.251", "multicast"),
    ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("240.0.0.1", "private"),  # reserved 240/4 is in Python's private list
    ("100.64.0.1", "carrier-grade NAT"),
    ("fd12:3456::1", "unique-local"),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:10.0.0.1", "private"),
    ("192.0.2.1", "private"),  # documentation range
    ("169.254.169.254", "cloud metadata"),
    ("::ffff:169.254.169.254", "cloud metadata"),
    ("64:ff9b::a9fe:a9fe", "cloud metadata"),  # NAT64 of 169.254.169.254
    ("169.254.170.2", "cloud metadata"),
    ("100.100.100.200", "cloud metadata"),
    ("fd00:ec2::254", "cloud metadata"),
]
PUBLIC = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize(("ip", "category"), REFUSED)
def test_non_public_addresses_are_refused_by_default(ip: str, category: str) -> None:
    policy = DestinationPolicy()
    assert policy.refusal(ip) == f"{ip} is a {category} address"
    with pytest.raises(DestinationRefusedError) as caught:
        policy.check(ip)
    assert caught.value.reason == "destination_refused"
    assert caught.value.detail == f"{ip} is a {category} address"


@pytest.mark.parametrize("ip", PUBLIC)
def test_public_addresses_are_allowed(ip: str) -> None:
    DestinationPolicy().check(ip)


@pytest.mark.parametrize(("ip", "category"), REFUSED)
def test_allow_private_allows_all_but_cloud_metadata(ip: str, category: str) -> None:
    refusal = DestinationPolicy(allow_private=True).refusal(ip)
    assert refusal == (
        f"{ip} is a cloud metadata address" if category == "cloud metadata" else None
    )


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
