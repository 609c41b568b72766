"""Name resolution for the gateway: the system's, or a DNS server's named by the operator.

The gateway resolves a name once, checks the addresses it got and connects to
one of them (``Egress.destination``); nothing else resolves on the way, so an
answer that changes between two lookups (DNS rebinding) cannot slip a private
address past the check. ``DnsResolver`` talks to one DNS server directly, which
is also how tests keep every query inside their own network namespace.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Protocol

import dns.asyncquery
import dns.exception
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype

from stockade.gateway._addresses import IPAddress

DEFAULT_DNS_TIMEOUT = 5.0


class ResolveError(Exception):
    """A name did not resolve: no such name, no address, a failing or silent server."""


class Resolver(Protocol):
    """Turns a host name into the addresses it has (IPv4 first)."""

    async def resolve(self, name: str) -> list[IPAddress]:
        """The addresses of ``name``, without duplicates; never empty.

        Raises:
            ResolveError: the name has no address, or the lookup failed.
        """
        ...


def _plain(text: str) -> IPAddress:
    """An address without an IPv6 ``%zone`` (getaddrinfo adds one to link-local answers)."""
    return ipaddress.ip_address(text.partition("%")[0])


class SystemResolver:
    """The host's resolver (``getaddrinfo``: /etc/hosts, nsswitch, the configured servers)."""

    async def resolve(self, name: str) -> list[IPAddress]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ResolveError(f"{name} did not resolve: {exc.strerror}; check the name") from exc
        found: dict[IPAddress, None] = {}
        for family, *_rest, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                found[_plain(str(sockaddr[0]))] = None
        if not found:
            raise ResolveError(f"{name} has no IPv4 or IPv6 address; check the name")
        return sorted(found, key=lambda a: a.version)


def _parse_server(spec: str) -> tuple[str, int]:
    """``"127.0.0.1:5353"``, ``"[::1]:53"``, ``"10.0.0.2"`` → (address, port)."""
    text = spec.strip()
    host, port_text = text, "53"
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            host = ""
        port_text = rest[1:] if rest else "53"
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"DNS server {spec!r} is not an address; write it as HOST:PORT with an IP address, "
            "such as '127.0.0.1:53' or '[::1]:53'"
        ) from None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(
            f"DNS server {spec!r} has no valid port; write it as HOST:PORT with a port from 1 to 65535"
        )
    return str(address), int(port_text)


