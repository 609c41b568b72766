"""What happens when things go wrong: the daemon killed with SIGKILL mid-run,
a subscriber that stops reading, a store that stops writing."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from stockade.errors import StoreError
from tests.daemon.test_server import (
    WAIT,
    Wire,
    agent_policy,
    close_wires,  # noqa: F401  (the fixture that closes every Wire)
    daemon_at,
    kind_is,
    living_processes,
    release,
    stored_events,
    workspace,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells under the daemon need root on this host")


@contextmanager
def daemon_process(state: Path, sock: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A daemon in a process of its own; yields once it listens."""
    code = (
        "import sys\n"
        "from stockade.daemon._server import serve\n"
        "serve(state=sys.argv[1], socket_path=sys.argv[2], ready=lambda d: print('ready', flush=True))\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, str(state), str(sock)], stdout=subprocess.PIPE
    ) as proc:
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], WAIT)
            assert ready and proc.stdout.readline() == b"ready\n", "the daemon did not start"
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def cell_processes(daemon_pid: int) -> dict[int, str]:
    """Every living process in a cell cgroup of that daemon
    (``…/stockade/<cell>@<pid>``), by pid. A zombie (killed, not yet reaped by
    pid 1) does not count."""
    return living_processes(lambda text: f"@{daemon_pid}" in text and "/stockade/" in text)


def wait_all_gone(pids: list[int], timeout: float = WAIT) -> list[int]:
    """Wait on each process's pidfd; return the ones still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    alive = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                alive.append(pid)
        finally:
            os.close(fd)
    return alive


def _blocked_run(tmp_path: Path, sock: Path) -> tuple[dict[str, object], dict[str, object], Path]:
    """Start a run whose agent had one intent allowed, left a double-forked
    straggler, and now blocks; return its info, the acknowledged intent event
    and the workspace."""
    granted = tmp_path / "granted"
    ws = workspace(tmp_path)
    fifo = ws / "hold"
    os.mkfifo(fifo, 0o666)
    plan = [
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}},
        # A straggler in a session of its own: it must die too.
        {"op": "spawn", "argv": ["/bin/sleep", "1000"]},
        {"op": "block", "fifo": str(fifo)},
    ]
    policy = agent_policy(tmp_path, plan, ws=ws)
    wire, events = Wire(str(sock)), Wire(str(sock))
    events.call("events.subscribe")
    info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
    acknowledged = events.until(kind_is("intent", info["id"]))[-1]
    follow = Wire(str(sock))
    seen = follow.call("run.logs", {"run": info["id"], "follow": True})["data"]
    while "blocking" not in seen:
        seen += follow.push()["event"]["data"]
    return info, acknowledged, ws


def test_after_a_sigkill_the_record_is_intact_and_the_restarted_daemon_serves(tmp_path: Path) -> None:
    state, sock = tmp_path / "state", tmp_path / "d.sock"
    with daemon_process(state, sock) as proc:
        info, acknowledged, ws = _blocked_run(tmp_path, sock)
        cells = cell_processes(proc.pid)
        assert len(cells) >= 3, cells  # the cell's C1, the agent, the straggler
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    try:
        with daemon_process(state, sock) as again:
            wire = Wire(str(sock))
            assert wire.call("status")["pid"] == again.pid
            # Nothing of the dead daemon's cells runs (the death signals; and
            # the restart sweeps the cgroups of dead daemons' cells).
            assert wait_all_gone(list(cells)) == []
            assert cell_processes(proc.pid) == {}
            assert wire.call("verify")["ok"] is True
            stored = stored_events(wire)
            assert acknowledged in stored, "an event the daemon acknowledged is gone"
            kinds = [e["event"]["kind"] for e in stored]
            assert kinds.count("daemon.start") == 2 and "daemon.stop" not in kinds
            lost = [e["event"] for e in stored if e["event"]["kind"] == "run.end"]
            assert [(e["run"], e["detail"]["state"]) for e in lost] == [(info["id"], "lost")]
            past = wire.call("run.list", {"all": True})["runs"]
            assert [(r["id"], r["state"]) for r in past] == [(info["id"], "lost")]
            assert "blocking" in wire.call("run.logs", {"run": info["id"]})["data"]
            # And it serves runs again.
            fresh = tmp_path / "again.json"
            fresh.write_text(json.dumps({"name": "again", "workspace": str(ws), "command": ["/bin/true"]}))
            events = Wire(str(sock))
            events.call("events.subscribe")
            second = wire.call("run.start", {"policy_path": str(fresh)})
            end = events.until(kind_is("run.end", second["id"]))[-1]["event"]
            assert end["detail"]["exit_code"] == 0
    finally:
        _kill(list(cells))


def test_a_sigkill_of_the_daemon_ends_every_cell_it_owns_at_once(tmp_path: Path) -> None:
    state, sock = tmp_path / "state", tmp_path / "d.sock"
    with daemon_process(state, sock) as proc:
        _blocked_run(tmp_path, sock)
        cells = cell_processes(proc.pid)
        assert len(cells) >= 3, cells
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    try:
        alive = wait_all_gone(list(cells), timeout=5.0)
        assert alive == [], f"processes outlived their daemon: {alive}"
    finally:
        _kill(list(cells))


def _kill(pids: list[int]) -> None:
    """Leave no process of a test behind (only these pids, which it found)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)


