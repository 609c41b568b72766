"""Keep a cell's move into its cgroups from waiting on the kernel.

C1 joins the cell's cgroups by writing ``cgroup.procs`` (``_native``), and
every such write takes the kernel's ``cgroup_threadgroup_rwsem`` for writing.
That semaphore is a per-CPU one: while no writer has come for a while it is in
its fast mode, and the first writer waits for an RCU grace period to leave it
(``rcu_sync_enter``), 8-15 ms on this host (docs/PERFORMANCE.md, issue 18),
every launch that comes more than ~20 ms after the last migration on the host.
While writers keep coming it stays in its slow mode and a write takes ~0.1 ms.

So a thread of this process moves itself into the cgroup it is already in
(a write of its own thread id to its v1 ``tasks`` file: a move of nothing,
which takes the semaphore all the same) every 4 ms (``_native.warm_cgroup``,
a thread of C that never takes the GIL, so the launch beside it never waits
for it), while a launch is near:

- ``stockade exec`` asks for it first thing, so that the grace period is paid
  while it imports and plans (its one launch always comes cold);
- every launch (``Cell.run``) and every session call (a move into the call's
  own cgroup, ``_session``) asks for ``LINGER_SECONDS`` more from its start:
  the next launch or call of this process within that time (a daemon's, an
  eval's, a benchmark's) finds the semaphore slow, where anything more than
  ~20 ms apart would pay the grace period again. Measured side by side for
  issue 18 (docs/PERFORMANCE.md): a cell of ``python3 -c pass`` 41 -> 28 ms,
  launched every ~40 ms; the first launch after an idle moment gains only
  its own plan's few milliseconds.

The thread costs ~7 ms of CPU a second while it runs, and the host's forks
and exits take the semaphore's reader side the slower way meanwhile
(benchmarks/cgroup_warm_cost.py measures what an unrelated process pays).
The kernel's own switch for this is cgroup's ``favordynmods`` mount option,
which holds it in its slow mode for every fork and exit of the host, always;
this holds it only for the moments around the launches.

cgroup v1 only: v2 has no per-thread file outside threaded cgroups, and
moving the whole process (``cgroup.procs``) could race a move of its own
(the daemon's into its leaf); there, ``CLONE_INTO_CGROUP`` is the fix, not
this. Where the file cannot be written (not root, no v1 hierarchy), nothing
is done: this is only ever a matter of speed, never of what the cell holds.
"""

from __future__ import annotations

import os

from stockade.cell import _native

LINGER_SECONDS = 1.0
"""How long from a launch's (or a session call's) start the semaphore is held
slow, for the next one of this process (see above)."""

_tasks_file: str | None = None
_looked = False


def keep_warm(seconds: float) -> None:
    """Hold the semaphore in its slow mode for ``seconds`` from now; returns
    at once (the thread is started if none runs, or runs longer)."""
    path = _own_tasks_file()
    if path is None:
        return  # nothing to write here (a v2-only host, not root)
    try:
        _native.warm_cgroup(path, seconds)
    except OSError:
        pass  # no thread to be had: the launch just waits for the kernel


def launching() -> None:
    """A launch or a session call starts: hold the semaphore slow through it
    and ``LINGER_SECONDS`` past its start, for the next."""
    keep_warm(LINGER_SECONDS)


def _own_tasks_file() -> str | None:
    """The v1 ``tasks`` file of the cgroup this process is in, in the first
    hierarchy of /proc/self/cgroup that has one; None on a v2-only host."""
    global _tasks_file, _looked
    if _looked:
        return _tasks_file
    _looked = True
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _hid, controllers, path = line.split(":", 2)
        if not controllers or controllers.startswith("name="):
            continue  # v2 (no controllers) or a named hierarchy (systemd's)
        candidate = f"/sys/fs/cgroup/{controllers}{path.rstrip('/')}/tasks"
        if os.access(candidate, os.W_OK):
            _tasks_file = candidate
            break
    return _tasks_file
