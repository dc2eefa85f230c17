"""Name lookups share nothing one name can hold: one lookup per name however many ask, a failed
or silent name remembered briefly, and a slow name never in another's way. Fake lookups here;
tests/integration/test_dns_isolation.py runs the real c-ares against a silent name server."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

import bridge.http.resolver as resolver_module
from bridge.core.destinations import DestinationPolicy
from bridge.core.errors import DestinationRefusedError
from bridge.http.resolver import SafeResolver

ANY = DestinationPolicy(allow_private=True)


class Lookups:
    """A fake lookup: names in ``answers`` resolve at once, names in ``failing`` raise
    gaierror, any other name waits until :attr:`release` is set; every call is counted."""

    def __init__(self, answers: dict[str, list[str]], failing: frozenset[str] = frozenset()):
        self.answers = answers
        self.failing = failing
        self.calls: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host in self.failing:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if host not in self.answers:
            await self.release.wait()
            return ["192.0.2.9"]
        return self.answers[host]


def test_concurrent_callers_of_one_name_share_one_lookup() -> None:
    async def scenario() -> None:
        lookups = Lookups({})
        resolver = SafeResolver(ANY, lookups)
        callers = [asyncio.ensure_future(resolver.resolve("slow.example", 443)) for _ in range(50)]
        await asyncio.sleep(0.01)
        lookups.release.set()
        assert await asyncio.gather(*callers) == [["192.0.2.9"]] * 50
        assert lookups.calls == ["slow.example"]

    asyncio.run(scenario())


def test_a_caller_giving_up_does_not_end_the_lookup_for_the_others() -> None:
    async def scenario() -> None:
        lookups = Lookups({})
        resolver = SafeResolver(ANY, lookups)
        first = asyncio.ensure_future(resolver.resolve("slow.example", 443))
        second = asyncio.ensure_future(resolver.resolve("slow.example", 443))
        await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.sleep(0.01)
        lookups.release.set()
        assert await second == ["192.0.2.9"]
        assert first.cancelled()
        assert lookups.calls == ["slow.example"]

    asyncio.run(scenario())


def test_a_slow_name_does_not_hold_up_another() -> None:
    async def scenario() -> None:
        lookups = Lookups({"fast.example": ["192.0.2.1"]})
        resolver = SafeResolver(ANY, lookups)
        stuck = [asyncio.ensure_future(resolver.resolve(f"s{n}.example", 443)) for n in range(20)]
        await asyncio.sleep(0.01)
        async with asyncio.timeout(1):
            assert await resolver.resolve("fast.example", 443) == ["192.0.2.1"]
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)

    asyncio.run(scenario())


def test_a_failed_name_is_remembered_briefly_then_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resolver_module, "FAILURE_TTL_S", 0.2)

    async def scenario() -> None:
        lookups = Lookups({}, failing=frozenset({"gone.example"}))
        resolver = SafeResolver(ANY, lookups, ttl=60)
        for _ in range(3):
            with pytest.raises(socket.gaierror, match="Name or service not known"):
                await resolver.resolve("gone.example", 443)
        assert lookups.calls == ["gone.example"]
        await asyncio.sleep(0.25)
        with pytest.raises(socket.gaierror):
            await resolver.resolve("gone.example", 443)
        assert lookups.calls == ["gone.example"] * 2

    asyncio.run(scenario())


def test_a_lookup_that_never_ends_fails_at_the_deadline_and_is_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resolver_module, "LOOKUP_DEADLINE_S", 0.1)

    async def scenario() -> None:
        lookups = Lookups({})
        resolver = SafeResolver(ANY, lookups)
        started = time.monotonic()
        with pytest.raises(socket.gaierror, match=r"no answer in 0\.1s"):
            await resolver.resolve("silent.example", 443)
        assert time.monotonic() - started < 1.0
        with pytest.raises(socket.gaierror):  # remembered: not asked again at once
            await resolver.resolve("silent.example", 443)
        assert lookups.calls == ["silent.example"]

    asyncio.run(scenario())


def test_an_unforeseen_lookup_error_becomes_a_lookup_failure() -> None:
    async def broken(host: str, port: int) -> list[str]:
        raise ValueError("a bug in the lookup")

    async def scenario() -> None:
        resolver = SafeResolver(ANY, broken)
        with pytest.raises(socket.gaierror, match=r"lookup failed \(ValueError\)"):
            await resolver.resolve("any.example", 443)

    asyncio.run(scenario())


def test_the_default_lookup_resolves_a_hosts_file_name_without_threads() -> None:
    """The real c-ares: ``localhost`` comes from the hosts file (or c-ares's own knowledge of
    it); no thread of the default executor is used."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        resolver = SafeResolver(ANY)
        try:
            addresses = await resolver.resolve("localhost", 80)
        finally:
            resolver.close()
        assert "127.0.0.1" in addresses or "::1" in addresses
        assert loop._default_executor is None  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_lookups_go_to_the_system_resolver_when_c_ares_cannot_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(**options: object) -> None:
        raise resolver_module.pycares.AresError(1, "Failed to initialize")

    monkeypatch.setattr(resolver_module.pycares, "Channel", refused)

    async def scenario() -> None:
        lookup = resolver_module.AresLookup()
        addresses = await lookup("localhost", 80)
        assert "127.0.0.1" in addresses or "::1" in addresses

    with caplog.at_level("WARNING", logger="bridge.http.resolver"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records] == ["dns.system_resolver"]


def test_a_name_with_many_addresses_keeps_sixteen_and_names_three_refusals() -> None:
    """A name can answer with thousands of addresses: connecting tries them one at a time, so
    sixteen are kept; an error names three refusals (it goes into shared topics' headers)."""
    public = [f"93.184.{n // 250}.{1 + n % 250}" for n in range(1000)]
    private = [f"10.0.{n // 250}.{1 + n % 250}" for n in range(1000)]

    async def scenario() -> None:
        resolver = SafeResolver(DestinationPolicy(), Lookups({"many.example": public}))
        assert await resolver.resolve("many.example", 443) == public[:16]
        refusing = SafeResolver(DestinationPolicy(), Lookups({"private.example": private}))
        with pytest.raises(DestinationRefusedError) as caught:
            await refusing.resolve("private.example", 443)
        assert caught.value.detail == (
            "private.example resolves only to refused addresses: 10.0.0.1 is a private address; "
            "10.0.0.2 is a private address; 10.0.0.3 is a private address; and 13 more"
        )

    asyncio.run(scenario())


def test_one_lookup_serves_every_port_of_a_name() -> None:
    async def scenario() -> None:
        lookups = Lookups({"shop.example": ["192.0.2.1"]})
        resolver = SafeResolver(ANY, lookups)
        for port in (443, 8443, 9443, 443):
            assert await resolver.resolve("shop.example", port) == ["192.0.2.1"]
        assert lookups.calls == ["shop.example"]

    asyncio.run(scenario())


def test_every_name_is_remembered_however_many_hosts_are_configured() -> None:
    """25,000 host names looked up, then again within their time: no second lookup (a bound
    on the count of names, 10,000 until 2026-11-27, made each of them a lookup again)."""
    names = {f"h{n}.example": ["192.0.2.1"] for n in range(25_000)}
    lookups = Lookups(names)
    resolver = SafeResolver(ANY, lookups, ttl=3600)

    async def main() -> None:
        for _ in range(2):
            for name in names:
                assert await resolver.resolve(name, 443) == ["192.0.2.1"]

    asyncio.run(main())
    assert len(lookups.calls) == len(names)
