"""The daemon's control socket, for real: a daemon on a loop in a thread of the
test, a real unix socket under tmp_path, frames written by hand.

Also the helpers the other daemon tests use (``Wire``, ``daemon_at``,
``agent_policy``): no test here sleeps to wait, every wait is on a socket with
a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import stat
import struct
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from stockade.broker._protocol import FrameDecoder
from stockade.daemon._server import DaemonThread
from stockade.errors import StockadeError

WAIT = 30.0
"""Seconds any wait in these tests may take before it fails."""
PY = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells under the daemon need root on this host")


# --------------------------------------------------------------------------- helpers


_OPEN: list[Wire] = []


@pytest.fixture(autouse=True)
def close_wires() -> Iterator[None]:
    """Every ``Wire`` a test opened is closed after it (warnings are errors)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


class Wire:
    """One connection to a daemon socket, frames by hand, every read bounded."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _OPEN.append(self)
        self.sock.connect(path)
        self.decoder = FrameDecoder(max_frame=64 << 20)
        self.frames: list[dict[str, Any]] = []
        self.ids = 0
        self.pushes: list[dict[str, Any]] = []

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message).encode()
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def read(self, timeout: float = WAIT) -> dict[str, Any] | None:
        """The next frame, or None at the end of the stream."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.sock], [], [], max(0.0, left))
            if not ready:
                raise AssertionError(f"no frame within {timeout} s")
            data = self.sock.recv(1 << 16)
            if not data:
                return None
            self.frames.extend(json.loads(body) for body in self.decoder.feed(data))
        return self.frames.pop(0)

    def request(
        self, method: str, params: dict[str, Any] | None = None, timeout: float = WAIT
    ) -> dict[str, Any]:
        """Send a request; return its reply (pushes that come first are kept in ``pushes``)."""
        self.ids += 1
        self.send({"v": 1, "id": self.ids, "method": method, "params": params or {}})
        while True:
            frame = self.read(timeout)
            assert frame is not None, f"the daemon closed the connection during {method}"
            if "push" in frame:
                self.pushes.append(frame)
                continue
            assert frame["id"] == self.ids, frame
            return frame

    def call(
        self, method: str, params: dict[str, Any] | None = None, timeout: float = WAIT
    ) -> dict[str, Any]:
        reply = self.request(method, params, timeout)
        assert reply["ok"], reply
        result: dict[str, Any] = reply["result"]
        return result

    def push(self, timeout: float = WAIT) -> dict[str, Any]:
        if self.pushes:
            return self.pushes.pop(0)
        frame = self.read(timeout)
        assert frame is not None and "push" in frame, frame
        return frame

    def until(self, pred: Callable[[dict[str, Any]], bool], timeout: float = WAIT) -> list[dict[str, Any]]:
        """Pushed events until one satisfies ``pred`` (included)."""
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            frame = self.push(max(0.0, deadline - time.monotonic()))
            assert frame["event"].get("kind") != "subscription.dropped", "this subscriber was dropped"
            seen.append(frame["event"])
            if pred(frame["event"]):
                return seen

    def closed_by_peer(self, timeout: float = WAIT) -> bool:
        while True:
            frame = self.read(timeout)
            if frame is None:
                return True

    def close(self) -> None:
        self.sock.close()


def release(fifo: Path) -> None:
    """Let an agent blocked on ``fifo`` (the ``block`` step) go on. Never waits:
    with nobody reading the fifo, this fails (ENXIO) instead of hanging."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, b"go")
    finally:
        os.close(fd)


def wait_output(path: str, run: str, text: str) -> str:
    """Follow ``run``'s transcript until ``text`` appears in it; the transcript so far."""
    follow = Wire(path)
    seen = follow.call("run.logs", {"run": run, "follow": True})["data"]
    while text not in seen:
        push = follow.push()["event"]
        assert push["kind"] == "run.output", f"the run ended before {text!r} appeared: {seen!r}"
        seen += push["data"]
    follow.close()
    return seen


