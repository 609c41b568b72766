"""Resolvers: a DNS server of the test's own, inside the test's network namespace."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest

from stockade.gateway._resolve import (
    CachingResolver,
    DnsResolver,
    ResolveError,
    SystemResolver,
    make_resolver,
)
from tests._netns import TestNetns
from tests.gateway._dns import TestDns

T = TypeVar("T")


@pytest.fixture(scope="module")
def ns() -> Iterator[TestNetns]:
    with TestNetns() as namespace:
        yield namespace


def run_in(ns: TestNetns, body: Callable[[TestDns], Awaitable[T]], host: str = "127.0.0.1") -> T:
    async def main() -> T:
        server = await TestDns().start(host)
        try:
            return await body(server)
        finally:
            await server.close()

    with ns.entered():
        return asyncio.run(main())


def test_a_and_aaaa_ipv4_first(ns: TestNetns) -> None:
    async def body(dns: TestDns) -> list[str]:
        dns.records["api.example"] = ["2001:db8::7", "93.184.216.34", "93.184.216.35"]
        return [str(a) for a in await DnsResolver(dns.spec).resolve("api.example")]

    found = run_in(ns, body)
    assert sorted(found[:2]) == ["93.184.216.34", "93.184.216.35"]  # an RRset has no order
    assert found[2:] == ["2001:db8::7"]


def test_cname_chain_followed(ns: TestNetns) -> None:
    async def body(dns: TestDns) -> list[str]:
        dns.cnames["www.example"] = "edge.cdn.example"
        dns.records["edge.cdn.example"] = ["93.184.216.34"]
        return [str(a) for a in await DnsResolver(dns.spec).resolve("www.example")]

    assert run_in(ns, body) == ["93.184.216.34"]


def test_nxdomain_is_a_resolve_error(ns: TestNetns) -> None:
    async def body(dns: TestDns) -> str:
        with pytest.raises(ResolveError) as caught:
            await DnsResolver(dns.spec).resolve("nowhere.example")
        return str(caught.value)

    message = run_in(ns, body)
    assert "nowhere.example does not exist" in message


def test_name_without_addresses(ns: TestNetns) -> None:
    async def body(dns: TestDns) -> str:
        dns.records["empty.example"] = []
        with pytest.raises(ResolveError) as caught:
            await DnsResolver(dns.spec).resolve("empty.example")
        return str(caught.value)

    assert "no A or AAAA record" in run_in(ns, body)


def test_truncated_answer_retried_over_tcp(ns: TestNetns) -> None:
    async def body(dns: TestDns) -> tuple[list[str], list[str]]:
        dns.records["big.example"] = ["93.184.216.34"]
        dns.truncate.add("big.example")
        found = [str(a) for a in await DnsResolver(dns.spec).resolve("big.example")]
        return found, [t for n, kind, t in dns.queries if kind == "A"]

    found, transports = run_in(ns, body)
    assert found == ["93.184.216.34"]
    assert transports == ["udp", "tcp"]


def test_silent_server_times_out(ns: TestNetns) -> None:
    async def body(dns: TestDns) -> str:
        dns.silent.add("slow.example")
        with pytest.raises(ResolveError) as caught:
            await DnsResolver(dns.spec, timeout=0.2).resolve("slow.example")
        return str(caught.value)

    assert "did not answer within 0.2 s" in run_in(ns, body)


def test_ipv6_server(ns: TestNetns) -> None:
    async def body(dns: TestDns) -> list[str]:
        dns.records["v6.example"] = ["2001:db8::1"]
        resolver = DnsResolver(dns.spec)
        assert resolver.server == "::1"
        return [str(a) for a in await resolver.resolve("v6.example")]

    assert run_in(ns, body, host="::1") == ["2001:db8::1"]


def test_no_server_listening(ns: TestNetns) -> None:
    async def main() -> str:
        with pytest.raises(ResolveError) as caught:
            await DnsResolver("127.0.0.1:9", timeout=1.0).resolve("x.example")
        return str(caught.value)

    with ns.entered():
        message = asyncio.run(main())
    assert "x.example did not resolve" in message


@pytest.mark.parametrize(
    ("spec", "server", "port"),
    [
        ("127.0.0.1:5353", "127.0.0.1", 5353),
        ("[::1]:53", "::1", 53),
        ("10.0.0.2", "10.0.0.2", 53),
        ("[fd00::53]", "fd00::53", 53),
    ],
)
def test_server_specs(spec: str, server: str, port: int) -> None:
    resolver = make_resolver(spec)
    assert isinstance(resolver, CachingResolver) and isinstance(resolver.inner, DnsResolver)
    assert (resolver.inner.server, resolver.inner.port) == (server, port)


@pytest.mark.parametrize("spec", ["dns.example:53", "127.0.0.1:0", "127.0.0.1:99999", "[::1", "::1:x"])
def test_bad_server_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        make_resolver(spec)


def test_no_spec_is_the_system_resolver(ns: TestNetns) -> None:
    resolver = make_resolver(None)
    assert isinstance(resolver, CachingResolver) and isinstance(resolver.inner, SystemResolver)

    # A numeric host: getaddrinfo answers it without asking anyone.
    async def main() -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        return await resolver.resolve("93.184.216.34")

    with ns.entered():
        assert asyncio.run(main()) == [ipaddress.ip_address("93.184.216.34")]


def test_a_cache_asks_once_for_many_at_once_and_keeps_no_failure(ns: TestNetns) -> None:
    async def main() -> tuple[int, int, int]:
        dns = await TestDns({"api.example.com": ["93.184.216.34"]}).start()
        try:
            cached = CachingResolver(DnsResolver(dns.spec), seconds=60)
            answers = await asyncio.gather(*(cached.resolve("api.example.com") for _ in range(50)))
            assert all(a == [ipaddress.ip_address("93.184.216.34")] for a in answers)
            first = dns.count("api.example.com")
            await cached.resolve("api.example.com")
            for _ in range(2):
                with pytest.raises(ResolveError):
                    await cached.resolve("nowhere.example")
            return first, dns.count("api.example.com"), dns.count("nowhere.example")
        finally:
            await dns.close()

    with ns.entered():
        first, later, failures = asyncio.run(main())
    assert first == later == 1  # fifty at once: one question; the next one: none
    assert failures == 2  # a failure is asked again
