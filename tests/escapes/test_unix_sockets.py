"""Escapes: pathname unix sockets of the host that no decoy hides (THREATS,
"no host unix socket is reachable, wherever it lies and whenever it was made").

The plan hides the sockets it finds (``_plan._host_sockets``), but it does not
search the workspace, stops after a budget of entries, and cannot see a socket
made after the cell started. Each of those is here, refused by the connect
supervisor (``cell/_unotify``) with EACCES and an event naming the path, and
never reached (the listener's backlog stays empty). Controls in each: a socket
the cell binds itself, a socketpair, the allowed TCP neighbour on loopback;
and a socket stockade offers the cell (as the daemon offers the broker's),
reached through the supervisor.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator

import pytest

from stockade.cell import _plan
from stockade.cell._plan import NOBODY
from stockade.policy import Policy
from tests.escapes._net_cell import (
    UNIX_PROBES,
    Probe,
    live_probe,
    net_policy,
    pending_connections,
    probe,
)

_BODY = (
    UNIX_PROBES
    + """
import stat
def pair():
    a, b = socket.socketpair()
    a.sendall(b"pair")
    got = b.recv(4).decode()
    a.close()
    b.close()
    return got
"""
)

_CONTROLS = """
attempt("own", own_pathname_socket)
attempt("pair", pair)
attempt("neighbour", neighbour)
"""


def assert_controls(p: Probe) -> None:
    assert p["own"].ok and p["own"].value == "ping", p.transcript()
    assert p["pair"].ok and p["pair"].value == "pair", p.transcript()
    assert p["neighbour"].ok and p["neighbour"].value == "ruobhgien", p.transcript()


def assert_refused_and_recorded(p: Probe, name: str, path: str) -> None:
    outcome = p[name]
    assert not outcome.ok, f"{name} reached a host socket: {outcome}\n{p.transcript()}"
    assert outcome.errno == errno.EACCES, p.transcript()
    assert len(p.unix_refusals(path)) == 1, p.transcript()


@pytest.fixture
def host_dir() -> Iterator[str]:
    """A directory outside /tmp (the cell's /tmp is its own), writable by the cell's host uid."""
    path = tempfile.mkdtemp(prefix="stockade-unix-", dir="/var/tmp")
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _listen(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    os.chmod(path, 0o777)  # file modes never stand in the way
    s.listen(8)
    return s


def _with_read(policy: Policy, path: str) -> Policy:
    fs = policy.filesystem
    return dataclasses.replace(policy, filesystem=dataclasses.replace(fs, read=(*fs.read, path)))


def test_host_socket_in_an_existing_workspace_is_refused(host_dir: str) -> None:
    """A socket a host service left in the workspace before the cell started:
    the workspace is never searched for sockets, and it is a live socket in
    the cell's view."""
    path = os.path.join(host_dir, "service.sock")
    with _listen(path) as listener:
        p = probe(
            net_policy(),
            _BODY
            + """
attempt("mode", lambda: stat.S_ISSOCK(os.lstat(P["path"]).st_mode))
attempt("absolute", lambda: unix_connect(P["path"]))
attempt("relative", lambda: unix_connect("service.sock"))
"""
            + _CONTROLS,
            {"path": path},
            workspace=host_dir,
        )
        reached = pending_connections(listener)
    p.check_clean()
    assert p["mode"].value is True, p.transcript()  # no decoy: the host's socket is there
    assert_refused_and_recorded(p, "absolute", path)
    assert_refused_and_recorded(p, "relative", "service.sock")
    assert reached == []
    assert_controls(p)


def test_host_socket_past_the_search_budget_is_refused(
    host_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket in a read grant beyond the plan's search budget (20,000 entries
    here; 1 in this test, so that no entry is looked at): no decoy hides it,
    and the supervisor refuses it all the same."""
    monkeypatch.setattr(_plan, "_SOCKET_SCAN_MAX", 1)
    grant = os.path.join(host_dir, "grant")
    os.makedirs(os.path.join(grant, "deep"))
    path = os.path.join(grant, "deep", "app.sock")
    with _listen(path) as listener:
        p = probe(
            _with_read(net_policy(), grant),
            _BODY
            + """
attempt("mode", lambda: stat.S_ISSOCK(os.lstat(P["path"]).st_mode))
attempt("connect", lambda: unix_connect(P["path"]))
"""
            + _CONTROLS,
            {"path": path},
        )
        reached = pending_connections(listener)
    p.check_clean()
    assert p["mode"].value is True, p.transcript()
    assert_refused_and_recorded(p, "connect", path)
    assert reached == []
    assert_controls(p)


def test_host_socket_made_after_the_cell_started_is_refused(host_dir: str) -> None:
    """A socket the host binds in a read grant while the cell runs (the test
    does it while the cell waits on its stdin): the plan could not know it."""
    grant = os.path.join(host_dir, "grant")
    os.mkdir(grant)
    path = os.path.join(grant, "late.sock")
    body = (
        _BODY
        + """
wait_for_go()
attempt("mode", lambda: stat.S_ISSOCK(os.lstat(P["path"]).st_mode))
attempt("connect", lambda: unix_connect(P["path"]))
"""
        + _CONTROLS
    )
    with live_probe(_with_read(net_policy(), grant), body, {"path": path}) as live:
        live.wait_ready()
        listener = _listen(path)
        try:
            live.release()
            p = live.probe()
            reached = pending_connections(listener)
        finally:
            listener.close()
    p.check_clean()
    assert p["mode"].value is True, p.transcript()
    assert_refused_and_recorded(p, "connect", path)
    assert reached == []
    assert_controls(p)


_OFFERED_IN_CELL = "/run/stockade/broker.sock"

_RACE = """
import threading
libc.connect.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]
def sockaddr(path):
    raw = (1).to_bytes(2, "little") + path.encode()
    return raw + b"\\0" * (110 - len(raw))
