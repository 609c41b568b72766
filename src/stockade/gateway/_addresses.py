"""IP literals in every spelling, and the addresses the gateway never connects to.

An agent that wants the cloud metadata service does not ask for
``169.254.169.254``: it asks for ``0xa9fea9fe``, ``0251.0376.0251.0376``,
``169.254.43518``, ``[::ffff:a9fe:a9fe]`` or ``[64:ff9b::a9fe:a9fe]``. Every one
of those reaches the same place through some resolver, socket library or
translator, so the gateway reads them all as the address they are
(``parse_ip_literal``), looks inside IPv6 addresses for the IPv4 address they
carry (``embedded_ipv4``), and refuses the whole family of internal ranges
(``forbidden_reason``) unless the policy names the range explicitly.

Pure functions, no I/O.
"""

from __future__ import annotations

import ipaddress
import re

IPv4Address = ipaddress.IPv4Address
IPv6Address = ipaddress.IPv6Address
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# One part of an inet_aton-style IPv4 address: hex (0x…, possibly empty as the
# WHATWG URL parser allows), octal (a leading 0) or decimal.
_PART = re.compile(r"^(0[xX][0-9a-fA-F]*|[0-9]+)$")


def _v4_part(text: str) -> int | None:
    if not _PART.match(text):
        return None
    if text[:2] in ("0x", "0X"):
        return int(text[2:] or "0", 16)
    if len(text) > 1 and text[0] == "0":
        if not all(c in "01234567" for c in text):
            return None  # 08, 09: neither octal nor decimal to inet_aton
        return int(text, 8)
    return int(text)