def kind_is(kind: str, run: str | None = None) -> Callable[[dict[str, Any]], bool]:
    def pred(stored: dict[str, Any]) -> bool:
        event = stored.get("event", stored)
        return bool(event.get("kind") == kind and (run is None or event.get("run") == run))

    return pred


@contextlib.contextmanager
def daemon_at(tmp_path: Path, **options: Any) -> Iterator[DaemonThread]:
    dt = DaemonThread(state=str(tmp_path / "state"), socket_path=str(tmp_path / "d.sock"), **options)
    dt.start()
    try:
        yield dt
    finally:
        dt.stop()


def workspace(tmp_path: Path, name: str = "ws") -> Path:
    ws = tmp_path / name
    ws.mkdir(exist_ok=True)
    return ws


AGENT_WIRE = textwrap.dedent(
    """
    import json, os, socket, struct, sys
    TOKEN = os.environ["STOCKADE_TOKEN"]
    BROKER = os.environ["STOCKADE_BROKER"]

    def connect():
        s = socket.socket(socket.AF_UNIX)
        s.connect(BROKER)
        return s

    def read_frame(s):
        head = b""
        while len(head) < 4:
            chunk = s.recv(4 - len(head))
            if not chunk:
                return None
            head += chunk
        n = struct.unpack(">I", head)[0]
        body = b""
        while len(body) < n:
            body += s.recv(n - len(body))
        return json.loads(body)
    """
)
"""The start of every hand-framing agent script in these tests: its token, a
connection to the broker socket and a reader of one length-prefixed frame
(None at end of stream). The agents of this file, test_floods and
test_sessions each add only their own plan loop, so a change to the wire is
made once."""

AGENT = AGENT_WIRE + textwrap.dedent(
    """
    plan = json.load(open(sys.argv[1]))

    def frame(obj):
        body = json.dumps(obj).encode()
        return struct.pack(">I", len(body)) + body

    main = connect()
    for i, step in enumerate(plan, 1):
        op = step["op"]
        if op == "intent":
            token = step.get("token", "own")
            if token == "own":
                token = TOKEN
            elif token == "forged":
                token = TOKEN[:-4] + ("AAAA" if not TOKEN.endswith("AAAA") else "BBBB")
            elif token.startswith("file:"):
                token = open(token[5:]).read().strip()
            main.sendall(frame({"v": 1, "id": i, "method": "intent",
                                "params": {"token": token, "intent": step["intent"], "args": step["args"]}}))
            out = read_frame(main)
            if step.get("brief"):  # too long to print: keep how long it was
                value = out["result"]["value"]
                value["content"] = len(value["content"])
        elif op == "raw":
            s = connect()
            s.sendall(bytes.fromhex(step["hex"]))
            if step.get("then_valid"):
                s.sendall(frame({"v": 1, "id": 9, "method": "intent",
                                 "params": {"token": TOKEN, "intent": "fs.list", "args": {"path": "/"}}}))
            out = [read_frame(s) for _ in range(step.get("replies", 1))]
            s.close()
        elif op == "hog":  # several connections, each holding a large unfinished frame
            socks, out = [], []
            for _ in range(step["conns"]):
                s = connect()
                socks.append(s)
                try:
                    s.sendall(struct.pack(">I", step["claim"]) + b"x" * step["send"])
                except OSError as e:
                    out.append(type(e).__name__)
            out.append(read_frame(socks[-1]))
            for s in socks:
                s.close()
        elif op == "many":  # more connections than a run may hold
            socks = [connect() for _ in range(step["conns"])]
            out = read_frame(socks[-1])
            for s in socks:
                s.close()
        elif op == "partial":
            s = connect()
            s.sendall(frame({"v": 1, "id": 1, "method": "intent", "params": {}})[:7])
            s.close()
            out = "sent half a frame"
        elif op == "block":  # until the test writes to the fifo (see release())
            import select as sel
            fd = os.open(step["fifo"], os.O_RDONLY | os.O_NONBLOCK)  # a reader now, before saying so
            print(json.dumps({"step": i, "op": op, "out": "blocking"}), flush=True)
            poller = sel.poll()
            poller.register(fd, sel.POLLIN)
            poller.poll()
            os.read(fd, 64)
            os.close(fd)
            out = "released"
        elif op == "spawn":
            import subprocess
            p = subprocess.Popen(step["argv"], start_new_session=True)
            out = p.pid
        print(json.dumps({"step": i, "op": op, "out": out}), flush=True)
    """
)