def test_a_slow_subscriber_is_dropped_and_stalls_nobody(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    count = 2000
    plan = [{"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}}] * count
    policy = agent_policy(tmp_path, plan)
    with daemon_at(tmp_path, subscriber_buffer=256 * 1024) as dt:
        wire, fast = Wire(dt.socket_path), Wire(dt.socket_path)
        slow = Wire(dt.socket_path)
        slow.call("events.subscribe")  # and then never reads again
        fast.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy)})
        seen = fast.until(kind_is("run.end", info["id"]), timeout=120)
        intents = [e for e in seen if e["event"]["kind"] == "intent"]
        assert len(intents) == count
        seqs = [e["seq"] for e in seen]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the fast subscriber missed events"
        status = wire.call("status")
        assert status["subscribers_dropped"] == 1
        dropped = [e for e in seen if e["event"]["kind"] == "subscriber.dropped"]
        assert len(dropped) == 1 and dropped[0]["event"]["detail"]["limit_bytes"] == 256 * 1024
        # The slow one was told, in a last push, after what it had not read.
        frames = []
        while True:
            frame = slow.read()
            assert frame is not None
            frames.append(frame)
            if frame.get("event", {}).get("kind") == "subscription.dropped":
                break
        assert len(frames) < count


def test_a_store_that_stops_writing_halts_runs_and_refuses_new_ones(tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    ws = workspace(tmp_path)
    fifo = ws / "hold"
    os.mkfifo(fifo, 0o666)
    plan = [
        {"op": "block", "fifo": str(fifo)},
        {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}},
        {"op": "block", "fifo": str(fifo)},
    ]
    policy = agent_policy(tmp_path, plan, ws=ws)
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
        follow = Wire(dt.socket_path)
        seen = follow.call("run.logs", {"run": info["id"], "follow": True})["data"]
        while "blocking" not in seen:
            seen += follow.push()["event"]["data"]
        assert dt.daemon.recorder is not None
        store = dt.daemon.recorder.store

        def full(events: object) -> list[object]:
            raise StoreError("database or disk is full: /tmp/x/events.db", path="/tmp/x/events.db")

        store.append = full  # type: ignore[method-assign]
        release(fifo)
        ended = None
        while ended is None:
            push = follow.push()["event"]
            if push["kind"] == "run.ended":
                ended = push["run"]
        assert ended["state"] == "halted" and "cannot write" in ended["halted"]
        status = wire.call("status")
        assert status["accepting_runs"] is False and "disk is full" in status["store"]["error"]
        refused = wire.request("run.start", {"policy_path": str(policy)})
        assert refused["error"]["code"] == "unavailable" and "cannot write" in refused["error"]["message"]
        # The intent sent into the failing store was refused, never served unrecorded.
        lines = [json.loads(x) for x in wire.call("run.logs", {"run": info["id"]})["data"].splitlines()]
        answers = [line["out"] for line in lines if line["op"] == "intent"]
        assert all(a.get("error", {}).get("code") == "unavailable" for a in answers)
        marker = json.loads((tmp_path / "state" / "store-error.json").read_text())
        assert "disk is full" in marker["error"]
        # The disk has room again: the next run.start tries the store, records
        # what happened, and runs.
        del store.append
        again = wire.call("run.start", {"policy_path": str(agent_policy(tmp_path, [], name="after"))})
        events.until(kind_is("run.end", again["id"]))
        assert wire.call("status")["accepting_runs"] is True
        stored = [e["event"] for e in stored_events(wire)]
        errors = [e for e in stored if e["kind"] == "store.error"]
        assert len(errors) == 1 and "disk is full" in errors[0]["detail"]["error"]
        assert not (tmp_path / "state" / "store-error.json").exists()
        assert wire.call("verify")["ok"] is True


def test_a_store_failure_the_daemon_could_not_record_is_recorded_at_the_next_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "store-error.json").write_text(json.dumps({"error": "disk full", "time": 1.0, "path": "x"}))
    with daemon_at(tmp_path) as dt:
        wire = Wire(dt.socket_path)
        stored = [e["event"] for e in stored_events(wire)]
        assert [e["kind"] for e in stored] == ["daemon.start", "store.error"]
        assert stored[1]["detail"]["error"] == "disk full"
    assert not (state / "store-error.json").exists()


