"""The agent SDK (``stockade_agent``) against a real daemon on real sockets.

A run is started whose agent blocks on a fifo; the test then speaks to the
run's broker socket on the host (``<state>/runs/<id>/broker.sock``) with the
run's token, through the SDK, and checks what it returns, what it raises, and
what the record holds. Other tests run the module under bare interpreters
(``-I -S``: no site-packages, no venv) on the host and inside a cell, and a
scripted fake broker checks the frames the SDK sends (``http.fetch``, the
``tool_call`` id, reconnecting) where the daemon's answer cannot be arranged.
No test sleeps: every wait is on a socket, a thread or a process, with a bound.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import hashlib
import json
import os
import select
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stockade.daemon import _paths
from stockade.daemon._runs import RequestError
from stockade.daemon._server import DaemonThread
from stockade.daemon._tools import check_tool_call_id
from stockade.sdk import (
    MODULE_PATH,
    Broker,
    BrokerError,
    Denied,
    IntentFailed,
    NoAnswer,
    NotInCell,
    RunHalted,
    Unauthorized,
    Unreachable,
    current_tool_call,
)
from tests.daemon.test_server import (
    WAIT,
    Wire,
    agent_policy,
    close_wires,  # noqa: F401  (the fixture that closes every Wire)
    daemon_at,
    kind_is,
    release,
    stored_events,
    wait_output,
    workspace,
)

SDK_DIR = os.path.dirname(MODULE_PATH)


# --------------------------------------------------------------------------- a live run


@dataclass
class Live:
    """A run whose agent blocks on a fifo, and the ways to reach it."""

    dt: DaemonThread
    wire: Wire
    events: Wire
    run: str
    path: str
    token: str
    granted: Path
    out: Path
    fifo: Path
    opened: list[Broker]

    def broker(self, token: str = "", **options: Any) -> Broker:
        """A Broker on the run's socket (closed when the run ends)."""
        broker = Broker(self.path, token or self.token, run=self.run, **options)
        self.opened.append(broker)
        return broker

    def recorded(self, kind: str) -> list[dict[str, Any]]:
        return [e["event"] for e in stored_events(self.wire, self.run) if e["event"]["kind"] == kind]


def _tools(granted: Path, out: Path) -> list[dict[str, Any]]:
    return [
        {
            "id": "no-secret",
            "intent": "fs.read",
            "verdict": "deny",
            "match": {"path": f"{granted}/secret.txt"},
        },
        {"id": "read-granted", "intent": "fs.read", "verdict": "allow", "match": {"path": f"{granted}/**"}},
        {"id": "read-out", "intent": "fs.read", "verdict": "allow", "match": {"path": f"{out}/*"}},
        {"id": "list-granted", "intent": "fs.list", "verdict": "allow", "match": {"path": f"{granted}/**"}},
        {"id": "write-out", "intent": "fs.write", "verdict": "allow", "match": {"path": f"{out}/*"}},
        {"id": "echo", "intent": "exec", "verdict": "allow", "match": {"argv": "/bin/echo *"}},
        {"id": "questions", "intent": "ask", "verdict": "allow"},
    ]


@contextlib.contextmanager
def live_run(tmp_path: Path, *, denials: int = 50, **options: Any) -> Iterator[Live]:
    ws = workspace(tmp_path)
    fifo = ws / "hold"
    os.mkfifo(fifo, 0o666)
    granted, out = tmp_path / "granted", tmp_path / "out"
    granted.mkdir(exist_ok=True)
    (granted / "sub").mkdir(exist_ok=True)
    (granted / "secret.txt").write_text("the secret\n")
    (granted / "sub" / "deep.txt").write_text("deep\n")
    out.mkdir(exist_ok=True)
    policy = agent_policy(
        tmp_path,
        [{"op": "block", "fifo": str(fifo)}],
        tools=_tools(granted, out),
        ws=ws,
        filesystem={"read": [str(granted)], "write": [str(out)]},
        limits={"denials": denials},
    )
    with daemon_at(tmp_path, **options) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
        assert dt.daemon.runs is not None
        token = dt.daemon.runs.runs[info["id"]].token
        path = _paths.broker_socket_path(dt.daemon.state, info["id"])
        live = Live(dt, wire, events, info["id"], path, token, granted, out, fifo, [])
        wait_output(dt.socket_path, info["id"], "blocking")
        try:
            yield live
        finally:
            for broker in live.opened:
                broker.close()
            with contextlib.suppress(OSError):  # a halted run's agent is gone already
                release(fifo)
        events.until(kind_is("run.end", info["id"]))


