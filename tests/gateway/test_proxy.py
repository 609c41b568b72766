"""The egress proxy: absolute-form requests, CONNECT tunnels, refusals, limits.

Every test runs inside a network namespace of its own (``TestNetns``) where the
"internet" is a few public-looking addresses on ``lo`` (93.184.216.34,
2606:2800:220:1::1), the forbidden canaries are 10.0.0.1 and 169.254.169.254,
and names resolve through a DNS server in the namespace (``TestDns``). Nothing
leaves the machine, whatever the proxy does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import select
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest

from stockade.errors import StoreError
from stockade.gateway._ca import RunCA
from stockade.gateway._egress import Egress
from stockade.gateway._proxy import Proxy
from stockade.gateway._resolve import DnsResolver
from stockade.gateway._secrets import Secrets
from stockade.gateway._tunnel import ClientHelloError, parse_client_hello
from stockade.gateway._upstream import upstream_tls_context
from stockade.policy._model import HostRule, NetworkPolicy, SecretPolicy
from stockade.record._event import Event
from tests._netns import TestNetns
from tests.gateway._dns import TestDns
from tests.gateway._tls import TestPki

PUBLIC4 = "93.184.216.34"
PUBLIC6 = "2606:2800:220:1::1"
PRIVATE = "10.0.0.1"
METADATA = "169.254.169.254"
ADDRESSES = [PUBLIC4, PUBLIC6, PRIVATE, METADATA]
NAMES = {
    "api.example.com": [PUBLIC4],
    "other.example.com": [PUBLIC4],
    "v6.example.com": [PUBLIC6],
    "internal.example.com": [PRIVATE],
    "evil.example": [PUBLIC4],
}


# --------------------------------------------------------------------------- hooks


class Hooks:
    """The daemon's side, for tests: events kept in order, denials counted."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.denials = 0
        self.halt: str | None = None
        self.fail = False
        self.on_record: Callable[[Sequence[Event]], None] | None = None
        self.recorded = asyncio.Event()

    async def record(self, events: Sequence[Event]) -> None:
        if self.on_record is not None:
            self.on_record(events)
        if self.fail:
            raise StoreError("the disk is full", path="/var/lib/stockade/events.db")
        self.events.extend(events)
        self.recorded.set()

    async def denied(self) -> None:
        self.denials += 1

    def halted(self) -> str | None:
        return self.halt

    async def wait_events(self, n: int) -> list[Event]:
        """The first ``n`` events, once recorded (allowed ones are recorded after the answer)."""
        async with asyncio.timeout(10):
            while len(self.events) < n:
                self.recorded.clear()
                await self.recorded.wait()
        return self.events


# --------------------------------------------------------------------------- origin servers


@dataclass
class Origin:
    """A keep-alive HTTP/1.1 server (h11) for the upstream side.

    ``/echo`` answers with what it received as JSON; ``/bytes/N`` answers N
    bytes; ``/hang`` sends headers and part of a body, then waits for the
    client to go away (and records that it did).
    """

    tls: ssl.SSLContext | None = None
    seen: list[dict[str, Any]] = field(default_factory=list)
    connections: int = 0
    open: int = 0
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    sent: int = 0
    """Body bytes of /bytes/N written so far."""
    answer: Callable[[dict[str, Any]], tuple[list[tuple[str, str]], bytes]] | None = None
    """Answers ``/reflect/…`` (headers, body) from what was seen; the test sets it."""
    _servers: list[asyncio.Server] = field(default_factory=list)

    async def listen(self, host: str, port: int) -> Origin:
        self._servers.append(await asyncio.start_server(self._serve, host, port, ssl=self.tls, backlog=1024))
        return self

    async def close(self) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request: h11.Request | None = None
                body = hashlib.sha256()
                size = 0
                sample = b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await reader.read(262144))
                        continue
                    if isinstance(event, h11.ConnectionClosed):
                        return
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body.update(event.data)
                        size += len(event.data)
                        if len(sample) < 65536:
                            sample += bytes(event.data)
                    elif isinstance(event, h11.EndOfMessage):
                        break
                assert request is not None
                seen = {
                    "method": request.method.decode(),
                    "target": request.target.decode(),
                    "headers": [[k.decode(), v.decode()] for k, v in request.headers],
                    "size": size,
                    "sha256": body.hexdigest(),
                    "body": sample.decode("latin-1"),
                    "local": writer.get_extra_info("sockname")[0],
                }
                self.seen.append(seen)
                path = seen["target"].split("?", 1)[0]
                if path.startswith("/bytes/"):
                    n = int(path.rsplit("/", 1)[1])
                    writer.write(
                        conn.send(h11.Response(status_code=200, headers=[("content-length", str(n))]))
                    )
                    chunk = b"x" * 262144
                    left = n
                    while left:
                        part = chunk[: min(left, len(chunk))]
                        writer.write(conn.send(h11.Data(data=part)))
                        left -= len(part)
                        self.sent += len(part)
                        await writer.drain()
                elif path.startswith("/reflect/") and self.answer is not None:
                    extra, answer = self.answer(seen)
                    headers = [*extra, ("content-length", str(len(answer)))]
                    writer.write(conn.send(h11.Response(status_code=200, headers=headers)))
                    writer.write(conn.send(h11.Data(data=answer)))
                elif path == "/hang":
                    writer.write(
                        conn.send(h11.Response(status_code=200, headers=[("content-length", "100000")]))
                    )
                    writer.write(conn.send(h11.Data(data=b"y" * 1000)))
                    await writer.drain()
                    while await reader.read(65536):
                        pass
                    return
                else:
                    answer = json.dumps(seen).encode()
                    headers = [("content-type", "application/json"), ("content-length", str(len(answer)))]
                    writer.write(conn.send(h11.Response(status_code=200, headers=headers)))
                    writer.write(conn.send(h11.Data(data=answer)))
                writer.write(conn.send(h11.EndOfMessage()))
                await writer.drain()
                if conn.our_state is not h11.DONE or path == "/bye":
                    return  # /bye: a server closing a kept connection without a word (it may)
                conn.start_next_cycle()
        except (ConnectionError, ssl.SSLError, h11.RemoteProtocolError):
            pass
        finally:
            self.open -= 1
            self.gone.set()
            writer.close()


