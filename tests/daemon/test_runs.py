"""Runs under the daemon and the broker's serving side, for real: an agent in a
cell (``/usr/bin/python3`` with the standard library only) speaks the framing
by hand on its broker socket, and the test reads the verdicts it got, the
transcript and the record."""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_server import (
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


def _frame_hex(body: bytes) -> str:
    return (struct.pack(">I", len(body)) + body).hex()


def _intents(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["event"] for e in events if e["event"]["kind"] == "intent"]


def test_intents_allowed_denied_forged_and_hostile(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    plan = [
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}},
        {"op": "intent", "intent": "fs.read", "args": {"path": "/etc/hostname"}},
        {
            "op": "intent",
            "intent": "fs.read",
            "args": {"path": f"{granted}/ok.txt", "password": "hunter2"},
            "token": "forged",
        },
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}, "token": "not-a-token"},
        # Garbage, then a good request on the same connection: answered, and it goes on.
        {"op": "raw", "hex": _frame_hex(b"\x00\x01garbage"), "then_valid": True, "replies": 2},
        # A frame claiming 64 MiB: refused, the connection closed.
        {"op": "raw", "hex": struct.pack(">I", 64 << 20).hex() + "00" * 16},
        {"op": "partial"},
        {"op": "raw", "hex": _frame_hex(b'{"v":1,"id":3,"method":"status","params":{}}')},
        # Allowed by the rule, but not the intent's arguments: refused before any decision.
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt", "follow": True}},
    ]
    policy = agent_policy(tmp_path, plan)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info, lines = run_to_end(wire, events, policy)
        assert info["exit_code"] == 0, wire.call("run.logs", {"run": info["id"]})
        out = {line["step"]: line["out"] for line in lines}
        allowed = out[1]["result"]
        assert allowed["verdict"] == "allow" and allowed["rule"] == "read-granted"
        assert allowed["value"]["content"] == "the granted file\n"
        assert out[2]["result"]["verdict"] == "deny" and out[2]["result"]["rule"] is None
        assert out[3]["error"]["code"] == "unauthorized" and "forged" in out[3]["error"]["message"]
        assert out[4]["error"]["code"] == "unauthorized"
        garbage, after = out[5]
        assert garbage["error"]["code"] in ("bad_json", "bad_frame")
        assert after["ok"] is True and after["result"]["verdict"] == "deny"  # fs.list: no rule
        assert out[6][0]["error"]["code"] == "too_large"
        assert out[8][0]["error"]["code"] == "unknown_method"
        assert out[9]["error"]["code"] == "bad_params" and "follow" in out[9]["error"]["message"]
        # Every decision is an event, in the order the agent made them.
        recorded = _intents(stored_events(wire, info["id"]))
        verdicts = [(e["detail"]["verdict"], e["detail"]["reason"].split(":")[0]) for e in recorded]
        assert [v for v, _ in verdicts] == ["allow", "deny", "deny", "deny", "deny"]
        assert verdicts[2][1] == verdicts[3][1] == "unauthorized"
        assert {e["run"] for e in recorded} == {info["id"]}
        assert all(e["cell"] == info["cells"][0] for e in recorded), "intents not attributed to the cell"
        # Secrets never reach the record.
        assert recorded[2]["detail"]["args"]["password"] == "[redacted]"
        token = dt.daemon.runs.runs[info["id"]].token  # type: ignore[union-attr]
        everything = json.dumps(stored_events(wire))
        assert token not in everything and token[-20:] not in everything
        assert info["denials"] == 4 and info["intents"] == 5
        assert wire.call("verify")["ok"] is True