def _spy_intents(live: Live) -> list[dict[str, Any]]:
    """The params of every intent the daemon is given from now on, as it got them."""
    runs = live.dt.daemon.runs
    assert runs is not None
    seen: list[dict[str, Any]] = []
    real = runs.intents.serve_intent

    def spy(run: Any, params: Any, *, cell: str) -> Any:
        seen.append(dict(params))
        return real(run, params, cell=cell)

    runs.intents.serve_intent = spy  # type: ignore[method-assign]
    return seen


# --------------------------------------------------------------------------- every call


def test_every_intent_allowed_and_denied_with_typed_results(tmp_path: Path) -> None:
    with live_run(tmp_path) as live:
        broker = live.broker()
        granted, out = live.granted, live.out
        assert broker.read(f"{granted}/ok.txt") == b"the granted file\n"

        with pytest.raises(Denied) as denied:
            broker.read(f"{granted}/secret.txt")
        assert denied.value.rule == "no-secret" and denied.value.verdict == "deny"
        assert denied.value.code == "deny" and denied.value.intent == "fs.read"
        assert str(denied.value).startswith("fs.read was denied by rule 'no-secret'")

        with pytest.raises(Denied) as unmatched:
            broker.read("/etc/hostname")
        assert unmatched.value.rule is None and "add {id: allow-fs-read" in unmatched.value.reason

        (granted / "link.txt").symlink_to(granted / "ok.txt")
        with pytest.raises(Denied) as refused:  # a rule allows it; the broker never follows a link
            broker.read(f"{granted}/link.txt")
        assert refused.value.refused is True and refused.value.rule == "read-granted"
        assert str(refused.value).startswith("fs.read was denied by the broker: refused by the broker")

        with pytest.raises(IntentFailed) as missing:
            broker.read(f"{granted}/nothing.txt")
        assert missing.value.code == "not_found" and missing.value.intent == "fs.read"

        listing = broker.list(str(granted))
        assert {(e.name, e.type) for e in listing} >= {("ok.txt", "file"), ("sub", "dir")}
        assert listing.path == str(granted) and listing.truncated is False
        assert next(e for e in listing if e.name == "ok.txt").size == len("the granted file\n")

        written = broker.write(f"{out}/report.md", "# hello\n")
        assert (written.path, written.bytes, written.created, written.mode) == (
            f"{out}/report.md",
            8,
            True,
            "create",
        )
        with pytest.raises(IntentFailed) as exists:
            broker.write(f"{out}/report.md", "again")
        assert exists.value.code == "exists"
        binary = bytes(range(256)) * 3  # not UTF-8: travels as base64
        assert broker.write(f"{out}/blob.bin", binary).bytes == len(binary)
        assert (out / "blob.bin").read_bytes() == binary
        assert broker.read(f"{out}/blob.bin") == binary
        broker.write(f"{out}/report.md", b"more\n", mode="append")
        assert (out / "report.md").read_text() == "# hello\nmore\n"
        with pytest.raises(Denied) as outside:
            broker.write(f"{granted}/new.txt", "no")
        assert outside.value.rule is None

        ran = broker.exec(["/bin/echo", "from", "the", "workbench"], timeout=60)
        assert ran.exit_code == 0 and ran.ok and ran.stdout == b"from the workbench\n"
        assert ran.stderr == b"" and ran.timed_out is False and ran.cell
        with pytest.raises(Denied):
            broker.exec(["/bin/ls", "/"])

        value = broker.intent("fs.read", {"path": f"{granted}/sub/deep.txt"})
        assert value["content"] == "deep\n" and value["encoding"] == "utf-8"
        with pytest.raises(BrokerError) as bad:
            broker.intent("fs.read", {"path": "relative.txt"})
        assert bad.value.code == "bad_params" and "absolute path" in str(bad.value)
        with pytest.raises(BrokerError) as unknown:
            broker.intent("fs.delete", {"path": "/x"})
        assert unknown.value.code == "bad_request"

        verdicts = [(e["detail"]["intent"], e["detail"]["verdict"]) for e in live.recorded("intent")]
        # fs.read denied: the secret, the unmatched path, the link (allowed, then refused).
        assert verdicts.count(("fs.read", "deny")) == 3 and ("exec", "allow") in verdicts
        assert ("fs.write", "deny") in verdicts
        broker.close()


