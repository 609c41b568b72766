"""Cells at scale: a hundred cells at once on this 2-core host, every one of
them enforced, every one cleaned up.

Each cell is a thread calling ``Cell.run`` on a program that tries to read a
secret of its own (hidden behind a decoy), says it is up, and then blocks on
its stdin until the test releases it; so all of them are provably alive at
the same moment (their pids 1 and their cgroups are checked then). After the
release, each cell's record must hold the refusal of its own read, attributed
to it and to no other, and the host must hold nothing of any cell: no
process, no mount, no cgroup, no workspace, no descriptor in this process.

The full hundred is the default run (it takes a few seconds when the cells
start as they should); with STOCKADE_SOAK=1 it is five hundred (issue 18).
The soak test repeats waves; CI runs its short form (3 waves of 20) unless
STOCKADE_SOAK=1 (10 waves of 100).
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest

from stockade.cell import Cell, _cell
from stockade.cell._cgroup import layout
from tests.escapes._net_cell import PYTHON, READY, LiveCell
from tests.escapes._scale_run import (
    Snapshot,
    Wave,
    cgroup_dirs_of,
    leftovers,
    make_secrets,
    run_wave,
    secrets_policy,
)

SOAK = os.environ.get("STOCKADE_SOAK") == "1"
SCALE = 100
AT_ONCE = 500 if SOAK else SCALE
"""Cells alive at the same moment in the at-once test: 500 in the soak form."""
FDS_PER_CELL = _cell.FDS_PER_CELL
"""Descriptors a running cell holds in the launching process, at most."""


@pytest.fixture
def secrets_root() -> Iterator[str]:
    """A directory the scale policy grants read-only, whose ``secrets`` it hides.
    Outside /tmp: a cell's /tmp is its own."""
    path = tempfile.mkdtemp(prefix="stockade-scale-", dir="/var/tmp")
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _report(waves: list[Wave], problems: list[str]) -> str:
    timings = "; ".join(
        f"wave {i}: " + ", ".join(f"{k} {v:.1f} s" for k, v in w.timings.items()) for i, w in enumerate(waves)
    )
    return "\n".join([*problems, f"timings: {timings}"])


def test_a_hundred_cells_at_once_are_each_enforced_and_leave_nothing(secrets_root: str) -> None:
    """A hundred cells (five hundred with STOCKADE_SOAK=1) started together:
    all alive at once (as many pids 1 and cgroups), each refused its own
    secret and recorded as such (its cell id, its pid), none holding
    another's event; afterwards no process, mount, cgroup, workspace or
    descriptor of any of them is left."""
    secrets = make_secrets(secrets_root, AT_ONCE)
    policy = secrets_policy(secrets_root, AT_ONCE)
    # One cell first, so that what the process keeps for its lifetime (the audit
    # reader, caches of the launch path) is there before the snapshot.
    warm = run_wave(1, policy, secrets[:1])
    assert not warm.problems, _report([warm], warm.problems)
    before = Snapshot.take()
    wave = run_wave(AT_ONCE, policy, secrets)
    problems = wave.problems + leftovers(before, wave)
    assert not problems, _report([wave], problems)
    assert wave.alive_at_once == AT_ONCE
    # What a running cell costs the process that launched it, in descriptors
    # (its pipes, pidfds, cgroup and namespace handles): counted, so that the
    # limit below is a figure, not a guess (RLIMIT_NOFILE, docs/PERFORMANCE.md).
    per_cell = (wave.fds_at_peak - wave.fds_before) / AT_ONCE
    assert per_cell <= FDS_PER_CELL, f"{per_cell:.1f} descriptors per running cell (at most {FDS_PER_CELL})"
    # And the process has room for them (``_cell._room_for_cells``).
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft >= min(_hard, FDS_PER_CELL * _cell.CELLS_AT_ONCE), (soft, _hard)


