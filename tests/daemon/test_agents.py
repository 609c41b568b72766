"""Groups of agents under a real daemon: a run spawns a helper through its broker
(``agent.spawn``), they message each other (``agent.send``, ``agent.recv``),
a too-wide helper and a stranger are refused, and stopping or halting the
parent stops the helper with it. The agents are ``/usr/bin/python3`` speaking
the framing by hand (``tests.daemon.test_server.AGENT``)."""

from __future__ import annotations

import asyncio
import json
import os
import types
from pathlib import Path
from typing import Any, cast

import pytest

from stockade.broker._rules import Decision
from stockade.daemon._agents import Agents, Mailbox, Message
from stockade.daemon._runs import RequestError, Run
from stockade.policy import loads_policy
from stockade.record import Event
from tests.daemon._family import idle_agents, idle_run
from tests.daemon.test_server import (
    AGENT,
    PY,
    Wire,
    agent_policy,
    close_wires,  # noqa: F401  (the fixture that closes every Wire)
    daemon_at,
    kind_is,
    living_processes,
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
    return list(living_processes(lambda text: any(cell in text for cell in cells)))


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
        info, lines = run_to_end(wire, events, policy, unattended=True)
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
        assert mine["exit_code"] == 0 and mine["unattended"] is True  # as its parent is
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
    # A link in the shared workspace to a place the parent cannot see: the cell
    # would mount the link's target, so the proof follows it.
    private = tmp_path / "private"
    private.mkdir()
    (ws / "link").symlink_to(private)
    linked = helper_policy(ws, [], name="linked", filesystem={"read": [str(ws / "link")]})
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        stranger = wire.call("run.start", {"policy_path": str(holder), "detach": True})["id"]
        plan = [
            spawn(wide),
            {"op": "intent", "intent": "agent.send", "args": {"to": stranger, "message": "hello"}},
            {"op": "intent", "intent": "agent.send", "args": {"to": "holder", "message": "hello"}},
            spawn(linked),
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
        through = lines[3]["out"]["result"]
        assert through["verdict"] == "deny"
        assert (
            f"following symbolic links (as the cell does), filesystem.read '{private}'" in through["reason"]
        )
        bad = lines[4]["out"]["error"]
        assert bad["code"] == "bad_params" and "'policy' is not a valid policy" in bad["message"]
        # Four denials, recorded and counted; the malformed spawn neither.
        assert info["denials"] == 4 and info["intents"] == 4 and info["children"] == []
        assert not [r for r in wire.call("run.list")["runs"] if r["parent"]]
        recorded = [e["event"] for e in stored_events(wire, info["id"]) if e["event"]["kind"] == "intent"]
        assert [e["detail"]["verdict"] for e in recorded] == ["deny"] * 4
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
        wanted = {("run.halted", parent), ("run.end", helper), ("run.end", parent)}

        def both(stored: dict[str, Any]) -> bool:
            event = stored.get("event", stored)
            wanted.discard((event.get("kind"), event.get("run")))
            return not wanted

        events.until(both)
        stopped = run_info(wire, helper)
        assert stopped["state"] == "ended" and stopped["exit_code"] == 137
        assert stopped["stopped_by"] == f"its parent {parent} was halted"
        assert cell_processes(cells) == []
        assert run_info(wire, parent)["state"] == "halted"


# ----------------------------------------------------- families, limits, mailboxes (no cells)


def _runs_of(*names: str, parents: dict[str, str] | None = None) -> tuple[Agents, dict[str, Run]]:
    """Runs by name (id ``r-<name>``) and the ``Agents`` that sees them, with the parent links given."""
    policy = loads_policy(
        "name: p\nworkspace: /work/ws\ntools: [{id: s, intent: agent.spawn, verdict: allow}]\n"
    )
    # Helpers carve their limits from their root's (the family's limits are
    # the root's), so a helper here asks for a sixteenth of the defaults.
    helper = loads_policy(
        "name: p\nworkspace: /work/ws\nlimits: {memory: 64M, pids: 16}\n"
        "tools: [{id: s, intent: agent.spawn, verdict: allow}]\n"
    )
    made = {
        name: idle_run(
            name, helper if name in (parents or {}) else policy, shown_as=name.rstrip("0123456789")
        )
        for name in names
    }
    for child, parent in (parents or {}).items():
        made[child].parent = made[parent].id
        made[parent].children.append(made[child].id)
    agents = idle_agents(made.values())
    return agents, made


ALLOW = Decision("allow", "s", "allowed")
HELPER = "name: h\ncommand: [true]\nfilesystem: {read: [/usr/lib]}\nlimits: {memory: 64M, pids: 16}\n"


def test_family_is_parent_siblings_and_helpers_never_strangers() -> None:
    agents, r = _runs_of(
        "root", "a", "b", "c", "x", "stranger", parents={"a": "root", "b": "root", "c": "a", "x": "c"}
    )
    names = {run.id: {m.id for m in agents.family(run)} for run in r.values()}
    assert names["r-a"] == {"r-root", "r-b", "r-c"}
    assert names["r-root"] == {"r-a", "r-b"}
    assert names["r-c"] == {"r-a", "r-x"}  # not its grandparent, not its uncle
    assert names["r-stranger"] == set()
    send = {"to": "r-stranger", "message": "hi"}
    denied = agents.decide(r["a"], "agent.send", send, ALLOW)
    assert denied.verdict == "deny" and "not a run of this run's family" in denied.reason
    assert agents.decide(r["a"], "agent.send", {"to": "b", "message": "hi"}, ALLOW) == ALLOW
    assert agents.decide(r["a"], "agent.send", {"to": "r-root", "message": "hi"}, ALLOW) == ALLOW
    assert agents.decide(r["a"], "agent.send", {"to": "r-a", "message": "hi"}, ALLOW).verdict == "deny"
    # A rule's denial stays a denial, whoever is named.
    ruled = Decision("deny", None, "no rule")
    assert agents.decide(r["a"], "agent.send", {"to": "b", "message": "hi"}, ruled) is ruled


def test_a_name_several_running_siblings_share_needs_an_id() -> None:
    agents, r = _runs_of("root", "w1", "w2", parents={"w1": "root", "w2": "root"})
    ambiguous = agents.decide(r["root"], "agent.send", {"to": "w", "message": "hi"}, ALLOW)
    assert ambiguous.verdict == "deny" and "(r-w1, r-w2); give an id" in ambiguous.reason
    r["w1"].done.set()
    assert agents.decide(r["root"], "agent.send", {"to": "w", "message": "hi"}, ALLOW) == ALLOW


def test_helpers_go_four_levels_deep_and_sixteen_at_once() -> None:
    chain = {f"d{i}": f"d{i - 1}" for i in range(1, 5)}
    agents, r = _runs_of("d0", "d1", "d2", "d3", "d4", parents=chain)
    assert agents.decide(r["d3"], "agent.spawn", {"policy": HELPER}, ALLOW) == ALLOW
    deep = agents.decide(r["d4"], "agent.spawn", {"policy": HELPER}, ALLOW)
    assert deep.verdict == "deny" and "4 levels deep, the most there may be (4)" in deep.reason
    many = [f"k{i}" for i in range(16)]
    agents, r = _runs_of("root", *many, parents=dict.fromkeys(many, "root"))
    full = agents.decide(r["root"], "agent.spawn", {"policy": HELPER}, ALLOW)
    assert full.verdict == "deny" and "16 helpers running" in full.reason
    r["k0"].done.set()  # one ended: room for another
    assert agents.decide(r["root"], "agent.spawn", {"policy": HELPER}, ALLOW) == ALLOW
    r["root"].state = "stopping"
    stopping = agents.decide(r["root"], "agent.spawn", {"policy": HELPER}, ALLOW)
    assert stopping.verdict == "deny" and "is stopping" in stopping.reason


def test_a_spawn_is_proven_even_when_it_would_ask_and_a_bad_policy_is_bad_params() -> None:
    agents, r = _runs_of("root")
    ask = Decision("ask", "s", "ask first")
    wide = agents.decide(r["root"], "agent.spawn", {"policy": "name: h\ncommand: [true]\nmode: audit\n"}, ask)
    assert wide.verdict == "deny" and wide.rule == "s" and "mode 'audit'" in wide.reason
    assert agents.decide(r["root"], "agent.spawn", {"policy": HELPER}, ask) is ask
    with pytest.raises(RequestError, match="'policy' is not a valid policy") as info:
        agents.decide(r["root"], "agent.spawn", {"policy": "mode: enforce\n"}, Decision("deny", None, "x"))
    assert info.value.code == "bad_params"
    with pytest.raises(RequestError, match="give 'argv', or a command in the policy") as info:
        agents.decide(r["root"], "agent.spawn", {"policy": "name: h\n"}, ALLOW)
    assert info.value.code == "bad_params"
    assert agents.decide(r["root"], "agent.spawn", {"policy": "name: h\n", "argv": ["true"]}, ALLOW) == ALLOW


def test_a_mailbox_keeps_order_wakes_its_reader_and_is_bounded() -> None:
    async def scenario() -> None:
        box = Mailbox()
        assert await box.get(0) is None
        reader = asyncio.ensure_future(box.get(300))
        await asyncio.sleep(0)  # let the reader start waiting (a scheduling step, not a wait for time)
        assert not reader.done()
        box.put(Message("r-a", "a", "first", 1.0, 5))
        box.put(Message("r-a", "a", "second", 2.0, 6))
        got = await reader
        assert got is not None and got.text == "first"
        again = await box.get(0)
        assert again is not None and again.text == "second" and box.bytes == 0
        for i in range(1000):
            assert box.full(1) is None
            box.put(Message("r-a", "a", str(i), 0.0, 1))
        assert box.full(1) == "1000 messages"
        closing = Mailbox()
        waiting = asyncio.ensure_future(closing.get(300))
        await asyncio.sleep(0)
        closing.close()
        assert await waiting is None
        assert Mailbox().full(16 * 1024 * 1024 + 1) == "16 MiB of messages"

    asyncio.run(scenario())


def test_send_records_then_delivers_and_refuses_a_full_or_ended_mailbox() -> None:
    agents, r = _runs_of("root", "kid", parents={"kid": "root"})
    recorded: list[Event] = []

    async def record_soon(events: list[Event]) -> None:
        recorded.extend(events)

    cast("Any", agents)._recorder = types.SimpleNamespace(record_soon=record_soon)

    async def scenario() -> None:
        long = "x" * 5000
        sent = await agents.execute(r["root"], "c-1", "agent.send", {"to": "kid", "message": long})
        assert sent == {"to": "r-kid", "size": 5000}
        event = recorded[-1]
        assert (event.kind, event.layer, event.outcome, event.run, event.cell) == (
            "agent.message",
            "broker",
            "info",
            "r-root",
            "c-1",
        )
        assert event.detail["message"] == "x" * 2000 and event.detail["truncated"] is True
        assert (event.detail["from"], event.detail["to"], event.detail["size"]) == ("r-root", "r-kid", 5000)
        got = await agents.execute(r["kid"], "c-2", "agent.recv", {"timeout": 0})
        assert (got["from"], got["name"], got["message"]) == ("r-root", "root", long)
        assert await agents.execute(r["kid"], "c-2", "agent.recv", {"timeout": 0}) == {"timeout": True}
        for i in range(1000):
            await agents.execute(r["root"], "c-1", "agent.send", {"to": "kid", "message": str(i)})
        before = len(recorded)
        full = await agents.execute(r["root"], "c-1", "agent.send", {"to": "kid", "message": "one more"})
        assert full["error"]["code"] == "full" and "1000 messages" in full["error"]["message"]
        assert len(recorded) == before, "a refused message was recorded as sent"
        first = await agents.execute(r["kid"], "c-2", "agent.recv", {})
        assert first["message"] == "0"
        r["kid"].state = "ended"
        r["kid"].done.set()
        agents.ended(r["kid"])
        gone = await agents.execute(r["root"], "c-1", "agent.send", {"to": "kid", "message": "late"})
        assert gone["error"]["code"] == "gone"

    asyncio.run(scenario())
