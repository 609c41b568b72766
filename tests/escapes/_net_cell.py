"""Helpers for the network and scale escape tests: probes run in real cells,
canary listeners on the host's loopback, cells kept alive until released, and
sockets placed inside a running cell's network namespace.

A *probe* is a short program run by Debian's ``/usr/bin/python3`` inside a cell
(the venv's interpreter lives under a home the cell sees only as a decoy). Its
body calls ``attempt(name, fn)`` for each thing it tries; the probe prints one
JSON object with, for every attempt, whether it worked (and what it returned)
or the errno it failed with. The test then holds three things side by side:
the attempt's outcome, the events of the run (the kernel's refusals, read from
the audit log) and a control that must work.

Network rules (HOST.md): every address a probe or a canary uses is loopback,
the cell's own or the host's. The one test whose attempt names a resolver
outside (a DNS lookup through the host's ``/etc/resolv.conf``) launches its
cell from a network namespace this module creates (:func:`run_in_private_netns`),
so that nothing could leave the machine even if every layer failed.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import pickle
import select
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stockade.cell import Cell, CellResult
from stockade.cell._layers import GATEWAY_PORT
from stockade.policy import NetworkPolicy, Policy, default_policy
from stockade.record import Event

PYTHON = "/usr/bin/python3"
RUN_TIMEOUT = 30.0
"""Wall-clock bound on one cell: a hang fails the test instead of blocking CI."""
WAIT = 30.0
"""Bound on waiting for a live cell to say it is ready."""

NEIGHBOUR_PORT = 18000
"""The loopback port the tests' policies allow (bind and connect): the
legitimate neighbour of every network attempt serves on it inside the cell."""

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

READY = "@@ready@@"
MARK = "@@probe@@"

_PRELUDE = r'''
import ctypes, errno, json, os, select, socket, struct, subprocess, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
P = json.loads(sys.argv[1])
RESULTS = {}

def attempt(name, fn):
    """Run fn(); keep what it returned, or the errno it failed with."""
    try:
        value = fn()
    except OSError as exc:
        RESULTS[name] = {"ok": False, "errno": exc.errno, "error": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # a bug in the probe, not a refusal
        RESULTS[name] = {"ok": False, "errno": None, "error": repr(exc)}
    else:
        try:
            json.dumps(value)
        except TypeError:
            value = repr(value)
        RESULTS[name] = {"ok": True, "value": value}

def raw_socket(family, type_, proto=0):
    """socket(2) through syscall(2), so that high bits reach the kernel untouched."""
    fd = libc.syscall(ctypes.c_long(41), ctypes.c_long(family), ctypes.c_long(type_), ctypes.c_long(proto))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    os.close(fd)
    return "created"

def tcp_connect(host, port, family=socket.AF_INET):
    """A plain TCP connect with a 5 s timeout: a hang shows as errno None."""
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
        return "connected"
    finally:
        s.close()

def neighbour(port=P.get("neighbour_port"), host="127.0.0.1"):
    """Serve on an allowed loopback port inside the cell and reach it from inside."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen()
    srv.settimeout(5)
    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.sendall(conn.recv(64)[::-1])
    t = threading.Thread(target=serve)
    t.start()
    try:
        with socket.create_connection((host, port), timeout=5) as c:
            c.sendall(b"neighbour")
            return c.recv(64).decode()
    finally:
        t.join(5)
        srv.close()

def wait_for_go():
    """Tell the test we are up, then wait until it releases us."""
    sys.stdout.write("\n" + READY + "\n")
    sys.stdout.flush()
    return sys.stdin.readline().strip()
