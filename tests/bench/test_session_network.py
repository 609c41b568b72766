"""A workbench session's own gateway: an allowed host is fetched through it
from a command in the session, any other is refused and recorded, and
``session.set_network`` changes its rules between phases (Harbor's dynamic
network policy). Everything runs in the bench world's network namespace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stockade.daemon._client import Client
from stockade.errors import RemoteError
from tests.bench.conftest import World

FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode().strip())\n"
    "except urllib.error.HTTPError as exc:\n"
    "    print('refused', exc.code); sys.exit(3)\n"
)


def _policy(ws: Path, hosts: list[str]) -> str:
    return json.dumps(
        {
            "name": "workbench",
            "workspace": str(ws),
            "network": {"allow": [{"host": h, "ports": [80, 443]} for h in hosts]},
        }
    )


def _fetch(session: Any, url: str) -> tuple[int, str]:
    r = session.exec(["/usr/bin/python3", "-I", "-c", FETCH, url], timeout=60)
    return r.returncode, r.stdout.decode().strip()


def test_a_session_fetches_its_allowed_host_and_is_refused_others(world: World, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with (
        Client(world.daemon.socket_path, timeout=60) as client,
        client.open_session(policy_text=_policy(ws, ["docs.example.com"])) as session,
    ):
        assert _fetch(session, "http://docs.example.com/api/version") == (0, "v42")
        code, out = _fetch(session, "http://elsewhere.example.org/")
        assert code == 3 and out == "refused 403", (code, out)
        page = client.call("events.export", format="jsonl", limit=1000)
        events = [json.loads(line)["event"] for line in page["data"].splitlines()]
        asked = [e for e in events if e["kind"] == "http.request"]
        assert any(e["outcome"] == "denied" and "elsewhere.example.org" in json.dumps(e) for e in asked)
        assert any(e["outcome"] != "denied" and "docs.example.com" in json.dumps(e) for e in asked)


def test_set_network_changes_the_sessions_rules_between_phases(world: World, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with (
        Client(world.daemon.socket_path, timeout=60) as client,
        client.open_session(policy_text=_policy(ws, ["docs.example.com"])) as session,
    ):
        sid = session.session_id
        assert _fetch(session, "http://docs.example.com/api/version") == (0, "v42")
        changed = client.call("session.set_network", session=sid, network={"allow": []})
        assert changed == {"session": sid, "allow": []}
        assert _fetch(session, "http://docs.example.com/api/version") == (3, "refused 403")
        assert session.set_network([{"host": "docs.example.com", "ports": [80]}]) == ["docs.example.com"]
        assert _fetch(session, "http://docs.example.com/api/version") == (0, "v42")  # the control
        for bad in ({"allow": [{"host": "*"}]}, {"loopback_ports": [80]}, "docs.example.com"):
            with pytest.raises(RemoteError) as refused:
                client.call("session.set_network", session=sid, network=bad)
            assert refused.value.code == "bad_params", refused.value
        page = client.call("events.export", format="jsonl", limit=1000)
        events = [json.loads(line)["event"] for line in page["data"].splitlines()]
    changes = [e for e in events if e["kind"] == "session.network" and e["detail"]["session"] == sid]
    assert [c["detail"]["allow"] for c in changes] == [[], ["docs.example.com"]]


def test_a_bound_sessions_own_gateway_counts_toward_its_run(world: World, tmp_path: Path) -> None:
    """Bound to a run but under a policy of its own: the session's gateway is
    its own (its rules, changeable), its refusals carry the run's id and count
    toward the run's tripwire; a session under the run's policy shares the run's
    gateway, whose rules set_network does not change."""
    ws = tmp_path / "ws"
    ws.mkdir()
    agent = json.dumps(
        {
            "name": "waiting-agent",
            "workspace": str(ws),
            "command": ["/bin/sleep", "60"],
            "limits": {"denials": 50},
        }
    )
    with Client(world.daemon.socket_path, timeout=60) as client:
        run = client.call("run.start", policy_text=agent, detach=True, unattended=True)
        try:
            with client.open_session(run=run["id"], policy_text=_policy(ws, ["docs.example.com"])) as own:
                assert _fetch(own, "http://docs.example.com/api/version") == (0, "v42")
                assert _fetch(own, "http://elsewhere.example.org/")[0] == 3
                client.call("session.set_network", session=own.session_id, network={"allow": []})
                assert _fetch(own, "http://docs.example.com/api/version")[0] == 3
            with client.open_session(run=run["id"]) as shared:
                with pytest.raises(RemoteError) as conflict:
                    client.call("session.set_network", session=shared.session_id, network={"allow": []})
                assert conflict.value.code == "conflict" and "policy of its own" in str(conflict.value)
            listed = next(r for r in client.call("run.list", all=True)["runs"] if r["id"] == run["id"])
            page = client.call("events.export", run=run["id"], format="jsonl", limit=1000)
        finally:
            client.call("run.stop", run=run["id"], grace=0)
    events = [json.loads(line)["event"] for line in page["data"].splitlines()]
    refused = [e for e in events if e["kind"] == "http.request" and e["outcome"] == "denied"]
    assert len(refused) == 2 and all(e["run"] == run["id"] for e in refused), refused
    assert listed["denials"] >= 2, listed