def test_a_read_the_rules_allow_but_the_broker_refuses_is_recorded_twice_and_counted(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "link.txt").symlink_to("/etc/hostname")
    plan = [
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/link.txt"}},
        {"op": "intent", "intent": "fs.list", "args": {"path": str(granted)}},
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/missing.txt"}},
    ]
    tools = [
        {"id": "read-granted", "intent": "fs.read", "verdict": "allow", "match": {"path": f"{granted}/*"}},
        {"id": "list-granted", "intent": "fs.list", "verdict": "allow", "match": {"path": str(granted)}},
    ]
    policy = agent_policy(tmp_path, plan, tools=tools)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info, lines = run_to_end(wire, events, policy)
        out = {line["step"]: line["out"] for line in lines}
        # The link: allowed by the rule, refused by the broker (it never follows one).
        refused = out[1]["result"]
        assert refused["verdict"] == "deny" and refused["rule"] == "read-granted"
        assert refused["reason"].startswith("refused by the broker") and "symbolic link" in refused["reason"]
        assert "hostname" not in json.dumps(refused.get("value") or {}).replace(str(granted), "")
        listed = out[2]["result"]
        assert listed["verdict"] == "allow" and {e["name"] for e in listed["value"]["entries"]} >= {"ok.txt"}
        missing = out[3]["result"]
        assert missing["verdict"] == "allow" and missing["value"]["error"]["code"] == "not_found"
        recorded = _intents(stored_events(wire, info["id"]))
        assert [(e["detail"]["intent"], e["detail"]["verdict"]) for e in recorded] == [
            ("fs.read", "allow"),
            ("fs.read", "deny"),  # the broker's refusal, right after the rule's verdict
            ("fs.list", "allow"),
            ("fs.read", "allow"),  # allowed; the file is missing (an error, not a denial)
        ]
        assert (
            recorded[1]["detail"]["rule"] == "read-granted"
            and "symbolic link" in recorded[1]["detail"]["reason"]
        )
        # One intent each, and the refusal counts toward the tripwire.
        assert info["intents"] == 3 and info["denials"] == 1
        assert wire.call("verify")["ok"] is True


def test_another_runs_token_is_refused_and_recorded(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    holder_ws = workspace(tmp_path, "holder")
    fifo = holder_ws / "hold"
    os.mkfifo(fifo, 0o666)
    holder = agent_policy(tmp_path, [{"op": "block", "fifo": str(fifo)}], name="holder", ws=holder_ws)
    thief_ws = workspace(tmp_path, "thief")
    stolen = thief_ws / "stolen-token"
    thief = agent_policy(
        tmp_path,
        [
            {
                "op": "intent",
                "intent": "fs.read",
                "args": {"path": f"{granted}/ok.txt"},
                "token": f"file:{stolen}",
            }
        ],
        name="thief",
        ws=thief_ws,
    )
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        first = wire.call("run.start", {"policy_path": str(holder), "detach": True})
        assert dt.daemon.runs is not None
        stolen.write_text(dt.daemon.runs.runs[first["id"]].token)
        info, lines = run_to_end(wire, events, thief)
        assert lines[0]["out"]["error"]["code"] == "unauthorized"
        assert "another run's" in lines[0]["out"]["error"]["message"]
        recorded = _intents(stored_events(wire, info["id"]))
        assert (
            recorded[0]["detail"]["verdict"] == "deny" and "another run's" in recorded[0]["detail"]["reason"]
        )
        wait_output(dt.socket_path, first["id"], "blocking")
        release(fifo)
        events.until(kind_is("run.end", first["id"]))


def test_the_tripwire_halts_the_run_and_later_intents_are_refused_and_recorded(tmp_path: Path) -> None:
    deny = {"op": "intent", "intent": "fs.read", "args": {"path": "/etc/hostname"}}
    plan = [deny, deny, deny, deny, deny]
    policy = agent_policy(tmp_path, plan, limits={"denials": 3})
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy)})
        seen = events.until(kind_is("run.end", info["id"]))
        kinds = [e["event"]["kind"] for e in seen]
        assert "run.halted" in kinds
        halted = next(e["event"] for e in seen if e["event"]["kind"] == "run.halted")
        assert "3 denials" in halted["detail"]["reason"]
        final = next(r for r in wire.call("run.list")["runs"] if r["id"] == info["id"])
        assert final["state"] == "halted" and final["halted"]
        # The third denial tripped it: the cell was killed there and then, so
        # the agent got at most one refusal past it before dying.
        recorded = _intents(stored_events(wire, info["id"]))
        assert [e["detail"]["verdict"] for e in recorded[:3]] == ["deny", "deny", "deny"]
        assert all("halted" in e["detail"]["reason"] for e in recorded[3:])
        assert final["exit_code"] == 137
        # Every later intent is refused and recorded (the socket is gone with the
        # cell, so go through the door a late connection's intent would take).
        runs = dt.daemon.runs
        assert runs is not None
        run = runs.runs[info["id"]]
        before = len(recorded)
        import asyncio

        from stockade.daemon._intent_path import PreparedRead
        from stockade.daemon._requests import RequestError

        async def late() -> str:
            params = {"token": run.token, "intent": "fs.read", "args": {"path": "/x"}}
            try:
                served = runs.intents.serve_intent(run, params, cell="")
                assert not isinstance(served, PreparedRead)  # a halted run's read is not done
                await served
            except RequestError as exc:
                return exc.code
            return "answered"

        loop = dt._loop
        assert loop is not None
        assert asyncio.run_coroutine_threadsafe(late(), loop).result(30) == "denied"
        recorded = _intents(stored_events(wire, info["id"]))
        assert len(recorded) == before + 1 and "halted" in recorded[-1]["detail"]["reason"]


