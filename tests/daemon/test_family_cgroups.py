"""A family of runs is held to its root's limits by the kernel (issue 12):
every cell of the family is made inside the root's family cgroup, so the
helpers' processes and the root's together stop at the root's limit, not
each at its own. Real helper agents under a real daemon."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

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

HOLD = """
def hold(fifo):
    # A reader of the fifo before saying so: the test's release (never
    # blocking) would fail if it came before this open.
    import select
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    print("blocking", flush=True)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.poll()
    os.close(fd)
"""
"""The root's wait on the fifo, until the test releases it (after ``blocking``)."""

ROOT = (
    "import json, os, socket, struct, sys\n"
    + FORKS
    + HOLD
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
hold(sys.argv[3])  # until the test has the helper's count
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
        wait_output(dt.socket_path, info["id"], "blocking")
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


# The root of a family spawns its helper and waits on a fifo; what it does
# meanwhile is the test's: hold memory, or keep a core busy.
SPAWNER = HOLD + """
import json, os, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["STOCKADE_BROKER"])
body = json.dumps({"v": 1, "id": 1, "method": "intent", "params": {
    "token": os.environ["STOCKADE_TOKEN"], "intent": "agent.spawn",
    "args": {"policy": open(sys.argv[1]).read(), "name": "helper"}}}).encode()
s.sendall(struct.pack(">I", len(body)) + body)
n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
print(json.dumps({"op": "intent", "out": json.loads(s.recv(n, socket.MSG_WAITALL))}), flush=True)
hold(sys.argv[2])  # until the test has seen the helper end
"""

MIB = 1 << 20
FAMILY_MEMORY, ROOT_HOLDS, HELPER_MEMORY, HELPER_WANTS = 256 * MIB, 80 * MIB, 240 * MIB, 200 * MIB

MEMORY_ROOT = (
    f"held = b'\\x01' * {ROOT_HOLDS}  # touched: charged to the cgroup\n"
    "print('holding', len(held), flush=True)\n"
    + SPAWNER
    + "print('root alive', len(held), held.count(1), flush=True)\n"
)

# Allocates (and touches) 10 MiB at a time, saying how much it holds after each.
MEMORY_HELPER = f"""
chunks = []
while len(chunks) * 10 < {HELPER_WANTS // MIB}:
    chunks.append(b"\\x01" * (10 << 20))
    print("holds", len(chunks) * 10, flush=True)
print("done", flush=True)
"""


def _last(pushed: list[dict[str, Any]]) -> dict[str, Any]:
    event: dict[str, Any] = pushed[-1].get("event", pushed[-1])
    return event


def _family(
    tmp_path: Path, root_code: str, root_limits: dict[str, object], helper: dict[str, object]
) -> Path:
    ws = workspace(tmp_path)
    fifo = ws / "hold"
    os.mkfifo(fifo, 0o666)
    helper_file = ws / "helper.json"
    helper_file.write_text(json.dumps({"name": "helper", **helper}))
    root = {
        "name": "root",
        "command": [PY, "-c", root_code, str(helper_file), str(fifo)],
        "workspace": str(ws),
        "tools": [{"id": "spawn", "intent": "agent.spawn", "verdict": "allow"}],
        "limits": root_limits,
    }
    policy = tmp_path / "root.json"
    policy.write_text(json.dumps(root))
    return policy


@pytest.mark.xfail(
    strict=False,
    reason=(
        "not understood, and open: on fresh-clone CI runs (2 of the last 4) the helper held 190 MiB "
        "where the root's 80 left it 176 of the family's 256, and the family's memory directory was "
        "already gone when read after the helper ended; it passes on every run on a dev host"
    ),
)
def test_a_helpers_memory_stops_at_what_the_root_left_of_the_familys(tmp_path: Path) -> None:
    """The root holds 80 MiB of a family's 256; its helper, allowed 240 of
    its own, wants 200 and is OOM-killed inside the family, short of that;
    the root (the control) keeps its memory and goes on."""
    policy = _family(
        tmp_path,
        MEMORY_ROOT,
        {"memory": FAMILY_MEMORY},
        {"command": [PY, "-c", MEMORY_HELPER], "limits": {"memory": HELPER_MEMORY}},
    )
    fifo = tmp_path / "ws" / "hold"
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True, "unattended": True})
        seen = wait_output(dt.socket_path, info["id"], '"op": "intent"')
        assert f"holding {ROOT_HOLDS}" in seen, seen
        helper_id = _helper_id(seen)
        runs = dt.daemon.runs
        assert runs is not None
        family = runs.runs[info["id"]].family_cgroup
        assert family is not None
        memory_dirs = [p for p in family.paths if os.path.exists(f"{p}/memory.limit_in_bytes")]
        assert (
            memory_dirs and int(Path(f"{memory_dirs[0]}/memory.limit_in_bytes").read_text()) == FAMILY_MEMORY
        )
        end = _last(events.until(kind_is("run.end", helper_id)))
        transcript = wire.call("run.logs", {"run": helper_id})["data"]
        held = [int(line.split()[1]) for line in transcript.splitlines() if line.startswith("holds ")]
        assert "done" not in transcript, "the helper got its own limit, not what the family had left"
        # What the root left (256 - 80 MiB, less two interpreters) is what it could hold.
        # (On failure, what the family's counters say: whose memory was not charged to it.)
        counters = {
            name: Path(f"{memory_dirs[0]}/{name}").read_text().strip()
            for name in ("memory.max_usage_in_bytes", "memory.failcnt")
            if os.path.exists(f"{memory_dirs[0]}/{name}")
        }
        assert held and max(held) * MIB < FAMILY_MEMORY - ROOT_HOLDS, (held, counters)
        assert end["detail"]["exit_code"] != 0, end
        limits = [e["event"] for e in stored_events(wire, helper_id) if e["event"]["kind"] == "cell.limit"]
        assert any("memory limit" in e["summary"] for e in limits), limits
        wait_output(dt.socket_path, info["id"], "blocking")
        release(fifo)
        root_end = _last(events.until(kind_is("run.end", info["id"])))
        root_out = wire.call("run.logs", {"run": info["id"]})["data"]
        assert f"root alive {ROOT_HOLDS} {ROOT_HOLDS}" in root_out, root_out
        assert root_end["detail"]["exit_code"] == 0, root_end


