"""IP literals in every encoding, embedded IPv4, and the ranges the gateway never reaches."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.gateway._addresses import (
    embedded_ipv4,
    embedded_ipv4_all,
    forbidden_reason,
    parse_ip_literal,
)

V4 = ipaddress.IPv4Address
V6 = ipaddress.IPv6Address


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("10.1.1", "10.1.0.1"),
        ("10.258", "10.0.1.2"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F000001", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0x7f.0x0.0x0.0x1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0177.0.0.01", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0xa9.0376.43518", "169.254.169.254"),
        ("0251.0376.0251.0376", "169.254.169.254"),
        ("169.254.43518", "169.254.169.254"),
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),
        ("127.0.0.1.", "127.0.0.1"),
        (" 10.0.0.1 ", "10.0.0.1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("fe80::1%eth0", "fe80::1"),
        ("[fe80::1%25eth0]", "fe80::1"),
        ("FD00:EC2::254", "fd00:ec2::254"),
    ],
)
def test_literals_in_every_encoding(text: str, expected: str) -> None:
    assert parse_ip_literal(text) == ipaddress.ip_address(expected)


@pytest.mark.parametrize(
    "text",
    [
        "example.com",
        "0x7f.example.com",
        "1.2.3.4.5",
        "256.0.0.1",
        "1.2.3.256",
        "1.2.65536",
        "1.16777216",
        "4294967296",
        "0x100000000",
        "08.0.0.1",
        "0xg.0.0.1",
        "1..2",
        "",
        "[]",
        "::g",
        "1.2.3.4 x",
    ],
)
def test_names_and_junk_are_not_literals(text: str) -> None:
    assert parse_ip_literal(text) is None


@pytest.mark.parametrize(
    ("v6", "v4"),
    [
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("::ffff:a9fe:a9fe", "169.254.169.254"),
        ("::ffff:0:7f00:1", "127.0.0.1"),
        ("::10.0.0.1", "10.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
        ("64:ff9b:1::a00:1", "10.0.0.1"),
        ("2002:a9fe:a9fe::1", "169.254.169.254"),
        # Teredo: server 65.54.227.120, client 10.0.0.1 stored XOR 0xffffffff.
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "10.0.0.1"),
    ],
)
def test_embedded_ipv4(v6: str, v4: str) -> None:
    assert embedded_ipv4(V6(v6)) == V4(v4)


def test_teredo_gives_client_and_server() -> None:
    assert embedded_ipv4_all(V6("2001:0:a00:1:8000:63bf:3fff:fdd2")) == (V4("192.0.2.45"), V4("10.0.0.1"))


def test_nat64_local_use_is_read_at_every_prefix_length() -> None:
    # 10.0.0.1 under 64:ff9b:1::/48 in the /48 layout: bits 48-63, skip the u octet, bits 72-87.
    found = embedded_ipv4_all(V6("64:ff9b:1:a00:0:100::"))
    assert V4("10.0.0.1") in found
    assert forbidden_reason(V6("64:ff9b:1:a00:0:100::")) is not None


@pytest.mark.parametrize("v6", ["2606:4700::1111", "2001:4860:4860::8888", "fe80::1", "::2"])
def test_no_embedded_ipv4_outside_the_embedding_ranges(v6: str) -> None:
    if v6 == "::2":  # IPv4-compatible ::0.0.0.2
        assert embedded_ipv4(V6(v6)) == V4("0.0.0.2")
    else:
        assert embedded_ipv4(V6(v6)) is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("168.63.129.16", "metadata"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("100.64.0.1", "shared"),
        ("100.127.255.254", "shared"),
        ("192.0.2.1", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.255", "benchmarking"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "metadata"),
        ("fd00::1", "unique local"),
        ("fc00::1", "unique local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("::ffff:10.0.0.1", "IPv4-mapped form of 10.0.0.1, a private"),
        ("::ffff:169.254.169.254", "metadata"),
        ("64:ff9b::7f00:1", "NAT64 form of 127.0.0.1"),
        ("2002:c0a8:101::", "6to4 form of 192.168.1.1"),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "Teredo form of 10.0.0.1"),
        ("::127.0.0.1", "IPv4-compatible form of 127.0.0.1"),
        ("::93.184.216.34", "reserved"),
        ("4000::1", "reserved"),
    ],
)
def test_forbidden_reasons(text: str, words: str) -> None:
    reason = forbidden_reason(ipaddress.ip_address(text))
    assert reason is not None
    assert words in reason


@pytest.mark.parametrize(
    "text",
    [
        "93.184.216.34",
        "8.8.8.8",
        "1.1.1.1",
        "172.32.0.1",
        "100.128.0.1",
        "2606:4700::1111",
        "::ffff:93.184.216.34",
        "64:ff9b::5db8:d822",
        "2002:5db8:d822::1",
    ],
)
def test_public_addresses_are_not_forbidden(text: str) -> None:
    assert forbidden_reason(ipaddress.ip_address(text)) is None


# ----------------------------------------------------------------- Hypothesis

FORBIDDEN_V4 = [
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
]


@st.composite
def forbidden_v4(draw: st.DrawFn) -> V4:
    net = draw(st.sampled_from(FORBIDDEN_V4))
    return net[draw(st.integers(0, net.num_addresses - 1))]


def _part(draw: st.DrawFn, value: int) -> str:
    style = draw(st.sampled_from(["dec", "oct", "hex", "HEX"]))
    if style == "dec":
        return str(value)
    if style == "oct":
        return "0" * draw(st.integers(1, 3)) + format(value, "o")
    return (
        ("0x" if style == "hex" else "0X")
        + "0" * draw(st.integers(0, 2))
        + format(value, "x" if style == "hex" else "X")
    )


@st.composite
def v4_spelling(draw: st.DrawFn, addr: V4) -> str:
    """``addr`` as inet_aton reads it: 1 to 4 parts, each decimal, octal or hex."""
    value = int(addr)
    count = draw(st.integers(1, 4))
    octets = list(addr.packed)
    head = octets[: count - 1]
    last = value & ((1 << (8 * (5 - count))) - 1)
    return ".".join([*(_part(draw, o) for o in head), _part(draw, last)])


@st.composite
def v6_embedding(draw: st.DrawFn, addr: V4) -> str:
    """An IPv6 address carrying ``addr``, written in one of the usual ways."""
    value = int(addr)
    kind = draw(
        st.sampled_from(
            [
                "mapped",
                "mapped-dotted",
                "translated",
                "compatible",
                "nat64",
                "nat64-local",
                "6to4",
                "teredo-client",
                "teredo-server",
            ]
        )
    )
    rand = draw(st.integers(0, (1 << 80) - 1))
    if kind == "mapped":
        v6 = V6((0xFFFF << 32) | value)
    elif kind == "mapped-dotted":
        return f"::ffff:{addr}"
    elif kind == "translated":
        v6 = V6((0xFFFF << 48) | value)
    elif kind == "compatible":
        v6 = V6(value)
    elif kind == "nat64":
        v6 = V6((0x64FF9B << 96) | value)
    elif kind == "nat64-local":
        v6 = V6((0x0064FF9B0001 << 80) | value)
    elif kind == "6to4":
        v6 = V6((0x2002 << 112) | (value << 80) | (rand & ((1 << 80) - 1)))
    elif kind == "teredo-client":
        server = draw(st.integers(0, (1 << 32) - 1))
        flags_port = draw(st.integers(0, (1 << 32) - 1))
        v6 = V6((0x20010000 << 96) | (server << 64) | (flags_port << 32) | (value ^ 0xFFFFFFFF))
    else:
        low = draw(st.integers(0, (1 << 64) - 1))
        v6 = V6((0x20010000 << 96) | (value << 64) | low)
    text = draw(st.sampled_from([v6.compressed, v6.exploded, v6.compressed.upper()]))
    return text


@given(st.data())
def test_any_forbidden_ipv4_in_any_spelling_is_forbidden(data: st.DataObject) -> None:
    addr = data.draw(forbidden_v4())
    text = data.draw(v4_spelling(addr))
    parsed = parse_ip_literal(text)
    assert parsed == addr, text
    assert socket.inet_aton(text) == addr.packed  # glibc reads it the same way
    assert forbidden_reason(parsed) is not None, text


@given(st.data())
def test_any_forbidden_ipv4_embedded_in_ipv6_is_forbidden(data: st.DataObject) -> None:
    addr = data.draw(forbidden_v4())
    text = data.draw(v6_embedding(addr))
    text = data.draw(st.sampled_from([text, f"[{text}]", f"{text}%eth0", f"[{text}%25lo]"]))
    parsed = parse_ip_literal(text)
    assert isinstance(parsed, V6), text
    assert addr in embedded_ipv4_all(parsed), text
    assert forbidden_reason(parsed) is not None, text


@given(st.integers(0, (1 << 32) - 1))
def test_what_is_not_forbidden_is_global(value: int) -> None:
    addr = V4(value)
    if forbidden_reason(addr) is None:
        assert addr.is_global, addr
