"""Escapes, Network section of THREATS.md, at the cell layer.

Every test tries the escape for real in a cell and asserts that it failed at
once (on the errno: a connect given a 5 s timeout that hung would show as a
timeout, not as EACCES), that an event records what was tried, and that the
legitimate neighbour works: a program serving on an allowed ``loopback_ports``
port inside the cell is reached from inside the cell.

Isolation is proved with canaries, never with an outside address (HOST.md,
"Network rules for tests"): TCP and UDP listeners the test starts on the host's
own loopback, which must see nothing, and sockets the test places in the cell's
network namespace (as the daemon will place the gateway there). The gateway-side
lines of the section (allow lists, address encodings, SNI) belong to the gateway.

Where a refusal leaves no kernel record, the docstring says which layer refused
and why nothing is recorded, and the test asserts the strongest evidence there is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import secrets
import shutil
import socket
import stat
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cell._layers import GATEWAY_PORT
from tests.escapes._net_cell import (
    NEIGHBOUR_PORT,
    UNIX_PROBES,
    FakeGateway,
    HostCanary,
    Probe,
    host_canary,
    live_probe,
    net_policy,
    pending_connections,
    probe,
    probe_in_private_netns,
    same_netns,
    socket_in_netns,
)

AF_PACKET = 17
AF_VSOCK = 40
AF_TIPC = 30
AF_NETLINK = 16
SOCK_PACKET = 10
IPPROTO_ICMPV6 = 58
IPPROTO_SCTP = 132
IPPROTO_UDPLITE = 136
IPPROTO_MPTCP = 262
ETH_P_ALL_BE = 0x0300  # htons(ETH_P_ALL)
ETH_P_IP_BE = 0x0008  # htons(ETH_P_IP)
MSG_FASTOPEN = 0x20000000
TCP_FASTOPEN_CONNECT = 30

UNUSED_PORT = 18081
"""A loopback port no test policy allows."""


@pytest.fixture
def canary() -> Iterator[HostCanary]:
    with host_canary() as c:
        yield c


def assert_neighbour(p: Probe) -> None:
    """The control: a server on the allowed loopback port answers inside the cell."""
    assert p["neighbour"].ok and p["neighbour"].value == "ruobhgien", p.transcript()


def assert_refused(p: Probe, name: str, err: int) -> None:
    outcome = p[name]
    assert not outcome.ok, f"{name} worked (returned {outcome.value!r}): an escape\n{p.transcript()}"
    assert outcome.errno == err, (
        f"{name} failed with errno {outcome.errno} ({outcome.error}), expected "
        f"{errno.errorcode.get(err, err)} at once\n{p.transcript()}"
    )


# --- any TCP connect other than to the gateway ---------------------------------------------

CONNECT_TARGETS = [
    pytest.param("tcp_connect('127.0.0.1', P['port'])", "127.0.0.1", id="ipv4-literal"),
    pytest.param(
        "socket.create_connection(('localhost', P['port']), timeout=5).close()",
        "127.0.0.1",
        id="name-localhost",
    ),
    pytest.param("tcp_connect('::1', P['port'], socket.AF_INET6)", "::1", id="ipv6"),
    pytest.param(
        "tcp_connect('::ffff:127.0.0.1', P['port'], socket.AF_INET6)",
        "::ffff:127.0.0.1",
        id="ipv4-mapped-ipv6",
    ),
    # The kernel's record of a connect to an unspecified address has no daddr.
    pytest.param("tcp_connect('0.0.0.0', P['port'])", None, id="ipv4-unspecified"),
    pytest.param("tcp_connect('::', P['port'], socket.AF_INET6)", None, id="ipv6-unspecified"),
]


@pytest.mark.parametrize(("call", "daddr"), CONNECT_TARGETS)
def test_tcp_connect_to_the_hosts_loopback_is_refused(
    canary: HostCanary, call: str, daddr: str | None
) -> None:
    """THREATS: any TCP connect other than to the gateway: by IP literal, by
    name, over IPv6, IPv4-mapped IPv6. Landlock refuses the connect (EACCES) and
    the kernel records it; the canary on the host's loopback sees nothing."""
    p = probe(
        net_policy(),
        f"""
attempt("resolved", lambda: sorted({{a[4][0] for a in socket.getaddrinfo("localhost", 0)}}))
attempt("connect", lambda: {call})
attempt("neighbour", neighbour)
""",
        {"port": canary.port},
    )
    p.check_clean()
    assert p["resolved"].ok and "127.0.0.1" in p["resolved"].value, p.transcript()
    assert_refused(p, "connect", errno.EACCES)
    events = p.landlock("net.connect_tcp", port=canary.port, daddr=daddr)
    assert len(events) == 1, (
        f"no Landlock event for the connect to {daddr} port {canary.port}\n{p.transcript()}"
    )
    assert all(e.detail.get("syscall") == "connect" for e in events)
    assert canary.touched() == []
    assert_neighbour(p)


