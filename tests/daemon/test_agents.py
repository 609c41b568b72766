"""Groups of agents under a real daemon: a run spawns a helper through its broker
(``agent.spawn``), they message each other (``agent.send``, ``agent.recv``),
a too-wide helper and a stranger are refused, and stopping or halting the
parent stops the helper with it. The agents are ``/usr/bin/python3`` speaking
the framing by hand (``tests.daemon.test_server.AGENT``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_server import (
    AGENT,
    PY,
    Wire,
    agent_policy,
    close_wires,  # noqa: F401  (the fixture that closes every Wire)
    daemon_at,
    kind_is,
    release,
    run_to_end,
    stored_events,
    wait_output,
    workspace,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells under the daemon need root on this host")

AGENT_TOOLS = [
    {"id": "spawn", "intent": "agent.spawn", "verdict": "allow"},
    {"id": "send", "intent": "agent.send", "verdict": "allow"},
    {"id": "recv", "intent": "agent.recv", "verdict": "allow"},
]


def helper_policy(ws: Path, plan: list[dict[str, Any]], name: str = "helper", **extra: Any) -> str:
    """The text of a helper's policy: the hand-framing agent over ``plan`` (written
    in the shared workspace), allowed to message its family."""
    plan_file = ws / f"plan-{name}.json"
    plan_file.write_text(json.dumps(plan))
    policy = {
        "name": name,
        "command": [PY, "-c", AGENT, str(plan_file)],
        "tools": [
            {"id": "send", "intent": "agent.send", "verdict": "allow"},
            {"id": "recv", "intent": "agent.recv", "verdict": "allow"},
        ],
        **extra,
    }
    return json.dumps(policy)


def spawn(policy: str, **args: Any) -> dict[str, Any]:
    return {"op": "intent", "intent": "agent.spawn", "args": {"policy": policy, **args}}


def lines_of(wire: Wire, run: str) -> list[dict[str, Any]]:
    data = wire.call("run.logs", {"run": run})["data"]
    return [json.loads(line) for line in data.splitlines() if line.startswith("{")]


def run_info(wire: Wire, run: str) -> dict[str, Any]:
    return next(r for r in wire.call("run.list")["runs"] if r["id"] == run)


def cell_processes(cells: list[str]) -> list[int]:
    """Living processes (not zombies) in the cgroups of ``cells``."""
    found = []
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
        if any(cell in text for cell in cells) and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def spawned_helper(socket_path: str, parent: str) -> str:
    """The id of the helper ``parent`` spawned, read from its transcript once it got the answer."""
    seen = wait_output(socket_path, parent, '"op": "intent"')
    first = json.loads(seen.splitlines()[0])
    result = first["out"]["result"]
    assert result["verdict"] == "allow", result
    return str(result["value"]["run"])


def test_a_helper_is_spawned_and_they_message_each_other(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    child = helper_policy(
        ws,
        [
            {"op": "intent", "intent": "agent.recv", "args": {"timeout": 60}},
            {"op": "intent", "intent": "agent.send", "args": {"to": "agent", "message": "pong"}},
        ],
    )
    plan = [
        spawn(child, name="helper"),
        {"op": "intent", "intent": "agent.send", "args": {"to": "helper", "message": "ping"}},
        {"op": "intent", "intent": "agent.recv", "args": {"timeout": 60}},
    ]
    policy = agent_policy(tmp_path, plan, tools=AGENT_TOOLS, ws=ws)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info, lines = run_to_end(wire, events, policy)
        assert info["exit_code"] == 0, lines
        spawned = lines[0]["out"]["result"]
        assert spawned["verdict"] == "allow" and spawned["rule"] == "spawn"
        helper = spawned["value"]["run"]
        assert spawned["value"]["name"] == "helper"
        sent = lines[1]["out"]["result"]
        assert sent["verdict"] == "allow" and sent["value"] == {"to": helper, "size": 4}
        got = lines[2]["out"]["result"]["value"]
        assert (got["from"], got["name"], got["message"]) == (helper, "helper", "pong")
        # The helper is a run of its own, whose parent is the spawning run.
        if run_info(wire, helper)["state"] in ("running", "stopping"):
            events.until(kind_is("run.end", helper))
        mine = run_info(wire, helper)
        assert mine["parent"] == info["id"] and info["children"] == [helper]
        assert mine["workspace"] == info["workspace"] == str(ws)
        assert mine["exit_code"] == 0
        heard = lines_of(wire, helper)[0]["out"]["result"]["value"]
        assert (heard["from"], heard["message"]) == (info["id"], "ping")
        # Every message is recorded, as the sender's event.
        messages = [e["event"] for e in stored_events(wire) if e["event"]["kind"] == "agent.message"]
        details = [
            (m["run"], m["detail"]["from"], m["detail"]["to"], m["detail"]["message"]) for m in messages
        ]
        assert details == [(info["id"], info["id"], helper, "ping"), (helper, helper, info["id"], "pong")]
        assert all(m["layer"] == "broker" and m["outcome"] == "info" for m in messages)
        assert messages[0]["detail"]["size"] == 4


def test_a_too_wide_helper_a_stranger_and_a_bad_policy_are_refused(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    holder_ws = workspace(tmp_path, "holder")
    fifo = holder_ws / "hold"
    os.mkfifo(fifo, 0o666)
    holder = agent_policy(tmp_path, [{"op": "block", "fifo": str(fifo)}], name="holder", ws=holder_ws)
    wide = helper_policy(ws, [], filesystem={"read": ["/opt"]}, limits={"denials": 50})
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        stranger = wire.call("run.start", {"policy_path": str(holder), "detach": True})["id"]
        plan = [
            spawn(wide),
            {"op": "intent", "intent": "agent.send", "args": {"to": stranger, "message": "hello"}},
            {"op": "intent", "intent": "agent.send", "args": {"to": "holder", "message": "hello"}},
            spawn("name: [not, a, name]"),
        ]
        policy = agent_policy(tmp_path, plan, tools=AGENT_TOOLS, ws=ws)
        info, lines = run_to_end(wire, events, policy)
        refused = lines[0]["out"]["result"]
        assert refused["verdict"] == "deny" and refused["rule"] == "spawn"
        assert "filesystem.read '/opt' is not within the parent's readable paths" in refused["reason"]
        assert "limits.denials 50 is more than the parent's 10" in refused["reason"]
        for line in lines[1:3]:
            result = line["out"]["result"]
            assert result["verdict"] == "deny" and "not a run of this run's family" in result["reason"]
        bad = lines[3]["out"]["error"]
        assert bad["code"] == "bad_params" and "'policy' is not a valid policy" in bad["message"]
        # Three denials, recorded and counted; the malformed spawn neither.
        assert info["denials"] == 3 and info["intents"] == 3 and info["children"] == []
        assert not [r for r in wire.call("run.list")["runs"] if r["parent"]]
        recorded = [e["event"] for e in stored_events(wire, info["id"]) if e["event"]["kind"] == "intent"]
        assert [e["detail"]["verdict"] for e in recorded] == ["deny", "deny", "deny"]
        assert "filesystem.read '/opt'" in recorded[0]["detail"]["reason"]
        assert not [e for e in stored_events(wire) if e["event"]["kind"] == "agent.message"]
        wait_output(dt.socket_path, stranger, "blocking")
        release(fifo)
        events.until(kind_is("run.end", stranger))


def test_stopping_the_parent_stops_its_helper(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    parent_fifo, helper_fifo = ws / "parent-hold", ws / "helper-hold"
    os.mkfifo(parent_fifo, 0o666)
    os.mkfifo(helper_fifo, 0o666)
    child = helper_policy(ws, [{"op": "block", "fifo": str(helper_fifo)}])
    plan = [spawn(child), {"op": "block", "fifo": str(parent_fifo)}]
    policy = agent_policy(tmp_path, plan, tools=AGENT_TOOLS, ws=ws)
    with daemon_at(tmp_path) as dt:
        wire = Wire(dt.socket_path)
        parent = wire.call("run.start", {"policy_path": str(policy), "detach": True})["id"]
        helper = spawned_helper(dt.socket_path, parent)
        wait_output(dt.socket_path, helper, "blocking")
        cells = run_info(wire, helper)["cells"]
        assert cells and cell_processes(cells), "the helper's cell is not running"
        # One command stops the whole group.
        wire.call("run.stop", {"run": parent, "grace": 0})
        stopped = run_info(wire, helper)
        assert stopped["state"] == "ended" and stopped["exit_code"] == 137
        assert f"with its parent {parent}" in stopped["stopped_by"]
        assert run_info(wire, parent)["state"] == "ended"
        assert cell_processes(cells) == []


def test_a_halted_parent_stops_its_helper(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    helper_fifo = ws / "helper-hold"
    os.mkfifo(helper_fifo, 0o666)
    child = helper_policy(ws, [{"op": "block", "fifo": str(helper_fifo)}], limits={"denials": 2})
    deny = {"op": "intent", "intent": "fs.read", "args": {"path": "/etc/hostname"}}
    parent_fifo = ws / "parent-hold"
    os.mkfifo(parent_fifo, 0o666)
    plan = [spawn(child), {"op": "block", "fifo": str(parent_fifo)}, deny, deny]
    policy = agent_policy(tmp_path, plan, tools=AGENT_TOOLS, ws=ws, limits={"denials": 2})
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        parent = wire.call("run.start", {"policy_path": str(policy), "detach": True})["id"]
        helper = spawned_helper(dt.socket_path, parent)
        wait_output(dt.socket_path, helper, "blocking")
        cells = run_info(wire, helper)["cells"]
        release(parent_fifo)  # on to the two denials: the tripwire halts the parent
        wanted = {("run.halted", parent), ("run.end", helper)}

        def both(stored: dict[str, Any]) -> bool:
            event = stored.get("event", stored)
            wanted.discard((event.get("kind"), event.get("run")))
            return not wanted

        events.until(both)
        stopped = run_info(wire, helper)
        assert stopped["state"] == "ended" and stopped["exit_code"] == 137
        assert stopped["stopped_by"] == f"its parent {parent} was halted"
        assert cell_processes(cells) == []
        events.until(kind_is("run.end", parent))
        assert run_info(wire, parent)["state"] == "halted"