def _parse_ipv4(text: str) -> IPv4Address | None:
    """The IPv4 address inet_aton (and the WHATWG URL parser) read in ``text``.

    Written by hand because ``ipaddress`` accepts only four decimal parts, and
    ``socket.inet_aton`` accepts trailing garbage after a space ("1.2.3.4 x")
    while it refuses forms browsers take (a final '.', a bare "0x").
    """
    if text.endswith("."):
        text = text[:-1]  # "127.0.0.1." is an address to URL parsers
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    numbers: list[int] = []
    for part in parts:
        number = _v4_part(part)
        if number is None:
            return None
        numbers.append(number)
    # a.b.c.d; a.b.c (c fills 16 bits); a.b (b fills 24 bits); a (all 32 bits).
    *head, last = numbers
    if any(n > 0xFF for n in head) or last >= 1 << (8 * (5 - len(numbers))):
        return None
    value = last
    for index, number in enumerate(head):
        value |= number << (8 * (3 - index))
    return IPv4Address(value)


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address ``host`` spells, in any form resolvers and socket libraries accept.

    Dotted decimal, short forms (``127.1``, ``10.1.1``), one number
    (``2130706433``), hex (``0x7f000001``, ``0x7f.0.0.1``), octal
    (``0177.0.0.1``) and mixes of them; IPv6 with or without brackets, with a
    ``%zone`` (dropped: a zone names an interface, not a host; ``%25zone`` as
    URLs write it too). ``None`` when ``host`` is a name (or nothing valid).
    """
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        address, _, _zone = text.partition("%")
        try:
            return IPv6Address(address)
        except ValueError:
            return None
    return _parse_ipv4(text)


def _rfc6052(addr: IPv6Address, prefix_len: int) -> IPv4Address:
    """The IPv4 address in a NAT64 address with a ``prefix_len`` prefix (RFC 6052 2.2).

    Written by hand: ``ipaddress`` knows no NAT64 layout. Bits 64-71 (the "u"
    octet) never carry address bits, hence the gap for prefixes under /96.
    """
    value = int(addr)
    octets = [(value >> (8 * (15 - i))) & 0xFF for i in range(16)]
    start = prefix_len // 8
    if prefix_len == 96:
        return IPv4Address(bytes(octets[12:16]))
    carried = [o for i, o in enumerate(octets) if i >= start and i != 8]
    return IPv4Address(bytes(carried[:4]))


_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT, RFC 7915
_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def embedded_ipv4_all(addr: IPv6Address) -> tuple[IPv4Address, ...]:
    """Every IPv4 address that ``addr`` may lead to, most direct first.

    Teredo gives two (the client, then the server); a local-use NAT64 address
    (``64:ff9b:1::/48``) may have been built with any RFC 6052 prefix length
    from /48 to /96, so each reading is given.
    """
    if addr in _MAPPED:
        return (IPv4Address(int(addr) & 0xFFFFFFFF),)
    if addr in _TRANSLATED or addr in _NAT64:
        return (IPv4Address(int(addr) & 0xFFFFFFFF),)
    if addr in _COMPATIBLE:
        return (IPv4Address(int(addr) & 0xFFFFFFFF),)
    if addr in _NAT64_LOCAL:
        found = [_rfc6052(addr, n) for n in (96, 64, 56, 48)]
        return tuple(dict.fromkeys(found))
    if addr.sixtofour is not None:
        return (addr.sixtofour,)
    if addr.teredo is not None:
        server, client = addr.teredo  # ipaddress undoes the client's XOR already
        return (client, server)
    return ()


def embedded_ipv4(addr: IPv6Address) -> IPv4Address | None:
    """The IPv4 address carried in ``addr``, or ``None``.

    IPv4-mapped (``::ffff:a.b.c.d``), IPv4-translated (``::ffff:0:a.b.c.d``),
    IPv4-compatible (``::a.b.c.d``), NAT64 (``64:ff9b::/96``; in
    ``64:ff9b:1::/48`` the /96 reading), 6to4 (``2002::/16``) and Teredo
    (``2001::/32``: the client address, un-inverted; ``embedded_ipv4_all``
    gives the server too).
    """
    found = embedded_ipv4_all(addr)
    return found[0] if found else None


def _nets(*specs: tuple[str, str]) -> tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...]:
    return tuple((ipaddress.ip_network(net), why) for net, why in specs)


# Order matters: the first range holding an address names it (the metadata
# address before link-local, broadcast before reserved).
_FORBIDDEN_V4 = _nets(
    ("0.0.0.0/8", "an unspecified ('this network') address"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.169.254/32", "the cloud metadata address"),
    ("169.254.0.0/16", "a link-local address"),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "a reserved (IETF protocol) address"),
    ("192.0.2.0/24", "a documentation address"),
    ("192.88.99.0/24", "a reserved (6to4 relay) address"),
    ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("224.0.0.0/4", "a multicast address"),
    ("255.255.255.255/32", "the broadcast address"),
    ("240.0.0.0/4", "a reserved address"),
    # Azure's WireServer answers on a public-looking address from every VM.
    ("168.63.129.16/32", "a cloud metadata address"),
)
_FORBIDDEN_V6 = _nets(
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    ("fd00:ec2::254/128", "the cloud metadata address"),
    ("fc00::/7", "a unique local (private) address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address"),
    ("ff00::/8", "a multicast address"),
    ("100::/64", "a reserved (discard-only) address"),
    ("2001:2::/48", "a benchmarking address"),
    ("2001:10::/28", "a reserved (ORCHID) address"),
    ("2001:20::/28", "a reserved (ORCHID) address"),
    ("2001:db8::/32", "a documentation address"),
    ("3fff::/20", "a documentation address"),
)
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")


def _forbidden_v4(addr: IPv4Address) -> str | None:
    for net, why in _FORBIDDEN_V4:
        if addr in net:
            return why
    return None


def forbidden_reason(addr: IPAddress) -> str | None:
    """Why the gateway never connects to ``addr`` on its own, as a noun phrase.

    ``"a private address"``, ``"the cloud metadata address"``, or for an IPv6
    address carrying one ``"an IPv4-mapped form of 10.0.0.1, a private
    address"``. The gateway connects there only when ``network.allow`` names a
    range that holds the address. ``None`` for a public address.
    """
    if isinstance(addr, IPv4Address):
        return _forbidden_v4(addr)
    addr = IPv6Address(int(addr))  # drop a %zone: ranges compare without it
    for net, why in _FORBIDDEN_V6:
        if addr in net:
            return why
    for inner in embedded_ipv4_all(addr):
        inner_why = _forbidden_v4(inner)
        if inner_why is not None:
            return f"{_embedding_kind(addr)} form of {inner}, {inner_why}"
    if (
        addr not in _GLOBAL_UNICAST
        and addr not in _MAPPED
        and addr not in _NAT64
        and addr not in _NAT64_LOCAL
    ):
        # Outside 2000::/3 nothing is allocated for the public internet; the
        # deprecated IPv4-compatible and SIIT forms go nowhere public either.
        return "a reserved address"
    return None


def _embedding_kind(addr: IPv6Address) -> str:
    if addr in _MAPPED:
        return "an IPv4-mapped"
    if addr in _TRANSLATED:
        return "an IPv4-translated"
    if addr in _COMPATIBLE:
        return "an IPv4-compatible"
    if addr in _NAT64 or addr in _NAT64_LOCAL:
        return "a NAT64"
    if addr.sixtofour is not None:
        return "a 6to4"
    return "a Teredo"


__all__ = [
    "IPAddress",
    "embedded_ipv4",
    "embedded_ipv4_all",
    "forbidden_reason",
    "parse_ip_literal",
]