def test_an_ask_is_answered_by_approvals_decide(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    tools = [{"id": "ask-first", "intent": "fs.read", "verdict": "ask"}]
    plan = [
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}},
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}},
    ]
    policy = agent_policy(tmp_path, plan, tools=tools)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
        asked = events.until(kind_is("approval.asked", info["id"]))[-1]["event"]["detail"]
        pending = wire.call("approvals.list")["approvals"]
        assert [a["id"] for a in pending] == [asked["id"]] and pending[0]["intent"] == "fs.read"
        decided = wire.call("approvals.decide", {"id": asked["id"], "decision": "approve", "reason": "fine"})
        assert decided["state"] == "approved"
        again = wire.request("approvals.decide", {"id": asked["id"], "decision": "deny", "reason": "late"})
        assert again["error"]["code"] == "conflict"
        second = events.until(kind_is("approval.asked", info["id"]))[-1]["event"]["detail"]
        wire.call("approvals.decide", {"id": second["id"], "decision": "deny", "reason": "not twice"})
        events.until(kind_is("run.end", info["id"]))
        lines = [json.loads(x) for x in wire.call("run.logs", {"run": info["id"]})["data"].splitlines()]
        first, then = lines[0]["out"]["result"], lines[1]["out"]["result"]
        assert first["verdict"] == "allow" and first["value"]["content"] == "the granted file\n"
        assert first["approval"] == asked["id"]
        assert then["verdict"] == "deny" and "not twice" in then["reason"]
        kinds = [e["event"]["kind"] for e in stored_events(wire, info["id"])]
        assert kinds.count("approval.asked") == 2 and kinds.count("approval.decided") == 2


