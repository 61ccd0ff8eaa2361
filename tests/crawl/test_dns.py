from __future__ import annotations

import socket
from typing import Any

import pytest
import trio
import trio.testing

from refresher._errors import ConfigError, DNSFailure
from refresher.crawl._dns import Resolver


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedResolver(trio.abc.HostnameResolver):
    """Stands in for the system resolver: answers from a table, counts calls, can block."""

    def __init__(self, answers: dict[str, str | None]) -> None:
        self.answers = answers
        self.calls: list[str] = []
        self.gate: trio.Event | None = None
        self.infos: list[Any] | None = None  # a full answer, overriding the table

    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[Any]:
        assert host is not None
        name = host.decode()
        self.calls.append(name)
        if self.gate is not None:
            await self.gate.wait()
        if self.infos is not None:
            return self.infos
        ip = self.answers.get(name)
        if ip is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        assert isinstance(port, int)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))]

    async def getnameinfo(self, sockaddr: Any, flags: int) -> tuple[str, str]:
        raise NotImplementedError


@pytest.fixture
async def system() -> ScriptedResolver:
    fake = ScriptedResolver({"a.example": "192.0.2.1", "b.example": "192.0.2.2"})
    trio.socket.set_custom_hostname_resolver(fake)
    return fake


async def test_a_static_wildcard_with_a_port_overrides_name_and_port(
    system: ScriptedResolver,
) -> None:
    resolver = Resolver(static={"*.sim.test": "127.0.0.1:8081"})
    assert await resolver.resolve("a.sim.test", 80) == ("127.0.0.1", 8081)
    assert await resolver.resolve("deep.b.SIM.test", 443) == ("127.0.0.1", 8081)
    assert await resolver.resolve("sim.test", 80) == ("127.0.0.1", 8081)
    assert system.calls == []
    assert resolver.statistics().static_hits == 3


async def test_a_static_wildcard_does_not_match_a_mere_suffix(system: ScriptedResolver) -> None:
    resolver = Resolver(static={"*.sim.test": "127.0.0.1:8081"})
    with pytest.raises(DNSFailure):
        await resolver.resolve("notsim.test", 80)
    assert system.calls == ["notsim.test"]


async def test_a_static_entry_without_a_port_keeps_the_url_port() -> None:
    resolver = Resolver(static={"a.example": "10.0.0.7", "v6.example": "[::1]:9000"})
    assert await resolver.resolve("a.example", 8080) == ("10.0.0.7", 8080)
    assert await resolver.resolve("v6.example", 80) == ("::1", 9000)


async def test_an_exact_entry_beats_a_wildcard_and_the_longest_wildcard_wins() -> None:
    resolver = Resolver(
        static={
            "*.sim.test": "127.0.0.1:1001",
            "*.deep.sim.test": "127.0.0.1:1002",
            "x.deep.sim.test": "127.0.0.1:1003",
        }
    )
    assert await resolver.resolve("y.deep.sim.test", 80) == ("127.0.0.1", 1002)
    assert await resolver.resolve("x.deep.sim.test", 80) == ("127.0.0.1", 1003)
    assert await resolver.resolve("other.sim.test", 80) == ("127.0.0.1", 1001)


async def test_an_ip_literal_is_used_without_a_lookup(system: ScriptedResolver) -> None:
    resolver = Resolver()
    assert await resolver.resolve("127.0.0.1", 8080) == ("127.0.0.1", 8080)
    assert await resolver.resolve("[::1]", 80) == ("::1", 80)
    assert await resolver.resolve("[::ffff:127.0.0.1]", 80) == ("::ffff:7f00:1", 80)
    assert system.calls == []


async def test_a_name_of_digits_and_dots_that_is_no_address_is_looked_up(
    system: ScriptedResolver,
) -> None:
    system.answers["1.2.3.4.5"] = "127.0.0.5"
    assert await Resolver().resolve("1.2.3.4.5", 80) == ("127.0.0.5", 80)
    assert system.calls == ["1.2.3.4.5"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("a.example", "localhost"),
        ("a.example", "127.0.0.1:0"),
        ("a.example", "127.0.0.1:65536"),
        ("a.example", "127.0.0.1:http"),
        ("a.example", "[127.0.0.1]:80"),
        ("a.example", "[::1"),
        ("a.example", ""),
        ("*", "127.0.0.1"),
        ("a.*.example", "127.0.0.1"),
        ("bad host", "127.0.0.1"),
        ("", "127.0.0.1"),
    ],
)
def test_an_invalid_static_entry_is_a_config_error_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Resolver(static={key: value})
    assert caught.value.key == f'dns.static."{key}"'
    assert "write" in str(caught.value)  # says how to fix it