def test_fetch_against_the_daemon_is_decided_by_the_network_policy(tmp_path: Path) -> None:
    """No network is reached: a policy without ``network.allow`` denies every
    fetch. What this proves is that the daemon takes the SDK's arguments (a
    malformed one would be ``bad_params``, not a verdict), text and binary bodies
    alike, and that the denial is recorded."""
    with live_run(tmp_path) as live:
        broker = live.broker()
        with pytest.raises(Denied) as plain:
            broker.fetch("https://example.com/data", headers={"Accept": "text/plain"})
        with pytest.raises(Denied):
            broker.fetch("https://example.com/up", method="POST", body=b"\xff\x00binary")
        with pytest.raises(Denied):
            broker.fetch("https://example.com/up", method="POST", body="text")
        assert plain.value.intent == "http.fetch" and plain.value.reason
        with pytest.raises(BrokerError) as bad:
            broker.fetch("https://example.com/", method="PUT")
        assert bad.value.code == "bad_params" and "method" in str(bad.value)
        fetches = [e for e in live.recorded("intent") if e["detail"]["intent"] == "http.fetch"]
        assert [e["detail"]["verdict"] for e in fetches] == ["deny", "deny", "deny"]
        assert fetches[1]["detail"]["args"]["encoding"] == "base64"