class DnsResolver:
    """Asks one DNS server for A and AAAA records, over UDP with TCP when an answer is truncated.

    The server is expected to recurse (a local resolver, or the test's own);
    CNAME chains in its answer are followed. ``spec`` is ``"HOST:PORT"`` with
    an IP address (``"[::1]:53"`` for IPv6; the port defaults to 53).
    """

    def __init__(self, spec: str, *, timeout: float = DEFAULT_DNS_TIMEOUT) -> None:
        self.server, self.port = _parse_server(spec)
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"DnsResolver({self.server!r}, port={self.port})"

    async def _query(self, name: dns.name.Name, rdtype: dns.rdatatype.RdataType) -> list[IPAddress]:
        query = dns.message.make_query(name, rdtype)
        response, _tcp = await dns.asyncquery.udp_with_fallback(
            query, self.server, timeout=self.timeout, port=self.port
        )
        rcode = response.rcode()
        if rcode == dns.rcode.NXDOMAIN:
            raise ResolveError(
                f"{name.to_text(omit_final_dot=True)} does not exist (NXDOMAIN); check the name"
            )
        if rcode != dns.rcode.NOERROR:
            raise ResolveError(
                f"{name.to_text(omit_final_dot=True)} did not resolve: the DNS server "
                f"{self.server}:{self.port} answered {dns.rcode.to_text(rcode)}; "
                "try again or check the server"
            )
        if not isinstance(response, dns.message.QueryMessage):  # pragma: no cover - dnspython made it one
            raise ResolveError(f"the DNS server {self.server}:{self.port} sent an answer that is not one")
        chained = response.resolve_chaining().answer
        if chained is None:
            return []
        return [_plain(rdata.address) for rdata in chained]

    async def resolve(self, name: str) -> list[IPAddress]:
        try:
            qname = dns.name.from_text(name)
        except dns.exception.DNSException as exc:
            raise ResolveError(f"{name!r} is not a valid DNS name; check the host") from exc
        try:
            async with asyncio.timeout(self.timeout):
                # Both at once; one failing (servers that botch AAAA exist) does
                # not lose the other's addresses.
                answers = await asyncio.gather(
                    self._query(qname, dns.rdatatype.A),
                    self._query(qname, dns.rdatatype.AAAA),
                    return_exceptions=True,
                )
        except TimeoutError as exc:
            raise self._silent(name) from exc
        found: list[IPAddress] = []
        errors: list[BaseException] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                errors.append(answer)
            else:
                found.extend(answer)
        found = list(dict.fromkeys(found))
        if found:
            return found
        for error in errors:
            if isinstance(error, ResolveError):
                raise error
            if isinstance(error, dns.exception.Timeout):
                raise self._silent(name) from error
            if isinstance(error, (OSError, dns.exception.DNSException)):
                raise ResolveError(
                    f"{name} did not resolve: asking the DNS server {self.server}:{self.port} failed "
                    f"({error}); check that it is running"
                ) from error
            raise error
        raise ResolveError(f"{name} has no IPv4 or IPv6 address (no A or AAAA record); check the name")

    def _silent(self, name: str) -> ResolveError:
        return ResolveError(
            f"{name} did not resolve: the DNS server {self.server}:{self.port} did not answer "
            f"within {self.timeout:g} s; check that it is running"
        )


CACHE_SECONDS = 10.0


class CachingResolver:
    """Answers kept for ``CACHE_SECONDS``, and one lookup at a time per name.

    Hundreds of requests to one host at once (a package manager's downloads)
    would otherwise each ask the DNS server, which drops some: five seconds of
    timeout each, then a failure. A cached answer is as safe as a fresh one:
    every address is still checked before the gateway connects to it.
    Failures are not kept.
    """

    def __init__(self, inner: Resolver, *, seconds: float = CACHE_SECONDS) -> None:
        self.inner = inner
        self.seconds = seconds
        self._answers: dict[str, tuple[float, list[IPAddress]]] = {}
        self._pending: dict[str, asyncio.Future[list[IPAddress]]] = {}

    async def resolve(self, name: str) -> list[IPAddress]:
        loop = asyncio.get_running_loop()
        kept = self._answers.get(name)
        if kept is not None and loop.time() < kept[0]:
            return list(kept[1])
        pending = self._pending.get(name)
        if pending is not None:
            return list(await asyncio.shield(pending))
        future: asyncio.Future[list[IPAddress]] = loop.create_future()
        self._pending[name] = future
        try:
            answer = await self.inner.resolve(name)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        finally:
            self._pending.pop(name, None)
        if len(self._answers) > 4096:
            self._answers.clear()  # bounded: a run asking for endless names starts over
        self._answers[name] = (loop.time() + self.seconds, answer)
        future.set_result(answer)
        return list(answer)


def make_resolver(spec: str | None) -> Resolver:
    """The resolver for the daemon's ``--dns`` (``STOCKADE_DNS``): ``None`` is the
    system's; either behind ``CachingResolver``.

    Raises:
        ValueError: ``spec`` is not ``HOST:PORT`` with an IP address.
    """
    if spec is None or not spec.strip():
        return CachingResolver(SystemResolver())
    return CachingResolver(DnsResolver(spec))


__all__ = ["CachingResolver", "DnsResolver", "ResolveError", "Resolver", "SystemResolver", "make_resolver"]
