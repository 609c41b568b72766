"""The SDK's calls for groups of agents (spawn, send, recv) against a real daemon:
a parent agent starts a helper with the SDK, and they talk through the broker."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.daemon.test_server import (
    Wire,
    close_wires,  # noqa: F401  (the fixture that closes every Wire)
    daemon_at,
    kind_is,
    run_to_end,
    workspace,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells under the daemon need root on this host")

PY = "/usr/bin/python3"
TOOLS = [
    {"id": "spawn", "intent": "agent.spawn", "verdict": "allow"},
    {"id": "send", "intent": "agent.send", "verdict": "allow"},
    {"id": "recv", "intent": "agent.recv", "verdict": "allow"},
]
CHILD = textwrap.dedent(
    """
    import stockade_agent as sa
    b = sa.Broker.connect()
    m = b.recv(60)
    b.send(m.sender, "pong:" + m.text)
    """
)
PARENT = textwrap.dedent(
    """
    import json, sys, stockade_agent as sa
    b = sa.Broker.connect()
    child = b.spawn(open(sys.argv[1]).read(), name="helper")
    b.send("helper", "ping")
    m = b.recv(60)
    print(json.dumps({"child": child, "from": m.sender, "name": m.name, "text": m.text}))
    try:
        b.send("stranger", "x")
        print(json.dumps({"stranger": "sent"}))
    except sa.Denied as e:
        print(json.dumps({"stranger": "denied", "reason": e.reason}))
    try:
        b.spawn(open(sys.argv[2]).read())
        print(json.dumps({"wide": "spawned"}))
    except sa.Denied as e:
        print(json.dumps({"wide": "denied", "reason": e.reason}))
    print(json.dumps({"nothing": b.recv(0) is None}))
    """
)


def test_spawn_send_and_recv_through_the_sdk(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    child = {"name": "helper", "command": [PY, "-c", CHILD], "tools": TOOLS[1:]}
    (ws / "child.json").write_text(json.dumps(child))
    wide = {"name": "wide", "command": [PY, "-c", "pass"], "filesystem": {"write": ["/opt"]}}
    (ws / "wide.json").write_text(json.dumps(wide))
    parent = {
        "name": "parent",
        "command": [PY, "-c", PARENT, str(ws / "child.json"), str(ws / "wide.json")],
        "workspace": str(ws),
        "tools": TOOLS,
    }
    policy = tmp_path / "parent.json"
    policy.write_text(json.dumps(parent))
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info, lines = run_to_end(wire, events, policy, unattended=True)
        assert info["exit_code"] == 0, wire.call("run.logs", {"run": info["id"]})
        first, stranger, wide_answer, nothing = lines
        assert first["child"] == info["children"][0]
        assert (first["from"], first["name"], first["text"]) == (first["child"], "helper", "pong:ping")
        assert stranger["stranger"] == "denied" and "stranger" in stranger["reason"]
        assert wide_answer["wide"] == "denied" and "/opt" in wide_answer["reason"]
        assert nothing == {"nothing": True}
        runs = {r["id"]: r for r in wire.call("run.list")["runs"]}
        if runs[first["child"]]["state"] in ("running", "stopping"):
            events.until(kind_is("run.end", first["child"]))
