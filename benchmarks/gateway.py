"""The egress proxy's added latency and tunnel throughput, side by side with tinyproxy.

Run as root from the repository:

    .venv/bin/python benchmarks/gateway.py [--quick] [--rounds N] [--floor] [--unrecorded]

Everything happens inside a network namespace this script makes, where the
upstream lives on a public-looking address (93.184.216.34) on the namespace's
``lo``; nothing can leave the machine. Four processes, so that no two share a
GIL:

- the upstream (``benchmarks/_gateway_servers.py``): HTTP on :80, TLS 1.3 on :443;
- tinyproxy (Debian's), ``ConnectPort 443``, logging at Info to a file;
- this process, the daemon's stand-in: the stockade proxy (``Proxy``) served on
  an asyncio loop in a thread of its own, allowed to the upstream by an IP
  rule, its events stored through the daemon's own ``Recorder``
  (``stockade.daemon._bus``: a writer thread, group commits, SQLite WAL with
  ``synchronous=FULL``) in a temporary directory, so the record's cost is paid
  as the daemon pays it;
- the client (this script with ``--client``), standard library only, raw
  sockets, one request at a time.

Each measure runs the contenders (direct, stockade, tinyproxy) in interleaved
rounds (the order rotates every round) after a warm-up round, so that the
drift of this shared machine touches them alike:

1. small GET (64-byte body), absolute-form through the proxies (origin-form
   direct): a new connection per request, and keep-alive on one connection
   (where the proxy keeps connections open);
2. CONNECT + TLS: connect, CONNECT, ``200``, a full TLS 1.3 handshake with the
   upstream through the tunnel (the stockade proxy reads its ClientHello
   first) and one small exchange inside it; direct: TCP + TLS + the exchange;
3. bulk: N MiB downloaded through a CONNECT tunnel inside a TLS session.

Printed: p50 and p99, what a proxy adds to the direct p50, ratios, and
throughput. Nothing here asserts a time.

Experiments: ``--floor`` adds the least a forward proxy
written in Python asyncio can do (no policy, no record, no HTTP parser: one
head read, a connect, bytes relayed), which tells the language's and the
loop's share from the proxy's own; ``--unrecorded`` adds a second stockade
proxy in the same process whose record hook returns at once, storing nothing
(what recording costs, side by side).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from _gateway_servers import Netns

    from stockade.daemon._bus import Recorder
    from stockade.gateway._proxy import Proxy

HERE = Path(__file__).resolve().parent
ADDRESS = "93.184.216.34"
STOCKADE_PORT = 3128  # the cell's GATEWAY_PORT
TINYPROXY_PORT = 8888
FLOOR_PORT = 3130
UNRECORDED_PORT = 3131
CONTENDERS = ("direct", "stockade", "tinyproxy")

# --------------------------------------------------------------------------- the client
# Runs in its own process inside the namespace; standard library only.


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while True:
        end = data.find(b"\r\n\r\n")
        if end != -1:
            return data[:end], data[end + 4 :]
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the connection closed before the end of a response's head")
        data += chunk


def _read_response(sock: socket.socket) -> bool:
    """Read one 200 response with a Content-Length; whether the connection stays open."""
    head, body = _read_head(sock)
    lines = head.split(b"\r\n")
    if b" 200 " not in lines[0] + b" ":
        raise ConnectionError(f"unexpected answer: {head[:300]!r}")
    length, keep = None, not lines[0].startswith(b"HTTP/1.0")
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name in (b"connection", b"proxy-connection"):
            keep = value.strip().lower() != b"close"
    if length is None:
        raise ConnectionError(f"no Content-Length: {head[:300]!r}")
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the connection closed inside a response body")
        body += chunk
    return keep


class Client:
    def __init__(self, ca_file: str) -> None:
        self.tls = ssl.create_default_context(cafile=ca_file)
        self.ports = {
            "stockade": STOCKADE_PORT,
            "tinyproxy": TINYPROXY_PORT,
            "floor": FLOOR_PORT,
            "unrecorded": UNRECORDED_PORT,
        }
        self.kept: dict[str, socket.socket | None] = {}
        self.sent: dict[str, int] = dict.fromkeys(self.ports, 0)
        self.sent["direct"] = 0
        """Requests (or tunnels) made through each contender: the proxy's record must hold as many."""

    def _connect(self, who: str) -> socket.socket:
        where = (ADDRESS, 80) if who == "direct" else ("127.0.0.1", self.ports[who])
        sock = socket.create_connection(where)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _request(self, who: str) -> bytes:
        self.sent[who] += 1
        target = "/small" if who == "direct" else f"http://{ADDRESS}/small"
        return f"GET {target} HTTP/1.1\r\nHost: {ADDRESS}\r\nUser-Agent: bench\r\n\r\n".encode()

    def get_new(self, who: str) -> int:
        t = time.perf_counter_ns()
        sock = self._connect(who)
        sock.sendall(self._request(who))
        _read_response(sock)
        took = time.perf_counter_ns() - t
        sock.close()
        return took

    def keeps_alive(self, who: str) -> bool:
        """Whether ``who`` answers a second request on the same connection."""
        sock = self._connect(who)
        try:
            sock.sendall(self._request(who))
            if not _read_response(sock):
                return False
            sock.sendall(self._request(who))
            _read_response(sock)
            return True
        except OSError:
            return False
        finally:
            sock.close()

    def get_kept(self, who: str) -> int:
        sock = self.kept.get(who)
        if sock is None:
            sock = self.kept[who] = self._connect(who)
        request = self._request(who)
        t = time.perf_counter_ns()
        sock.sendall(request)
        keep = _read_response(sock)
        took = time.perf_counter_ns() - t
        if not keep:
            raise ConnectionError(f"{who} closed a keep-alive connection")
        return took

    def drop_kept(self) -> None:
        for sock in self.kept.values():
            if sock is not None:
                sock.close()
        self.kept.clear()

    def _tunnel(self, who: str) -> socket.socket:
        self.sent[who] += 1
        if who == "direct":
            sock = socket.create_connection((ADDRESS, 443))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        sock = self._connect(who)
        sock.sendall(f"CONNECT {ADDRESS}:443 HTTP/1.1\r\nHost: {ADDRESS}:443\r\n\r\n".encode())
        head, rest = _read_head(sock)
        if b" 200 " not in head.split(b"\r\n")[0] + b" " or rest:
            raise ConnectionError(f"CONNECT through {who}: {head[:300]!r}")
        return sock

    def connect_tls(self, who: str) -> tuple[int, int]:
        """(connect to 200, connect to the end of the first exchange inside TLS), in ns."""
        t = time.perf_counter_ns()
        raw = self._tunnel(who)
        established = time.perf_counter_ns() - t
        # server_hostname is the address: the certificate's IP SAN is checked, and
        # no SNI is sent (none is allowed for an address; the stockade proxy checks that).
        with self.tls.wrap_socket(raw, server_hostname=ADDRESS) as conn:
            conn.sendall(b"small\n")
            got = b""
            while len(got) < 64:
                chunk = conn.recv(64 - len(got))
                if not chunk:
                    raise ConnectionError(f"the tunnel through {who} closed early")
                got += chunk
            took = time.perf_counter_ns() - t
        return established, took

    def bulk(self, who: str, size: int) -> float:
        """Seconds to download ``size`` bytes over TLS through ``who``'s tunnel (after the handshake)."""
        raw = self._tunnel(who)
        with self.tls.wrap_socket(raw, server_hostname=ADDRESS) as conn:
            buffer = memoryview(bytearray(1024 * 1024))
            t = time.perf_counter()
            conn.sendall(f"bulk {size}\n".encode())
            got = 0
            while got < size:
                n = conn.recv_into(buffer)
                if not n:
                    raise ConnectionError(f"the tunnel through {who} closed after {got} of {size} bytes")
                got += n
            return time.perf_counter() - t


