"""Floods from one run, for real, and what they must not do to another run:
an agent in a cell floods the daemon (questions, connections, records) while
the test asserts that another run's request completes while the flood is held,
and that nothing the daemon acknowledged was lost.

No wait here is timed: each waits on the thing itself (an event pushed, a
frame read) with the bound ``WAIT`` of the helpers in ``test_server``.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_server import (
    PY,
    Wire,
    agent_policy,
    close_wires,  # noqa: F401  (the fixture that closes every Wire)
    daemon_at,
    kind_is,
    run_to_end,
    workspace,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells under the daemon need root on this host")

FLOOD_AGENT = textwrap.dedent(
    """
    import json, os, socket, struct, sys
    plan = json.load(open(sys.argv[1]))
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

    def frame(i, method, params):
        body = json.dumps({"v": 1, "id": i, "method": method, "params": params}).encode()
        return struct.pack(">I", len(body)) + body

    def intent(i, name, args):
        return frame(i, "intent", {"token": TOKEN, "intent": name, "args": args})

    for n, step in enumerate(plan, 1):
        op = step["op"]
        if op == "intent":
            s = connect()
            s.sendall(intent(n, step["intent"], step["args"]))
            out = read_frame(s)
            s.close()
        elif op == "asks":  # many questions at once, one connection each, all held open
            socks = [connect() for _ in range(step["n"])]
            for i, s in enumerate(socks):
                s.sendall(intent(i + 1, "ask", {"question": f"question {i}"}))
            out = [read_frame(s) for s in socks]
            for s in socks:
                s.close()
        elif op == "records":  # tool.record as fast as answered
            s = connect()
            out = {}
            for i in range(step["n"]):
                s.sendall(frame(i + 1, "tool.record", {
                    "token": TOKEN, "name": "flood", "tool_call": f"tc-{i:016x}",
                    "args": {"blob": "x" * step["size"]}, "result_size": 0, "duration": 0.0, "ok": True}))
                got = read_frame(s)
                key = "ok" if got.get("ok") else got["error"]["code"]
                out[key] = out.get(key, 0) + 1
                if key == "ok":
                    out["last_seq"] = got["result"]["seq"]
            s.close()
        print(json.dumps({"step": n, "op": op, "out": out}), flush=True)
    """
)


def flood_policy(tmp_path: Path, plan: list[dict[str, Any]], *, name: str, **extra: Any) -> Path:
    """A policy running ``FLOOD_AGENT`` over ``plan`` in a workspace of its own."""
    ws = workspace(tmp_path, f"ws-{name}")
    plan_file = ws / f"plan-{name}.json"
    tools = extra.pop(
        "tools",
        [
            {"id": "questions", "intent": "ask", "verdict": "allow"},
            {"id": "echo", "intent": "exec", "verdict": "allow", "match": {"argv": "/bin/echo *"}},
        ],
    )
    return agent_policy(
        tmp_path,
        plan,
        name=name,
        ws=ws,
        tools=tools,
        command=[PY, "-c", FLOOD_AGENT, str(plan_file)],
        **extra,
    )


def _lines(wire: Wire, run: str) -> list[dict[str, Any]]:
    data = wire.call("run.logs", {"run": run})["data"]
    return [json.loads(line) for line in data.splitlines() if line.startswith("{")]


def test_one_runs_open_questions_do_not_hold_up_another_runs_exec(tmp_path: Path) -> None:
    from stockade.daemon._peer import MAX_BROKER_CONNECTIONS

    # 64 questions filled the daemon-wide pool of 64 worker threads, and
    # another run's exec waited for one of them until its client gave up.
    n = MAX_BROKER_CONNECTIONS
    asker = flood_policy(tmp_path, [{"op": "asks", "n": n}], name="asker")
    echo = {"op": "intent", "intent": "exec", "args": {"argv": ["/bin/echo", "still", "served"]}}
    other = flood_policy(tmp_path, [echo], name="other")
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        flood = wire.call("run.start", {"policy_path": str(asker), "detach": True})
        for _ in range(n):
            events.until(kind_is("approval.asked", flood["id"]))
        _info, lines = run_to_end(wire, events, other)
        ran = lines[0]["out"]["result"]
        assert ran["verdict"] == "allow" and ran["value"]["stdout"]["content"] == "still served\n"
        pending = wire.call("approvals.list")["approvals"]
        assert len(pending) == n and {a["run"] for a in pending} == {flood["id"]}, "the flood was not held"
        for a in pending:
            wire.call(
                "approvals.decide", {"id": a["id"], "decision": "approve", "reason": a["args"]["question"]}
            )
        events.until(kind_is("run.end", flood["id"]))
        answers = _lines(wire, flood["id"])[0]["out"]
        assert [a["result"]["value"]["answer"] for a in answers] == [f"question {i}" for i in range(n)]


def test_a_runs_bundle_carries_the_head_at_its_end(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from stockade.cli._record_cmds import verify
    from stockade.record import open_store

    policy = flood_policy(tmp_path, [], name="short")
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info, _lines = run_to_end(wire, events, policy)
        meta = json.loads((tmp_path / "state" / "runs" / info["id"] / "run.json").read_text())
    head = meta["record"]
    db = str(tmp_path / "state" / "events.db")
    with open_store(db, readonly=True) as store:
        ends = [s for s in store.query(run=info["id"]) if s.event.kind == "run.end"]
    assert [(s.seq, s.hash) for s in ends] == [(head["seq"], head["hash"])]
    result = CliRunner().invoke(verify, ["--db", db, "--expect", f"{head['seq']}:{head['hash']}"])
    assert result.exit_code == 0 and "the chain holds the expected head(s)" in result.output
