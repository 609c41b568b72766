"""The cgroup-move warm-up (``cell._migration``): a thread of the launching
process moves itself into the cgroup it is already in, again and again for as
long as asked, and never anywhere else. (What it saves, C1's wait for the
kernel's grace period, is measured by benchmarks/cli_exec.py, not here.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from stockade.cell import _migration


def _warm_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "stockade-cgroup-warm"]


def _wait_gone(seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while _warm_threads() and time.monotonic() < end:
        time.sleep(0.01)
    assert not _warm_threads(), "the warm-up thread outlived its hold"


def test_it_moves_itself_within_its_own_cgroup_and_stops() -> None:
    own = Path("/proc/self/cgroup").read_text()
    tasks = _migration._own_tasks_file()
    assert tasks is not None, "this host has cgroup v1 hierarchies, and the suite runs as root"
    assert tasks.endswith("/tasks")
    _wait_gone()
    _migration.keep_warm(0.1)
    (thread,) = _warm_threads()
    assert thread.daemon  # never holds an exit up
    _wait_gone()
    # Nothing of the process moved: every hierarchy names the same cgroup.
    assert Path("/proc/self/cgroup").read_text() == own


def test_it_writes_its_own_thread_id_until_the_hold_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plain file in place of the tasks file: what the thread writes stays.
    tasks = tmp_path / "tasks"
    tasks.write_bytes(b"")
    _wait_gone()
    monkeypatch.setattr(_migration, "_tasks_file", str(tasks))
    monkeypatch.setattr(_migration, "_looked", True)
    _migration.keep_warm(0.1)
    (thread,) = _warm_threads()
    _migration.keep_warm(0.1)  # a second ask extends the hold, with no second thread
    assert _warm_threads() == [thread]
    _wait_gone()
    written = tasks.read_bytes()
    tid = str(thread.native_id).encode()
    assert written and written == tid * (len(written) // len(tid)), written[:80]
    assert len(written) // len(tid) >= 2  # again and again, not once


def test_nothing_is_started_where_there_is_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    _wait_gone()
    monkeypatch.setattr(_migration, "_tasks_file", None)
    monkeypatch.setattr(_migration, "_looked", True)
    _migration.keep_warm(0.1)
    assert _warm_threads() == []