async def test_an_answer_is_cached_until_its_ttl_expires(system: ScriptedResolver) -> None:
    clock = FakeClock()
    resolver = Resolver(ttl=60.0, clock=clock)
    assert await resolver.resolve("a.example", 80) == ("192.0.2.1", 80)
    clock.now += 59.0
    assert await resolver.resolve("a.example", 443) == ("192.0.2.1", 443)
    assert system.calls == ["a.example"]
    clock.now += 1.0
    system.answers["a.example"] = "192.0.2.9"
    assert await resolver.resolve("a.example", 80) == ("192.0.2.9", 80)
    assert system.calls == ["a.example", "a.example"]
    stats = resolver.statistics()
    assert (stats.lookups, stats.cache_hits, stats.failures, stats.entries) == (2, 1, 0, 1)


async def test_a_failure_is_cached_with_a_doubling_backoff(system: ScriptedResolver) -> None:
    clock = FakeClock()
    resolver = Resolver(negative_ttl=5.0, max_negative_ttl=12.0, clock=clock)

    async def fails() -> None:
        with pytest.raises(DNSFailure):
            await resolver.resolve("dead.example", 80)

    await fails()
    assert len(system.calls) == 1
    clock.now += 4.9
    await fails()  # still backing off: no new lookup
    assert len(system.calls) == 1
    clock.now += 0.1
    await fails()  # 5 s passed: looked up again, fails, backoff now 10 s
    assert len(system.calls) == 2
    clock.now += 9.9
    await fails()
    assert len(system.calls) == 2
    clock.now += 0.1
    await fails()  # backoff would be 20 s but is capped at 12 s
    assert len(system.calls) == 3
    clock.now += 12.0
    await fails()
    assert len(system.calls) == 4
    stats = resolver.statistics()
    assert (stats.failures, stats.backoff_hits) == (4, 2)


async def test_a_success_ends_the_backoff(system: ScriptedResolver) -> None:
    clock = FakeClock()
    resolver = Resolver(negative_ttl=5.0, ttl=1.0, clock=clock)
    with pytest.raises(DNSFailure):
        await resolver.resolve("flaky.example", 80)
    clock.now += 5.0
    system.answers["flaky.example"] = "192.0.2.5"
    assert await resolver.resolve("flaky.example", 80) == ("192.0.2.5", 80)
    clock.now += 1.0
    system.answers["flaky.example"] = None
    with pytest.raises(DNSFailure):
        await resolver.resolve("flaky.example", 80)
    clock.now += 5.0  # the first backoff again, not a doubled one
    with pytest.raises(DNSFailure):
        await resolver.resolve("flaky.example", 80)
    assert system.calls == ["flaky.example"] * 4


async def test_an_ipv4_address_is_preferred_to_an_ipv6_one(system: ScriptedResolver) -> None:
    system.infos = [
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2001:db8::1", 80, 0, 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.7", 80)),
    ]
    assert await Resolver().resolve("dual.example", 80) == ("192.0.2.7", 80)


async def test_a_name_under_invalid_fails_without_a_lookup(system: ScriptedResolver) -> None:
    resolver = Resolver()
    with pytest.raises(DNSFailure, match="invalid"):
        await resolver.resolve("nothing.invalid", 80)
    assert system.calls == []


async def test_an_unresolvable_name_counts_as_a_failure() -> None:
    resolver = Resolver()
    with pytest.raises(DNSFailure):
        await resolver.resolve("no-such-host.invalid", 443)
    assert resolver.statistics().failures == 1


async def test_the_cache_is_bounded_and_evicts_the_least_recently_used(
    system: ScriptedResolver,
) -> None:
    resolver = Resolver(max_entries=2)
    system.answers["c.example"] = "192.0.2.3"
    await resolver.resolve("a.example", 80)
    await resolver.resolve("b.example", 80)
    await resolver.resolve("a.example", 80)  # a is now the most recent
    await resolver.resolve("c.example", 80)  # evicts b
    assert resolver.statistics().entries == 2
    await resolver.resolve("a.example", 80)
    await resolver.resolve("b.example", 80)
    assert system.calls == ["a.example", "b.example", "c.example", "b.example"]


async def test_concurrent_resolutions_of_one_name_share_one_lookup(
    system: ScriptedResolver,
) -> None:
    resolver = Resolver()
    system.gate = trio.Event()
    answers: list[tuple[str, int]] = []

    async def resolve() -> None:
        answers.append(await resolver.resolve("a.example", 80))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(resolve)
        await trio.testing.wait_all_tasks_blocked()
        system.gate.set()
    assert answers == [("192.0.2.1", 80)] * 3
    assert system.calls == ["a.example"]