def agent_policy(
    tmp_path: Path,
    plan: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    name: str = "agent",
    ws: Path | None = None,
    **extra: Any,
) -> Path:
    """A policy file running the hand-framing agent over ``plan``, with a
    granted directory ``granted/`` holding ``ok.txt``."""
    ws = ws or workspace(tmp_path)
    granted = tmp_path / "granted"
    granted.mkdir(exist_ok=True)
    (granted / "ok.txt").write_text("the granted file\n")
    plan_file = ws / f"plan-{name}.json"
    plan_file.write_text(json.dumps(plan))
    policy = {
        "name": name,
        "command": [PY, "-c", AGENT, str(plan_file)],
        "workspace": str(ws),
        "filesystem": {"read": [str(granted)]},
        "tools": tools
        if tools is not None
        else [
            {"id": "read-granted", "intent": "fs.read", "verdict": "allow", "match": {"path": f"{granted}/*"}}
        ],
        **extra,
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(policy))
    return path


def run_to_end(
    wire: Wire, events: Wire, policy: Path, **params: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Start a run, wait for its ``run.end``; its info and its agent's JSON lines."""
    info = wire.call("run.start", {"policy_path": str(policy), **params})
    events.until(kind_is("run.end", info["id"]))
    logs = wire.call("run.logs", {"run": info["id"]})
    lines = [json.loads(line) for line in logs["data"].splitlines() if line.startswith("{")]
    final = next(r for r in wire.call("run.list")["runs"] if r["id"] == info["id"])
    return final, lines


def living_processes(cgroup_has: Callable[[str], bool]) -> dict[int, str]:
    """Living processes (not zombies: killed, not yet reaped) whose
    ``/proc/PID/cgroup`` text satisfies ``cgroup_has``, by pid, with that text."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cgroup") as f:
                text = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if cgroup_has(text) and state not in ("Z", "X"):
            found[int(entry)] = text
    return found


def stored_events(wire: Wire, run: str | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"format": "jsonl", "limit": 1000}
    if run:
        params["run"] = run
    out: list[dict[str, Any]] = []
    while True:
        page = wire.call("events.export", params)
        out.extend(json.loads(line) for line in page["data"].splitlines())
        if not page["more"]:
            return out
        params["after_seq"] = page["last_seq"]


def cli(*args: str) -> tuple[int, str, str]:
    """Run one of the daemon's commands as `stockade` would (run_app's error mapping)."""
    from click.testing import CliRunner

    from stockade.cli._daemon_cmds import COMMANDS

    group = click.Group("stockade")
    for command in COMMANDS:
        group.add_command(command)
    runner = CliRunner()

    def invoke() -> int:
        try:
            code = group.main(args=list(args), prog_name="stockade", standalone_mode=False)
        except StockadeError as exc:
            click.echo(f"stockade: {exc}", err=True)
            return exc.exit_code
        except click.ClickException as exc:
            exc.show()
            return 2
        return code if isinstance(code, int) else 0

    holder: dict[str, int] = {}

    @click.command()
    def wrapper() -> None:
        holder["code"] = invoke()

    result = runner.invoke(wrapper, [], catch_exceptions=False)
    return holder["code"], result.stdout, result.stderr


# --------------------------------------------------------------------------- the socket


def test_the_control_socket_is_owner_only_and_status_answers(tmp_path: Path) -> None:
    with daemon_at(tmp_path) as dt:
        mode = os.stat(dt.socket_path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        wire = Wire(dt.socket_path)
        status = wire.call("status")
        assert status["pid"] == os.getpid()
        assert status["state"] == str(tmp_path / "state")
        assert status["accepting_runs"] is True
        assert status["store"]["last_seq"] >= 1
        journal = status["store"]["journal"]
        assert journal["path"] == str(tmp_path / "state" / "events.db.journal")
        assert journal["bytes"] == os.stat(journal["path"]).st_size and 0 <= journal["unindexed"] <= 1
        assert stat.S_IMODE(os.stat(journal["path"]).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    assert not os.path.exists(tmp_path / "d.sock"), "the socket outlived the daemon"


def test_a_second_daemon_on_the_same_state_is_refused(tmp_path: Path) -> None:
    from stockade.errors import DaemonError

    with daemon_at(tmp_path):
        other = DaemonThread(state=str(tmp_path / "state"), socket_path=str(tmp_path / "other.sock"))
        with pytest.raises(DaemonError, match="another daemon is using the state directory"):
            other.start()
        other.stop()


def test_a_stale_socket_is_replaced_and_a_live_one_is_refused(tmp_path: Path) -> None:
    from stockade.errors import DaemonError

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "d.sock"))
    stale.close()  # bound, never listening: what a killed daemon leaves
    with daemon_at(tmp_path) as dt:
        assert Wire(dt.socket_path).call("status")["pid"] == os.getpid()
        second = DaemonThread(state=str(tmp_path / "state2"), socket_path=dt.socket_path)
        with pytest.raises(DaemonError, match="already listening"):
            second.start()
        second.stop()


def test_a_store_that_cannot_be_written_stops_the_daemon_from_starting(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "events.db").write_bytes(b"this is not a sqlite database, it is garbage " * 100)
    dt = DaemonThread(state=str(state), socket_path=str(tmp_path / "d.sock"))
    with pytest.raises(StockadeError, match=r"events\.db"):
        dt.start()
    dt.stop()
    assert not os.path.exists(tmp_path / "d.sock")


def test_hostile_frames_get_clear_errors_and_the_daemon_keeps_serving(tmp_path: Path) -> None:
    with daemon_at(tmp_path) as dt:
        good = Wire(dt.socket_path)
        bad = Wire(dt.socket_path)
        # Not JSON, JSON that is not an object, a request with no version: each
        # answered, the connection goes on.
        for body, code in (
            (b"\xff\xfe garbage", "bad_json"),
            (b"[1, 2]", "bad_request"),
            (b'{"id": 5, "method": "status"}', "bad_request"),
        ):
            bad.send_raw(struct.pack(">I", len(body)) + body)
            reply = bad.read()
            assert reply is not None and reply["ok"] is False and reply["error"]["code"] == code, reply
            assert reply["error"]["message"]
        assert bad.request("no.such.method")["error"]["code"] == "unknown_method"
        assert bad.request("run.stop", {"run": 42})["error"]["code"] == "bad_params"
        assert bad.request("run.logs", {"run": "r-000000000000"})["error"]["code"] == "not_found"
        assert bad.call("status")["connections"] == 2
        # A frame over the limit: answered, then the connection is closed.
        bad.send_raw(struct.pack(">I", 50 << 20) + b"x" * 1000)
        reply = bad.read()
        assert reply is not None and reply["error"]["code"] == "too_large"
        assert bad.closed_by_peer()
        # Half a frame, then gone.
        half = Wire(dt.socket_path)
        half.send_raw(struct.pack(">I", 100) + b'{"v":1')
        half.close()
        # Text to a framed socket (an HTTP client): too large, closed.
        http = Wire(dt.socket_path)
        http.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = http.read()
        assert reply is not None and "length-prefixed" in reply["error"]["message"]
        assert good.call("status")["pid"] == os.getpid()


def test_a_client_that_never_reads_its_answers_is_not_read_either(tmp_path: Path) -> None:
    with daemon_at(tmp_path) as dt:
        greedy = Wire(dt.socket_path)
        greedy.sock.setblocking(False)
        body = json.dumps({"v": 1, "id": 1, "method": "status", "params": {}}).encode()
        frame = struct.pack(">I", len(body)) + body
        sent = 0
        # Pipeline requests without reading: the daemon stops reading us once
        # our answers pile up, so our send buffer fills instead of its memory.
        with contextlib.suppress(BlockingIOError):
            for _ in range(200_000):
                sent += greedy.sock.send(frame * 64)
        assert sent < 200_000 * len(frame) * 64
        other = Wire(dt.socket_path)
        assert other.call("status")["pid"] == os.getpid()
        greedy.close()
        assert other.call("status")["connections"] >= 1


# --------------------------------------------------------------------------- control methods


def test_run_start_list_logs_stop_and_export(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    policy = tmp_path / "p.json"
    script = (
        "import sys\nfor i in range(3): print('line', i, flush=True)\n"
        "print('to stderr', file=sys.stderr, flush=True)\nopen(sys.argv[1]).read()\n"
    )
    fifo = ws / "hold"
    os.mkfifo(fifo, 0o666)
    policy.write_text(
        json.dumps({"name": "lister", "command": [PY, "-c", script, str(fifo)], "workspace": str(ws)})
    )
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
        run_id = info["id"]
        assert info["name"] == "lister" and info["state"] == "running" and run_id.startswith("r-")
        sub = events.call("events.subscribe", {"run": run_id})
        assert sub["sub"] >= 1
        follow = Wire(dt.socket_path)
        first = follow.call("run.logs", {"run": run_id, "follow": True})
        seen = first["data"]
        while seen.count("\n") < 4:
            push = follow.push()["event"]
            assert push["kind"] == "run.output"
            seen += push["data"]
        assert "line 2\n" in seen and "to stderr\n" in seen
        tail = wire.call("run.logs", {"run": "lister", "tail": 1})
        assert tail["data"].count("\n") == 1 and tail["truncated"] is True
        listed = wire.call("run.list")["runs"]
        assert [r["id"] for r in listed] == [run_id] and listed[0]["state"] == "running"
        stopped = wire.call("run.stop", {"run": "lister", "grace": 0.5})
        # SIGTERM, passed on by the cell's init to a command without a handler:
        # it ends at once (143), not at the grace's SIGKILL (137).
        assert stopped["state"] == "ended" and stopped["exit_code"] == 143 and stopped["stopped_by"]
        assert follow.push()["event"]["kind"] == "run.ended"
        kinds = [e["event"]["kind"] for e in events.until(kind_is("run.end", run_id))]
        # cell.start is recorded live, at launch (once, not again at the end); the
        # cell's persistence report and its end when it ends, then the run's end.
        assert kinds[-3:] == ["cell.persistence", "cell.end", "run.end"]
        assert kinds.count("cell.start") == 1, kinds
        exported = stored_events(wire, run_id)
        assert exported[0]["event"]["kind"] == "run.start"
        assert [e["seq"] for e in exported] == sorted(e["seq"] for e in exported)
        text = wire.call("events.export", {"format": "text", "run": run_id})
        assert text["count"] == len(exported) and f"run {run_id} started" in text["data"]
        whole = wire.call("events.export", {"format": "json"})
        assert isinstance(json.loads(whole["data"]), list)
        assert wire.call("verify")["ok"] is True
        assert wire.request("events.export", {"format": "xml"})["error"]["code"] == "bad_params"
        unsub = events.call("events.unsubscribe", {"sub": sub["sub"]})
        assert unsub["sub"] == sub["sub"]


def test_a_bad_run_start_is_refused_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nlimits: {memory: lots}\n")
    with daemon_at(tmp_path) as dt:
        wire = Wire(dt.socket_path)
        reply = wire.request("run.start", {"policy_path": str(bad)})
        assert reply["error"]["code"] == "bad_params" and "bad.yaml" in reply["error"]["message"]
        reply = wire.request("run.start", {"policy_text": "name: x", "policy_path": str(bad)})
        assert reply["error"]["code"] == "bad_params"
        reply = wire.request("run.start", {"policy_path": "relative.yaml"})
        assert "absolute" in reply["error"]["message"]
        assert wire.call("run.list")["runs"] == []


def test_a_foreground_run_ends_with_the_connection_that_started_it(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    fifo = ws / "hold"
    os.mkfifo(fifo, 0o666)
    policy = tmp_path / "p.json"
    policy.write_text(
        json.dumps(
            {
                "name": "fg",
                "command": [PY, "-c", "import sys; open(sys.argv[1]).read()", str(fifo)],
                "workspace": str(ws),
            }
        )
    )
    with daemon_at(tmp_path) as dt:
        events = Wire(dt.socket_path)
        events.call("events.subscribe")
        starter = Wire(dt.socket_path)
        info = starter.call("run.start", {"policy_path": str(policy), "detach": False})
        events.until(kind_is("run.start", info["id"]))
        starter.close()
        end = events.until(kind_is("run.end", info["id"]))[-1]["event"]
        assert end["detail"]["stopped_by"] == "its client left"


# --------------------------------------------------------------------------- the CLI


def test_cli_without_a_daemon_says_so_with_exit_4(tmp_path: Path) -> None:
    code, _out, err = cli("ps", "--socket", str(tmp_path / "none.sock"))
    assert code == 4 and "not running" in err
    code, _out, err = cli("status", "--socket", str(tmp_path / "none.sock"))
    assert code == 4


def test_cli_run_without_a_daemon_starts_one_for_the_run(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    policy = tmp_path / "p.yaml"
    policy.write_text(f"name: once\nworkspace: {ws}\ncommand: [/bin/sh, -c, 'echo hello; exit 7']\n")
    sock = str(tmp_path / "d.sock")
    code, out, _err = cli("run", "-f", str(policy), "--state", str(tmp_path / "st"), "--socket", sock)
    assert code == 7 and out == "hello\n"
    assert not os.path.exists(sock), "the in-process daemon outlived its run"
    code, out, _err = cli(
        "run",
        "-f",
        str(policy),
        "--state",
        str(tmp_path / "st"),
        "--socket",
        sock,
        "--",
        "/bin/echo",
        "from",
        "argv",
    )
    assert code == 0 and out == "from argv\n"
    code, _out, err = cli(
        "run", "--detach", "-f", str(policy), "--state", str(tmp_path / "st"), "--socket", sock
    )
    assert code == 4 and "detached run needs" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nnot_a_key: 1\n")
    code, _out, err = cli("run", "-f", str(bad), "--socket", sock)
    assert code == 3 and "bad.yaml" in err


def test_cli_against_a_running_daemon(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    fifo = ws / "hold"
    os.mkfifo(fifo, 0o666)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"name: clirun\nworkspace: {ws}\n"
        f"command: [{PY}, -c, 'import sys; print(\"up\", flush=True); open(sys.argv[1]).read()', {fifo}]\n"
    )
    with daemon_at(tmp_path) as dt:
        sock = dt.socket_path
        events = Wire(sock)
        events.call("events.subscribe")
        code, out, _ = cli("run", "--detach", "--json", "-f", str(policy), "--socket", sock)
        assert code == 0
        run_id = json.loads(out)["id"]
        events.until(kind_is("run.start", run_id))
        code, out, _ = cli("ps", "--socket", sock)
        assert code == 0 and run_id in out and "running" in out
        code, out, _ = cli("ps", "--json", "--socket", sock)
        assert json.loads(out)[0]["id"] == run_id
        code, out, _ = cli("status", "--json", "--socket", sock)
        assert code == 0 and json.loads(out)["runs"]["running"] == 1
        code, out, _ = cli("status", "--socket", sock)
        assert "1 running" in out
        follow = Wire(sock)
        got = follow.call("run.logs", {"run": run_id, "follow": True})["data"]
        while "up\n" not in got:
            got += follow.push()["event"]["data"]
        code, out, _ = cli("logs", "clirun", "--socket", sock)
        assert code == 0 and out == "up\n"
        code, out, _ = cli("approvals", "--socket", sock)
        assert code == 0 and "no approvals" in out
        code, _out, err = cli("approve", "a-000000000000", "--socket", sock)
        assert code == 6 and "no approval" in err
        code, _out, err = cli("deny", "a-000000000000", "--socket", sock)
        assert code == 2  # --reason is required
        code, out, _ = cli("stop", run_id, "--grace", "0", "--socket", sock)
        assert code == 0 and "exit code 137" in out
        code, out, _ = cli("logs", "-f", run_id, "--socket", sock)
        assert code == 0 and out == "up\n"
        code, _out, err = cli("stop", "nobody", "--socket", sock)
        assert code == 6 and "no run" in err


def test_cli_daemon_command_serves_until_sigterm(tmp_path: Path) -> None:
    import subprocess

    sock = str(tmp_path / "d.sock")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from stockade.cli._daemon_cmds import daemon; "
            "sys.exit(daemon.main(args=sys.argv[1:], prog_name='stockade daemon', standalone_mode=False))",
            "--state",
            str(tmp_path / "st"),
            "--socket",
            sock,
        ],
        stderr=subprocess.PIPE,
    )
    with proc:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], WAIT)
        assert ready, "the daemon did not say it listens"
        line = proc.stderr.readline().decode()
        assert "listening on" in line
        assert Wire(sock).call("status")["pid"] == proc.pid
        proc.terminate()
        assert proc.wait(WAIT) == 0
    assert not os.path.exists(sock)
    from stockade.record._store import open_store

    with open_store(str(tmp_path / "st" / "events.db"), readonly=True) as store:
        kinds = [stored.event.kind for stored in store.query()]
        assert kinds[0] == "daemon.start" and kinds[-1] == "daemon.stop"
        assert store.verify().ok


def test_cli_run_in_the_foreground_asks_at_the_terminal(tmp_path: Path) -> None:
    """`stockade run` on a terminal: the agent's ask is put to the operator there."""
    import subprocess

    granted = tmp_path / "granted"
    plan = [{"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}}]
    policy = agent_policy(tmp_path, plan, tools=[{"id": "ask-me", "intent": "fs.read", "verdict": "ask"}])
    code = (
        "import sys, click\n"
        "from stockade.cli._daemon_cmds import COMMANDS\n"
        "g = click.Group('stockade')\n"
        "for c in COMMANDS: g.add_command(c)\n"
        "sys.exit(g.main(args=sys.argv[1:], prog_name='stockade', standalone_mode=False))\n"
    )
    master, slave = os.openpty()
    args = ["run", "-f", str(policy), "--state", str(tmp_path / "st"), "--socket", str(tmp_path / "d.sock")]
    with subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=slave, stdout=slave, stderr=slave
    ) as proc:
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + WAIT
        answered = False
        while True:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no prompt within {WAIT} s: {seen!r}"
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            seen += chunk
            if not answered and b"approve?" in seen:
                os.write(master, b"y\r")
                answered = True
        assert proc.wait(WAIT) == 0
    os.close(master)
    text = seen.decode(errors="replace")
    assert "fs.read" in text and answered
    assert '"verdict": "allow"' in text and "the granted file" in text


def test_cli_approvals_approve_and_deny(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    ask = {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}}
    policy = agent_policy(
        tmp_path, [ask, ask], tools=[{"id": "ask-me", "intent": "fs.read", "verdict": "ask"}]
    )
    with daemon_at(tmp_path) as dt:
        sock = dt.socket_path
        wire, events = Wire(sock), Wire(sock)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
        first = events.until(kind_is("approval.asked", info["id"]))[-1]["event"]["detail"]["id"]
        code, out, _ = cli("approvals", "--socket", sock)
        assert code == 0 and first in out and "fs.read" in out and "s left" in out
        code, out, _ = cli("approvals", "--json", "--run", info["id"], "--socket", sock)
        assert [a["id"] for a in json.loads(out)] == [first]
        code, out, _ = cli("approve", first, "--socket", sock)
        assert code == 0 and out == f"{first} approved\n"
        second = events.until(kind_is("approval.asked", info["id"]))[-1]["event"]["detail"]["id"]
        code, out, _ = cli("deny", second, "--reason", "enough reading", "--json", "--socket", sock)
        assert code == 0 and json.loads(out)["reason"] == "enough reading"
        code, _out, err = cli("approve", second, "--socket", sock)
        assert code == 5 and "already denied" in err
        events.until(kind_is("run.end", info["id"]))
        verdicts = [
            json.loads(x)["out"]["result"]["verdict"]
            for x in wire.call("run.logs", {"run": info["id"]})["data"].splitlines()
        ]
        assert verdicts == ["allow", "deny"]