@pytest.mark.soak
def test_waves_of_cells_leave_nothing_behind(secrets_root: str) -> None:
    """Wave after wave of cells (10 waves of 100 with STOCKADE_SOAK=1, else 3 of 20):
    every wave is enforced and cleaned up, and nothing accumulates across waves
    (descriptors, cgroups, mounts, directories)."""
    rounds, n = (10, SCALE) if SOAK else (3, 20)
    secrets = make_secrets(secrets_root, n)
    policy = secrets_policy(secrets_root)
    warm = run_wave(1, policy, secrets[:1])
    assert not warm.problems, _report([warm], warm.problems)
    before = Snapshot.take()
    waves: list[Wave] = []
    problems: list[str] = []
    for i in range(rounds):
        wave = run_wave(n, policy, secrets)
        waves.append(wave)
        problems += [f"wave {i}: {p}" for p in wave.problems]
        if problems:
            break
    problems += leftovers(before, *waves)
    assert not problems, _report(waves, problems)


_WAITER = f"""
import sys
print({READY!r}, flush=True)
sys.stdin.readline()
"""


def _fds_of(pid: int) -> dict[int, str]:
    table = {}
    for entry in os.listdir(f"/proc/{pid}/fd"):
        try:
            table[int(entry)] = os.readlink(f"/proc/{pid}/fd/{entry}")
        except OSError:
            continue
    return table


def test_a_cells_processes_hold_no_descriptor_of_the_caller() -> None:
    """What a cell's processes hold of the process that launched it: nothing
    but the cell's own stdio. Every process of the cell (its cgroup's: the
    command, and the launcher that waits for it as long as the cell lives) is
    looked at while the cell runs, for a pipe and a socket the caller opened
    before the cell started (close-on-exec, as a caller's descriptors are).

    Found here (Python launcher as of 2f4ebdb): the launcher that waits for the
    cell's pid 1 (C1) keeps every descriptor the caller had when it forked
    (fork copies them; C1 closes only its stdio, and close-on-exec does nothing
    for a process that never execs). With cells started from several threads
    this stalls ``Cell.run``: the launch of cell A waits for EOF on its status
    pipe, and cell B's C1, forked meanwhile, holds a copy of that pipe's write
    end until B ends (the hundred-cells test shows it). C1 also keeps the
    caller's audit socket, other cells' output pipes (their EOF waits for B
    too) and the stdin write end of every cell. Suggested fix: C1 closes every
    descriptor but the few it needs (status, go, stdio sources, idmap user
    namespaces, the Landlock rule descriptors) right after the fork, as C2
    does before exec."""
    sentinel_r, sentinel_w = os.pipe2(os.O_CLOEXEC)
    probe_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sentinels = {
            f"pipe:[{os.fstat(sentinel_r).st_ino}]",
            f"socket:[{os.fstat(probe_sock.fileno()).st_ino}]",
        }
        with Cell() as cell:
            live = LiveCell(cell, [PYTHON, "-c", _WAITER]).start()
            try:
                live.wait_ready()
                pid = live.init_pid()
                v2 = [d for d in cgroup_dirs_of(pid) if d.startswith(layout().v2.mount)]
                assert len(v2) == 1, (
                    f"the cell's pid 1 is in no cell cgroup of its own: {cgroup_dirs_of(pid)}"
                )
                with open(f"{v2[0]}/cgroup.procs") as f:
                    members = [int(p) for p in f.read().split()]
                held = {member: _fds_of(member) for member in members}
            finally:
                live.release()
                result = live.join()
                live.close()
        assert result.exit_code == 0, result
        assert pid in members, (pid, members)
        # The cell's command: its stdio, nothing else of the host's.
        assert sorted(held[pid]) == [0, 1, 2], held[pid]
        leaked = {member: {fd: t for fd, t in fds.items() if t in sentinels} for member, fds in held.items()}
        leaked = {member: fds for member, fds in leaked.items() if fds}
        assert not leaked, (
            f"processes of the cell hold the caller's own pipe and socket: {leaked} "
            f"(they hold {', '.join(f'{m}: {len(held[m])}' for m in leaked)} descriptors in all)"
        )
    finally:
        os.close(sentinel_r)
        os.close(sentinel_w)
        probe_sock.close()