'''.replace("READY", repr(READY))

_EPILOGUE = r"""
sys.stdout.write("\n" + MARK + json.dumps(RESULTS) + "\n")
sys.stdout.flush()
""".replace("MARK", repr(MARK))


UNIX_PROBES = """
def unix_connect(address):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect(address)
        s.sendall(b"exfiltrated")
        return "connected"
    finally:
        s.close()
def own_pathname_socket():
    # The legitimate neighbour for unix sockets: one the cell binds itself.
    path = os.path.join(os.getcwd(), "own.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    with socket.socket(socket.AF_UNIX) as c:
        c.connect(path)
        conn, _ = srv.accept()
        c.sendall(b"ping")
        data = conn.recv(4)
        conn.close()
    srv.close()
    os.unlink(path)
    return data.decode()
"""
"""Probe functions (a body's part) for the unix-socket escapes of test_network
and test_unix_sockets: ``unix_connect`` tries a host socket and writes to it;
``own_pathname_socket`` is their control, a socket the cell binds and reaches
itself (answers ``ping``)."""


def probe_argv(body: str, params: dict[str, Any] | None = None) -> list[str]:
    """The argv of a probe running ``body`` with ``params`` (as ``P`` inside)."""
    code = _PRELUDE + "\n" + body + "\n" + _EPILOGUE
    return [PYTHON, "-c", code, json.dumps(params or {})]


def net_policy(*ports: int, env: tuple[tuple[str, str], ...] = ()) -> Policy:
    """The default policy with ``ports`` (and the neighbour's) allowed on loopback."""
    base = default_policy("escapes-network")
    allowed = tuple(sorted({NEIGHBOUR_PORT, *ports}))
    return dataclasses.replace(
        base,
        network=NetworkPolicy(loopback_ports=allowed),
        env=dataclasses.replace(base.env, set=(*base.env.set, *env)),
    )


# --- results ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    name: str
    ok: bool
    errno: int | None = None
    error: str = ""
    value: Any = None


@dataclass(frozen=True, slots=True)
class Probe:
    """A finished probe: the cell's result, stdout, and each attempt's outcome."""

    result: CellResult
    stdout: str
    stderr: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Outcome:
        if name not in self.outcomes:
            raise AssertionError(f"attempt {name!r} left no outcome\n{self.transcript()}")
        return self.outcomes[name]

    @property
    def events(self) -> tuple[Event, ...]:
        return self.result.events

    def denials(self) -> list[Event]:
        return [e for e in self.result.events if e.kind == "cell.denied"]

    def landlock(self, blocker: str, **detail: Any) -> list[Event]:
        """Landlock refusals naming ``blocker`` whose detail has every ``detail`` item."""
        return [
            e
            for e in self.denials()
            if e.layer == "landlock"
            and blocker in (e.detail.get("blockers") or ())
            and all(e.detail.get(k) == v for k, v in detail.items())
        ]

    def seccomp(self, syscall: str) -> list[Event]:
        return [e for e in self.denials() if e.layer == "seccomp" and e.detail.get("syscall") == syscall]

    def decoy_connects(self, path: str) -> list[Event]:
        """The connect supervisor's records of a connect refused by a decoy at
        ``path`` (``cell/_unotify``: not a socket, ECONNREFUSED, the path named)."""
        return self.unix_refusals(path, "ECONNREFUSED")

    def unix_refusals(self, path: str, err: str = "EACCES") -> list[Event]:
        """The connect supervisor's refusals of a unix connect to ``path`` (``@name``
        for an abstract one) that failed with ``err``."""
        return [
            e
            for e in self.denials()
            if e.layer == "seccomp"
            and e.detail.get("syscall") == "connect"
            and e.detail.get("action") == "user_notif"
            and e.detail.get("errno") == err
            and e.detail.get("path") == path
        ]

    def transcript(self) -> str:
        r = self.result
        lines = [
            f"cell {r.cell_id}: exit {r.exit_code}, timed out {r.timed_out}, limits {r.limits_hit}",
            "stdout: " + self.stdout[-3000:],
            "stderr: " + self.stderr[-3000:],
            "events:",
            *(
                f"  {e.kind} {e.layer} {e.outcome}: {e.summary[:120]}"
                + ("" if e.kind == "cell.start" else f" {e.detail}")
                for e in r.events
            ),
        ]
        return "\n".join(lines)

    def check_clean(self) -> None:
        """The probe ran to its end and every event is its own cell's."""
        assert self.result.exit_code == 0 and not self.result.timed_out, self.transcript()
        foreign = [e for e in self.result.events if e.cell != self.result.cell_id]
        assert not foreign, f"events of another cell in this cell's record: {foreign}"


def _parse(result: CellResult, stdout: str, stderr: str) -> Probe:
    outcomes: dict[str, Outcome] = {}
    for line in stdout.splitlines():
        if line.startswith(MARK):
            for name, raw in json.loads(line[len(MARK) :]).items():
                outcomes[name] = Outcome(
                    name, raw["ok"], raw.get("errno"), raw.get("error", ""), raw.get("value")
                )
    probe = Probe(result, stdout, stderr, outcomes)
    if not outcomes:
        raise AssertionError(f"the probe printed no outcomes\n{probe.transcript()}")
    return probe


def probe(
    policy: Policy,
    body: str,
    params: dict[str, Any] | None = None,
    *,
    workspace: str | os.PathLike[str] | None = None,
    sockets: dict[str, str] | None = None,
) -> Probe:
    """Run a probe in a fresh cell and wait for it. ``sockets``: host sockets
    shown in the cell, as the daemon shows the broker's."""
    params = {"neighbour_port": NEIGHBOUR_PORT, **(params or {})}
    with Cell(policy, workspace=workspace, sockets=sockets) as cell:
        result = cell.run(probe_argv(body, params), timeout=RUN_TIMEOUT)
    return _parse(result, result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace"))


# --- the host's loopback canary -------------------------------------------------------


class HostCanary:
    """Listeners on the host's loopback, one port for TCP and UDP, on 127.0.0.1
    and ::1: a cell that reached any of them would show up in :meth:`touched`."""

    def __init__(self, avoid: tuple[int, ...] = ()) -> None:
        avoid = (GATEWAY_PORT, NEIGHBOUR_PORT, 53, *avoid)
        for _ in range(100):
            socks: list[socket.socket] = []
            try:
                tcp4 = _sock(socks, socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0))
                port = tcp4.getsockname()[1]
                if port in avoid:
                    raise OSError("reserved port")
                tcp6 = _sock(socks, socket.AF_INET6, socket.SOCK_STREAM, ("::1", port))
                udp4 = _sock(socks, socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", port))
                udp6 = _sock(socks, socket.AF_INET6, socket.SOCK_DGRAM, ("::1", port))
            except OSError:
                for s in socks:
                    s.close()
                continue
            break
        else:  # pragma: no cover - the host's loopback is exhausted
            raise RuntimeError("no free loopback port for the canary")
        for s in (tcp4, tcp6):
            s.listen(64)
        self.port = port
        self.sockets = (tcp4, tcp6, udp4, udp6)
        for s in self.sockets:
            s.setblocking(False)

    def touched(self) -> list[str]:
        """Every connection and datagram that reached the canary so far."""
        seen: list[str] = []
        for s in self.sockets:
            while True:
                try:
                    if s.type == socket.SOCK_STREAM:
                        conn, peer = s.accept()
                        conn.close()
                        seen.append(f"TCP connection from {peer}")
                    else:
                        data, peer = s.recvfrom(65536)
                        seen.append(f"UDP datagram {data[:40]!r} from {peer}")
                except BlockingIOError:
                    break
        return seen

    def self_check(self) -> None:
        """The canary sees what reaches it (else 'saw nothing' proves nothing)."""
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.create_connection((host, self.port), timeout=5):
                pass
            with socket.socket(family, socket.SOCK_DGRAM) as u:
                u.sendto(b"self-check", (host, self.port))
        seen = self.touched()
        deadline = time.monotonic() + 5
        while len(seen) < 4 and time.monotonic() < deadline:
            select.select(list(self.sockets), [], [], max(0.0, deadline - time.monotonic()))
            seen += self.touched()
        assert len(seen) == 4, f"the canary did not see the host's own attempts: {seen}"

    def close(self) -> None:
        for s in self.sockets:
            s.close()


def _sock(keep: list[socket.socket], family: int, type_: int, addr: tuple[str, int]) -> socket.socket:
    s = socket.socket(family, type_)
    keep.append(s)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind(addr)
    return s


@contextlib.contextmanager
def host_canary() -> Iterator[HostCanary]:
    canary = HostCanary()
    try:
        canary.self_check()
        yield canary
    finally:
        canary.close()


def pending_connections(listener: socket.socket) -> list[str]:
    """Connections queued on a listening socket (TCP or unix), without waiting."""
    listener.setblocking(False)
    seen = []
    while True:
        try:
            conn, peer = listener.accept()
        except BlockingIOError:
            return seen
        conn.close()
        seen.append(f"connection from {peer!r}")


# --- cells kept alive until released ---------------------------------------------------


class LiveCell:
    """A cell whose command runs in a thread and blocks on its stdin until
    :meth:`release`; ready once it printed :data:`READY`. Lets a test act on
    the running cell (find its pid, put a socket in its network namespace)."""

    def __init__(self, cell: Cell, argv: list[str], *, timeout: float = RUN_TIMEOUT) -> None:
        self.cell = cell
        self.argv = argv
        self.timeout = timeout
        self.stdin_r, self.stdin_w = os.pipe2(os.O_CLOEXEC)
        self.stdin_inode = os.fstat(self.stdin_r).st_ino
        self.ready = threading.Event()
        self.on_ready: Callable[[], None] | None = None
        self._chunks: dict[int, list[bytes]] = {1: [], 2: []}
        self._tail = b""
        self._result: CellResult | None = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="live-cell", daemon=True)

    def start(self) -> LiveCell:
        self.thread.start()
        return self

    def _sink(self, stream: int, data: bytes) -> None:
        self._chunks[stream].append(data)
        if stream == 1 and not self.ready.is_set():
            self._tail = (self._tail + data)[-4096:]
            if READY.encode() in self._tail:
                self.ready.set()
                if self.on_ready is not None:
                    self.on_ready()

    def _run(self) -> None:
        try:
            self._result = self.cell.run(
                self.argv, stdin=self.stdin_r, on_output=self._sink, timeout=self.timeout
            )
        except BaseException as exc:
            self._error = exc
        finally:
            if not self.ready.is_set() and self.on_ready is not None:
                self.on_ready()  # wake whoever counts readiness: this one never will be

    def wait_ready(self, timeout: float = WAIT) -> None:
        if not self.ready.wait(timeout):
            raise AssertionError(f"the cell did not get ready within {timeout} s")

    def init_pid(self) -> int:
        """Host pid of the cell's pid 1 (the command), found by its stdin pipe."""
        pids = pids_by_stdin({self.stdin_inode}).get(self.stdin_inode, [])
        assert len(pids) == 1, f"expected one pid 1 reading the cell's stdin, found {pids}"
        return pids[0]

    def release(self, line: bytes = b"go\n") -> None:
        # Written, not closed: the write end may be held elsewhere (see test_scale).
        os.write(self.stdin_w, line)

    def join(self, timeout: float = RUN_TIMEOUT + 10) -> CellResult:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"Cell.run did not return within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    @property
    def stdout(self) -> str:
        return b"".join(self._chunks[1]).decode(errors="replace")

    @property
    def stderr(self) -> str:
        return b"".join(self._chunks[2]).decode(errors="replace")

    def probe(self, timeout: float = RUN_TIMEOUT + 10) -> Probe:
        result = self.join(timeout)
        return _parse(result, self.stdout, self.stderr)

    def close(self) -> None:
        for fd in (self.stdin_r, self.stdin_w):
            with contextlib.suppress(OSError):
                os.close(fd)


@contextlib.contextmanager
def live_probe(policy: Policy, body: str, params: dict[str, Any] | None = None) -> Iterator[LiveCell]:
    """A probe in a live cell; its body calls ``wait_for_go()`` where the test
    must act first. The cell is released (and joined) on the way out."""
    params = {"neighbour_port": NEIGHBOUR_PORT, **(params or {})}
    with Cell(policy) as cell:
        live = LiveCell(cell, probe_argv(body, params)).start()
        try:
            yield live
        finally:
            if live.thread.is_alive():
                with contextlib.suppress(OSError):
                    live.release(b"stop\n")
                live.thread.join(RUN_TIMEOUT + 10)
            live.close()


def pids_by_stdin(inodes: set[int]) -> dict[int, list[int]]:
    """For each pipe inode, the pids whose stdin it is and which are pid 1 of
    their own pid namespace (a cell's command, not its launcher)."""
    found: dict[int, list[int]] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            link = os.readlink(f"/proc/{entry}/fd/0")
        except OSError:
            continue
        if not link.startswith("pipe:["):
            continue
        inode = int(link[6:-1])
        if inode not in inodes:
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                nspid = next(line for line in f if line.startswith("NSpid:")).split()[1:]
        except (OSError, StopIteration):
            continue
        if len(nspid) > 1 and nspid[-1] == "1":
            found.setdefault(inode, []).append(int(entry))
    return found


# --- sockets inside a cell's network namespace -------------------------------------------


def socket_in_netns(pid: int, family: int, type_: int, address: Any, *, listen: bool = True) -> socket.socket:
    """A socket made in the network namespace of ``pid`` (a running cell), bound
    to ``address``: what the stockade daemon does to serve a cell (the gateway).

    It is made by a short-lived thread that joins the namespace (setns(2) on a
    thread changes only that thread); the socket keeps the namespace it was
    made in and is then used from this process like any other.
    """
    ns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    box: dict[str, Any] = {}

    def worker() -> None:
        try:
            if _libc.setns(ns, CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"setns into the net namespace of pid {pid}: {os.strerror(e)}")
            s = socket.socket(family, type_)
            try:
                if family != socket.AF_UNIX:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(address)
                if listen:
                    s.listen(16)
            except BaseException:
                s.close()
                raise
            box["socket"] = s
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=worker, name="setns")
    t.start()
    t.join(WAIT)
    os.close(ns)
    if "error" in box:
        raise box["error"]
    if "socket" not in box:
        raise AssertionError("the setns thread did not finish")
    sock: socket.socket = box["socket"]
    return sock


def same_netns(pid: int) -> bool:
    """Whether ``pid`` shares this process's network namespace."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino


# --- a cell launched from a network namespace of the test's own -------------------------


def run_in_private_netns(policy: Policy, argv: list[str]) -> tuple[CellResult, list[str]]:
    """Run ``argv`` in a cell launched by a child of this process that first
    moved into a network namespace of its own (only ``lo``, down).

    For attempts that name an address outside the machine (a resolver from the
    host's ``/etc/resolv.conf``): even if the cell's own namespace, seccomp and
    Landlock all failed, the packet could not leave. The child reads the audit
    log with its own reader, opened before it leaves the host's namespace (the
    kernel multicasts audit records in the initial namespace only).

    Returns the cell's result and the interfaces the child's namespace had.
    """
    from stockade.cell._audit import AuditReader

    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            try:
                with AuditReader() as reader:
                    if _libc.unshare(CLONE_NEWNET) != 0:
                        e = ctypes.get_errno()
                        raise OSError(e, f"unshare(CLONE_NEWNET): {os.strerror(e)}")
                    interfaces = [name for _, name in socket.if_nameindex()]
                    with Cell(policy, audit=reader) as cell:
                        result = cell.run(argv, timeout=RUN_TIMEOUT)
                payload = pickle.dumps(("ok", (result, interfaces)))
            except BaseException as exc:
                payload = pickle.dumps(("error", "".join(traceback.format_exception(exc))))
            view = memoryview(payload)
            while view:
                view = view[os.write(write_end, view) :]
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + RUN_TIMEOUT + 15
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, 9)
                raise AssertionError("the private-netns launcher gave no answer in time")
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        raise AssertionError(f"the private-netns launcher failed:\n{value}")
    result, interfaces = value
    return result, interfaces


def probe_in_private_netns(
    policy: Policy, body: str, params: dict[str, Any] | None = None
) -> tuple[Probe, list[str]]:
    params = {"neighbour_port": NEIGHBOUR_PORT, **(params or {})}
    result, interfaces = run_in_private_netns(policy, probe_argv(body, params))
    parsed = _parse(result, result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace"))
    return parsed, interfaces


class FakeGateway:
    """Answers plain HTTP proxy requests on a socket placed in a cell's network
    namespace at the gateway port, as the real gateway (a later layer) will: the
    legitimate path out, against which direct connects are compared."""

    BODY = b"via-the-gateway"

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.requests: list[str] = []
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._serve, name="fake-gateway", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.listener.setblocking(False)
        while True:
            ready, _, _ = select.select([self.listener, self._stop_r], [], [], WAIT)
            if self._stop_r in ready or not ready:
                return
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                continue
            with conn:
                conn.settimeout(5)
                head = b""
                with contextlib.suppress(OSError):
                    while b"\r\n\r\n" not in head and len(head) < 65536:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        head += chunk
                self.requests.append(head.split(b"\r\n", 1)[0].decode(errors="replace"))
                with contextlib.suppress(OSError):
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                        % (len(self.BODY), self.BODY)
                    )

    def close(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(WAIT)
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)
        self.listener.close()
