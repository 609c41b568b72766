"""Keep a cell's move into its cgroups from waiting on the kernel.

C1 joins the cell's cgroups by writing ``cgroup.procs`` (``_native``), and
every such write takes the kernel's ``cgroup_threadgroup_rwsem`` for writing.
That semaphore is a per-CPU one: while no writer has come for a while it is in
its fast mode, and the first writer waits for an RCU grace period to leave it
(``rcu_sync_enter``), 8-15 ms on this host (docs/PERFORMANCE.md, issue 18),
every launch that comes more than ~20 ms after the last migration on the host.
While writers keep coming it stays in its slow mode and a write takes ~0.1 ms.

So, while a launch is being prepared, a thread of this process moves itself
into the cgroup it is already in (a write of its own thread id to its v1
``tasks`` file: a move of nothing, which takes the semaphore all the same)
every few milliseconds: it pays the grace period while the plan and the
launch's other steps are made, and C1 finds the semaphore in its slow mode.
The kernel's own switch for this is cgroup's ``favordynmods`` mount option,
which holds it in its slow mode for every fork and exit of the host; this
holds it only for the ~50 ms after a launch asked.

cgroup v1 only: v2 has no per-thread file outside threaded cgroups, and
moving the whole process (``cgroup.procs``) could race a move of its own
(the daemon's into its leaf); there, ``CLONE_INTO_CGROUP`` is the fix, not
this. Where the file cannot be written (not root, no v1 hierarchy), nothing
is done: this is only ever a matter of speed, never of what the cell holds.
"""

from __future__ import annotations

import os
import threading
import time

HOLD_SECONDS = 0.025
"""How long after the last ask the semaphore is held in its slow mode: a
launch's preparation (its plan, its cgroups) and a back-to-back next one."""

POKE_SECONDS = 0.004
"""Between two moves: well inside the ~20 ms after which the kernel goes back
to the fast mode (measured: a gap of 5 ms never waits, one of 20 ms mostly)."""

_lock = threading.Lock()
_until = 0.0
_running = False
_tasks_file: str | None = None
_looked = False


def keep_warm(seconds: float = HOLD_SECONDS) -> None:
    """Hold the semaphore in its slow mode for ``seconds`` from now (a thread
    of its own, started if none runs); returns at once."""
    global _until, _running
    if _looked and _tasks_file is None:
        return  # nothing to write here (a v2-only host, not root)
    with _lock:
        _until = max(_until, time.monotonic() + seconds)
        if _running:
            return
        _running = True
    try:
        threading.Thread(target=_poke_until_due, name="stockade-cgroup-warm", daemon=True).start()
    except RuntimeError:  # at interpreter shutdown: the launch just waits
        with _lock:
            _running = False


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


def _poke_until_due() -> None:
    global _running
    fd = -1
    try:
        path = _own_tasks_file()
        if path is not None:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        tid = str(threading.get_native_id()).encode()
        while True:
            with _lock:
                if fd < 0 or time.monotonic() >= _until:
                    _running = False
                    return
            os.write(fd, tid)  # this thread into the cgroup it is in: a move of nothing
            time.sleep(POKE_SECONDS)
    except OSError:
        with _lock:
            _running = False
    finally:
        if fd >= 0:
            os.close(fd)
