"""A family of runs is held to its root's limits by the kernel (issue 12):
every cell of the family is made inside the root's family cgroup, so the
helpers' processes and the root's together stop at the root's limit, not
each at its own. Real helper agents under a real daemon."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.daemon.test_server import (
    PY,
    Wire,
    close_wires,  # noqa: F401  (the fixture that closes every Wire)
    daemon_at,
    kind_is,
    release,
    stored_events,
    wait_output,
    workspace,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells under the daemon need root on this host")

ROOT_PIDS, HELPER_PIDS, HELD = 48, 40, 30

# Forks children that wait on a pipe until it ends: ``n`` of them, or as many
# as the kernel allows (fork refused with EAGAIN at a pids limit).
FORKS = """
def fork_up_to(n):
    r, w = os.pipe()
    made = 0
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        made += 1
    return made, w
"""

ROOT = (
    "import json, os, socket, struct, sys\n"
    + FORKS
    + """
held, w = fork_up_to(int(sys.argv[1]))
print("held", held, flush=True)
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["STOCKADE_BROKER"])
body = json.dumps({"v": 1, "id": 1, "method": "intent", "params": {
    "token": os.environ["STOCKADE_TOKEN"], "intent": "agent.spawn",
    "args": {"policy": open(sys.argv[2]).read(), "name": "forker"}}}).encode()
s.sendall(struct.pack(">I", len(body)) + body)
n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
print(json.dumps({"op": "intent", "out": json.loads(s.recv(n, socket.MSG_WAITALL))}), flush=True)
open(sys.argv[3]).read()  # the fifo: until the test has the helper's count
"""
)

HELPER = (
    "import os, sys\n"
    + FORKS
    + """
made, w = fork_up_to(int(sys.argv[1]))
print("forked", made, flush=True)
"""
)


def test_a_helpers_processes_stop_at_what_the_root_left_of_its_limit(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    fifo = ws / "hold"
    os.mkfifo(fifo, 0o666)
    helper = {
        "name": "forker",
        "command": [PY, "-c", HELPER, str(HELPER_PIDS)],
        "limits": {"pids": HELPER_PIDS},
    }
    helper_file = ws / "helper.json"
    helper_file.write_text(json.dumps(helper))
    root = {
        "name": "root",
        "command": [PY, "-c", ROOT, str(HELD), str(helper_file), str(fifo)],
        "workspace": str(ws),
        "tools": [{"id": "spawn", "intent": "agent.spawn", "verdict": "allow"}],
        "limits": {"pids": ROOT_PIDS},
    }
    policy = tmp_path / "root.json"
    policy.write_text(json.dumps(root))
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True, "unattended": True})
        seen = wait_output(dt.socket_path, info["id"], '"op": "intent"')
        assert f"held {HELD}" in seen, seen
        helper_id = _helper_id(seen)
        forked = wait_output(dt.socket_path, helper_id, "forked ")
        made = int(forked.split("forked ")[1].split()[0])
        # The root's cell holds its HELD children, its python and its init:
        # the helper's cell (its python, its init) gets what is left of
        # ROOT_PIDS, well short of its own HELPER_PIDS.
        assert 1 <= made <= ROOT_PIDS - HELD - 2, f"the helper forked {made}"
        assert made < HELPER_PIDS - 2, "the helper got its own limit, not the family's"
        # The family cgroup is there while the family lives, with the root's limit.
        runs = dt.daemon.runs
        assert runs is not None
        family = runs.runs[info["id"]].family_cgroup
        assert family is not None
        pids_dirs = [p for p in family.paths if os.path.exists(f"{p}/pids.max")]
        assert pids_dirs and Path(f"{pids_dirs[0]}/pids.max").read_text().strip() == str(ROOT_PIDS)
        events.until(kind_is("run.end", helper_id))  # the helper ends on its own, first
        assert runs.runs[info["id"]].family_cgroup is not None, "the family outlives a helper"
        release(fifo)
        events.until(kind_is("run.end", info["id"]))
        # The family's last run ended: its cgroup is gone, and the root's
        # record says the family (not a cell) was held to its limit.
        assert runs.runs[info["id"]].family_cgroup is None
        assert not any(os.path.exists(p) for p in pids_dirs)
        limits = [e["event"] for e in stored_events(wire, info["id"]) if e["event"]["kind"] == "cell.limit"]
        theirs = [e["event"] for e in stored_events(wire, helper_id) if e["event"]["kind"] == "cell.limit"]
        assert [e["summary"] for e in theirs] == [
            f"process limit of its run's family (this cell held fewer than its own {HELPER_PIDS}) "
            "reached: fork refused"
        ]
        assert [(e["layer"], e["detail"]) for e in limits] == [("cgroup", {"family": info["id"]})]
        assert f"process limit of {ROOT_PIDS} reached" in limits[0]["summary"]


def _helper_id(seen: str) -> str:
    line = next(x for x in seen.splitlines() if x.startswith("{"))
    result = json.loads(line)["out"]["result"]
    assert result["verdict"] == "allow", result
    return str(result["value"]["run"])