def _rounds(contenders: list[str], rounds: int) -> list[tuple[int, list[str]]]:
    """Round 0 is the warm-up; each round rotates the order."""
    return [
        (r, contenders[r % len(contenders) :] + contenders[: r % len(contenders)]) for r in range(rounds + 1)
    ]


def client_main(config: dict[str, Any]) -> None:
    client = Client(config["ca"])
    rounds: int = config["rounds"]
    out: dict[str, Any] = {}

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    everyone = list(CONTENDERS)
    everyone += ["unrecorded"] if config["unrecorded"] else []
    everyone += ["floor"] if config["floor"] else []
    samples: dict[str, dict[str, list[int]]] = {}

    log("small GET, a new connection each")
    samples["get_new"] = {who: [] for who in everyone}
    for r, order in _rounds(everyone, rounds):
        for who in order:
            got = [client.get_new(who) for _ in range(config["gets"])]
            if r:
                samples["get_new"][who] += got

    alive = [who for who in everyone if client.keeps_alive(who)]
    out["keep_alive"] = alive
    log(f"small GET, keep-alive ({', '.join(alive)})")
    samples["get_kept"] = {who: [] for who in alive}
    for r, order in _rounds(alive, rounds):
        for who in order:
            client.get_kept(who)  # the connection (and the proxy's upstream one) is up
            got = [client.get_kept(who) for _ in range(config["gets"])]
            if r:
                samples["get_kept"][who] += got
        client.drop_kept()

    log("CONNECT + TLS handshake + one exchange")
    samples["connect_200"] = {who: [] for who in everyone}
    samples["connect_tls"] = {who: [] for who in everyone}
    for r, order in _rounds(everyone, rounds):
        for who in order:
            for _ in range(config["handshakes"]):
                established, took = client.connect_tls(who)
                if r:
                    samples["connect_200"][who].append(established)
                    samples["connect_tls"][who].append(took)

    size = config["bulk_mib"] * 1024 * 1024
    log(f"bulk: {config['bulk_mib']} MiB through a tunnel, {config['bulk_rounds']} rounds")
    bulk: dict[str, list[float]] = {who: [] for who in everyone}
    for r, order in _rounds(everyone, config["bulk_rounds"]):
        for who in order:
            seconds = client.bulk(who, size if r else size // 8)
            if r:
                bulk[who].append(size / seconds / 1e6)
    out["samples"] = samples
    out["bulk_mb_s"] = bulk
    out["sent"] = client.sent
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------- the stockade proxy


class StockadeProxy:
    """``Proxy`` on an asyncio loop in a thread of its own, as the daemon serves it.

    The thread lives in the benchmark's namespace (sockets it makes, the
    listening one and the upstream ones, are made there). Events go through
    the daemon's ``Recorder`` to a real store.
    """

    def __init__(self, netns: Netns, ca_file: str, store: Path, port: int, *, record: bool = True) -> None:
        self.netns = netns
        self.port = port
        self.record = record
        self.ca_file = ca_file
        self.store = store
        self.stored = 0
        self.commits = 0
        self.denials = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"stockade-gateway-{port}", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proxy: Proxy | None = None
        self._recorder: Recorder | None = None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        with self.netns.entered():
            from stockade.daemon._server import new_loop

            loop = self._loop = new_loop()  # the daemon's loop (uvloop)
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._setup())
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            loop.run_forever()
            if self._proxy is not None:
                loop.run_until_complete(self._proxy.close())
            loop.close()

    async def _setup(self) -> None:
        from collections.abc import Sequence

        from stockade._netns import listen_in
        from stockade.daemon._bus import Recorder
        from stockade.gateway._addresses import IPAddress
        from stockade.gateway._egress import Egress
        from stockade.gateway._proxy import Proxy
        from stockade.gateway._resolve import ResolveError
        from stockade.gateway._secrets import Secrets
        from stockade.gateway._upstream import upstream_tls_context
        from stockade.policy._model import HostRule, NetworkPolicy
        from stockade.record import Event

        bench = self

        class Hooks:
            async def record(self, events: Sequence[Event]) -> None:
                if bench.record:
                    await recorder.record_soon(events)

            async def denied(self) -> None:
                bench.denials += 1

            def halted(self) -> str | None:
                return None

        class NoResolver:
            """The upstream is named by its address: nothing is ever resolved."""

            async def resolve(self, name: str) -> list[IPAddress]:
                raise ResolveError(f"{name}: the benchmark resolves no names")

        def stored(events: list[Any]) -> None:
            bench.stored += len(events)

        loop = asyncio.get_running_loop()
        recorder = self._recorder = Recorder(
            str(self.store), loop, on_stored=stored, on_failure=lambda exc: None
        )
        recorder.start()
        egress = Egress(NetworkPolicy(allow=(HostRule(ADDRESS, ports=(80, 443)),)), resolver=NoResolver())
        self._proxy = Proxy(
            run_id="r-bench",
            egress=egress,
            hooks=Hooks(),
            secrets=Secrets.load([], {}),
            ca=None,
            upstream_tls=upstream_tls_context(self.ca_file),
        )
        # The listening socket exactly as the daemon makes it in a cell.
        fd = os.open(self.netns.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            (sock,) = listen_in(fd, [("127.0.0.1", self.port)])
        finally:
            os.close(fd)
        await self._proxy.serve(sock, "c-bench")

    def stop(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        if self._recorder is not None:
            self.commits = self._recorder.commits
            self._recorder.close()


class _FloorUpstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Floor(asyncio.Protocol):
    """The least a forward proxy in Python asyncio can do (--floor): no policy, no
    record, no HTTP parser; reads one request head, connects to the address in
    its target and relays bytes both ways: a GET's target rewritten to
    origin-form, a CONNECT answered 200 once the upstream is connected (no
    look at the ClientHello)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.opening: asyncio.Task[None] | None = None
        self.head = b""

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's does not derive from asyncio's class.
        self.transport = transport = cast(asyncio.Transport, base)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if self.upstream is not None:
            self.upstream.write(data)
            return
        self.head += data
        if b"\r\n\r\n" not in self.head:
            return
        line, rest = self.head.split(b"\r\n", 1)
        method, target, version = line.split(b" ")
        self.transport.pause_reading()
        loop = asyncio.get_running_loop()
        if method == b"CONNECT":
            host, _, port = target.partition(b":")
            self.opening = loop.create_task(self._open(host.decode(), int(port), None))
        else:
            host, _, path = target.removeprefix(b"http://").partition(b"/")
            request = b"%s /%s %s\r\n%s" % (method, path, version, rest)
            self.opening = loop.create_task(self._open(host.decode(), 80, request))

    async def _open(self, host: str, port: int, request: bytes | None) -> None:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, (host, port))
        client = self.transport
        self.upstream, _ = await loop.create_connection(lambda: _FloorUpstream(client), sock=sock)
        if request is None:
            client.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            self.upstream.write(request)
        client.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


class Floor:
    """``_Floor`` on a loop in a thread of its own, in the namespace."""

    def __init__(self, netns: Netns) -> None:
        self.netns = netns
        from stockade.daemon._server import new_loop

        self.loop = new_loop()  # the proxy's kind of loop: the floor is that loop's least
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="floor", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def _main(self) -> None:
        with self.netns.entered():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.loop.create_server(_Floor, "127.0.0.1", FLOOR_PORT))
            self._ready.set()
            self.loop.run_forever()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)


# --------------------------------------------------------------------------- orchestration


def _tinyproxy() -> str:
    found = shutil.which("tinyproxy")
    if found:
        return found
    print("tinyproxy is not installed: apt-get install -y tinyproxy", flush=True)
    subprocess.run(["apt-get", "install", "-y", "tinyproxy"], check=True, stdout=subprocess.DEVNULL)
    found = shutil.which("tinyproxy")
    if not found:
        raise SystemExit("tinyproxy could not be installed; install it with apt-get install -y tinyproxy")
    return found


def _tinyproxy_version(binary: str) -> str:
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip()


def _wait_port(netns: Netns, port: int, what: str) -> None:
    deadline = time.monotonic() + 20
    with netns.entered():
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{what} did not listen on 127.0.0.1:{port}") from None
                time.sleep(0.05)


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1e6  # ms


def _latency_table(title: str, samples: dict[str, list[int]]) -> None:
    print(f"\n{title}")
    print(f"  {'':<10} {'n':>6} {'p50':>9} {'p99':>9} {'req/s':>8} {'added p50':>10} {'/ direct':>9}")
    base = _pct(samples["direct"], 0.5) if "direct" in samples else None
    for who, values in samples.items():
        p50, p99 = _pct(values, 0.5), _pct(values, 0.99)
        rate = 1e9 / statistics.fmean(values)
        added = f"{p50 - base:+.3f} ms" if base is not None and who != "direct" else ""
        ratio = f"{p50 / base:.2f}x" if base is not None else ""
        print(
            f"  {who:<10} {len(values):>6} {p50:>6.3f} ms {p99:>6.3f} ms {rate:>8.0f} {added:>10} {ratio:>9}"
        )
    if "stockade" in samples and "tinyproxy" in samples:
        s, t = _pct(samples["stockade"], 0.5), _pct(samples["tinyproxy"], 0.5)
        line = f"  stockade / tinyproxy p50: {s / t:.2f}x"
        if base is not None:
            line += f"; added p50, stockade / tinyproxy: {(s - base) / max(t - base, 1e-9):.2f}x"
        print(line)


def report(results: dict[str, Any], proxy: StockadeProxy, args: argparse.Namespace, version: str) -> None:
    samples = results["samples"]
    print(f"\nstockade gateway benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"peer: {version}; rounds: {args.rounds} (+1 warm-up), interleaved, order rotated each round")
    _latency_table(f"small GET, new connection per request ({args.gets}/round)", samples["get_new"])
    missing = [who for who in CONTENDERS if who not in results["keep_alive"]]
    note = f"; {', '.join(missing)}: closes the connection after each request" if missing else ""
    _latency_table(f"small GET, keep-alive{note}", samples["get_kept"])
    _latency_table(f"CONNECT to 200 ({args.handshakes}/round)", samples["connect_200"])
    _latency_table(
        "CONNECT + TLS 1.3 handshake + one exchange (direct: TCP + TLS + exchange)", samples["connect_tls"]
    )
    print(
        f"\nbulk download through a CONNECT tunnel, TLS inside, {args.bulk_mib} MiB each, MB/s (10^6 bytes)"
    )
    bulk = results["bulk_mb_s"]
    print(f"  {'':<10} {'median':>8} {'min':>8} {'max':>8}")
    for who, values in bulk.items():
        print(f"  {who:<10} {statistics.median(values):>8.0f} {min(values):>8.0f} {max(values):>8.0f}")
    s, t = statistics.median(bulk["stockade"]), statistics.median(bulk["tinyproxy"])
    d = statistics.median(bulk["direct"])
    print(f"  stockade / tinyproxy: {s / t:.2f}x; stockade / direct: {s / d:.2f}x")
    sent = results["sent"]["stockade"]
    held = "every one" if proxy.stored == sent else f"MISSING {sent - proxy.stored}"
    print(
        f"\nrecord: {sent} requests and tunnels through stockade, {proxy.stored} events stored durably "
        f"({held}) in {proxy.commits} commits ({proxy.stored / max(proxy.commits, 1):.1f} per commit); "
        f"denials: {proxy.denials}"
    )
    s_get = _pct(samples["get_new"]["stockade"], 0.5) - _pct(samples["get_new"]["direct"], 0.5)
    s_tls = _pct(samples["connect_tls"]["stockade"], 0.5) - _pct(samples["connect_tls"]["direct"], 0.5)
    print("\ntargets:")
    print(f"  added p50 <= 1 ms: small GET (new connection) {s_get:+.3f} ms, CONNECT + TLS {s_tls:+.3f} ms")
    print(f"  tunnel throughput >= tinyproxy's: {s:.0f} vs {t:.0f} MB/s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds and a smaller download")
    parser.add_argument("--rounds", type=int, help="rounds after the warm-up (default 10, quick 3)")
    parser.add_argument(
        "--unrecorded",
        action="store_true",
        help="also measure a second stockade proxy, in the same process, whose record hook returns "
        "at once (storing nothing): what recording costs, side by side",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure the least a forward proxy in Python asyncio can do (no policy, record "
        "or parser): what the language and the loop cost on their own",
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(json.loads(args.client))
        return
    args.rounds = args.rounds or (3 if args.quick else 10)
    args.gets = 50 if args.quick else 200
    args.handshakes = 20 if args.quick else 50
    args.bulk_mib = 32 if args.quick else 256
    args.bulk_rounds = 3 if args.quick else 5
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark makes a network namespace")
    sys.path.insert(0, str(HERE))
    from _gateway_servers import Netns, make_pki

    binary = _tinyproxy()
    version = _tinyproxy_version(binary)
    tmp = Path(tempfile.mkdtemp(prefix="stockade-bench-gw-", dir="/tmp"))
    os.chmod(tmp, 0o755)
    netns = Netns([ADDRESS])
    started: list[subprocess.Popen[bytes]] = []
    proxy: StockadeProxy | None = None
    floor: Floor | None = None
    unrecorded: StockadeProxy | None = None
    try:
        ca, cert, key = make_pki(tmp, ADDRESS)
        upstream = subprocess.Popen(
            netns.argv([sys.executable, str(HERE / "_gateway_servers.py"), "--cert", cert, "--key", key]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        started.append(upstream)
        assert upstream.stdout is not None
        if upstream.stdout.readline() != b"ready\n":
            raise SystemExit("the upstream servers did not start")
        conf = tmp / "tinyproxy.conf"
        conf.write_text(
            # Debian's defaults where they matter (LogLevel Info, Timeout 600,
            # MaxClients 100), listening in the namespace, CONNECT to 443 only.
            f"User nobody\nGroup nogroup\nPort {TINYPROXY_PORT}\nListen 127.0.0.1\n"
            f"Timeout 600\nMaxClients 100\nAllow 127.0.0.1\nConnectPort 443\n"
            f'LogFile "{tmp}/tinyproxy.log"\nLogLevel Info\n'
        )
        (tmp / "tinyproxy.log").touch()
        os.chown(tmp / "tinyproxy.log", 65534, -1)
        started.append(
            subprocess.Popen(
                netns.argv([binary, "-d", "-c", str(conf)]),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        _wait_port(netns, TINYPROXY_PORT, "tinyproxy")
        proxy = StockadeProxy(netns, ca, tmp / "events.db", STOCKADE_PORT)
        proxy.start()
        if args.unrecorded:
            unrecorded = StockadeProxy(netns, ca, tmp / "unused.db", UNRECORDED_PORT, record=False)
            unrecorded.start()
        if args.floor:
            floor = Floor(netns)
            floor.start()
        config = {
            "floor": args.floor,
            "unrecorded": args.unrecorded,
            "ca": ca,
            "rounds": args.rounds,
            "gets": args.gets,
            "handshakes": args.handshakes,
            "bulk_mib": args.bulk_mib,
            "bulk_rounds": args.bulk_rounds,
        }
        done = subprocess.run(
            netns.argv([sys.executable, str(Path(__file__).resolve()), "--client", json.dumps(config)]),
            stdout=subprocess.PIPE,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"the client failed (exit {done.returncode})")
        results = json.loads(done.stdout.decode().strip().splitlines()[-1])
        proxy.stop()
        report(results, proxy, args, version)
    finally:
        if floor is not None:
            floor.stop()
        if unrecorded is not None:
            unrecorded.stop()
        if proxy is not None:
            proxy.stop()
        for process in reversed(started):
            if process.stdin is not None:
                process.stdin.close()
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        netns.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