def test_the_hosts_loopback_is_another_network_even_for_an_allowed_port(
    canary: HostCanary,
) -> None:
    """The second layer alone: with the canary's port *allowed* by Landlock, a
    connect to 127.0.0.1 or ::1 reaches the cell's own loopback (its own network
    namespace), where nothing listens: ECONNREFUSED, and the host's canary sees
    nothing. No event: nothing was refused by a layer that records; the network
    namespace simply has no route to the host."""
    p = probe(
        net_policy(canary.port),
        """
attempt("v4", lambda: tcp_connect("127.0.0.1", P["port"]))
attempt("v6", lambda: tcp_connect("::1", P["port"], socket.AF_INET6))
attempt("mapped", lambda: tcp_connect("::ffff:127.0.0.1", P["port"], socket.AF_INET6))
attempt("interfaces", lambda: [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]])
attempt("neighbour", neighbour)
""",
        {"port": canary.port},
    )
    p.check_clean()
    for name in ("v4", "v6", "mapped"):
        assert_refused(p, name, errno.ECONNREFUSED)
    assert p["interfaces"].value == ["lo"], p.transcript()
    assert p.landlock("net.connect_tcp", port=canary.port) == []
    assert canary.touched() == []
    assert_neighbour(p)


_IN_NETNS_BODY = """
wait_for_go()
attempt("connect", lambda: tcp_connect("127.0.0.1", P["port"]))
def fastopen_connect():
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, P["tfo_connect"], 1)
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", P["port"]))
        return "connected"
    finally:
        s.close()
attempt("fastopen_connect", fastopen_connect)
attempt("gateway", lambda: tcp_connect("127.0.0.1", P["gateway"]))
attempt("neighbour", neighbour)
"""


