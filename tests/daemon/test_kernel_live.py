"""Kernel refusals under the daemon, live: each Landlock refusal of a run's
cell is on the live stream, in ``run.list``'s denial count and in the record
while the run is still alive, and counts toward the tripwire like a broker
denial (issue 12). Real cells, a real daemon on a loop in a thread."""

from __future__ import annotations

import json
import os
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

REFUSE_THEN_BLOCK = """
import os, select, sys
fifo, n = sys.argv[1], int(sys.argv[2])
fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader now, so the test can release it
for i in range(n):
    try:
        open(f"/etc/stockade-live-{i}", "w")
    except OSError:
        pass
print("refused", n, flush=True)
p = select.poll()
p.register(fd, select.POLLIN)
p.poll()
print("released", flush=True)
"""


def _policy(tmp_path: Path, refusals: int, **extra: Any) -> tuple[Path, Path]:
    ws = workspace(tmp_path)
    fifo = ws / "go"
    os.mkfifo(fifo)
    policy = {
        "name": "refuser",
        "command": [PY, "-c", REFUSE_THEN_BLOCK, str(fifo), str(refusals)],
        "workspace": str(ws),
        **extra,
    }
    path = tmp_path / "refuser.json"
    path.write_text(json.dumps(policy))
    return path, fifo


def _kernel_denials(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kernel = (e["event"] for e in events)
    return [e for e in kernel if e["kind"] == "cell.denied" and e["layer"] == "landlock"]


def test_kernel_refusals_are_streamed_counted_and_recorded_while_the_run_lives(tmp_path: Path) -> None:
    policy, fifo = _policy(tmp_path, 3)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy)})
        run = info["id"]
        wait_output(dt.socket_path, run, "refused 3")
        seen: list[dict[str, Any]] = []
        while len(_kernel_denials(seen)) < 3:
            seen += events.until(lambda e: e["event"]["kind"] == "cell.denied" and e["event"]["run"] == run)
        # Creating a file in /etc: Landlock names the directory it refused.
        assert [e["detail"]["path"] for e in _kernel_denials(seen)] == ["/etc"] * 3
        assert all("fs.make_reg" in e["detail"]["blockers"] for e in _kernel_denials(seen))
        # The run still lives: ps counts them, the store holds them.
        listed = next(r for r in wire.call("run.list")["runs"] if r["id"] == run)
        assert listed["state"] == "running" and listed["denials"] == 3
        assert len(_kernel_denials(stored_events(wire, run))) == 3
        # Control: released, the run ends normally, and each refusal is recorded once.
        release(fifo)
        events.until(kind_is("run.end", run))
        final = next(r for r in wire.call("run.list")["runs"] if r["id"] == run)
        assert final["state"] == "ended" and final["exit_code"] == 0 and final["denials"] == 3
        stored = stored_events(wire, run)
        assert len(_kernel_denials(stored)) == 3
        kinds = [e["event"]["kind"] for e in stored]
        assert kinds.count("cell.start") == 1 and kinds.count("cell.end") == 1
        assert kinds.index("cell.start") < kinds.index("cell.denied") < kinds.index("cell.end")


def test_kernel_refusals_trip_the_tripwire_and_halt_the_run(tmp_path: Path) -> None:
    # 20 refused writes, then a wait that is never released: only the
    # tripwire (3 denials) can end this run.
    policy, _fifo = _policy(tmp_path, 20, limits={"denials": 3})
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy)})
        seen = events.until(kind_is("run.end", info["id"]))
        kinds = [e["event"]["kind"] for e in seen if e["event"]["run"] == info["id"]]
        assert "run.halted" in kinds, kinds
        assert kinds[: kinds.index("run.halted")].count("cell.denied") >= 3
        halted = next(e["event"] for e in seen if e["event"]["kind"] == "run.halted")
        assert "denials reached the limit of 3" in halted["detail"]["reason"]
        final = next(r for r in wire.call("run.list")["runs"] if r["id"] == info["id"])
        assert final["state"] == "halted" and final["exit_code"] == 137 and final["denials"] >= 3