def test_a_really_full_disk_halts_the_run_and_loses_no_acknowledged_event(tmp_path: Path) -> None:
    """The state directory on a small tmpfs, filled while an agent works: the
    journal's space was allocated at start, so intents are still made durable
    there; SQLite cannot grow, so the indexer fails, the run is halted and new
    runs refused; once space is freed, a new run makes the daemon index what
    it had acknowledged, and nothing is missing."""
    import subprocess as sp

    state = tmp_path / "state"
    state.mkdir()
    sp.run(["mount", "-t", "tmpfs", "-o", "size=40m,mode=0700", "tmpfs", str(state)], check=True)
    try:
        granted = tmp_path / "granted"
        ws = workspace(tmp_path)
        fifo = ws / "hold"
        os.mkfifo(fifo, 0o666)
        read = {"op": "intent", "intent": "fs.read", "args": {"path": f"{granted}/ok.txt"}}
        policy = agent_policy(tmp_path, [{"op": "block", "fifo": str(fifo)}, *[read] * 400], ws=ws)
        with daemon_at(tmp_path) as dt:
            wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
            events.call("events.subscribe")
            info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
            follow = Wire(dt.socket_path)
            seen = follow.call("run.logs", {"run": info["id"], "follow": True})["data"]
            while "blocking" not in seen:
                seen += follow.push()["event"]["data"]
            # Everything so far indexed first: the disk fills under the agent's
            # intents, not under the run's start.
            assert stored_events(wire, info["id"])
            filler = state / "filler"
            with open(filler, "wb", buffering=0) as f:  # every byte the filesystem has left
                for size in (1 << 20, 4096, 1):
                    with contextlib.suppress(OSError):
                        while True:
                            f.write(b"\0" * size)
            release(fifo)
            while True:
                push = follow.push()["event"]
                if push["kind"] == "run.ended":
                    break
            final = next(r for r in wire.call("run.list", {"all": True})["runs"] if r["id"] == info["id"])
            assert final["state"] == "halted" and "full" in final["halted"], final
            # The transcript or the store may be the first to meet the full
            # disk; the store's own failure follows once the run's end is
            # recorded (bounded wait).
            for _ in range(200):
                status = wire.call("status")
                if status["store"]["error"]:
                    break
                time.sleep(0.05)
            assert status["accepting_runs"] is False and "full" in status["store"]["error"]
            refused = wire.request("run.start", {"policy_path": str(agent_policy(tmp_path, [], name="x"))})
            assert refused["error"]["code"] == "unavailable" and "full" in refused["error"]["message"]
            acknowledged = final["intents"]
            assert acknowledged > 0
            # Space again: the next run makes the daemon try the store, which
            # first indexes every event it had acknowledged.
            filler.unlink()
            again = wire.call("run.start", {"policy_path": str(agent_policy(tmp_path, [], name="after"))})
            events.until(kind_is("run.end", again["id"]))
            assert wire.call("status")["accepting_runs"] is True
            stored = [e["event"] for e in stored_events(wire, info["id"])]
            # Every intent answered is stored: the allowed ones, and the one
            # refused because the run was halted (it counts among the run's).
            answered = [e for e in stored if e["kind"] == "intent"]
            assert len(answered) >= acknowledged
            assert any(e["detail"]["verdict"] == "allow" for e in answered)
            assert wire.call("verify")["ok"] is True
    finally:
        sp.run(["umount", "-l", str(state)], check=False)


def test_a_transcript_that_cannot_be_opened_halts_the_run_which_still_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's thread opens its transcript files before the cell starts; an
    open that fails there (no descriptor left, no inode left) halts the run as
    a failed write does, and the run ends: it never stays "running" with no
    thread behind it. The cell is not started: its output would be kept
    nowhere."""
    import errno

    from stockade.daemon import _runs

    def no_descriptor(path: str) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), path)

    policy = agent_policy(tmp_path, [])
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        monkeypatch.setattr(_runs, "_open_transcript", no_descriptor)
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
        events.until(kind_is("run.end", info["id"]))
        run = next(r for r in wire.call("run.list")["runs"] if r["id"] == info["id"])
        assert run["state"] == "halted", run
        assert "transcript cannot be written" in run["halted"] and "Too many open files" in run["halted"]
        kinds = [e["event"]["kind"] for e in stored_events(wire, info["id"])]
        assert "run.halted" in kinds and "cell.start" not in kinds, kinds
        # Descriptors again: the next start's probe write clears the refusal.
        monkeypatch.undo()
        again = wire.call("run.start", {"policy_path": str(agent_policy(tmp_path, [], name="after"))})
        events.until(kind_is("run.end", again["id"]))
        assert wire.call("status")["accepting_runs"] is True