def test_an_unanswered_ask_expires_as_a_denial(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    tools = [{"id": "ask-first", "intent": "fs.read", "verdict": "ask"}]
    plan = [{"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}}]
    policy = agent_policy(tmp_path, plan, tools=tools)
    with daemon_at(tmp_path, approval_timeout=0.3) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info, lines = run_to_end(wire, events, policy)
        result = lines[0]["out"]["result"]
        assert result["verdict"] == "deny" and "timeout" in result["reason"]
        decided = [
            e["event"] for e in stored_events(wire, info["id"]) if e["event"]["kind"] == "approval.decided"
        ]
        assert decided[0]["detail"]["by"] == "timeout" and decided[0]["outcome"] == "denied"
        assert info["denials"] == 1
        assert wire.call("approvals.list")["approvals"] == []


def test_unattended_denies_what_would_ask_and_counts_it(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    tools = [{"id": "ask-first", "intent": "fs.read", "verdict": "ask"}]
    plan = [{"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}}] * 2
    policy = agent_policy(tmp_path, plan, tools=tools)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info, lines = run_to_end(wire, events, policy, unattended=True)
        assert all(line["out"]["result"]["verdict"] == "deny" for line in lines)
        assert "unattended" in lines[0]["out"]["result"]["reason"]
        assert info["unattended_denials"] == 2 and info["denials"] == 2
        kinds = [e["event"]["kind"] for e in stored_events(wire, info["id"])]
        assert "approval.asked" not in kinds


def test_the_broker_socket_is_the_cells_own(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    fifo = ws / "hold"
    os.mkfifo(fifo, 0o666)
    policy = agent_policy(tmp_path, [{"op": "block", "fifo": str(fifo)}], ws=ws)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
        token = dt.daemon.runs.runs[info["id"]].token  # type: ignore[union-attr]
        sock = tmp_path / "state" / "runs" / info["id"] / "broker.sock"
        st = os.stat(sock)
        from stockade.cell._plan import _cell_identity

        assert stat.S_IMODE(st.st_mode) == 0o600
        assert (st.st_uid, st.st_gid) == _cell_identity(str(ws))
        assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o700
        wait_output(dt.socket_path, info["id"], "blocking")
        release(fifo)
        events.until(kind_is("run.end", info["id"]))
        assert not sock.exists(), "the broker socket outlived its run"
        meta = json.loads((sock.parent / "run.json").read_text())
        assert meta["state"] == "ended" and token not in json.dumps(meta)


def test_the_transcript_is_capped(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    policy = tmp_path / "p.json"
    policy.write_text(
        json.dumps(
            {
                "name": "chatty",
                "workspace": str(ws),
                "limits": {"output": 1000},
                "command": ["/usr/bin/python3", "-c", "print('x' * 100000)"],
            }
        )
    )
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy)})
        events.until(kind_is("run.end", info["id"]))
        final = next(r for r in wire.call("run.list")["runs"] if r["id"] == info["id"])
        assert final["transcript"]["bytes"] == 1000
        size = (tmp_path / "state" / "runs" / info["id"] / "transcript.log").stat().st_size
        assert size == 1000


def test_large_reads_exec_in_a_workbench_and_questions(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "big.bin").write_bytes(b"\xff" * (3 << 20))  # not UTF-8: base64, 4 MiB on the wire
    tools = [
        {"id": "read-granted", "intent": "fs.read", "verdict": "allow", "match": {"path": f"{granted}/*"}},
        {"id": "echo", "intent": "exec", "verdict": "allow", "match": {"argv": "/bin/echo *"}},
        {"id": "questions", "intent": "ask", "verdict": "allow"},
    ]
    plan = [
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/big.bin"}, "brief": True},
        {"op": "intent", "intent": "exec", "args": {"argv": ["/bin/echo", "from", "the", "workbench"]}},
        {"op": "intent", "intent": "ask", "args": {"question": "which colour?"}},
    ]
    policy = agent_policy(tmp_path, plan, tools=tools)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
        asked = events.until(kind_is("approval.asked", info["id"]))[-1]["event"]["detail"]
        assert asked["intent"] == "ask" and asked["args"]["question"] == "which colour?"
        wire.call("approvals.decide", {"id": asked["id"], "decision": "approve", "reason": "blue"})
        events.until(kind_is("run.end", info["id"]))
        data = wire.call("run.logs", {"run": info["id"]})["data"]
        out = {line["step"]: line["out"] for line in map(json.loads, data.splitlines())}
        big = out[1]["result"]["value"]
        assert big["size"] == 3 << 20 and big["encoding"] == "base64" and big["content"] == 4 << 20
        ran = out[2]["result"]["value"]
        assert ran["exit_code"] == 0 and ran["stdout"]["content"] == "from the workbench\n"
        assert out[3]["result"]["value"]["answer"] == "blue"
        stored = stored_events(wire, info["id"])
        cells = {e["event"]["cell"] for e in stored if e["event"]["kind"] == "cell.start"}
        assert ran["cell"] in cells and len(cells) == 2, "the workbench cell's events are not in the record"


def test_a_cell_cannot_make_the_daemon_hold_much_for_it(tmp_path: Path) -> None:
    from stockade.daemon._peer import BROKER_BUFFER_BUDGET, MAX_BROKER_CONNECTIONS

    granted = tmp_path / "granted"
    read = {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}}
    plan = [
        # Four unfinished 20 MiB frames, 17 MiB sent of each: past the run's budget.
        {"op": "hog", "conns": 4, "claim": 20 << 20, "send": 17 << 20},
        {"op": "many", "conns": MAX_BROKER_CONNECTIONS + 1},
        read,
    ]
    policy = agent_policy(tmp_path, plan)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info, lines = run_to_end(wire, events, policy)
        assert info["exit_code"] == 0
        out = {line["step"]: line["out"] for line in lines}
        hogged = out[1][-1]
        assert hogged["error"]["code"] == "too_large"
        assert f"{BROKER_BUFFER_BUDGET >> 20} MiB" in hogged["error"]["message"]
        assert out[2]["error"]["code"] == "unavailable" and "connections open" in out[2]["error"]["message"]
        assert out[3]["result"]["verdict"] == "allow", "the daemon stopped serving the run"
        assert wire.call("status")["pid"] == os.getpid()


def test_runs_started_at_once_each_get_their_own_cell_socket_and_token(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    read = {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}}
    policies = [
        agent_policy(tmp_path, [read, read], name=f"a{i}", ws=workspace(tmp_path, f"ws{i}")) for i in range(6)
    ]
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        # Pipelined: the daemon starts them concurrently, launching cells while
        # it makes the next runs' broker sockets.
        for i, policy in enumerate(policies, 1):
            wire.send(
                {
                    "v": 1,
                    "id": i,
                    "method": "run.start",
                    "params": {"policy_path": str(policy), "detach": True},
                }
            )
        started = [wire.read() for _ in policies]
        ids = {reply["result"]["id"] for reply in started if reply and reply["ok"]}
        assert len(ids) == len(policies), started
        ended: set[str] = set()
        while ended != ids:
            ended.add(events.until(lambda e: e["event"]["kind"] == "run.end")[-1]["event"]["run"])
        for run in wire.call("run.list")["runs"]:
            assert run["exit_code"] == 0 and run["intents"] == 2 and run["denials"] == 0, run


def test_run_start_takes_a_name_and_refuses_a_missing_workspace(tmp_path: Path) -> None:
    policy = agent_policy(tmp_path, [])
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info, _lines = run_to_end(wire, events, policy, name="pipeline/summarise-2")
        assert info["name"] == "pipeline/summarise-2"
        missing = wire.request("run.start", {"policy_path": str(policy), "workspace": str(tmp_path / "nope")})
        assert missing["error"]["code"] == "bad_params" and "not a directory" in missing["error"]["message"]
        bad = wire.request("run.start", {"policy_path": str(policy), "name": "../x"})
        assert bad["error"]["code"] == "bad_params" and "not a run name" in bad["error"]["message"]


def test_an_empty_fresh_workspace_is_removed_and_one_with_work_kept(tmp_path: Path) -> None:
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        empty = tmp_path / "empty.json"
        empty.write_text(json.dumps({"name": "idle", "command": ["/bin/true"]}))
        info, _ = run_to_end(wire, events, empty)
        assert info["workspace"].startswith("/var/lib/stockade/workspaces/")
        assert not os.path.exists(info["workspace"])
        worked = tmp_path / "worked.json"
        worked.write_text(json.dumps({"name": "busy", "command": ["/bin/sh", "-c", "echo result > out.txt"]}))
        info, _ = run_to_end(wire, events, worked)
        try:
            assert (Path(info["workspace"]) / "out.txt").read_text() == "result\n"
        finally:
            import shutil

            shutil.rmtree(info["workspace"], ignore_errors=True)