def test_one_broker_is_shared_by_threads_on_one_connection(tmp_path: Path) -> None:
    with live_run(tmp_path) as live:
        broker = live.broker()
        results: list[bytes] = []
        lock = threading.Lock()

        def reader() -> None:
            for _ in range(20):
                data = broker.read(f"{live.granted}/ok.txt")
                with lock:
                    results.append(data)

        threads = [threading.Thread(target=reader) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert not any(t.is_alive() for t in threads)
        assert results == [b"the granted file\n"] * 160
        # The agent in its cell connects too, at a moment of its own (counting
        # before and after raced with it). Not by the peer's pid: the connect
        # supervisor makes the cell's connect, so its peer is this process too;
        # the daemon names the cell of a connection from its network namespace.
        mine = [p for p in live.dt.daemon._peers if p.run is not None and not p.cell]
        assert len(mine) == 1, "the threads opened connections of their own"
        assert len(live.recorded("intent")) == 160


def test_ask_returns_the_operators_answer_and_raises_when_none_came(tmp_path: Path) -> None:
    with live_run(tmp_path) as live:
        broker = live.broker()
        answers: list[object] = []

        def ask(question: str) -> None:
            try:
                answers.append(broker.ask(question))
            except BrokerError as exc:
                answers.append(exc)

        for decision, reason in (("approve", "blue"), ("deny", "not now")):
            asker = threading.Thread(target=ask, args=("which colour?",))
            asker.start()
            asked = live.events.until(kind_is("approval.asked", live.run))[-1]["event"]["detail"]
            assert asked["args"]["question"] == "which colour?"
            live.wire.call("approvals.decide", {"id": asked["id"], "decision": decision, "reason": reason})
            asker.join(WAIT)
            assert not asker.is_alive()
        assert answers[0] == "blue"
        assert isinstance(answers[1], NoAnswer) and answers[1].code == "no_answer"
        assert "which colour?" in str(answers[1])


def test_a_bad_token_raises_unauthorized_and_is_recorded(tmp_path: Path) -> None:
    with live_run(tmp_path) as live:
        forged = live.token[:-4] + ("AAAA" if not live.token.endswith("AAAA") else "BBBB")
        for token, word in ((forged, "forged"), ("not-a-token", "malformed")):
            with pytest.raises(Unauthorized) as refused:
                live.broker(token).read(f"{live.granted}/ok.txt")
            assert refused.value.code == "unauthorized" and word in str(refused.value)
        with pytest.raises(Unauthorized), live.broker(forged).tool_call("lookup"):
            pass
        reasons = [e["detail"]["reason"] for e in live.recorded("intent")]
        assert len(reasons) == 3 and all(r.startswith("unauthorized") for r in reasons)
        assert live.recorded("intent")[-1]["detail"]["intent"] == "tool.record"
        assert live.recorded("tool.call") == []
        assert live.token not in json.dumps(stored_events(live.wire))


def test_a_halted_run_raises_run_halted(tmp_path: Path) -> None:
    with live_run(tmp_path, denials=2) as live:
        runs = live.dt.daemon.runs
        assert runs is not None
        # Hold the run's end (which closes its broker socket) until the test has
        # spoken to the halted run, so what it meets is the halt, not a closed socket.
        held: list[tuple[Any, ...]] = []
        ended = threading.Event()
        real_end = runs._cell_ended

        def hold(*args: Any) -> None:
            held.append(args)
            ended.set()

        runs._cell_ended = hold  # type: ignore[method-assign]
        broker = live.broker()
        with pytest.raises(Denied):
            broker.read("/etc/hostname")
        with pytest.raises(Denied):  # the second denial trips the tripwire, and is still answered
            broker.read("/etc/hostname")
        assert live.events.until(kind_is("run.halted", live.run))
        with pytest.raises(RunHalted) as halted:
            broker.read(f"{live.granted}/ok.txt")
        assert halted.value.code == "denied" and "halted" in str(halted.value)
        with pytest.raises(RunHalted):
            broker.list(str(live.granted))
        # The tool call that met the halt is still recorded: it says what the agent was doing.
        with pytest.raises(RunHalted), broker.tool_call("last_words", {"n": 1}):
            broker.read(f"{live.granted}/ok.txt")
        calls = [c["detail"] for c in live.recorded("tool.call")]
        assert [(c["name"], c["ok"]) for c in calls] == [("last_words", False)]
        assert calls[0]["error"].startswith("RunHalted: ")
        assert ended.wait(WAIT), "the halted run's cell did not end"
        live.dt.call(lambda: real_end(*held[0]))


def test_not_in_a_cell_and_an_unreachable_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STOCKADE_BROKER", "STOCKADE_TOKEN", "STOCKADE_RUN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(NotInCell) as outside:
        Broker.connect()
    assert outside.value.code == "not_in_cell"
    assert "$STOCKADE_BROKER and $STOCKADE_TOKEN are not set" in str(outside.value)
    monkeypatch.setenv("STOCKADE_BROKER", str(tmp_path / "none.sock"))
    with pytest.raises(NotInCell, match=r"\$STOCKADE_TOKEN is not set"):
        Broker.connect()
    monkeypatch.setenv("STOCKADE_TOKEN", "st1.x.y")
    broker = Broker.connect()
    assert "st1.x.y" not in repr(broker)
    with pytest.raises(Unreachable) as gone:
        broker.read("/etc/hostname")
    assert gone.value.code == "unreachable" and str(tmp_path / "none.sock") in str(gone.value)


# --------------------------------------------------------------------------- tool calls


def test_tool_calls_are_recorded_and_their_intents_carry_the_call_id(tmp_path: Path) -> None:
    with live_run(tmp_path) as live:
        broker = live.broker()
        seen = _spy_intents(live)
        ids: list[str] = []

        @broker.tool
        def lookup(path: str, *, limit: int = 10, password: str = "") -> bytes:
            call = current_tool_call()
            assert call is not None
            ids.append(call.id)
            return broker.read(path)[:limit]

        @broker.tool(name="peek_secret")
        def peek() -> bytes:
            call = current_tool_call()
            assert call is not None
            ids.append(call.id)
            return broker.read(f"{live.granted}/secret.txt")

        assert lookup(f"{live.granted}/ok.txt", limit=3, password="hunter2") == b"the"
        assert lookup.__name__ == "lookup"
        with pytest.raises(Denied):
            peek()
        broker.read(f"{live.granted}/ok.txt")  # outside any tool call
        assert current_tool_call() is None

        calls = live.recorded("tool.call")
        assert [c["detail"]["name"] for c in calls] == ["lookup", "peek_secret"]
        first, second = (c["detail"] for c in calls)
        assert first["tool_call"] == ids[0] and second["tool_call"] == ids[1] and ids[0] != ids[1]
        assert first["args"] == {"path": f"{live.granted}/ok.txt", "limit": 3, "password": "[redacted]"}
        assert first["ok"] is True and first["result_size"] == 3 and first["error"] == ""
        assert first["duration"] >= 0
        assert second["ok"] is False and second["result_size"] == 0
        assert second["error"].startswith("Denied: fs.read was denied by rule 'no-secret'")
        assert all(c["layer"] == "broker" and c["outcome"] == "info" for c in calls)
        assert "hunter2" not in json.dumps(stored_events(live.wire))
        # Every intent made during a call carried its id to the daemon; the one after did not.
        assert [p.get("tool_call") for p in seen] == [ids[0], ids[1], None]
        # The intents were recorded before the call that made them, and name it.
        kinds = [e["event"]["kind"] for e in stored_events(live.wire, live.run)]
        assert kinds.index("tool.call") > kinds.index("intent")
        intents = [
            e["event"]["detail"] for e in stored_events(live.wire, live.run) if e["event"]["kind"] == "intent"
        ]
        assert [d.get("tool_call") for d in intents] == [ids[0], ids[1], None]


def test_an_async_tool_and_a_model_call_id(tmp_path: Path) -> None:
    with live_run(tmp_path) as live:
        broker = live.broker()
        seen = _spy_intents(live)

        @broker.tool
        async def fetch_doc(path: str) -> str:
            return broker.read(path).decode()

        assert asyncio.run(fetch_doc(f"{live.granted}/ok.txt")) == "the granted file\n"
        with broker.tool_call(
            "summarise", {"text": "x" * 5000, "data": b"\x00" * 10}, call_id="call_abc123"
        ) as c:
            c.result = {"summary": broker.read(f"{live.granted}/sub/deep.txt").decode()}
        with pytest.raises(ValueError, match="tool call id"):
            broker.tool_call("bad", call_id="has space")
        with pytest.raises(TypeError, match="generator"):

            @broker.tool
            def gen() -> Iterator[int]:
                yield 1

        calls = [c["detail"] for c in live.recorded("tool.call")]
        assert [c["name"] for c in calls] == ["fetch_doc", "summarise"]
        assert calls[0]["ok"] is True and calls[0]["result_size"] == len("the granted file\n")
        assert calls[1]["tool_call"] == "call_abc123"
        assert calls[1]["args"]["data"] == "<10 bytes>"
        assert calls[1]["args"]["text"].startswith("x" * 1000 + "… [4000 more characters]")
        assert calls[1]["result_size"] == len(json.dumps({"summary": "deep\n"}))
        assert [p.get("tool_call") for p in seen] == [calls[0]["tool_call"], "call_abc123"]


def test_a_tool_call_that_cannot_be_recorded_raises(tmp_path: Path) -> None:
    nowhere = Broker(str(tmp_path / "none.sock"), "st1.x.y")
    ran: list[int] = []

    @nowhere.tool
    def add(a: int, b: int) -> int:
        ran.append(a + b)
        return a + b

    with pytest.raises(Unreachable):
        add(1, 2)
    assert ran == [3], "the tool ran, and its recording failed after"

    @nowhere.tool
    def fails() -> None:
        raise KeyError("inner")

    with pytest.raises(Unreachable) as both:
        fails()
    chain: list[BaseException] = []
    link: BaseException | None = both.value
    while link is not None:
        chain.append(link)
        link = link.__context__
    assert any(isinstance(e, KeyError) for e in chain), f"the tool's own error was lost: {chain!r}"


def test_tool_record_params_are_checked(tmp_path: Path) -> None:
    with live_run(tmp_path) as live:
        wire = Wire(live.path)
        good = {
            "token": live.token,
            "name": "lookup",
            "args": {"q": "x"},
            "result_size": 1,
            "duration": 0.5,
            "ok": True,
            "tool_call": "tc-0011223344556677",
        }
        assert wire.call("tool.record", good)["recorded"] is True
        cases: list[tuple[dict[str, Any], str]] = [
            ({**good, "extra": 1}, "'extra' is not a param of tool.record"),
            ({k: v for k, v in good.items() if k != "name"}, "'name' is missing"),
            ({**good, "name": "two words"}, "is not a tool name"),
            ({**good, "tool_call": "x" * 129}, "is not a tool call id"),
            ({**good, "args": ["q"]}, "'args' must be an object"),
            ({**good, "args": {f"k{i}": "v" * 4000 for i in range(40)}}, "over the limit of 65536"),
            ({**good, "result_size": -1}, "'result_size' -1 must be a whole number"),
            ({**good, "result_size": True}, "'result_size' True must be a whole number"),
            ({**good, "duration": "1"}, "'duration' '1' must be a number of seconds"),
            ({**good, "ok": 1}, "'ok' must be true or false, not a number"),
            ({**good, "error": "boom"}, "'ok' is true"),
            ({**good, "ok": False, "error": 5}, "'error' must be a string"),
        ]
        for params, message in cases:
            reply = wire.request("tool.record", params)
            assert reply["ok"] is False and reply["error"]["code"] == "bad_params", params
            assert message in reply["error"]["message"], reply["error"]["message"]
        assert len(live.recorded("tool.call")) == 1
        assert wire.request("tool.delete", {})["error"]["code"] == "unknown_method"


def test_check_tool_call_id() -> None:
    assert check_tool_call_id(None) is None
    assert check_tool_call_id("call_9F.x:y-z") == "call_9F.x:y-z"
    for bad in ("", "a b", "x" * 129, 5, ["tc-1"]):
        with pytest.raises(RequestError) as refused:
            check_tool_call_id(bad)
        assert refused.value.code == "bad_params"


# --------------------------------------------------------------------------- bare interpreters


def _interpreters() -> list[str]:
    """This venv's Python, Debian's (/usr/bin/python3), and the oldest one kept
    here (pyenv's 3.8), when they exist: the module must need none of them."""
    found = [sys.executable]
    for candidate in ("/usr/bin/python3", *sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python3"))):
        path = str(candidate)
        if os.access(path, os.X_OK) and os.path.realpath(path) not in map(os.path.realpath, found):
            found.append(path)
    return found


AGENT_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys
    if sys.argv[1] != "-":  # else from $PYTHONPATH, as a cell sets it
        sys.path.insert(0, sys.argv[1])
    import stockade_agent as sa

    granted = sys.argv[2]
    broker = sa.Broker.connect()
    out = {"version": list(sys.version_info[:2]), "site": "site" in sys.modules, "file": sa.__file__}
    with open(sa.__file__, "rb") as f:
        out["sha256"] = hashlib.sha256(f.read()).hexdigest()
    out["read"] = broker.read(granted + "/ok.txt").decode()
    try:
        broker.read(granted + "/secret.txt")
    except sa.Denied as exc:
        out["denied"] = [exc.code, exc.rule]

    @sa.tool
    def count_entries(path):
        return len(broker.list(path))

    out["entries"] = count_entries(granted)
    out["third_party"] = sorted(m for m in sys.modules if m.split(".")[0] in ("stockade", "pydantic"))
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("python", _interpreters())
def test_the_module_runs_on_bare_interpreters(tmp_path: Path, python: str) -> None:
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    with live_run(tmp_path) as live:
        env = {"STOCKADE_BROKER": live.path, "STOCKADE_TOKEN": live.token, "STOCKADE_RUN": live.run}
        done = subprocess.run(
            [python, "-I", "-S", str(script), SDK_DIR, str(live.granted)],
            env=env,
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["site"] is False and out["third_party"] == []
        assert out["file"] == MODULE_PATH
        assert out["read"] == "the granted file\n"
        assert out["denied"] == ["deny", "no-secret"]
        assert out["entries"] == len(os.listdir(live.granted))
        calls = live.recorded("tool.call")
        assert [c["detail"]["name"] for c in calls] == ["count_entries"]
        assert calls[0]["detail"]["args"] == {"path": str(live.granted)}


def test_the_module_is_python_3_8_syntax() -> None:
    with open(MODULE_PATH, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_an_agent_in_a_cell_imports_the_mounted_module(tmp_path: Path) -> None:
    """Debian's Python without site-packages, in a real cell, imports the module
    the cell mounts at /run/stockade/lib through $PYTHONPATH, and it works."""
    granted, out = tmp_path / "granted", tmp_path / "out"
    granted.mkdir()
    out.mkdir()
    (granted / "ok.txt").write_text("the granted file\n")
    (granted / "secret.txt").write_text("the secret\n")
    ws = workspace(tmp_path)
    (ws / "agent.py").write_text(AGENT_SCRIPT)
    policy = tmp_path / "agent.json"
    policy.write_text(
        json.dumps(
            {
                "name": "sdk-agent",
                "command": ["/usr/bin/python3", "-S", f"{ws}/agent.py", "-", str(granted)],
                "workspace": str(ws),
                "filesystem": {"read": [str(granted)], "write": [str(out)]},
                "tools": _tools(granted, out),
            }
        )
    )
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy)})
        events.until(kind_is("run.end", info["id"]))
        logs = wire.call("run.logs", {"run": info["id"]})["data"]
        final = next(r for r in wire.call("run.list")["runs"] if r["id"] == info["id"])
        assert final["exit_code"] == 0, logs
        result = json.loads(logs.strip().splitlines()[-1])
        assert result["file"] == "/run/stockade/lib/stockade_agent.py" and result["site"] is False
        with open(MODULE_PATH, "rb") as f:
            assert result["sha256"] == hashlib.sha256(f.read()).hexdigest(), "the cell has another module"
        assert result["read"] == "the granted file\n" and result["denied"] == ["deny", "no-secret"]
        assert result["entries"] == 2
        events_of_run = [e["event"] for e in stored_events(wire, info["id"])]
        calls = [e for e in events_of_run if e["kind"] == "tool.call"]
        assert len(calls) == 1 and calls[0]["cell"] == final["cells"][0], "not attributed to the cell"


# --------------------------------------------------------------------------- the frames


class FakeBroker:
    """A scripted broker socket: each request read is answered by the next step
    of ``script`` (a result dict, or ``("error", code, message)``, or
    ``"close"``: close without answering, or ``"reply-close"``: answer, then
    close). ``requests`` holds every request read, with its connection's number."""

    def __init__(self, path: Path, script: list[Any]) -> None:
        self.path = str(path)
        self.script = list(script)
        self.requests: list[tuple[int, dict[str, Any]]] = []
        self.closed = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn_no = 0
        while self.script:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn_no += 1
            with conn:
                while self.script:
                    head = _read_exact(conn, 4)
                    if head is None:
                        break
                    body = _read_exact(conn, struct.unpack(">I", head)[0])
                    assert body is not None
                    request = json.loads(body)
                    self.requests.append((conn_no, request))
                    step = self.script.pop(0)
                    if step == "close":
                        break
                    if step == "idle":  # the daemon's idle close, the request unread
                        push = b'{"v":1,"push":"closing","reason":"idle"}'
                        conn.sendall(struct.pack(">I", len(push)) + push)
                        break
                    if isinstance(step, tuple):
                        reply = {
                            "v": 1,
                            "id": request["id"],
                            "ok": False,
                            "error": {"code": step[1], "message": step[2]},
                        }
                    else:
                        reply = {"v": 1, "id": request["id"], "ok": True, "result": step["result"]}
                    data = json.dumps(reply).encode()
                    conn.sendall(struct.pack(">I", len(data)) + data)
                    if isinstance(step, dict) and step.get("then") == "close":
                        break
            self.closed.set()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes an accept() still waiting
        self.listener.close()
        self.thread.join(WAIT)


def _read_exact(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _allow(value: dict[str, Any], then: str = "") -> dict[str, Any]:
    return {"result": {"verdict": "allow", "rule": "r", "reason": "", "value": value}, "then": then}


@contextlib.contextmanager
def fake(tmp_path: Path, script: list[Any]) -> Iterator[FakeBroker]:
    server = FakeBroker(tmp_path / "fake.sock", script)
    try:
        yield server
    finally:
        server.close()


def test_fetch_sends_the_http_fetch_intent_and_reads_both_body_shapes(tmp_path: Path) -> None:
    flat = {
        "status": 200,
        "url": "https://example.com/final",
        "headers": [["Content-Type", "application/json"], ["Set-Cookie", "a"], ["Set-Cookie", "b"]],
        "truncated": False,
        "hops": 2,
        "duration": 0.25,
        "content": '{"ok": true}',
        "encoding": "utf-8",
    }
    nested = {
        "status": 201,
        "url": "https://example.com/up",
        "headers": [],
        "body": {"content": "/w==", "encoding": "base64"},
        "truncated": True,
    }
    with fake(tmp_path, [_allow(flat), _allow(nested)]) as server:
        broker = Broker(server.path, "st1.tok.en")
        got = broker.fetch("https://example.com/start", headers={"Accept": "application/json"})
        assert got.status == 200 and got.url == "https://example.com/final" and got.hops == 2
        assert got.json() == {"ok": True} and got.header("content-type") == "application/json"
        assert [v for k, v in got.headers if k == "Set-Cookie"] == ["a", "b"]
        posted = broker.fetch("https://example.com/up", method="post", body=b"\xff\x00")
        assert posted.body == b"\xff" and posted.truncated is True and posted.status == 201
        broker.close()
    (_, first), (_, second) = server.requests
    assert first == {
        "v": 1,
        "id": 1,
        "method": "intent",
        "params": {
            "token": "st1.tok.en",
            "intent": "http.fetch",
            "args": {
                "url": "https://example.com/start",
                "method": "GET",
                "headers": {"Accept": "application/json"},
            },
        },
    }
    assert second["id"] == 2
    assert second["params"]["args"] == {
        "url": "https://example.com/up",
        "method": "POST",
        "body": "/wA=",
        "encoding": "base64",
    }


def test_text_bodies_and_the_tool_call_on_the_wire(tmp_path: Path) -> None:
    denied = {"result": {"verdict": "deny", "rule": None, "reason": "no tools rule allows it", "value": None}}
    recorded = {"result": {"recorded": True, "tool_call": "x", "seq": 7}}
    with fake(tmp_path, [_allow({"status": 204, "url": "u", "headers": []}), denied, recorded]) as server:
        broker = Broker(server.path, "tok")
        with broker.tool_call("post_it", {"n": 1}) as call:
            assert broker.fetch("https://example.com/", method="POST", body="héllo").body == b""
            with pytest.raises(Denied) as refused:
                broker.fetch("https://other.example/")
            call.result = "done"
        assert str(refused.value).startswith("http.fetch was denied by the broker: no tools rule")
        broker.close()
    (_, post), (_, other), (_, record) = server.requests
    assert post["params"]["args"]["body"] == "héllo" and "encoding" not in post["params"]["args"]
    assert post["params"]["tool_call"] == other["params"]["tool_call"] == call.id
    assert call.id.startswith("tc-") and len(call.id) == 19
    assert record["method"] == "tool.record" and record["id"] == 3
    params = record["params"]
    assert sorted(params) == ["args", "duration", "error", "name", "ok", "result_size", "token", "tool_call"]
    assert (params["name"], params["args"], params["ok"], params["error"]) == ("post_it", {"n": 1}, True, "")
    assert params["result_size"] == 4 and params["tool_call"] == call.id and params["token"] == "tok"


def test_a_broken_connection_is_opened_again_once_and_a_request_never_sent_twice(tmp_path: Path) -> None:
    ok = _allow({"path": "/a", "size": 1, "content": "a", "encoding": "utf-8"})
    with fake(tmp_path, [{**ok, "then": "close"}, ok, "close"]) as server:
        broker = Broker(server.path, "tok")
        assert broker.read("/a") == b"a"
        assert server.closed.wait(WAIT)  # the broker dropped the connection after answering
        assert broker.read("/a") == b"a"  # sent on a fresh connection, once
        with pytest.raises(Unreachable, match="may or may not have been done"):
            broker.read("/a")  # read, then the connection closed without an answer
    assert [(conn, req["id"]) for conn, req in server.requests] == [(1, 1), (2, 1), (2, 2)]


def test_a_connection_closed_as_idle_after_the_request_went_is_sent_again(tmp_path: Path) -> None:
    """The daemon's closing push says it read nothing more: unlike any other
    broken connection, the request is sent again on a fresh one."""
    ok = _allow({"path": "/a", "size": 1, "content": "a", "encoding": "utf-8"})
    with fake(tmp_path, ["idle", ok]) as server:
        broker = Broker(server.path, "tok")
        assert broker.read("/a") == b"a"
        broker.close()
    assert [(conn, req["id"]) for conn, req in server.requests] == [(1, 1), (2, 1)]


def test_the_daemon_closes_an_idle_connection_and_the_sdk_reconnects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stockade.daemon import _peer

    monkeypatch.setattr(_peer, "BROKER_IDLE", 0.2)
    with live_run(tmp_path) as live:
        broker = live.broker()
        assert broker.read(f"{live.granted}/ok.txt") == b"the granted file\n"
        sock = broker._sock
        assert sock is not None
        # Wait on the thing: the daemon's last push, then the end of the connection.
        ready, _, _ = select.select([sock], [], [], WAIT)
        assert ready, "the daemon did not close the idle connection"
        assert broker.read(f"{live.granted}/ok.txt") == b"the granted file\n"
        assert broker._sock is not sock, "the second read went on a fresh connection"
        mine = [p for p in live.dt.daemon._peers if p.run is not None and not p.cell]
        assert len(mine) == 1, "the idle connection is still held by the daemon"
        assert len(live.recorded("intent")) == 2  # each read once


def test_error_codes_map_to_errors(tmp_path: Path) -> None:
    script = [
        (
            "error",
            "unauthorized",
            "unauthorized: the capability token is forged; use the token in $STOCKADE_TOKEN",
        ),
        ("error", "denied", "run r-1 is halted (3 denials); every intent is refused"),
        ("error", "unavailable", "the event store cannot write"),
        {"result": {"verdict": "maybe", "value": None}},
        _allow({"error": {"code": "too_large", "message": "over 16 MiB"}}),
        _allow({"answer": None}),
    ]
    with fake(tmp_path, script) as server:
        broker = Broker(server.path, "tok")
        with pytest.raises(Unauthorized, match="forged"):
            broker.read("/a")
        with pytest.raises(RunHalted, match="halted"):
            broker.read("/a")
        with pytest.raises(BrokerError) as unavailable:
            broker.read("/a")
        assert unavailable.value.code == "unavailable" and type(unavailable.value) is BrokerError
        with pytest.raises(BrokerError) as odd:
            broker.read("/a")
        assert odd.value.code == "protocol" and "'maybe'" in str(odd.value)
        with pytest.raises(IntentFailed) as big:
            broker.read("/a")
        assert big.value.code == "too_large" and "over 16 MiB" in str(big.value)
        with pytest.raises(NoAnswer):
            broker.ask("anyone?")
        broker.close()


def test_a_call_past_its_timeout_raises_and_the_connection_is_dropped(tmp_path: Path) -> None:
    gate = threading.Event()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "slow.sock"))
    listener.listen(1)

    def silent() -> None:
        conn, _ = listener.accept()
        with conn:
            gate.wait(WAIT)  # never answers

    thread = threading.Thread(target=silent, daemon=True)
    thread.start()
    broker = Broker(str(tmp_path / "slow.sock"), "tok", timeout=0.05)
    with pytest.raises(BrokerError) as late:
        broker.read("/a")
    assert late.value.code == "timeout" and "may still be done" in str(late.value)
    assert broker._sock is None
    gate.set()
    thread.join(WAIT)
    listener.close()


def test_requests_that_cannot_be_sent_are_refused_before_sending(tmp_path: Path) -> None:
    broker = Broker(str(tmp_path / "none.sock"), "tok")
    with pytest.raises(BrokerError) as surrogate:
        broker.read("/bad\udcff")
    assert surrogate.value.code == "bad_params" and "lone surrogate" in str(surrogate.value)
    with pytest.raises(TypeError, match="list of words"):
        broker.exec("ls -l")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes or str"):
        broker.write("/a", 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool name"):
        broker.tool(lambda: None)