def test_tcp_connect_to_a_service_in_the_cells_namespace_is_refused() -> None:
    """THREATS: any TCP connect other than to the gateway, where something does
    listen: the test places listeners in the running cell's own network
    namespace (as the daemon will place the gateway), one on the gateway port
    and one on a port the policy does not allow. The connect to the second is
    refused by Landlock and recorded, also with TCP_FASTOPEN_CONNECT (which
    still goes through connect(2)); the gateway is reached."""
    params = {"port": UNUSED_PORT, "gateway": GATEWAY_PORT, "tfo_connect": TCP_FASTOPEN_CONNECT}
    with live_probe(net_policy(), _IN_NETNS_BODY, params) as live:
        live.wait_ready()
        pid = live.init_pid()
        assert not same_netns(pid)
        service = socket_in_netns(pid, socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", UNUSED_PORT))
        gateway = socket_in_netns(pid, socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", GATEWAY_PORT))
        try:
            live.release()
            p = live.probe()
            reached_service = pending_connections(service)
            reached_gateway = pending_connections(gateway)
        finally:
            service.close()
            gateway.close()
    p.check_clean()
    assert_refused(p, "connect", errno.EACCES)
    assert_refused(p, "fastopen_connect", errno.EACCES)
    assert len(p.landlock("net.connect_tcp", port=UNUSED_PORT, daddr="127.0.0.1")) == 2, p.transcript()
    assert reached_service == []
    # The control: the gateway port is the way out, and it is open.
    assert p["gateway"].ok, p.transcript()
    assert len(reached_gateway) == 1
    assert p.landlock("net.connect_tcp", port=GATEWAY_PORT) == []
    assert_neighbour(p)


_FASTOPEN_DEF = """
def fastopen():
    # sendto(MSG_FASTOPEN) on a fresh TCP socket connects and sends in one call
    # (tcp_sendmsg_fastopen -> __inet_stream_connect): no connect(2) at all.
    s = socket.socket()
    s.settimeout(5)
    try:
        try:
            s.sendto(b"exfiltrated", P["msg_fastopen"], ("127.0.0.1", P["port"]))
        except BlockingIOError:  # EINPROGRESS: the SYN is out; see where it went
            select.select([], [s], [], 5)
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, os.strerror(err))
        return "connected to %s:%d" % s.getpeername()
    finally:
        s.close()
"""

_FASTOPEN_BODY = (
    _FASTOPEN_DEF
    + """
wait_for_go()
attempt("fastopen", fastopen)
attempt("neighbour", neighbour)
"""
)


def test_tcp_fast_open_to_a_port_not_allowed_is_refused() -> None:
    """THREATS: any TCP connect other than to the gateway, by TCP Fast Open:
    ``sendto(MSG_FASTOPEN)`` connects without connect(2), and Landlock hooks only
    connect(2) (landlock-lsm/linux#41, open upstream). Without a further layer
    the cell connects to a port its policy does not allow, and nothing is
    recorded (seen here on Linux 6.18 with Landlock and seccomp as of 7b3bba7).

    The network namespace still keeps the host out of reach (the canary tests),
    so what this reaches is whatever listens in the cell's own namespace: the
    gateway's neighbours once the daemon serves cells there. Refused by seccomp
    (MSG_FASTOPEN in the flags of sendto/sendmsg/sendmmsg: EPERM, logged) or by
    a Landlock that checks it (EACCES): either way the attempt is recorded."""
    params = {"port": UNUSED_PORT, "msg_fastopen": MSG_FASTOPEN}
    with live_probe(net_policy(), _FASTOPEN_BODY, params) as live:
        live.wait_ready()
        pid = live.init_pid()
        service = socket_in_netns(pid, socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", UNUSED_PORT))
        try:
            live.release()
            p = live.probe()
            reached = pending_connections(service)
        finally:
            service.close()
    p.check_clean()
    assert_neighbour(p)
    assert reached == [], (
        f"TCP Fast Open reached a port the policy does not allow: {reached}; the probe said {p['fastopen']}"
    )
    outcome = p["fastopen"]
    assert not outcome.ok and outcome.errno in (errno.EPERM, errno.EACCES), p.transcript()
    recorded = p.seccomp("sendto") + p.landlock("net.connect_tcp", port=UNUSED_PORT)
    assert len(recorded) == 1, f"the Fast Open attempt left no event\n{p.transcript()}"


# --- UDP, including DNS ----------------------------------------------------------------------

UDP_SOCKETS = [
    pytest.param(socket.AF_INET, socket.SOCK_DGRAM, 0, id="udp4"),
    pytest.param(socket.AF_INET6, socket.SOCK_DGRAM, 0, id="udp6"),
    pytest.param(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP, id="udp4-explicit-protocol"),
    pytest.param(
        socket.AF_INET,
        socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
        0,
        id="udp4-nonblock-cloexec",
    ),
    pytest.param(socket.AF_INET, socket.SOCK_DGRAM, IPPROTO_UDPLITE, id="udplite"),
    pytest.param(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP, id="icmp-ping"),
    pytest.param(socket.AF_INET6, socket.SOCK_DGRAM, IPPROTO_ICMPV6, id="icmp6-ping"),
    pytest.param((1 << 32) | socket.AF_INET, socket.SOCK_DGRAM, 0, id="udp4-high-bits-in-domain"),
    pytest.param(socket.AF_INET, (1 << 32) | socket.SOCK_DGRAM, 0, id="udp4-high-bits-in-type"),
]


@pytest.mark.parametrize(("family", "type_", "proto"), UDP_SOCKETS)
def test_udp_is_refused(canary: HostCanary, family: int, type_: int, proto: int) -> None:
    """THREATS: UDP. seccomp refuses the socket (EPERM), logged; the datagram
    the probe would have sent to the host's canary never arrives. High bits
    above an int argument are ignored by the kernel, and by the filter too."""
    p = probe(
        net_policy(),
        """
def send():
    raw_socket(P["family"], P["type"], P["proto"])  # the exact arguments, by syscall(2)
    with socket.socket(P["family"] & 0xFFFFFFFF, P["type"] & 0xFFFFFFFF, P["proto"]) as s:
        host = "::1" if (P["family"] & 0xFFFFFFFF) == socket.AF_INET6 else "127.0.0.1"
        s.sendto(b"exfiltrated", (host, P["port"]))
    return "sent"
attempt("udp", send)
attempt("neighbour", neighbour)
""",
        {"family": family, "type": type_, "proto": proto, "port": canary.port},
    )
    p.check_clean()
    assert_refused(p, "udp", errno.EPERM)
    assert len(p.seccomp("socket")) == 1, p.transcript()
    assert canary.touched() == []
    assert_neighbour(p)


_DNS_QUERY = """
def dns_query(name):
    header = struct.pack("!HHHHHH", 0x5eed, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.split("."))
    return header + labels + b"\\0" + struct.pack("!HH", 1, 1)
"""


def test_dns_lookup_fails_and_is_recorded() -> None:
    """THREATS: UDP, including DNS queries (the cell has no resolver; names are
    resolved by the gateway). getaddrinfo of a name other than localhost fails,
    and the resolver's UDP socket is refused by seccomp and recorded; localhost
    still resolves (from /etc/hosts, without the network).

    The lookup goes to the resolver in the host's /etc/resolv.conf, which is not
    a loopback address, so this cell is launched from a network namespace of the
    test's own (only ``lo``): nothing could leave even if every layer failed."""
    name = f"exfil-{secrets.token_hex(4)}.stockade-canary.invalid"
    p, interfaces = probe_in_private_netns(
        net_policy(),
        """
attempt("lookup", lambda: socket.getaddrinfo(P["name"], 443))
attempt("localhost", lambda: sorted({a[4][0] for a in socket.getaddrinfo("localhost", 443)}))
attempt("neighbour", neighbour)
""",
        {"name": name},
    )
    assert interfaces == ["lo"]
    p.check_clean()
    lookup = p["lookup"]
    assert not lookup.ok, f"{name} resolved inside the cell: {lookup.value}"
    assert lookup.errno is not None and lookup.errno < 0, f"not a resolver error: {lookup}"
    assert "gaierror" in lookup.error, lookup
    assert p.seccomp("socket"), f"the resolver's UDP socket left no event\n{p.transcript()}"
    assert p["localhost"].value == ["127.0.0.1"], p.transcript()
    assert_neighbour(p)


def test_dns_query_to_a_resolver_on_loopback_is_refused(canary: HostCanary) -> None:
    """THREATS: DNS exfiltration, by hand: a query in a UDP datagram to a resolver
    on the host's loopback (the canary) is refused at socket(2) by seccomp, over
    IPv4 and IPv6; DNS over TCP (53) and DNS over TLS (853) are refused by
    Landlock. Every attempt is recorded; the canary sees nothing."""
    p = probe(
        net_policy(),
        _DNS_QUERY
        + """
def udp(family, host):
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.sendto(dns_query(P["name"]), (host, P["port"]))
attempt("udp4", lambda: udp(socket.AF_INET, "127.0.0.1"))
attempt("udp6", lambda: udp(socket.AF_INET6, "::1"))
attempt("tcp53", lambda: tcp_connect("127.0.0.1", 53))
attempt("tls853", lambda: tcp_connect("127.0.0.1", 853))
attempt("neighbour", neighbour)
""",
        {"name": f"exfil-{secrets.token_hex(4)}.stockade-canary.invalid", "port": canary.port},
    )
    p.check_clean()
    assert_refused(p, "udp4", errno.EPERM)
    assert_refused(p, "udp6", errno.EPERM)
    assert len(p.seccomp("socket")) == 2, p.transcript()
    assert_refused(p, "tcp53", errno.EACCES)
    assert_refused(p, "tls853", errno.EACCES)
    assert p.landlock("net.connect_tcp", port=53, daddr="127.0.0.1"), p.transcript()
    assert p.landlock("net.connect_tcp", port=853, daddr="127.0.0.1"), p.transcript()
    assert canary.touched() == []
    assert_neighbour(p)


# --- raw, packet and netlink sockets; other transports -------------------------------------

RAW_AND_PACKET = [
    pytest.param(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, id="raw4-icmp"),
    pytest.param(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW, id="raw4-ipproto-raw"),
    pytest.param(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP, id="raw4-tcp"),
    pytest.param(socket.AF_INET6, socket.SOCK_RAW, IPPROTO_ICMPV6, id="raw6-icmp6"),
    pytest.param(AF_PACKET, socket.SOCK_RAW, ETH_P_ALL_BE, id="packet-raw"),
    pytest.param(AF_PACKET, socket.SOCK_DGRAM, ETH_P_IP_BE, id="packet-dgram"),
    pytest.param(socket.AF_INET, SOCK_PACKET, ETH_P_ALL_BE, id="inet-sock-packet"),
]

NETLINK = [
    pytest.param(AF_NETLINK, socket.SOCK_RAW, 0, id="route"),
    pytest.param(AF_NETLINK, socket.SOCK_DGRAM, 0, id="route-dgram"),
    pytest.param(AF_NETLINK, socket.SOCK_RAW, 4, id="sock-diag"),
    pytest.param(AF_NETLINK, socket.SOCK_RAW, 6, id="xfrm"),
    pytest.param(AF_NETLINK, socket.SOCK_RAW, 9, id="audit"),
    pytest.param(AF_NETLINK, socket.SOCK_RAW, 12, id="netfilter"),
    pytest.param(AF_NETLINK, socket.SOCK_RAW, 15, id="kobject-uevent"),
    pytest.param(AF_NETLINK, socket.SOCK_RAW, 16, id="generic"),
]

OTHER_TRANSPORTS = [
    pytest.param(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP, id="mptcp4"),
    pytest.param(socket.AF_INET6, socket.SOCK_STREAM, IPPROTO_MPTCP, id="mptcp6"),
    pytest.param(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_SCTP, id="sctp-stream"),
    pytest.param(socket.AF_INET, socket.SOCK_SEQPACKET, IPPROTO_SCTP, id="sctp-seqpacket"),
    pytest.param(AF_VSOCK, socket.SOCK_STREAM, 0, id="vsock"),
    pytest.param(AF_TIPC, socket.SOCK_RDM, 0, id="tipc"),
]

_SOCKET_BODY = """
attempt("socket", lambda: raw_socket(P["family"], P["type"], P["proto"]))
attempt("neighbour", neighbour)
"""


def _refused_socket(family: int, type_: int, proto: int, err: int = errno.EPERM) -> Probe:
    p = probe(net_policy(), _SOCKET_BODY, {"family": family, "type": type_, "proto": proto})
    p.check_clean()
    assert_refused(p, "socket", err)
    events = p.seccomp("socket")
    assert len(events) == 1, p.transcript()
    assert events[0].detail.get("action") == "errno"
    assert_neighbour(p)
    return p


@pytest.mark.parametrize(("family", "type_", "proto"), RAW_AND_PACKET)
def test_raw_and_packet_sockets_are_refused(family: int, type_: int, proto: int) -> None:
    """THREATS: raw and packet sockets. seccomp refuses socket(2) (EPERM) and
    logs it; the event names the call (the kernel's seccomp record carries no
    arguments, so not the family)."""
    _refused_socket(family, type_, proto)


@pytest.mark.parametrize(("family", "type_", "proto"), NETLINK)
def test_netlink_sockets_are_refused(family: int, type_: int, proto: int) -> None:
    """THREATS: netlink sockets that configure interfaces (route), and the other
    netlink families a cell could use to reach the kernel (audit, netfilter,
    xfrm, uevents, generic netlink): refused by seccomp, logged. The errno is
    EAFNOSUPPORT (a kernel without netlink), on which shadow's useradd and
    other audit-aware tools carry on instead of aborting."""
    _refused_socket(family, type_, proto, errno.EAFNOSUPPORT)


@pytest.mark.parametrize(("family", "type_", "proto"), OTHER_TRANSPORTS)
def test_transports_outside_landlocks_tcp_rules_are_refused(family: int, type_: int, proto: int) -> None:
    """Around "any TCP connect other than to the gateway": transports Landlock's
    TCP port rules do not cover (MPTCP, SCTP, vsock, TIPC) would connect past
    them. seccomp allows only TCP (protocol 0 or IPPROTO_TCP) over inet, and
    unix sockets: these are refused and logged."""
    _refused_socket(family, type_, proto)


def test_interface_configuration_by_ioctl_is_refused() -> None:
    """THREATS: configuring interfaces, by the ioctl route rather than netlink:
    SIOCSIFFLAGS (take ``lo`` down), SIOCSIFADDR and SIOCADDRT on an allowed
    TCP socket. Refused for want of CAP_NET_ADMIN (EPERM): the cell holds no
    capability, even in its own user namespace. No event: capability checks
    are not audited by the kernel here (no LSM logs them), so this is evidence
    by errno and by the interface staying up (the neighbour still works)."""
    p = probe(
        net_policy(),
        """
import fcntl
SIOCGIFFLAGS, SIOCSIFFLAGS, SIOCSIFADDR, SIOCADDRT = 0x8913, 0x8914, 0x8916, 0x890B
s = socket.socket()
def down():
    req = struct.pack("16sH14x", b"lo", 0)
    flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags & ~1))
def address():
    sin = struct.pack("=HH4s8x", socket.AF_INET, 0, socket.inet_aton("127.0.0.2"))
    fcntl.ioctl(s, SIOCSIFADDR, struct.pack("16s16s8x", b"lo", sin))
def route():
    fcntl.ioctl(s, SIOCADDRT, bytes(120))
attempt("down", down)
attempt("address", address)
attempt("route", route)
def flags():
    return struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0)))[1]
attempt("flags", lambda: flags() & 1)
attempt("neighbour", neighbour)
""",
    )
    p.check_clean()
    for name in ("down", "address", "route"):
        assert_refused(p, name, errno.EPERM)
    assert p["flags"].value == 1, "lo is no longer up"
    assert_neighbour(p)


# --- a program that ignores HTTP_PROXY -------------------------------------------------------

PROXY_ENV = tuple(
    (name, f"http://127.0.0.1:{GATEWAY_PORT}")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
)

_PROXY_BODY = """
import urllib.error, urllib.request
wait_for_go()
def curl(*args):
    r = subprocess.run(["/usr/bin/curl", "-sS", "--connect-timeout", "5", "--max-time", "5", *args],
                       capture_output=True, timeout=20)
    return {"exit": r.returncode, "body": r.stdout.decode(errors="replace"),
            "stderr": r.stderr.decode(errors="replace")[-300:]}
def direct_urllib(url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # ignores HTTP_PROXY
    try:
        return opener.open(url, timeout=5).read().decode()
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, OSError):
            raise exc.reason from None
        raise
attempt("curl_direct_ip", lambda: curl("--noproxy", "*", f"http://127.0.0.1:{P['port']}/"))
attempt("curl_direct_name", lambda: curl("--noproxy", "*", f"http://localhost:{P['port']}/"))
attempt("urllib_direct", lambda: direct_urllib(f"http://127.0.0.1:{P['port']}/"))
attempt("curl_proxied", lambda: curl("http://allowed.example/curl"))
def proxied_urllib(url):
    return urllib.request.urlopen(url, timeout=5).read().decode()  # honours HTTP_PROXY
attempt("urllib_proxied", lambda: proxied_urllib("http://allowed.example/urllib"))
attempt("neighbour", neighbour)
"""


def test_program_ignoring_http_proxy_fails_at_once_and_is_recorded(canary: HostCanary) -> None:
    """THREATS: a program that ignores HTTP_PROXY and connects directly fails at
    once (no hang) and the attempt is recorded. curl --noproxy (by IP and by
    name) and Python's urllib without a proxy handler get "couldn't connect"
    (curl exit 7, not 28: no timeout) / EACCES from Landlock, each recorded; the
    canary sees nothing. The control: the same programs honouring HTTP_PROXY
    reach a stand-in gateway the test serves in the cell's namespace."""
    policy = net_policy(env=PROXY_ENV)
    with live_probe(policy, _PROXY_BODY, {"port": canary.port}) as live:
        live.wait_ready()
        listener = socket_in_netns(
            live.init_pid(), socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", GATEWAY_PORT)
        )
        gateway = FakeGateway(listener)
        try:
            live.release()
            p = live.probe()
        finally:
            gateway.close()
    p.check_clean()
    for name in ("curl_direct_ip", "curl_direct_name"):
        outcome = p[name]
        assert outcome.ok and outcome.value["exit"] == 7, f"{name}: {outcome}\n{p.transcript()}"
    assert_refused(p, "urllib_direct", errno.EACCES)
    denied = p.landlock("net.connect_tcp", port=canary.port)
    # curl by IP, curl by name (localhost: 127.0.0.1, and ::1 if curl tries it), urllib.
    assert len([e for e in denied if e.detail.get("daddr") == "127.0.0.1"]) >= 3, p.transcript()
    assert {e.detail.get("comm") for e in denied} >= {"curl", "python3"}, p.transcript()
    assert canary.touched() == []
    # The legitimate path: through the gateway, which saw both requests.
    assert p["curl_proxied"].ok and p["curl_proxied"].value["body"] == "via-the-gateway", p.transcript()
    assert p["urllib_proxied"].ok and p["urllib_proxied"].value == "via-the-gateway", p.transcript()
    assert sorted(gateway.requests) == [
        "GET http://allowed.example/curl HTTP/1.1",
        "GET http://allowed.example/urllib HTTP/1.1",
    ]
    assert p.landlock("net.connect_tcp", port=GATEWAY_PORT) == []
    assert_neighbour(p)


# --- abstract and pathname unix sockets of the host ----------------------------------------

_UNIX_BODY = (
    UNIX_PROBES
    + """
def own_socket():
    # The control by path (UNIX_PROBES), then one by an abstract name.
    data = own_pathname_socket()
    abstract = b"\\0own-" + os.urandom(4).hex().encode()
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(abstract)
    srv.listen()
    with socket.socket(socket.AF_UNIX) as c:
        c.connect(abstract)
    srv.close()
    return data
"""
)


def test_abstract_unix_socket_of_the_host_is_unreachable() -> None:
    """THREATS: abstract unix sockets of the host. The test binds one in the
    host's network namespace; the cell's connect fails with ECONNREFUSED and the
    socket sees nothing.

    No event: abstract names live in a network namespace, and the cell's has no
    such name, so the connect supervisor finds nothing of that name in it and
    answers ECONNREFUSED, as the kernel would. A name bound in the cell's own
    namespace by another uid is refused and recorded (the next test)."""
    name = f"stockade-canary-{secrets.token_hex(6)}"
    with socket.socket(socket.AF_UNIX) as host:
        host.bind(b"\0" + name.encode())
        host.listen()
        p = probe(
            net_policy(),
            _UNIX_BODY
            + """
attempt("abstract", lambda: unix_connect(b"\\0" + P["name"].encode()))
attempt("own", own_socket)
attempt("neighbour", neighbour)
""",
            {"name": name},
        )
        reached = pending_connections(host)
    p.check_clean()
    assert_refused(p, "abstract", errno.ECONNREFUSED)
    assert reached == []
    assert p["own"].ok and p["own"].value == "ping", p.transcript()
    assert_neighbour(p)


def test_abstract_unix_socket_outside_the_cell_is_refused() -> None:
    """THREATS: abstract unix sockets of the host, bound in the cell's own network
    namespace by a process outside the cell (as the daemon may do): the name is
    found, and the connect supervisor refuses it (EACCES: bound by another uid
    than the cell's) and records it with the name. Landlock's abstract-unix
    scope no longer sees the connect: the cgroup guard sends every unix connect
    of the cell through the supervisor. The cell's own abstract sockets work."""
    name = f"stockade-daemon-{secrets.token_hex(6)}"
    body = (
        _UNIX_BODY
        + """
wait_for_go()
attempt("abstract", lambda: unix_connect(b"\\0" + P["name"].encode()))
attempt("own", own_socket)
attempt("neighbour", neighbour)
"""
    )
    with live_probe(net_policy(), body, {"name": name}) as live:
        live.wait_ready()
        daemon = socket_in_netns(live.init_pid(), socket.AF_UNIX, socket.SOCK_STREAM, b"\0" + name.encode())
        try:
            live.release()
            p = live.probe()
            reached = pending_connections(daemon)
        finally:
            daemon.close()
    p.check_clean()
    assert_refused(p, "abstract", errno.EACCES)
    assert len(p.unix_refusals("@" + name)) == 1, p.transcript()
    assert reached == []
    assert p["own"].ok and p["own"].value == "ping", p.transcript()
    assert_neighbour(p)


@pytest.fixture
def host_unix_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A listening socket the test binds under a directory no policy grants."""
    path = str(tmp_path / "host.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        os.chmod(path, 0o777)
        s.listen()
        yield path, s


def test_pathname_socket_outside_the_view_is_unreachable(
    host_unix_socket: tuple[str, socket.socket],
) -> None:
    """THREATS: pathname unix sockets of the host, under a directory the policy
    does not grant (a 0777 socket, so file modes do not stand in the way): the
    mount view does not hold it (the cell's /tmp is its own), so connect fails
    with ENOENT and the socket sees nothing.

    No event: the path does not exist in the cell's view, and a missing path is
    nothing a layer refused. Landlock does not cover connecting to pathname unix
    sockets at all (no access right for it up to ABI 7): the view is the only
    layer here."""
    path, listener = host_unix_socket
    p = probe(
        net_policy(),
        _UNIX_BODY
        + """
attempt("connect", lambda: unix_connect(P["path"]))
attempt("stat", lambda: os.stat(P["path"]).st_mode)
attempt("own", own_socket)
attempt("neighbour", neighbour)
""",
        {"path": path},
    )
    p.check_clean()
    assert_refused(p, "connect", errno.ENOENT)
    assert_refused(p, "stat", errno.ENOENT)
    assert pending_connections(listener) == []
    assert p["own"].ok and p["own"].value == "ping", p.transcript()
    assert_neighbour(p)


@pytest.fixture
def run_sockets() -> Iterator[dict[str, socket.socket]]:
    """Sockets the test binds under the host's /run, as a daemon (stockade's own,
    Docker's) would: one directly in /run, one in a directory of its own."""
    tag = secrets.token_hex(6)
    paths = {
        "flat": f"/run/stockade-canary-{tag}.sock",
        "nested": f"/run/stockade-canary-{tag}/daemon.sock",
    }
    os.mkdir(os.path.dirname(paths["nested"]), 0o755)
    made: dict[str, socket.socket] = {}
    try:
        for key, path in paths.items():
            s = socket.socket(socket.AF_UNIX)
            made[key] = s
            s.bind(path)
            os.chmod(path, 0o777)
            s.listen()
        yield made
    finally:
        for s in made.values():
            s.close()
        for path in paths.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        shutil.rmtree(os.path.dirname(paths["nested"]), ignore_errors=True)


def test_run_sockets_are_decoys(run_sockets: dict[str, socket.socket]) -> None:
    """THREATS: the daemon's own socket, docker.sock: sockets under /run (and
    /var/run). /run is a decoy in every cell: its names are there, as empty
    files, so connecting fails (ECONNREFUSED: not a socket; ENOENT where the
    decoy mirrors no name; /var/run links to the same decoy)
    and the sockets see nothing. Any open of the decoy is refused by
    Landlock and recorded.

    The connect supervisor (``cell/_unotify``) finds a file that is no socket
    there, fails the connect with ECONNREFUSED as the kernel would, and records
    it naming the path. An ENOENT (nothing of that name in the view) is not
    recorded: nothing was there to refuse. Were the decoy missing, the
    supervisor would refuse the host's socket all the same (the tests below)."""
    flat = run_sockets["flat"].getsockname()
    nested = run_sockets["nested"].getsockname()
    p = probe(
        net_policy(),
        _UNIX_BODY
        + """
attempt("flat", lambda: unix_connect(P["flat"]))
attempt("flat_var_run", lambda: unix_connect("/var" + P["flat"]))
attempt("nested", lambda: unix_connect(P["nested"]))
attempt("mode", lambda: os.lstat(P["flat"]).st_mode)
attempt("open", lambda: open(P["flat"], "rb").read())
attempt("own", own_socket)
attempt("neighbour", neighbour)
""",
        {"flat": flat, "nested": nested},
    )
    p.check_clean()
    assert_refused(p, "flat", errno.ECONNREFUSED)
    # /var/run is the link to /run in the view (as on the host): the same decoy.
    assert_refused(p, "flat_var_run", errno.ECONNREFUSED)
    # ENOENT where the decoy mirrors no name this deep, ECONNREFUSED where it does.
    assert p["nested"].errno in (errno.ENOENT, errno.ECONNREFUSED) and not p["nested"].ok, p.transcript()
    assert p["mode"].ok and not stat.S_ISSOCK(p["mode"].value), p.transcript()
    assert_refused(p, "open", errno.EACCES)
    assert p.landlock("fs.read_file", path=flat), p.transcript()
    assert len(p.decoy_connects(flat)) == 1, p.transcript()
    if p["nested"].errno == errno.ECONNREFUSED:
        assert p.decoy_connects(nested), p.transcript()
    for s in run_sockets.values():
        assert pending_connections(s) == []
    assert p["own"].ok and p["own"].value == "ping", p.transcript()
    assert_neighbour(p)


@pytest.fixture
def granted_socket_dir() -> Iterator[str]:
    """A directory outside /tmp holding a world-writable socket and a 0660 one."""
    path = tempfile.mkdtemp(prefix="stockade-grant-", dir="/var/tmp")
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_host_socket_inside_a_read_only_grant_is_a_decoy(granted_socket_dir: str) -> None:
    """THREATS: pathname unix sockets of the host, where a policy grants the
    directory that holds one read-only (a project tree, a tools directory).

    A read-only grant alone would not stop a connect: Landlock has no right for
    connecting to a pathname socket (up to ABI 7) and connect is no write to
    the file system, so only file modes would stand in the way (found by this
    suite and by the demo; fixed in ad35993). The plan now hides every socket it
    finds in the policy's grants behind a decoy: the connect fails with
    ECONNREFUSED (not a socket), whatever the socket's mode, and the host's
    sockets see nothing; an open of the decoy is refused by Landlock and recorded.

    The connect meets the decoy (an empty file): the connect supervisor fails
    it with ECONNREFUSED and records it. A socket the host creates in the
    grant after the cell started has no decoy, and the supervisor refuses it
    (test_host_socket_made_after_the_cell_started_is_refused)."""
    open_path = os.path.join(granted_socket_dir, "app.sock")
    private_path = os.path.join(granted_socket_dir, "private.sock")
    with socket.socket(socket.AF_UNIX) as wide, socket.socket(socket.AF_UNIX) as private:
        wide.bind(open_path)
        os.chmod(open_path, 0o777)
        wide.listen()
        private.bind(private_path)
        os.chmod(private_path, 0o660)
        private.listen()
        base = net_policy()
        read = (*base.filesystem.read, granted_socket_dir)
        policy = dataclasses.replace(base, filesystem=dataclasses.replace(base.filesystem, read=read))
        p = probe(
            policy,
            _UNIX_BODY
            + """
attempt("listing", lambda: sorted(os.listdir(P["dir"])))
attempt("wide", lambda: unix_connect(P["wide"]))
attempt("private", lambda: unix_connect(P["private"]))
attempt("mode", lambda: os.lstat(P["wide"]).st_mode)
attempt("open", lambda: open(P["wide"], "rb").read())
attempt("own", own_socket)
attempt("neighbour", neighbour)
""",
            {"dir": granted_socket_dir, "private": private_path, "wide": open_path},
        )
        reached_wide = pending_connections(wide)
        reached_private = pending_connections(private)
    p.check_clean()
    assert p["listing"].value == ["app.sock", "private.sock"], p.transcript()
    assert reached_wide == [], f"the cell reached a host socket in a read-only grant: {p['wide']}"
    assert reached_private == []
    assert_refused(p, "wide", errno.ECONNREFUSED)
    assert_refused(p, "private", errno.ECONNREFUSED)
    assert len(p.decoy_connects(open_path)) == 1 and len(p.decoy_connects(private_path)) == 1, p.transcript()
    assert p["mode"].ok and not stat.S_ISSOCK(p["mode"].value), p.transcript()
    assert_refused(p, "open", errno.EACCES)
    assert p.landlock("fs.read_file", path=open_path), p.transcript()
    assert p["own"].ok and p["own"].value == "ping", p.transcript()
    assert_neighbour(p)


# --- binding a port that is not allowed ------------------------------------------------------

BINDS = [
    pytest.param("s = socket.socket()\ns.bind(('127.0.0.1', P['port']))", UNUSED_PORT, id="ipv4"),
    pytest.param("s = socket.socket(socket.AF_INET6)\ns.bind(('::1', P['port']))", UNUSED_PORT, id="ipv6"),
    pytest.param("s = socket.socket()\ns.bind(('0.0.0.0', P['port']))", UNUSED_PORT, id="any"),
    pytest.param("s = socket.socket()\ns.bind(('127.0.0.1', P['gateway']))", GATEWAY_PORT, id="gateway-port"),
    pytest.param(
        # AF_UNSPEC with INADDR_ANY: inet_bind accepts it for compatibility.
        """s = socket.socket()
sa = struct.pack("=HH4s8x", 0, socket.htons(P["port"]), bytes(4))
if libc.bind(s.fileno(), sa, len(sa)) != 0:
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e))""",
        None,
        id="af-unspec",
    ),
]


@pytest.mark.parametrize(("code", "port"), BINDS)
def test_binding_a_port_not_allowed_is_refused(code: str, port: int | None) -> None:
    """Binding a TCP port the policy does not allow (including the gateway's,
    which a cell may connect to but never serve) is refused by Landlock
    (EACCES) and recorded. The control binds the allowed port and serves on
    it. Port 0, the kernel's choice, is allowed (urllib3 binds ('::1', 0) in
    every pip run): test_an_unlisted_listener_is_unreachable."""
    p = probe(
        net_policy(),
        f"""
def bind():
{textwrap.indent(code, "    ")}
    s.listen()
    return s.getsockname()
attempt("bind", bind)
attempt("neighbour", neighbour)
""",
        {"port": UNUSED_PORT, "gateway": GATEWAY_PORT},
    )
    p.check_clean()
    assert_refused(p, "bind", errno.EACCES)
    events = p.landlock("net.bind_tcp")
    assert len(events) == 1, p.transcript()
    if port is not None:
        assert events[0].detail.get("port") == port, events[0]
    assert events[0].detail.get("syscall") == "bind"
    assert_neighbour(p)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param("srv = socket.socket()", id="autobind"),
        pytest.param("srv = socket.socket()\nsrv.bind(('127.0.0.1', 0))", id="port-0"),
        pytest.param("srv = socket.socket()\nsrv.bind(('0.0.0.0', 0))", id="port-0-any"),
    ],
)
def test_an_unlisted_listener_is_unreachable(make: str) -> None:
    """listen(2) on a socket never bound makes the kernel pick a port (autobind),
    and Landlock up to ABI 7 has no right for listen: nothing refuses or records
    it (a gap, listed in the report). A bind of port 0 gives the same socket,
    so the cell may make it (urllib3's IPv6 probe does, in every pip run, and
    refusing it recorded noise, not an escape). What must hold is that nobody
    reaches that port: from inside the cell a connect to it is refused by
    Landlock and a Fast Open send by seccomp, both recorded; the host is
    another namespace."""
    p = probe(
        net_policy(),
        _FASTOPEN_DEF
        + make
        + """
srv.listen()
P["port"] = srv.getsockname()[1]
attempt("connect", lambda: tcp_connect("127.0.0.1", P["port"]))
attempt("fastopen", fastopen)
srv.setblocking(False)
def accepted():
    try:
        srv.accept()
        return "a connection came in"
    except BlockingIOError:
        return "none"
attempt("accepted", accepted)
attempt("neighbour", neighbour)
""",
        {"msg_fastopen": MSG_FASTOPEN},
    )
    p.check_clean()
    assert p["accepted"].value == "none", p.transcript()
    assert_refused(p, "connect", errno.EACCES)
    assert p["fastopen"].errno in (errno.EPERM, errno.EACCES) and not p["fastopen"].ok, p.transcript()
    assert len(p.landlock("net.connect_tcp", daddr="127.0.0.1")) >= 1, p.transcript()
    assert len(p.seccomp("sendto") + p.landlock("net.connect_tcp")) == 2, p.transcript()
    assert_neighbour(p)


def test_neighbour_works_over_ipv6() -> None:
    """The control, over IPv6: the allowed port serves on ::1 inside the cell."""
    p = probe(
        net_policy(),
        'attempt("neighbour", lambda: neighbour(host="::1"))',
    )
    p.check_clean()
    assert_neighbour(p)
    assert p.denials() == [], p.transcript()


def test_allowed_port_is_what_the_policy_says() -> None:
    """The policy's own line, both ways, in one cell: the allowed port binds and
    connects; the port next to it does neither, and both refusals are recorded."""
    p = probe(
        net_policy(),
        """
attempt("neighbour", neighbour)
def bind_next():
    with socket.socket() as s:
        s.bind(("127.0.0.1", P["next"]))
attempt("bind_next", bind_next)
attempt("connect_next", lambda: tcp_connect("127.0.0.1", P["next"]))
""",
        {"next": NEIGHBOUR_PORT + 1},
    )
    p.check_clean()
    assert_neighbour(p)
    assert_refused(p, "bind_next", errno.EACCES)
    assert_refused(p, "connect_next", errno.EACCES)
    assert p.landlock("net.bind_tcp", port=NEIGHBOUR_PORT + 1)
    assert p.landlock("net.connect_tcp", port=NEIGHBOUR_PORT + 1)