class Canary:
    """Accepts connections and counts them: a refused request must leave ``hits`` at 0."""

    def __init__(self) -> None:
        self.hits = 0
        self._servers: list[asyncio.Server] = []

    async def listen(self, host: str, port: int) -> Canary:
        async def hit(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.hits += 1
            writer.close()

        self._servers.append(await asyncio.start_server(hit, host, port))
        return self

    async def close(self) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()


# --------------------------------------------------------------------------- the world


@dataclass
class World:
    """One namespace's worth of everything: DNS, origins, canaries, the proxy and its hooks."""

    ns: TestNetns
    pki: TestPki
    dns: TestDns
    hooks: Hooks
    proxy: Proxy
    port: int
    origin: Origin
    tls_origin: Origin
    canaries: list[Canary]
    secrets: Secrets
    ca: RunCA | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        verify = ssl.create_default_context(cadata=self.pki.ca_pem.decode())
        if self.ca is not None:
            verify.load_verify_locations(cadata=self.ca.cert_pem.decode())
        return httpx.AsyncClient(proxy=self.url, verify=verify, trust_env=False, timeout=20, **kwargs)

    async def raw(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def curl(self, *args: str) -> tuple[int, str, str]:
        """curl inside the namespace (``nsenter``): exit code, stdout, stderr."""
        process = await asyncio.create_subprocess_exec(
            *self.ns.argv(["curl", "-sS", "--max-time", "20", "--proxy", self.url, *args]),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin"},
        )
        out, err = await process.communicate()
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    def hits(self) -> int:
        return sum(c.hits for c in self.canaries)


def rules(*entries: HostRule) -> NetworkPolicy:
    return NetworkPolicy(allow=entries)


DEFAULT_RULES = rules(
    HostRule("api.example.com", ports=(80, 443)),
    HostRule("v6.example.com", ports=(80, 443)),
    HostRule("internal.example.com", ports=(80, 443)),
    HostRule(PUBLIC4, ports=(80, 443)),
    HostRule(PUBLIC6, ports=(80, 443)),
)


def in_world(
    body: Callable[[World], Awaitable[None]],
    tmp_path: Path,
    *,
    network: NetworkPolicy = DEFAULT_RULES,
    secrets: Sequence[SecretPolicy] = (),
    environ: dict[str, str] | None = None,
    idle_timeout: float = 30.0,
    max_connections: int = 1024,
    hide_echoed_secrets: bool = True,
) -> None:
    """Run ``body`` with a World, every socket inside a fresh namespace."""
    options = {
        "idle_timeout": idle_timeout,
        "max_connections": max_connections,
        "hide_echoed_secrets": hide_echoed_secrets,
    }
    with TestNetns(ADDRESSES) as ns, ns.entered():
        asyncio.run(_world(body, ns, tmp_path, network, secrets, environ or {}, options))


async def _world(
    body: Callable[[World], Awaitable[None]],
    ns: TestNetns,
    tmp_path: Path,
    network: NetworkPolicy,
    secret_specs: Sequence[SecretPolicy],
    environ: dict[str, str],
    options: dict[str, Any],
) -> None:
    pki = TestPki(tmp_path)
    dns = await TestDns(NAMES).start()
    hooks = Hooks()
    secrets = Secrets.load(secret_specs, environ)
    egress = Egress(network, resolver=DnsResolver(dns.spec), inspect_hosts=secrets.for_host)
    inspects = bool(secret_specs) or any(r.methods or r.paths for r in network.allow)
    ca = RunCA.create("r-test") if inspects else None
    proxy = Proxy(
        run_id="r-test",
        egress=egress,
        hooks=hooks,
        secrets=secrets,
        ca=ca,
        upstream_tls=upstream_tls_context(pki.ca_file),
        **options,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    sock.setblocking(False)
    await proxy.serve(sock, "c-test")
    origin = Origin()
    tls_origin = Origin(tls=pki.server_context([*NAMES, PUBLIC4, PUBLIC6]))
    for host in (PUBLIC4, PUBLIC6):
        await origin.listen(host, 80)
        await tls_origin.listen(host, 443)
    canaries = [await Canary().listen(host, port) for host in (PRIVATE, METADATA) for port in (80, 443)]
    world = World(
        ns, pki, dns, hooks, proxy, sock.getsockname()[1], origin, tls_origin, canaries, secrets, ca
    )
    # The proxy logs only what it did not expect (a bug), asyncio a task that
    # failed unseen: no test may cause either.
    errors = _Errors()
    for name in ("stockade.gateway", "asyncio"):
        logging.getLogger(name).addHandler(errors)
    try:
        await body(world)
        assert errors.records == [], [r.getMessage() for r in errors.records]
    finally:
        for name in ("stockade.gateway", "asyncio"):
            logging.getLogger(name).removeHandler(errors)
        await proxy.close()
        await origin.close()
        await tls_origin.close()
        for canary in canaries:
            await canary.close()
        await dns.close()


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def exchange(world: World, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw`` on a new connection; the response's status, headers and body."""
    reader, writer = await world.raw()
    writer.write(raw)
    await writer.drain()
    try:
        return await read_response(reader)
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    status, headers, body = 0, {}, b""
    async with asyncio.timeout(20):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, headers, body


def detail(event: Event) -> dict[str, Any]:
    assert event.kind == "http.request" and event.layer == "gateway" and event.run == "r-test"
    assert event.cell == "c-test"
    return event.detail


# --------------------------------------------------------------------------- absolute-form requests


def test_allowed_request_is_forwarded_without_hop_by_hop_headers(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        async with w.client() as client:
            r = await client.get(
                "http://api.example.com/echo?q=1",
                headers={
                    "Proxy-Authorization": "Basic eA==",
                    "Connection": "x-drop",
                    "X-Drop": "1",
                    "X-Keep": "2",
                },
            )
        assert r.status_code == 200
        seen = r.json()
        names = {k for k, _ in seen["headers"]}
        assert seen["target"] == "/echo?q=1"
        assert ["host", "api.example.com"] in seen["headers"]
        assert "proxy-authorization" not in names and "x-drop" not in names and "connection" not in names
        assert "x-keep" in names
        assert seen["local"] == PUBLIC4
        (event,) = await w.hooks.wait_events(1)
        d = detail(event)
        assert event.outcome == "allowed"
        assert d["method"] == "GET" and d["scheme"] == "http" and d["host"] == "api.example.com"
        assert d["port"] == 80 and d["path"] == "/echo?q=1" and d["address"] == PUBLIC4
        assert (
            d["status"] == 200
            and d["verdict"] == "allow"
            and d["rule"] == "network.allow[0] (api.example.com)"
        )
        assert d["bytes_down"] == len(r.content) and d["bytes_up"] == 0
        assert event.summary.startswith("GET http://api.example.com/echo?q=1 allowed by network.allow[0]")
        assert w.hooks.denials == 0

    in_world(body, tmp_path)


def test_denied_host_gets_403_naming_the_rule_recorded_before_the_answer(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.create_connection(("127.0.0.1", w.port))
        sock.setblocking(False)
        answered_while_recording: list[bool] = []

        def check(_events: Sequence[Event]) -> None:
            # The proxy has not written a byte of its answer while it records.
            answered_while_recording.append(bool(select.select([sock], [], [], 0)[0]))

        w.hooks.on_record = check
        await loop.sock_sendall(sock, b"GET http://evil.example/x HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        raw = b""
        while chunk := await loop.sock_recv(sock, 65536):
            raw += chunk
        sock.close()
        head, _, text = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 ")
        assert b"\r\nx-stockade-verdict: deny" in head
        assert text.startswith(b"stockade: GET http://evil.example/x refused: no network.allow rule")
        assert b'"- evil.example:80"' in text
        assert answered_while_recording == [False]
        (event,) = w.hooks.events
        assert (
            event.outcome == "denied"
            and detail(event)["verdict"] == "deny"
            and detail(event)["status"] == 403
        )
        assert w.hooks.denials == 1

    in_world(body, tmp_path)


def test_keep_alive_decides_each_request_on_its_own_host(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        reader, writer = await w.raw()
        writer.write(b"GET http://api.example.com/echo HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        status1, _, _ = await read_response(reader)
        writer.write(b"GET http://api.example.com/echo HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        status2, _, _ = await read_response(reader)
        writer.write(b"GET http://other.example.com/echo HTTP/1.1\r\nHost: other.example.com\r\n\r\n")
        status3, headers3, _ = await read_response(reader)
        writer.close()
        assert (status1, status2, status3) == (200, 200, 403)
        assert headers3["x-stockade-verdict"] == "deny"
        # Two requests on one client connection, one upstream connection; the third never left.
        assert w.origin.connections == 1 and len(w.origin.seen) == 2
        events = await w.hooks.wait_events(3)
        assert sorted(e.outcome for e in events) == ["allowed", "allowed", "denied"]

    in_world(body, tmp_path)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://internal.example.com/", b"10.0.0.1"),  # allowed name, private address
        (f"http://{METADATA}/latest/meta-data/", b"169.254.169.254"),
        (f"http://{PRIVATE}/", b"10.0.0.1"),
        ("http://0xa000001/", b"10.0.0.1"),  # 10.0.0.1 in hex
    ],
)
def test_internal_addresses_are_refused_and_never_reached(tmp_path: Path, url: str, why: bytes) -> None:
    async def body(w: World) -> None:
        host = url.split("/")[2]
        status, headers, text = await exchange(w, f"GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert status == 403, text
        assert why in text
        assert headers["x-stockade-verdict"] == "deny"
        assert w.hits() == 0
        assert w.hooks.denials == 1 and w.hooks.events[0].outcome == "denied"

    in_world(body, tmp_path)


def test_ipv6_upstream(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        async with w.client() as client:
            r = await client.get("http://v6.example.com/echo")
        assert r.status_code == 200 and r.json()["local"] == PUBLIC6
        (event,) = await w.hooks.wait_events(1)
        assert detail(event)["address"] == PUBLIC6

    in_world(body, tmp_path)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"GET http://api.example.com/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", b"Host header"),
        (b"GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com:8080\r\n\r\n", b"Host header"),
        (b"GET /echo HTTP/1.1\r\nHost: api.example.com\r\n\r\n", b"HTTP_PROXY"),
        (b"GET https://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n", b"CONNECT"),
        (b"GET http://user@evil.example@api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n", b"'@'"),
        (b"CONNECT api.example.com HTTP/1.1\r\nHost: api.example.com\r\n\r\n", b"host:port"),
    ],
)
def test_malformed_requests_get_400_and_are_recorded(tmp_path: Path, raw: bytes, needle: bytes) -> None:
    async def body(w: World) -> None:
        status, headers, text = await exchange(w, raw)
        assert status == 400, text
        assert needle in text
        assert headers["x-stockade-verdict"] == "deny"
        assert w.origin.connections == 0
        (event,) = w.hooks.events
        assert event.outcome == "denied" and detail(event)["status"] == 400
        assert w.hooks.denials == 1

    in_world(body, tmp_path)


def test_oversized_headers_get_431(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        raw = b"GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\nX-Big: " + b"a" * 100_000
        status, _, _ = await exchange(w, raw + b"\r\n\r\n")
        assert status == 431
        assert w.origin.connections == 0 and w.hooks.events[0].outcome == "denied"

    in_world(body, tmp_path)


def test_upstream_connections_outlive_their_client_connection(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        for _ in range(3):  # a new client connection each time, as curl in a loop
            request = b"GET http://api.example.com/echo HTTP/1.1\r\nHost: api.example.com\r\n"
            status, _, _ = await exchange(w, request + b"Connection: close\r\n\r\n")
            assert status == 200
        assert w.origin.connections == 1 and len(w.origin.seen) == 3
        # Each request was still decided and its address checked: a refused host gets nothing.
        status, _, _ = await exchange(w, b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        assert status == 403 and len(w.origin.seen) == 3
        assert [e.outcome for e in await w.hooks.wait_events(4)].count("allowed") == 3

    in_world(body, tmp_path)


def test_upstream_closing_a_kept_connection_is_not_a_failure(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        reader, writer = await w.raw()
        for path in ("/bye", "/echo", "/bye", "/bye", "/echo"):
            writer.write(
                f"GET http://api.example.com{path} HTTP/1.1\r\nHost: api.example.com\r\n\r\n".encode()
            )
            status, _, _ = await read_response(reader)
            assert status == 200, path
        writer.close()
        assert [s["target"] for s in w.origin.seen] == ["/bye", "/echo", "/bye", "/bye", "/echo"]

    in_world(body, tmp_path)


def test_http_1_0_without_host_is_forwarded_with_one(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        status, _, text = await exchange(w, b"GET http://api.example.com/echo HTTP/1.0\r\n\r\n")
        assert status == 200
        assert ["host", "api.example.com"] in json.loads(text)["headers"]

    in_world(body, tmp_path)


def test_close_ends_every_connection(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        idle_reader, idle_writer = await w.raw()
        reader, writer = await w.raw()
        writer.write(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        ctx = ssl.create_default_context(cadata=w.pki.ca_pem.decode())
        await writer.start_tls(ctx, server_hostname="api.example.com")
        await _until(lambda: w.tls_origin.open == 1 and w.proxy.connections == 2)
        await w.proxy.close()
        assert w.proxy.connections == 0
        assert await idle_reader.read() == b""
        await _until(lambda: w.tls_origin.open == 0)
        (event,) = await w.hooks.wait_events(1)  # the tunnel, recorded before close returned
        assert detail(event)["scheme"] == "tunnel"
        idle_writer.close()
        writer.close()
        # Nobody is listening any more.
        try:
            _, late = await w.raw()
        except ConnectionRefusedError:
            pass
        else:
            late.close()
            raise AssertionError("the proxy still accepts connections after close()")

    in_world(body, tmp_path)


def test_halted_run_refuses_everything(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        w.hooks.halt = "run r-test is halted (the tripwire tripped after 3 denials)"
        status, _, text = await exchange(
            w, b"GET http://api.example.com/echo HTTP/1.1\r\nHost: api.example.com\r\n\r\n"
        )
        assert status == 403 and b"halted" in text and b"tripwire" in text
        status, _, _ = await exchange(
            w, b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n"
        )
        assert status == 403
        assert w.origin.connections == 0 and w.tls_origin.connections == 0
        assert [e.outcome for e in w.hooks.events] == ["denied", "denied"] and w.hooks.denials == 2
        assert w.hooks.events[1].summary.startswith(
            "CONNECT api.example.com:443 refused: run r-test is halted"
        )

    in_world(body, tmp_path)


def test_store_failure_answers_503_and_forwards_nothing_more(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        w.hooks.fail = True
        status, _, text = await exchange(
            w, b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n"
        )
        assert status == 503 and b"record cannot be written" in text
        assert w.hooks.denials == 0  # not recorded, so not counted either
        # An allowed request is recorded after its answer; its record fails,
        # so the next request stops at 503 until the store works again.
        async with w.client() as client:
            first = await client.get("http://api.example.com/echo")
            assert first.status_code == 200
            async with asyncio.timeout(10):
                while not w.proxy._unrecorded:
                    await asyncio.sleep(0.01)
            second = await client.get("http://api.example.com/echo")
            assert second.status_code == 503
            assert len(w.origin.seen) == 1
            w.hooks.fail = False
            third = await client.get("http://api.example.com/echo")
            assert third.status_code == 200
        events = await w.hooks.wait_events(2)
        assert [detail(e)["status"] for e in events[:2]] == [200, 200]

    in_world(body, tmp_path)


def test_large_transfers_are_streamed_and_counted(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        upload = bytes(range(256)) * (5 * 4096)  # 5 MiB: past the substitution limit, streamed
        async with w.client() as client:
            down = await client.get("http://api.example.com/bytes/8000000")
            up = await client.post("http://api.example.com/echo", content=upload)

            async def chunks() -> Any:
                for i in range(0, len(upload), 100_000):
                    yield upload[i : i + 100_000]

            chunked = await client.post("http://api.example.com/echo", content=chunks())
        assert down.status_code == 200 and len(down.content) == 8_000_000
        assert up.json()["size"] == len(upload) and up.json()["sha256"] == hashlib.sha256(upload).hexdigest()
        assert chunked.json()["sha256"] == hashlib.sha256(upload).hexdigest()
        events = await w.hooks.wait_events(3)
        by_path = {detail(e)["path"]: detail(e) for e in events if detail(e)["method"] == "GET"}
        assert by_path["/bytes/8000000"]["bytes_down"] == 8_000_000
        posts = [detail(e) for e in events if detail(e)["method"] == "POST"]
        assert [p["bytes_up"] for p in posts] == [len(upload), len(upload)]

    in_world(body, tmp_path)


# --------------------------------------------------------------------------- CONNECT tunnels


def test_tunnel_relays_tls_end_to_end(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        async with w.client() as client:
            r = await client.get("https://api.example.com/bytes/3000000")
            small = await client.get("https://api.example.com/echo")
        assert r.status_code == 200 and len(r.content) == 3_000_000
        assert small.json()["local"] == PUBLIC4
        (event,) = await w.hooks.wait_events(1)
        d = detail(event)
        assert d["method"] == "CONNECT" and d["scheme"] == "tunnel" and d["path"] is None
        assert d["host"] == "api.example.com" and d["port"] == 443 and d["address"] == PUBLIC4
        assert d["status"] == 200 and d["bytes_down"] > 3_000_000 and d["bytes_up"] > 0
        assert event.outcome == "allowed"

    in_world(body, tmp_path)


def test_tunnel_upload_is_counted(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        upload = b"z" * 4_000_000
        async with w.client() as client:
            r = await client.post("https://api.example.com/echo", content=upload)
        assert r.json()["size"] == len(upload)
        (event,) = await w.hooks.wait_events(1)
        assert detail(event)["bytes_up"] > len(upload)

    in_world(body, tmp_path)


async def _tls_through(w: World, connect: str, server_hostname: str | None) -> ssl.SSLError | None:
    reader, writer = await w.raw()
    writer.write(f"CONNECT {connect} HTTP/1.1\r\nHost: {connect}\r\n\r\n".encode())
    line = await reader.readuntil(b"\r\n\r\n")
    assert line.startswith(b"HTTP/1.1 200"), line
    ctx = ssl.create_default_context(cadata=w.pki.ca_pem.decode())
    if server_hostname is None:
        ctx.check_hostname = False
    try:
        await writer.start_tls(ctx, server_hostname=server_hostname)
    except (ssl.SSLError, ConnectionError) as exc:
        writer.close()
        return exc if isinstance(exc, ssl.SSLError) else ssl.SSLError(str(exc))
    writer.close()
    return None


@pytest.mark.parametrize(
    ("connect", "sni", "allowed"),
    [
        ("api.example.com:443", "api.example.com", True),
        ("api.example.com:443", "evil.example", False),
        ("api.example.com:443", None, False),  # no SNI for a name
        (f"{PUBLIC4}:443", None, True),  # an address may come without SNI
        (f"{PUBLIC4}:443", "api.example.com", False),
        (f"[{PUBLIC6}]:443", None, True),
        ("v6.example.com:443", "v6.example.com", True),
    ],
)
def test_tunnel_sni_must_be_the_connect_host(
    tmp_path: Path, connect: str, sni: str | None, allowed: bool
) -> None:
    async def body(w: World) -> None:
        error = await _tls_through(w, connect, sni)
        assert (error is None) == allowed, error
        events = await w.hooks.wait_events(1)
        assert w.tls_origin.connections == (1 if allowed else 0)
        assert events[0].outcome == ("allowed" if allowed else "denied")
        if not allowed:
            assert "ClientHello" in detail(events[0])["reason"] and w.hooks.denials == 1
            assert error is not None and "UNRECOGNIZED_NAME" in str(error).upper()

    in_world(body, tmp_path)


def test_tunnel_refuses_what_is_not_tls(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        reader, writer = await w.raw()
        writer.write(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        assert await reader.read() == b""
        writer.close()
        (event,) = await w.hooks.wait_events(1)
        assert event.outcome == "denied" and "TLS" in detail(event)["reason"]
        assert w.tls_origin.connections == 0

    in_world(body, tmp_path)


@pytest.mark.parametrize(
    "target", ["evil.example:443", "api.example.com:22", f"{METADATA}:443", "internal.example.com:443"]
)
def test_connect_refused_gets_403(tmp_path: Path, target: str) -> None:
    async def body(w: World) -> None:
        status, headers, text = await exchange(
            w, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
        )
        assert status == 403, text
        assert text.startswith(f"stockade: CONNECT {target} refused: ".encode())
        assert headers["x-stockade-verdict"] == "deny"
        assert w.hits() == 0 and w.tls_origin.connections == 0
        assert w.hooks.events[0].outcome == "denied" and w.hooks.denials == 1

    in_world(body, tmp_path)


# --------------------------------------------------------------------------- limits and hang-ups


async def _until(check: Callable[[], bool]) -> None:
    """Wait (bounded) for ``check`` to hold: the thing itself, not a sleep of a guessed length."""
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.005)


def test_client_hanging_up_mid_request_leaks_nothing(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        fds = _open_fds()
        # Mid-headers, mid-body, mid-response, mid-tunnel.
        _, writer = await w.raw()
        writer.write(b"GET http://api.example.com/echo HTTP/1.1\r\nHost: api.exa")
        await writer.drain()
        writer.close()
        _, writer = await w.raw()
        writer.write(b"POST http://api.example.com/echo HTTP/1.1\r\nHost: api.example.com\r\n")
        writer.write(b"Content-Length: 5000000\r\n\r\n" + b"a" * 1000)
        await writer.drain()
        await _until(lambda: w.origin.open == 1)
        writer.close()
        await _until(lambda: w.origin.open == 0)
        reader, writer = await w.raw()
        writer.write(b"GET http://api.example.com/hang HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        await reader.readexactly(100)
        writer.close()
        await _until(lambda: w.origin.open == 0 and len(w.origin.seen) == 1)
        reader, writer = await w.raw()
        writer.write(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        ctx = ssl.create_default_context(cadata=w.pki.ca_pem.decode())
        await writer.start_tls(ctx, server_hostname="api.example.com")
        await _until(lambda: w.tls_origin.open == 1)
        writer.transport.abort()
        await _until(lambda: w.tls_origin.open == 0 and w.proxy.connections == 0)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert all("Proxy" not in repr(t.get_coro()) for t in tasks), tasks
        # The two requests that reached the upstream and the tunnel are recorded, with their errors.
        events = await w.hooks.wait_events(3)
        assert all(e.outcome == "allowed" for e in events)
        await _until(lambda: _open_fds() == fds)  # every socket of those connections closed

    in_world(body, tmp_path)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_slow_reader_holds_the_upstream_back(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        # Socket buffers of at most 1 MiB in this namespace (the host lets TCP grow
        # them to 32 MiB): what the kernel may hold on the way stays well under the
        # bound below, and a proxy without flow control would blow through it.
        limits = ["net.ipv4.tcp_rmem=4096 131072 1048576", "net.ipv4.tcp_wmem=4096 16384 1048576"]
        subprocess.run(w.ns.argv(["sysctl", "-q", "-w", *limits]), check=True)
        size = 64 * 1024 * 1024
        for raw in (
            b"GET http://api.example.com/bytes/%d HTTP/1.1\r\nHost: api.example.com\r\n\r\n" % size,
            None,  # the same through a tunnel
        ):
            w.origin.sent = w.tls_origin.sent = 0
            reader, writer = await w.raw()
            if raw is None:
                origin = w.tls_origin
                writer.write(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
                await reader.readuntil(b"\r\n\r\n")
                ctx = ssl.create_default_context(cadata=w.pki.ca_pem.decode())
                await writer.start_tls(ctx, server_hostname="api.example.com")
                writer.write(b"GET /bytes/%d HTTP/1.1\r\nHost: api.example.com\r\n\r\n" % size)
            else:
                origin = w.origin
                writer.write(raw)
            # The client reads slowly, a little per turn of the loop while the origin
            # writes 256 KiB per turn: only flow control along the way keeps the
            # origin from racing ahead by the whole 64 MiB.
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            got = ahead = 0
            while got < size:
                got += len(await reader.read(16384))
                ahead = max(ahead, origin.sent - got)
                await asyncio.sleep(0)
            assert got == size and origin.sent == size
            assert ahead < 16 * 1024 * 1024, ahead
            writer.close()

    in_world(body, tmp_path)


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        reader, writer = await w.raw()
        assert await reader.read() == b""  # closed by the proxy, without a word
        writer.close()
        reader, writer = await w.raw()
        writer.write(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        assert await reader.read() == b""  # no ClientHello in time
        writer.close()
        await _until(lambda: w.proxy.connections == 0)

    in_world(body, tmp_path, idle_timeout=0.2)


def test_many_concurrent_connections(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        # All open at once before any request, then every request in flight together.
        clients = await asyncio.gather(*(w.raw() for _ in range(300)))
        await _until(lambda: w.proxy.connections == 300)
        for i, (_, writer) in enumerate(clients):
            writer.write(f"GET http://{PUBLIC4}/echo?i={i} HTTP/1.1\r\nHost: {PUBLIC4}\r\n\r\n".encode())
        answers = await asyncio.gather(*(read_response(reader) for reader, _ in clients))
        for _, writer in clients:
            writer.close()
        assert [status for status, _, _ in answers] == [200] * 300
        assert sorted(json.loads(text)["target"] for _, _, text in answers) == sorted(
            f"/echo?i={i}" for i in range(300)
        )
        assert len(await w.hooks.wait_events(300)) == 300
        await _until(lambda: w.proxy.connections == 0)

    in_world(body, tmp_path)


def test_connections_past_the_limit_get_503_one_event_and_count_as_denials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap is the run's own doing: each refusal counts toward its
    tripwire; the first is a ``connection.refused`` event, the later ones
    one event when the gateway closes; a held connection is still served."""
    refused: list[Event] = []

    async def body(w: World) -> None:
        held = [await w.raw() for _ in range(3)]
        await _until(lambda: w.proxy.connections == 3)
        try:
            for _ in range(6):
                # Answered at once, before the client says anything (what it would send is not read).
                reader, writer = await w.raw()
                status, _, text = await read_response(reader)
                writer.close()
                assert status == 503 and b"too many connections" in text
            await _until(lambda: w.hooks.denials == 6)
            refused.extend(e for e in w.hooks.events if e.kind == "connection.refused")
            assert len(refused) == 1 and refused[0].layer == "gateway" and refused[0].outcome == "denied"
            assert refused[0].detail["count"] == 1 and refused[0].detail["max_connections"] == 3
            assert "3 connections to the gateway open" in refused[0].detail["reason"]
            # The neighbour: a connection the gateway took is served as ever.
            reader, writer = held[0]
            writer.write(f"GET http://{PUBLIC4}/echo HTTP/1.1\r\nHost: {PUBLIC4}\r\n\r\n".encode())
            status, _, _ = await read_response(reader)
            assert status == 200
        finally:
            for _, held_writer in held:
                held_writer.close()
        refused.clear()

    hooks_seen: list[Hooks] = []
    real = Hooks.__init__

    def keep(self: Hooks) -> None:
        real(self)
        hooks_seen.append(self)

    monkeypatch.setattr(Hooks, "__init__", keep)
    in_world(body, tmp_path, max_connections=3)
    later = [e for e in hooks_seen[0].events if e.kind == "connection.refused"]
    assert [e.detail["count"] for e in later] == [1, 5], "the later refusals are one event, at close"


# --------------------------------------------------------------------------- curl


def test_curl_through_the_proxy(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        code, out, err = await w.curl("http://api.example.com/echo")
        assert code == 0, err
        assert json.loads(out)["target"] == "/echo"
        ca = tmp_path / "ca.pem"
        ca.write_bytes(w.pki.ca_pem)
        code, out, err = await w.curl("--cacert", str(ca), "https://api.example.com/echo")
        assert code == 0, err
        assert json.loads(out)["local"] == PUBLIC4
        code, out, err = await w.curl("-i", "http://evil.example/")
        assert code == 0 and "403" in out.splitlines()[0] and "x-stockade-verdict: deny" in out.lower()
        code, out, err = await w.curl("--cacert", str(ca), "https://evil.example/")
        assert code != 0 and "403" in err  # curl: CONNECT tunnel failed, response 403
        assert w.hooks.denials == 2

    in_world(body, tmp_path)


# --------------------------------------------------------------------------- the ClientHello parser


def _client_hello(server_hostname: str | None) -> bytes:
    ctx = ssl.create_default_context()
    if server_hostname is None:
        ctx.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_client_hello_parser() -> None:
    hello = _client_hello("API.Example.com")
    parsed = parse_client_hello(hello)
    assert parsed is not None and parsed.sni == "api.example.com" and parsed.size == len(hello)
    assert parse_client_hello(_client_hello(None)) is not None
    assert parse_client_hello(_client_hello(None)).sni is None  # type: ignore[union-attr]
    for cut in (0, 3, 5, 40, len(hello) - 1):
        assert parse_client_hello(hello[:cut]) is None
    # The same hello split over two records.
    body = hello[5:]
    split = b"\x16\x03\x01" + (100).to_bytes(2, "big") + body[:100]
    split += b"\x16\x03\x01" + (len(body) - 100).to_bytes(2, "big") + body[100:]
    assert parse_client_hello(split).sni == "api.example.com"  # type: ignore[union-attr]
    for bad in (
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00",
        b"\x17\x03\x03\x00\x01x",
    ):
        with pytest.raises(ClientHelloError):
            parse_client_hello(bad)
    # A length that lies about the extensions: refused, never read past the end.
    broken = bytearray(hello)
    broken[-1 - 40] ^= 0xFF
    try:
        parse_client_hello(bytes(broken))
    except ClientHelloError:
        pass
    with pytest.raises(ClientHelloError):
        parse_client_hello(b"\x16\x03\x01\x40\x00" + b"\x01" + (70000).to_bytes(3, "big") + b"\x00" * 16380)


def test_a_refused_tunnel_closes_its_early_upstream_connection_unused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upstream connection opens while the ClientHello is on its way; a
    tunnel then refused for its server name sends nothing on it and closes it."""
    from stockade.gateway import _proxy

    peers: list[socket.socket] = []

    async def watched_open(dest: Any, *, tls: Any, timeout: float) -> Any:
        ours, theirs = socket.socketpair()
        peers.append(theirs)
        return await asyncio.open_connection(sock=ours)

    monkeypatch.setattr(_proxy, "open_upstream", watched_open)

    async def body(w: World) -> None:
        error = await _tls_through(w, "api.example.com:443", "evil.example")
        assert error is not None
        (event,) = await w.hooks.wait_events(1)
        assert event.outcome == "denied"
        assert len(peers) == 1
        peer = peers[0]
        peer.setblocking(False)

        received = bytearray()

        def closed() -> bool:
            try:
                data = peer.recv(65536)
            except BlockingIOError:
                return False
            received.extend(data)
            return data == b""

        await _until(closed)
        peer.close()
        assert received == b""  # not one byte of the client's went upstream

    in_world(body, tmp_path)