good, bad = sockaddr(P["offered"]), sockaddr(P["host"])
buf = ctypes.create_string_buffer(good, 110)
stop = []
def flip():
    while not stop:
        ctypes.memmove(buf, bad, 110)
        ctypes.memmove(buf, good, 110)
def race():
    t = threading.Thread(target=flip)
    t.start()
    outcomes = {}
    try:
        for _ in range(300):
            s = socket.socket(socket.AF_UNIX)
            r = libc.connect(s.fileno(), ctypes.addressof(buf), 110)
            key = "ok" if r == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
            outcomes[key] = outcomes.get(key, 0) + 1
            s.close()
    finally:
        stop.append(1)
        t.join()
    return outcomes
def talk():
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(P["offered"])
        s.sendall(b"ping")
        return s.recv(4).decode()
attempt("race", race)
attempt("talk", talk)
"""


def test_offered_socket_works_and_a_flipped_address_never_reaches_the_host(host_dir: str) -> None:
    """A socket stockade offers the cell (shown at the broker's path) is reached
    through the supervisor, which connects to the inode it knows. A thread
    flipping the address between that path and a host socket's while another
    connects 300 times never reaches the host socket: the supervisor read the
    address once and connected to what it checked, and a connect it refused
    left an event naming the host path."""
    offered_host = os.path.join(host_dir, "offered.sock")
    host_path = os.path.join(host_dir, "host.sock")
    served: list[int] = []

    def serve(srv: socket.socket) -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                served.append(1)
                conn.settimeout(0.5)
                try:
                    if conn.recv(4) == b"ping":
                        conn.sendall(b"pong")
                except OSError:
                    pass

    with _listen(offered_host) as offered, _listen(host_path) as host:
        server = threading.Thread(target=serve, args=(offered,), daemon=True)
        server.start()
        p = probe(
            net_policy(),
            _BODY + _RACE + _CONTROLS,
            {"offered": _OFFERED_IN_CELL, "host": host_path},
            workspace=host_dir,
            sockets={_OFFERED_IN_CELL: offered_host},
        )
        reached = pending_connections(host)
        offered.shutdown(socket.SHUT_RDWR)
    p.check_clean()
    assert reached == [], f"the race reached the host socket: {p['race']}\n{p.transcript()}"
    outcomes = p["race"].value
    assert p["race"].ok and set(outcomes) <= {"ok", "EACCES", "ENOENT", "ECONNREFUSED"}, p.transcript()
    # Both ways happened (about half each here): the offered socket was reached,
    # and the host's path was asked for and refused.
    assert outcomes.get("ok", 0) > 0 and outcomes.get("EACCES", 0) > 0, p.transcript()
    assert len(p.unix_refusals(host_path)) == outcomes.get("EACCES", 0), p.transcript()
    assert p["talk"].ok and p["talk"].value == "pong", p.transcript()
    assert served, "the offered socket saw no connection"
    assert_controls(p)


def test_the_view_shows_the_offered_socket_as_a_socket(host_dir: str) -> None:
    """The control of the control: the offered socket is a socket in the cell
    (not a decoy), so the refusals above are the supervisor's, not the view's."""
    offered_host = os.path.join(host_dir, "offered.sock")
    with _listen(offered_host):
        p = probe(
            net_policy(),
            'import stat\nattempt("mode", lambda: stat.S_ISSOCK(os.stat(P["offered"]).st_mode))',
            {"offered": _OFFERED_IN_CELL},
            sockets={_OFFERED_IN_CELL: offered_host},
        )
    p.check_clean()
    assert p["mode"].ok and p["mode"].value is True, p.transcript()
    assert stat.S_ISSOCK(os.stat(offered_host).st_mode)


def test_audit_mode_records_the_connect_and_lets_it_through(host_dir: str) -> None:
    """``mode: audit``: the supervisor records what it would refuse
    (``cell.audited``) and makes the connect; the host socket is reached, which
    is what audit mode means (docs/CELL.md). The control is the enforce-mode
    tests above, where the same connect is refused."""
    path = os.path.join(host_dir, "service.sock")
    with _listen(path) as listener:
        p = probe(
            dataclasses.replace(net_policy(), mode="audit"),
            _BODY + 'attempt("connect", lambda: unix_connect(P["path"]))\n' + _CONTROLS,
            {"path": path},
            workspace=host_dir,
        )
        listener.settimeout(5)  # bounded: a refused connect would leave nothing to accept
        conn, _ = listener.accept()  # it did connect: the backlog holds it
        conn.close()
    assert p["connect"].ok, p.transcript()
    audited = [
        e
        for e in p.events
        if e.kind == "cell.audited"
        and e.detail.get("action") == "user_notif"
        and e.detail.get("path") == path
    ]
    assert len(audited) == 1 and audited[0].outcome == "audited", p.transcript()
    assert_controls(p)
