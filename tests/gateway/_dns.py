"""A tiny DNS server for tests, answering from a dict the test may change between queries.

It runs on the test's own event loop, inside the test's network namespace, so
that resolving names in a test never reaches the system resolver (the network
rule of these tests). ``records`` maps a name to its addresses (IPv4 ones answer
A queries, IPv6 ones AAAA); ``cnames`` maps a name to another; a name in
neither is NXDOMAIN. ``after_query`` lets a test change the answers once a
query was answered (DNS rebinding); ``truncate`` names whose UDP answers come
back truncated (so the client must retry over TCP); ``silent`` names get no
answer at all.
"""

from __future__ import annotations

import asyncio
import ipaddress
import struct
import typing
from collections.abc import Callable

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class TestDns:
    __test__ = False

    def __init__(self, records: dict[str, list[str]] | None = None) -> None:
        self.records: dict[str, list[str]] = dict(records or {})
        self.cnames: dict[str, str] = {}
        self.truncate: set[str] = set()
        self.silent: set[str] = set()
        self.after_query: Callable[[str, str], None] | None = None
        self.queries: list[tuple[str, str, str]] = []  # (name, type, "udp" | "tcp")
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self.host = ""
        self.port = 0

    @property
    def spec(self) -> str:
        """``HOST:PORT`` for ``DnsResolver``."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def count(self, name: str, rdtype: str = "A") -> int:
        return sum(1 for n, t, _ in self.queries if n == name and t == rdtype)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> TestDns:
        loop = asyncio.get_running_loop()
        self._tcp = await asyncio.start_server(self._serve_tcp, host, port)
        self.host = host
        self.port = self._tcp.sockets[0].getsockname()[1]
        self._udp, _ = await loop.create_datagram_endpoint(lambda: _Udp(self), local_addr=(host, self.port))
        return self

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            await self._tcp.wait_closed()

    async def __aenter__(self) -> TestDns:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def answer(self, wire: bytes, transport: str) -> bytes | None:
        query = dns.message.from_wire(wire)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, rdtype, transport))
        if name in self.silent:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.RA
        if transport == "udp" and name in self.truncate:
            response.flags |= dns.flags.TC
            return response.to_wire()
        owner, current = question.name, name
        for _ in range(8):
            if current not in self.cnames:
                break
            target = self.cnames[current]
            response.answer.append(
                dns.rrset.from_text(owner, 60, dns.rdataclass.IN, dns.rdatatype.CNAME, target + ".")
            )
            owner, current = dns.name.from_text(target), target
        if current not in self.records and current not in self.cnames:
            response.set_rcode(dns.rcode.NXDOMAIN)
        else:
            version = 4 if question.rdtype == dns.rdatatype.A else 6
            found = [a for a in self.records.get(current, []) if ipaddress.ip_address(a).version == version]
            if found and question.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
                response.answer.append(
                    dns.rrset.from_text_list(owner, 60, dns.rdataclass.IN, question.rdtype, found)
                )
        if self.after_query is not None:
            self.after_query(name, rdtype)
        return response.to_wire()

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (length,) = struct.unpack("!H", await reader.readexactly(2))
                reply = self.answer(await reader.readexactly(length), "tcp")
                if reply is None:
                    continue
                writer.write(struct.pack("!H", len(reply)) + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: TestDns) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = self.server.answer(data, "udp")
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)
