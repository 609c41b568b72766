"""The cell's own init (C2, pid 1 of its pid namespace): the command runs as
its child, keeps its default signal actions, gets the signals sent to the
cell, and its exit status is the cell's; orphans are reaped."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from stockade.cell import Cell
from stockade.record import Event

PY = "/usr/bin/python3"
BOUND = 10.0
"""Seconds anything here may take at most; a healthy run takes a fraction."""


class _PidSpy:
    """Stands in for the audit reader: keeps the host pid of the cell's pid 1,
    which ``Cell`` hands to ``watch`` (as the daemon's ``_CellWatch`` does)."""

    def __init__(self) -> None:
        self.pid = 0
        self.watched = threading.Event()

    def watch(self, cell_id: str, *, session: int, pid: int, places: object = None) -> None:
        self.pid = pid
        self.watched.set()

    def unwatch(self, cell_id: str) -> None:
        pass

    def begin_settle(self, timeout: float = 2.0) -> None:
        return None

    def abandon(self, settling: object) -> None:
        pass

    def collect(self, cell_id: str, *, timeout: float = 2.0, begun: object = None) -> list[Event]:
        return []


def _run_and_signal(tmp_path: Path, argv: list[str], sig: int) -> tuple[int, bytes, float]:
    """Run ``argv``; when it prints ``ready``, send ``sig`` to the cell's pid 1."""
    spy = _PidSpy()
    out = bytearray()

    def on_output(stream: int, chunk: bytes) -> None:
        if stream != 1:
            return
        before = b"ready" in out
        out.extend(chunk)
        if not before and b"ready" in out:
            assert spy.watched.wait(BOUND)
            os.kill(spy.pid, sig)

    with Cell(workspace=tmp_path, audit=spy) as cell:  # type: ignore[arg-type]
        start = time.monotonic()
        result = cell.run(argv, on_output=on_output, timeout=BOUND * 3)
        took = time.monotonic() - start
    assert not result.timed_out, bytes(out)
    return result.exit_code, bytes(out), took


def test_a_command_that_signals_itself_dies_of_it(tmp_path: Path) -> None:
    """As pid 1 the command would ignore its own SIGTERM (exit 0); as the
    init's child it dies of it, and the cell reports 143 as a shell does."""
    with Cell(workspace=tmp_path) as cell:
        term = cell.run(["/bin/sh", "-c", "kill -TERM $$; echo survived"])
        kill = cell.run([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
        pids = cell.run(["/bin/sh", "-c", "echo $$; cat /proc/1/comm"])
    assert term.exit_code == 128 + signal.SIGTERM and term.stdout == b""
    assert kill.exit_code == 128 + signal.SIGKILL
    assert pids.stdout == b"2\nstockade-init\n", pids.stdout


def test_sigterm_to_the_cell_ends_a_command_without_a_handler(tmp_path: Path) -> None:
    """``run.stop`` signals the cell's pid 1: the init passes SIGTERM on, and a
    command that never set a handler ends at once (143), not at the timeout."""
    code, out, took = _run_and_signal(
        tmp_path,
        [PY, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        signal.SIGTERM,
    )
    assert code == 128 + signal.SIGTERM, out
    assert took < BOUND


def test_signals_reach_the_commands_handler(tmp_path: Path) -> None:
    """SIGUSR1 sent to the cell is the command's to handle; its exit code is
    passed through."""
    script = (
        "import signal, sys\n"
        "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        "signal.pause()\n"
    )
    code, out, _ = _run_and_signal(tmp_path, [PY, "-c", script], signal.SIGUSR1)
    assert code == 42, out


ORPHAN = r"""
import os, time
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:       # the grandchild: an orphan once its parent exits
        os.close(r); os.write(w, str(os.getpid()).encode()); os._exit(0)
    os._exit(0)
os.close(w)
orphan = int(os.read(r, 32))
os.wait()
deadline = time.monotonic() + 5
state = "?"
while time.monotonic() < deadline:
    try:
        with open(f"/proc/{orphan}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: while it is being reaped
        state = "reaped"
        break
    os.sched_yield()
print(state)
"""


def test_orphans_are_reaped(tmp_path: Path) -> None:
    """An orphan that exits is reaped by the init (without one it would stay a
    zombie, state Z, for the cell's life); the control is the command's own
    child, which the command reaps itself."""
    with Cell(workspace=tmp_path) as cell:
        result = cell.run([PY, "-c", ORPHAN], timeout=BOUND * 3)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"reaped\n"
