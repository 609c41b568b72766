"""The cgroup-move warm-up (``cell._migration``, ``_native.warm_cgroup``): a
thread of the launching process moves itself into the cgroup it is already
in, again and again for as long as asked, then ends, and never moves
anything anywhere else. (What it saves, C1's wait for the kernel's grace
period, is measured by benchmarks/cli_exec.py and cell_launch.py, not here.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stockade.cell import _migration, _native


def _threads() -> set[str]:
    """The warm-up threads of this process (named by ``_native``)."""
    found = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            if Path(f"/proc/self/task/{tid}/comm").read_text().strip() == "stockade-cgwarm":
                found.add(tid)
        except FileNotFoundError:
            pass  # it ended meanwhile
    return found


def _wait_for(done: object, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not done() and time.monotonic() < end:  # type: ignore[operator]
        time.sleep(0.01)
    assert done(), "the warm-up thread did not start, or did not end after its hold"  # type: ignore[operator]


def test_it_moves_itself_within_its_own_cgroup_and_ends() -> None:
    own = Path("/proc/self/cgroup").read_text()
    tasks = _migration._own_tasks_file()
    assert tasks is not None, "this host has cgroup v1 hierarchies, and the suite runs as root"
    assert tasks.endswith("/tasks") and os.access(tasks, os.W_OK)
    _wait_for(lambda: not _threads())  # an earlier launch's has ended
    _migration.keep_warm(0.1)
    _wait_for(_threads)  # named once it runs
    started = _threads()
    assert len(started) == 1, started  # one thread of the process's own
    (tid,) = started
    # It is in the tasks file of the cgroup it was in, and so is every other thread.
    assert tid in Path(tasks).read_text().split()
    _wait_for(lambda: tid not in _threads())
    # Nothing of the process moved: every hierarchy names the same cgroup.
    assert Path("/proc/self/cgroup").read_text() == own


def test_it_writes_its_own_thread_id_until_the_hold_ends(tmp_path: Path) -> None:
    # A plain file in place of the tasks file: what the thread writes stays.
    tasks = tmp_path / "tasks"
    tasks.write_bytes(b"")
    _wait_for(lambda: not _threads())  # an earlier launch's has ended
    _native.warm_cgroup(str(tasks), 0.1)
    _native.warm_cgroup(str(tasks), 0.1)  # a second ask holds it longer, with no second thread
    _wait_for(_threads)  # named once it runs
    started = _threads()
    assert len(started) == 1, started
    (tid,) = started
    _wait_for(lambda: tid not in _threads())
    written = tasks.read_bytes()
    # Its own id, again and again, and nothing more after its end.
    assert written and written == tid.encode() * (len(written) // len(tid)), written[:80]
    assert len(written) // len(tid) >= 2
    time.sleep(0.05)
    assert tasks.read_bytes() == written


def test_a_bad_ask_is_refused() -> None:
    with pytest.raises(ValueError, match="0-10 seconds"):
        _native.warm_cgroup("/nonexistent/tasks", 60.0)


def test_nothing_is_started_where_there_is_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_migration, "_tasks_file", None)
    monkeypatch.setattr(_migration, "_looked", True)
    _wait_for(lambda: not _threads())
    _migration.keep_warm(0.1)
    time.sleep(0.05)  # time enough for a thread to have started and named itself
    assert _threads() == set()


def test_a_launch_leaves_it_running_for_the_next_launch() -> None:
    """``Cell.run`` asks for the thread from its start and for a second past
    it, so that the process's next launch finds the semaphore slow; then it
    ends by itself."""
    from stockade.cell import Cell
    from stockade.policy import default_policy

    _wait_for(lambda: not _threads())
    result = Cell(default_policy()).run(["/bin/true"])
    assert result.exit_code == 0
    running = _threads()
    assert running, "no warm-up thread after a launch"
    _wait_for(lambda: not (_threads() & running), seconds=_migration.LINGER_SECONDS + 5)
