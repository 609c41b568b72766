"""The client against tiny servers on real Unix sockets under tmp_path.

Each server is a thread that accepts connections and runs a script on each: a
well-behaved one built on the protocol's own ``Connection``, and broken ones
(closes mid-frame, never answers, sends garbage). Nothing sleeps: a test waits
on the thing itself (an event, a reply, the client's own timeout), bounded.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.broker import MAX_FRAME, Connection, Request, encode
from stockade.daemon._client import Client, RemoteError
from stockade.errors import DaemonError, ProtocolError

BOUND = 10.0  # seconds: the most any wait here may take before the test fails

Script = Callable[[socket.socket, "Server"], None]


class Server:
    """Accepts connections on ``path``; runs ``script`` on each in its own thread."""

    def __init__(self, path: Path, script: Script) -> None:
        self.path = str(path)
        self.script = script
        self.connections = 0
        self.release = threading.Event()  # scripts that stall wait on this
        self.peer_closed = threading.Event()
        self.requests: list[Request] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(8)
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while True:
            sock, _ = self._listener.accept()
            if self._stopping:
                sock.close()
                return
            self.connections += 1
            thread = threading.Thread(target=self._run, args=(sock,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _run(self, sock: socket.socket) -> None:
        with sock:
            sock.settimeout(BOUND)
            try:
                self.script(sock, self)
            except (BrokenPipeError, ConnectionResetError):  # the client left first
                self.peer_closed.set()

    def read_request(self, sock: socket.socket) -> Request | None:
        """The next request on ``sock``, or None at EOF."""
        conn = Connection()
        while True:
            data = sock.recv(65536)
            if not data:
                self.peer_closed.set()
                return None
            for item in conn.receive(data):
                assert isinstance(item, Request), item
                self.requests.append(item)
                return item

    def stop(self) -> None:
        self.release.set()
        self._stopping = True
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as poke:  # wake accept()
            poke.connect(self.path)
        self._accepter.join(BOUND)
        for thread in self._threads:
            thread.join(BOUND)
        self._listener.close()
        assert not self._accepter.is_alive() and not any(t.is_alive() for t in self._threads)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Script], Server]]:
    servers: list[Server] = []

    def start(script: Script) -> Server:
        server = Server(tmp_path / f"d{len(servers)}.sock", script)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# --- scripts --------------------------------------------------------------------------


def protocol_server(sock: socket.socket, server: Server) -> None:
    """Serves with the protocol core: ``echo`` returns its params, ``fail``
    fails with the code and message it is given, ``subscribe`` answers
    {"sub": 1} then pushes ``n`` events and closes; ``bye`` answers and closes."""
    conn = Connection()
    while True:
        data = sock.recv(65536)
        if not data:
            server.peer_closed.set()
            return
        for item in conn.receive(data):
            if not isinstance(item, Request):
                sock.sendall(conn.fail(item.id, item.code, item.message))
                continue
            server.requests.append(item)
            p = item.params
            if item.method == "echo":
                sock.sendall(conn.respond(item.id, {"params": p}))
            elif item.method == "fail":
                sock.sendall(conn.fail(item.id, p["code"], p["message"]))
            elif item.method == "subscribe":
                if p.get("early"):
                    sock.sendall(conn.push(1, {"seq": 0}))
                sock.sendall(conn.respond(item.id, {"sub": 1}))
                for seq in range(1, p["n"] + 1):
                    sock.sendall(conn.push(1, {"seq": seq}))
                if p.get("then_fail"):
                    sock.sendall(conn.fail(0, "unavailable", "the event store cannot write; free disk space"))
                if not p.get("hold"):
                    return
            elif item.method == "bye":
                sock.sendall(conn.respond(item.id, {}))
                return
            else:
                sock.sendall(conn.fail(item.id, "unknown_method", f"no method {item.method!r}; see status"))
        if conn.closed:
            return


def replies(*frames: bytes) -> Script:
    """Reads one request, sends ``frames`` as they are, then closes."""

    def script(sock: socket.socket, server: Server) -> None:
        if server.read_request(sock) is not None:
            for f in frames:
                sock.sendall(f)

    return script


def never_answers(sock: socket.socket, server: Server) -> None:
    server.read_request(sock)
    server.release.wait(BOUND)


def half_a_reply_then_silence(sock: socket.socket, server: Server) -> None:
    request = server.read_request(sock)
    assert request is not None
    sock.sendall(Connection().respond(request.id, {"a": 1})[:9])
    server.release.wait(BOUND)


def reply_to(request_id: int, **result: Any) -> bytes:
    return Connection().respond(request_id, result)


# --- calls ----------------------------------------------------------------------------


def test_call_returns_the_result(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path) as client:
        assert client.call("echo", run="r-1", grace=2.5) == {"params": {"run": "r-1", "grace": 2.5}}
        assert client.call("echo") == {"params": {}}
    assert [r.id for r in server.requests] == [1, 2]
    assert server.connections == 1


def test_params_may_be_named_method_or_self(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path) as client:
        assert client.call("echo", method="x", self=1) == {"params": {"method": "x", "self": 1}}


def test_a_refusal_is_a_remote_error_with_its_code(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path) as client:
        with pytest.raises(RemoteError) as info:
            client.call("fail", code="not_found", message="no run 'r-9'; list runs with `stockade ps`")
        assert str(info.value) == "no run 'r-9'; list runs with `stockade ps`"
        assert (info.value.code, info.value.method, info.value.exit_code) == ("not_found", "fail", 6)
        # The connection is still good after a refusal.
        assert client.call("echo", a=1) == {"params": {"a": 1}}
    assert server.connections == 1


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [("bad_params", 2), ("not_found", 6), ("denied", 126), ("conflict", 5), ("internal", 5), ("new_code", 5)],
)
def test_remote_error_exit_codes(serve: Callable[[Script], Server], code: str, exit_code: int) -> None:
    server = serve(
        replies(encode({"v": 1, "id": 1, "ok": False, "error": {"code": code, "message": "m; f"}}))
    )
    with Client(server.path) as client, pytest.raises(RemoteError) as info:
        client.call("x")
    assert (info.value.code, info.value.exit_code) == (code, exit_code)


def test_the_daemons_protocol_errors_come_back_as_remote_errors(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path) as client, pytest.raises(RemoteError) as info:
        client.call("Not.A.Name")
    assert info.value.code == "bad_request"
    assert "the method name 'Not.A.Name' is not a valid name" in str(info.value)


def test_daemon_not_running_no_socket(tmp_path: Path) -> None:
    path = tmp_path / "none.sock"
    with Client(path) as client, pytest.raises(DaemonError) as info:
        client.call("status")
    assert str(info.value) == f"the daemon is not running at {path}; start it with `stockade daemon`"
    assert info.value.exit_code == 4


def test_daemon_not_running_stale_socket(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))  # the file stays; nothing listens: ECONNREFUSED
    with Client(path) as client, pytest.raises(DaemonError, match="the daemon is not running at"):
        client.call("status")


def test_not_a_socket_path(tmp_path: Path) -> None:
    path = tmp_path / "file" / "d.sock"
    (tmp_path / "file").write_text("")
    with (
        Client(path) as client,
        pytest.raises(DaemonError, match=r"cannot connect to the daemon at .* \(Not a direct"),
    ):
        client.call("status")


def test_timeout_when_the_daemon_never_answers(serve: Callable[[Script], Server]) -> None:
    server = serve(never_answers)
    start = time.monotonic()
    with Client(server.path, timeout=0.2) as client, pytest.raises(DaemonError) as info:
        client.call("status")
    assert 0.2 <= time.monotonic() - start < BOUND
    assert str(info.value) == (
        f"the daemon at {server.path} did not answer 'status' within 0.2 s;"
        " it may be stuck: see its log, or allow longer with a larger timeout"
    )


def test_timeout_covers_a_reply_cut_short(serve: Callable[[Script], Server]) -> None:
    server = serve(half_a_reply_then_silence)
    with Client(server.path, timeout=0.2) as client, pytest.raises(DaemonError, match="did not answer"):
        client.call("status")


def test_daemon_closes_in_the_middle_of_a_reply(serve: Callable[[Script], Server]) -> None:
    server = serve(replies(reply_to(1, a="x" * 100)[:50]))
    with Client(server.path) as client, pytest.raises(DaemonError) as info:
        client.call("status")
    assert str(info.value) == (
        f"the daemon at {server.path} closed the connection in the middle of a reply during 'status';"
        " see the daemon's log"
    )
    assert info.value.exit_code == 4


def test_daemon_closes_before_answering(serve: Callable[[Script], Server]) -> None:
    server = serve(replies())
    with (
        Client(server.path) as client,
        pytest.raises(DaemonError, match="closed the connection before answering"),
    ):
        client.call("status")


def test_a_new_connection_after_one_broke(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path) as client:
        assert client.call("bye") == {}
        with pytest.raises(DaemonError, match="closed the connection"):
            client.call("echo")  # this request was sent on the closed connection, and is not resent
        assert client.call("echo", n=1) == {"params": {"n": 1}}
    assert server.connections == 2
    assert [r.method for r in server.requests] == ["bye", "echo"]


@pytest.mark.parametrize(
    ("frame", "fragment"),
    [
        (struct.pack(">I", 7) + b"garbage", "the daemon sent a malformed reply: the frame is not valid JSON"),
        (encode({"v": 2, "id": 1, "ok": True, "result": {}}), "the daemon speaks protocol version 2"),
        (reply_to(5), "the daemon answered request 5 while this client waited for 1"),
        (
            struct.pack(">I", MAX_FRAME + 1),
            f"sent a frame of {MAX_FRAME + 1} bytes, over this client's limit",
        ),
    ],
    ids=["garbage", "version-2", "wrong-id", "too-large"],
)
def test_malformed_replies(serve: Callable[[Script], Server], frame: bytes, fragment: str) -> None:
    server = serve(replies(frame))
    with Client(server.path) as client, pytest.raises(ProtocolError) as info:
        client.call("status")
    assert fragment in str(info.value)


def test_pushes_on_a_call_connection_are_skipped(serve: Callable[[Script], Server]) -> None:
    server = serve(replies(Connection().push(1, {"seq": 1}), reply_to(1, ok=1)))
    with Client(server.path) as client:
        assert client.call("status") == {"ok": 1}


def test_a_request_over_the_limit_is_never_sent(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path, max_frame=100) as client:
        with pytest.raises(ProtocolError, match="over the frame limit of 100; send less"):
            client.call("echo", data="x" * 200)
        assert client.call("echo") == {"params": {}}
    assert [r.params for r in server.requests] == [{}]


def test_a_request_that_is_not_json_is_never_sent(tmp_path: Path) -> None:
    with Client(tmp_path / "none.sock") as client, pytest.raises(ProtocolError, match="NaN"):
        client.call("echo", n=float("nan"))


def test_no_timeout(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path, timeout=None) as client:
        assert client.call("echo") == {"params": {}}


# --- subscriptions --------------------------------------------------------------------


def test_subscribe_streams_pushes_until_the_daemon_closes(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path) as client:
        stream = client.subscribe("subscribe", n=3, early=True)
        assert stream.result == {"sub": 1}
        assert [e["seq"] for e in stream] == [0, 1, 2, 3]
        assert list(stream) == []
        # Subscriptions have their own connection: calls go on meanwhile.
        assert client.call("echo") == {"params": {}}
    assert server.connections == 2


def test_closing_a_subscription_closes_its_connection(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path) as client:
        with client.subscribe("subscribe", n=2, hold=True) as stream:
            assert next(stream) == {"seq": 1}
        assert server.peer_closed.wait(BOUND)
        assert list(stream) == []


def test_client_close_closes_its_subscriptions(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    client = Client(server.path)
    stream = client.subscribe("subscribe", n=1, hold=True)
    client.close()
    assert server.peer_closed.wait(BOUND)
    assert list(stream) == []


def test_a_subscription_ended_by_an_error(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path) as client:
        stream = client.subscribe("subscribe", n=1, then_fail=True)
        assert next(stream) == {"seq": 1}
        with pytest.raises(RemoteError) as info:
            next(stream)
        assert info.value.code == "unavailable" and info.value.method == "subscribe"
        assert list(stream) == []


def test_a_refused_subscription(serve: Callable[[Script], Server]) -> None:
    server = serve(protocol_server)
    with Client(server.path) as client, pytest.raises(RemoteError, match="no method 'nope'"):
        client.subscribe("nope")
    assert server.peer_closed.wait(BOUND)


def test_a_subscription_cut_mid_frame(serve: Callable[[Script], Server]) -> None:
    server = serve(replies(reply_to(1, sub=1), Connection().push(1, {"seq": 1})[:10]))
    with Client(server.path) as client:
        stream = client.subscribe("subscribe")
        with pytest.raises(DaemonError, match="in the middle of a reply"):
            next(stream)


def test_subscribe_to_no_daemon(tmp_path: Path) -> None:
    with Client(tmp_path / "none.sock") as client, pytest.raises(DaemonError, match="not running"):
        client.subscribe("events.subscribe")
