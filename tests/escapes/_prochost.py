"""Host-side helpers for the process escapes: find a cell's processes by a
marker in their command line, hold pidfds on them, wait (bounded) until they
are gone, and locate a cell's cgroup directories."""

from __future__ import annotations

import os
import re
import select
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from stockade.cell._cgroup import PARENT, layout

BOUND = 10.0
"""Seconds any wait on a process in these tests may take before it counts as a failure."""

_CELL_CGROUP = re.compile(r"c-[0-9a-f]+@\d+")


def pids_with_marker(marker: str, program: str = "/usr/bin/python3") -> list[int]:
    """Host pids of live processes running ``program`` whose command line
    holds ``marker`` (a launcher that passes the marker on is not one)."""
    found = []
    needle = marker.encode()
    head = program.encode() + b"\0"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue  # gone meanwhile
        if cmdline.startswith(head) and needle in cmdline:
            found.append(int(entry))
    return sorted(found)


def children_of(pid: int) -> list[int]:
    """The live children of ``pid`` (by the ppid field of /proc/*/stat)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return sorted(found)


def cgroup_name_of(pid: int) -> str:
    """The cell cgroup name (``c-…@owner``) that ``pid`` belongs to."""
    text = Path(f"/proc/{pid}/cgroup").read_text()
    match = _CELL_CGROUP.search(text)
    assert match, f"process {pid} is in no cell cgroup:\n{text}"
    return match.group(0)


def cgroup_dirs(name: str) -> list[str]:
    """Every directory a cell cgroup called ``name`` may have, in any hierarchy."""
    lay = layout()
    owns = {h.own for h in lay.v1.values()}
    if lay.v2 is not None:
        owns.add(lay.v2.own)
    return sorted(f"{own}/{PARENT}/{name}" for own in owns)


class Watched:
    """pidfds on a set of processes, taken while they run."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.fds: dict[int, int] = {}
        for pid in pids:
            try:
                self.fds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue  # already gone: nothing to wait for

    def alive(self) -> list[int]:
        """The watched processes that have not exited (pidfd not readable)."""
        out = []
        for pid, fd in self.fds.items():
            ready, _, _ = select.select([fd], [], [], 0)
            if not ready:
                out.append(pid)
        return out

    def wait_gone(self, bound: float = BOUND) -> list[int]:
        """Wait until every watched process has exited, at most ``bound``
        seconds; return those still alive then (empty when all are gone)."""
        deadline = time.monotonic() + bound
        pending = dict(self.fds)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(pending.values()), [], [], left)
            for fd in ready:
                pending = {p: f for p, f in pending.items() if f != fd}
        return sorted(pending)

    def kill_all(self) -> None:
        """SIGKILL what is still alive (through the pidfds: never a reused pid)."""
        for fd in self.fds.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def __enter__(self) -> Watched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spawn_time(argv: list[str], bound: float = BOUND) -> float:
    """Seconds the host takes to start and reap ``argv`` (a responsiveness probe)."""
    start = time.monotonic()
    pid = os.posix_spawn(argv[0], argv, {})
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], bound)
        assert ready, f"the host could not run {argv} within {bound} s"
        os.waitpid(pid, 0)
    finally:
        os.close(pidfd)
    return time.monotonic() - start