CPU_ROOT = (
    "import os, signal, time\n"
    "spinner = os.fork()\n"
    "if spinner == 0:\n"
    "    while True:\n"
    "        pass\n"
    "print('spinning', flush=True)\n" + SPAWNER + "os.kill(spinner, signal.SIGKILL)\n"
)

# Spins until it has had a second of CPU; says when it starts and ends.
CPU_HELPER = """
import time
print("spinning", flush=True)
while time.process_time() < 1.0:
    pass
print("spun", flush=True)
"""

CPU_SHARE = 0.5


def _usage_ns(paths: tuple[str, ...]) -> int:
    """CPU time the family's processes have had (cgroup v2's ``cpu.stat``, always
    there, or v1's ``cpuacct.usage``)."""
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            for line in Path(f"{p}/cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) * 1000
        with contextlib.suppress(FileNotFoundError):
            return int(Path(f"{p}/cpuacct.usage").read_text())
    raise AssertionError(f"no CPU usage count in {paths}")


def test_a_familys_cpu_share_holds_across_its_cells(tmp_path: Path) -> None:
    """The root (half a core) keeps a process spinning; its helper (half a
    core of its own) spins beside it. Each cell alone may have half a core,
    so the two would have a whole one; the family, held to the root's half,
    gets no more than that in the helper's whole life: the family's usage
    over that window is bounded by its quota (plus one period each side),
    and both cells had a part of it."""
    policy = _family(
        tmp_path,
        CPU_ROOT,
        {"cpu": CPU_SHARE},
        {"command": [PY, "-c", CPU_HELPER], "limits": {"cpu": CPU_SHARE}},
    )
    fifo = tmp_path / "ws" / "hold"
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True, "unattended": True})
        seen = wait_output(dt.socket_path, info["id"], '"op": "intent"')
        helper_id = _helper_id(seen)
        runs = dt.daemon.runs
        assert runs is not None
        family = runs.runs[info["id"]].family_cgroup
        assert family is not None
        wait_output(dt.socket_path, helper_id, "spinning")
        used0, wall0 = _usage_ns(family.paths), time.monotonic_ns()
        events.until(kind_is("run.end", helper_id))
        used1, wall1 = _usage_ns(family.paths), time.monotonic_ns()
        assert "spun" in wire.call("run.logs", {"run": helper_id})["data"]
        period_ns = 100_000_000  # CFS_PERIOD_US
        allowed = CPU_SHARE * (wall1 - wall0) + 2 * CPU_SHARE * period_ns
        used = used1 - used0
        # The helper alone had a second of CPU in this window, the root's spinner its part too.
        assert used >= 1_000_000_000 * 0.9, used
        assert used <= allowed, (
            f"the family had {used / 1e9:.2f} s of CPU in {(wall1 - wall0) / 1e9:.2f} s, "
            f"past its share of {CPU_SHARE} core ({allowed / 1e9:.2f} s)"
        )
        cpu_dirs = [p for p in family.paths if os.path.exists(f"{p}/cpu.cfs_quota_us")]
        if cpu_dirs:  # cgroup v1 here: the root's quota on the family
            assert int(Path(f"{cpu_dirs[0]}/cpu.cfs_quota_us").read_text()) == int(
                CPU_SHARE * period_ns / 1000
            )
        wait_output(dt.socket_path, info["id"], "blocking")
        release(fifo)
        events.until(kind_is("run.end", info["id"]))
