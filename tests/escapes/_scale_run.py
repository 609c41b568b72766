"""Many cells at once, for the scale tests: start them together, hold them all
alive, prove each is enforced, release them, and find anything left behind.

Every wait here is on the thing itself, bounded: a cell's readiness (its output
arriving), a process's exit (its pidfd), a thread's end (join).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from stockade.cell import Cell, CellResult, _native
from stockade.cell._cell import shared_audit_reader
from stockade.cell._cgroup import layout
from stockade.policy import Policy, default_policy
from tests.escapes._net_cell import PYTHON, READY, pids_by_stdin

STALL = 20.0
"""No cell got ready for this long while others were still starting: stuck."""
ALL_READY = 120.0
"""Bound on the whole start-up of a wave."""
RUN_TIMEOUT = 180.0
"""Each cell's own wall-clock limit (a backstop; the test releases them first)."""

_PROGRAM = f"""
import sys
try:
    open(sys.argv[1]).read()
    print("read", flush=True)
except OSError as exc:
    print("denied", exc.errno, flush=True)
print({READY!r}, flush=True)
print("released", sys.stdin.readline().strip(), flush=True)
"""


SECRETS_PER_DIR = 100
"""Secrets in one hidden directory: a decoy lists at most 128 names of its
top level (``_plan._DECOY_NAMES_MAX``), so five hundred cells' secrets are
spread over directories of a hundred, each hidden."""


def _secrets_dir(root: str, i: int) -> str:
    group = i // SECRETS_PER_DIR
    return os.path.join(root, "secrets" if group == 0 else f"secrets-{group}")


def secrets_policy(root: str, n: int = SECRETS_PER_DIR) -> Policy:
    """The default policy, with ``root`` readable and ``root/secrets`` (and
    ``secrets-1``… for more than a hundred cells) hidden: decoys whose files
    every cell may see by name and none may read."""
    base = default_policy("escapes-scale")
    hidden = dict.fromkeys(_secrets_dir(root, i) for i in range(n))
    fs = dataclasses.replace(
        base.filesystem,
        read=(*base.filesystem.read, root),
        deny=(*base.filesystem.deny, *hidden),
    )
    return dataclasses.replace(base, filesystem=fs)


def make_secrets(root: str, n: int) -> list[str]:
    paths = []
    for i in range(n):
        os.makedirs(_secrets_dir(root, i), exist_ok=True)
        path = os.path.join(_secrets_dir(root, i), f"secret-{i:03d}")
        with open(path, "w") as f:
            f.write(f"secret {i}\n")
        paths.append(path)
    return paths


class ScaleCell:
    """One cell of a wave: a thread that runs ``Cell.run`` on a program that
    tries to read its own secret, says it is ready, and waits on its stdin."""

    def __init__(
        self, index: int, policy: Policy, secret: str, start: threading.Barrier, on_ready: threading.Semaphore
    ) -> None:
        self.index = index
        self.policy = policy
        self.secret = secret
        self._start = start
        self._on_ready = on_ready
        self.stdin_r, self.stdin_w = os.pipe2(os.O_CLOEXEC)
        self.inode = os.fstat(self.stdin_r).st_ino
        self.ready = threading.Event()
        self.out = bytearray()
        self.result: CellResult | None = None
        self.error: BaseException | None = None
        self.workspace: str | None = None
        self.started_at = 0.0
        self.ready_at = 0.0
        self.init_pid: int | None = None
        self.command_pids: set[int] = set()
        """The init's children when the cell was found: the command runs as
        pid 2 under the cell's init and its refusals name it."""
        self.launcher_pid: int | None = None
        self.cgroup_dirs: list[str] = []
        self.thread = threading.Thread(target=self._run, name=f"scale-{index}", daemon=True)

    def _sink(self, stream: int, data: bytes) -> None:
        if stream != 1:
            return
        self.out += data
        if not self.ready.is_set() and READY.encode() in self.out:
            self.ready_at = time.monotonic()
            self.ready.set()
            self._on_ready.release()

    def _run(self) -> None:
        try:
            self._start.wait(ALL_READY)
            self.started_at = time.monotonic()
            with Cell(self.policy) as cell:
                self.workspace = cell.workspace
                self.result = cell.run(
                    [PYTHON, "-c", _PROGRAM, self.secret],
                    stdin=self.stdin_r,
                    on_output=self._sink,
                    timeout=RUN_TIMEOUT,
                )
        except BaseException as exc:
            self.error = exc
        finally:
            if not self.ready.is_set():
                self._on_ready.release()  # never will be: let the counter move on

    def release(self) -> None:
        # Written, never closed: every launcher forked meanwhile holds a copy of
        # the write end, so closing it would not end the cell's read.
        with contextlib.suppress(OSError):
            os.write(self.stdin_w, b"go\n")

    def close(self) -> None:
        for fd in (self.stdin_r, self.stdin_w):
            with contextlib.suppress(OSError):
                os.close(fd)


# --- what the host holds -----------------------------------------------------------


def fd_table() -> dict[int, str]:
    """This process's descriptors, less those the launcher keeps across
    launches by design (``_native.kept``: the decoys' templates, Landlock's
    host entries), which a wave may make or replace."""
    table = {}
    kept = set(_native.kept())
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if int(entry) not in kept:
                table[int(entry)] = os.readlink(f"/proc/self/fd/{entry}")
    return table


def mounts() -> set[str]:
    """The mount table of this process's namespace, one line per mount, without
    the mount ids (which say nothing of what is mounted where)."""
    with open("/proc/self/mountinfo") as f:
        return {" ".join(line.split()[2:]) for line in f}


def listing(path: str) -> set[str]:
    try:
        return set(os.listdir(path))
    except FileNotFoundError:
        return set()


@dataclass
class Snapshot:
    """What this process holds and sees before a wave."""

    fds: dict[int, str]
    mounts: set[str]

    @classmethod
    def take(cls) -> Snapshot:
        return cls(fd_table(), mounts())


def cgroup_dirs_of(pid: int) -> list[str]:
    """The cell cgroup directories (``…/stockade/<cell>@<owner>``) ``pid`` is in."""
    lay = layout()
    found = []
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _hid, names, path = line.rstrip("\n").split(":", 2)
            if "/stockade/" not in path:
                continue
            if not names:
                mount = lay.v2.mount if lay.v2 is not None else None
            else:
                h = lay.v1.get(names.split(",")[0])
                mount = h.mount if h is not None else None
            if mount is not None:
                found.append(mount + path)
    return found


def launcher_report() -> str:
    """Which launcher processes (children of this process) hold descriptors of
    this process, and how many: the evidence when cells stall at start."""
    me = os.getpid()
    mine = {target for target in fd_table().values() if target.startswith("pipe:")}
    lines = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid != me:
            continue
        held = []
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    held.append(os.readlink(f"/proc/{entry}/fd/{fd}"))
        shared = [t for t in held if t in mine]
        lines.append(f"launcher {entry}: {len(held)} descriptors, {len(shared)} pipes of this process")
    return "\n".join(sorted(lines)[:12]) + (f"\n… {len(lines)} launchers in all" if len(lines) > 12 else "")


# --- a wave -------------------------------------------------------------------------


@dataclass
class Wave:
    cells: list[ScaleCell]
    problems: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    alive_at_once: int = 0
    fds_before: int = 0
    """Descriptors this process held before the wave."""
    fds_at_peak: int = 0
    """Descriptors it held while every cell of the wave was alive (less the
    test's own pidfds), so that a cell's cost in descriptors is counted."""


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) - 1 - len(_native.kept())  # less listdir's own and the kept


@contextlib.contextmanager
def _pidfds(pids: list[int]) -> Iterator[dict[int, int]]:
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                fds[pid] = os.pidfd_open(pid)
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


def run_wave(n: int, policy: Policy, secrets: list[str]) -> Wave:
    """Start ``n`` cells at once, hold them all alive, release them, and check
    each one's record. Appends to ``problems`` rather than stopping at the
    first, so that one run shows everything that went wrong."""
    shared_audit_reader()
    start = threading.Barrier(n + 1)
    ready = threading.Semaphore(0)
    cells = [ScaleCell(i, policy, secrets[i], start, ready) for i in range(n)]
    wave = Wave(cells, fds_before=open_fds())
    problems = wave.problems
    t0 = time.monotonic()
    for c in cells:
        c.thread.start()
    try:
        start.wait(ALL_READY)
        t_start = time.monotonic()
        # Wait for every cell's readiness (or failure), bounded by a stall.
        counted = 0
        deadline = t_start + ALL_READY
        while counted < n:
            left = min(STALL, deadline - time.monotonic())
            if left <= 0 or not ready.acquire(timeout=left):
                break
            counted += 1
        wave.timings["all_ready"] = time.monotonic() - t_start
        not_ready = [c for c in cells if not c.ready.is_set()]
        failed = [c for c in cells if c.error is not None]
        by_error: dict[str, list[int]] = {}
        for c in failed:
            by_error.setdefault(repr(c.error), []).append(c.index)
        for error, indices in by_error.items():
            problems.append(f"{len(indices)} cells failed to start with {error}: cells {indices[:30]}")
        if not_ready and len(not_ready) > len(failed):
            problems.append(
                f"only {n - len(not_ready)} of {n} cells were up after "
                f"{wave.timings['all_ready']:.1f} s (no progress for {STALL:g} s): Cell.run "
                f"is stuck for the others.\n{launcher_report()}"
            )
        with _pidfds(_find_pids(cells, problems)) as pidfds:
            if not not_ready:
                _check_all_alive(wave, pidfds)
            t_release = time.monotonic()
            for c in cells:
                c.release()
            join_deadline = time.monotonic() + STALL + 30
            for c in cells:
                c.thread.join(max(0.0, join_deadline - time.monotonic()))
            wave.timings["release_to_end"] = time.monotonic() - t_release
            stuck = [c.index for c in cells if c.thread.is_alive()]
            if stuck:
                problems.append(f"Cell.run did not return after release for cells {stuck[:20]}")
            _check_gone(pidfds, problems)
    finally:
        for c in cells:
            c.release()
        for c in cells:
            c.thread.join(RUN_TIMEOUT)
            c.close()
    wave.timings["total"] = time.monotonic() - t0
    _check_records(wave)
    return wave


def _find_pids(cells: list[ScaleCell], problems: list[str]) -> list[int]:
    """Each ready cell's pid 1 and launcher, by its stdin pipe."""
    by_inode = pids_by_stdin({c.inode for c in cells if c.ready.is_set()})
    pids = []
    for c in cells:
        if not c.ready.is_set():
            continue
        found = by_inode.get(c.inode, [])
        if len(found) != 1:
            problems.append(f"cell {c.index}: expected one pid 1 on its stdin, found {found}")
            continue
        c.init_pid = found[0]
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{c.init_pid}/stat") as f:
                c.launcher_pid = int(f.read().rsplit(")", 1)[1].split()[1])
            c.cgroup_dirs = cgroup_dirs_of(c.init_pid)
        children = f"/proc/{c.init_pid}/task/{c.init_pid}/children"
        with contextlib.suppress(OSError, ValueError), open(children) as f:
            c.command_pids = {int(pid) for pid in f.read().split()}
        pids.append(c.init_pid)
        if c.launcher_pid is not None:
            pids.append(c.launcher_pid)
    return pids


def _check_all_alive(wave: Wave, pidfds: dict[int, int]) -> None:
    """At this moment every cell is up: n distinct live pids 1, each in a cgroup
    of its own that exists in every hierarchy the cell uses."""
    cells, problems = wave.cells, wave.problems
    inits = [c.init_pid for c in cells if c.init_pid is not None]
    live = [pid for pid in inits if pid in pidfds and not _exited(pidfds[pid])]
    wave.alive_at_once = len(set(live))
    wave.fds_at_peak = open_fds() - len(pidfds)
    if wave.alive_at_once != len(cells):
        problems.append(f"{wave.alive_at_once} of {len(cells)} cells' processes alive at once")
    names = set()
    for c in cells:
        if not c.cgroup_dirs:
            problems.append(f"cell {c.index} (pid {c.init_pid}) is in no cell cgroup")
            continue
        leaf = {os.path.basename(d) for d in c.cgroup_dirs}
        if len(leaf) != 1:
            problems.append(f"cell {c.index} is in different cells' cgroups: {c.cgroup_dirs}")
        names |= leaf
        for d in c.cgroup_dirs:
            if not os.path.isdir(d):
                problems.append(f"cell {c.index}: its cgroup {d} does not exist")
    if len(names) != len(cells):
        problems.append(f"{len(names)} distinct cell cgroups for {len(cells)} cells")


def _exited(pidfd: int) -> bool:
    # poll, not select: with a hundred cells this process holds descriptors
    # past select's FD_SETSIZE (1024).
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _check_gone(pidfds: dict[int, int], problems: list[str]) -> None:
    """Every process of every cell has exited (pidfds, immune to pid reuse)."""
    deadline = time.monotonic() + 10
    waiting = dict(pidfds)
    while waiting and time.monotonic() < deadline:
        poller = select.poll()
        for fd in waiting.values():
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(max(0, int((deadline - time.monotonic()) * 1000)))}
        for pid in [p for p, fd in waiting.items() if fd in ready]:
            del waiting[pid]
    if waiting:
        problems.append(f"processes of cells still alive after every Cell.run returned: {sorted(waiting)}")


def _check_records(wave: Wave) -> None:
    """Each cell ran to its end, was refused its own secret, and its record holds
    that refusal, attributed to it (its cell id, its pid), and nothing of another's.
    Problems of the same kind are reported once, with the cells they concern."""
    secrets = {c.secret for c in wave.cells}
    bad_end: list[str] = []
    unrecorded: list[int] = []
    misattributed: list[str] = []
    for c in wave.cells:
        r = c.result
        if r is None:
            continue
        out = c.out.decode(errors="replace")
        if r.exit_code != 0 or r.timed_out or "denied 13" not in out or "released go" not in out:
            bad_end.append(
                f"cell {c.index}: exit {r.exit_code}, timed out {r.timed_out}, "
                f"output {out[-200:]!r}, stderr {r.stderr[-200:]!r}"
            )
        denials = [e for e in r.events if e.kind == "cell.denied"]
        mine = [e for e in denials if e.layer == "landlock" and e.detail.get("path") == c.secret]
        if len(mine) != 1:
            unrecorded.append(c.index)
        for e in mine:
            # The pid comes from the SYSCALL record grouped with the denial; under
            # load the reader may finish the group without it (pid None): the
            # cell id and the path still attribute it. A wrong pid is a problem.
            if c.init_pid is not None and e.detail.get("pid") not in (None, c.init_pid, *c.command_pids):
                misattributed.append(
                    f"cell {c.index}: its denial names pid {e.detail.get('pid')}, its pid 1 is "
                    f"{c.init_pid} and its command {sorted(c.command_pids)}"
                )
        foreign = [e for e in r.events if e.cell != r.cell_id] + [
            e for e in denials if e.detail.get("path") in secrets - {c.secret}
        ]
        if foreign:
            misattributed.append(f"cell {c.index} ({r.cell_id}) holds another cell's events: {foreign}")
        if c.cgroup_dirs and not all(os.path.basename(d).startswith(r.cell_id + "@") for d in c.cgroup_dirs):
            misattributed.append(f"cell {c.index} ({r.cell_id}) ran in the cgroups {c.cgroup_dirs}")
    if bad_end:
        wave.problems.append(f"{len(bad_end)} cells did not run to their end: " + "; ".join(bad_end[:5]))
    if unrecorded:
        late = [c.index for c in wave.cells if c.index in unrecorded and c.ready_at - c.started_at > 10]
        wave.problems.append(
            f"{len(unrecorded)} cells have no event (or more than one) for the refused read of "
            f"their own secret: cells {unrecorded[:30]}"
            + (
                f"; {len(late)} of them took more than 10 s to start (the audit reader's limbo "
                f"keeps an unwatched cell's records for 10 s)"
                if late
                else ""
            )
        )
    wave.problems.extend(misattributed[:20])


def leftovers(before: Snapshot, *waves: Wave) -> list[str]:
    """What the waves left on the host: processes, mounts, cgroups, directories
    and this process's descriptors."""
    problems = []
    after = Snapshot.take()
    cells = [c for wave in waves for c in wave.cells]
    names = {r.cell_id for c in cells if (r := c.result) is not None}
    # Processes: nothing on the host is in any of these cells' cgroups.
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/cgroup") as f:
                text = f.read()
            if any(f"/stockade/{name}@" in text for name in names):
                problems.append(f"process {entry} is still in a cell's cgroup: {text.strip()!r}")
    # Cgroups: the stockade directories hold nothing of these cells, nor of this process.
    parents = {os.path.dirname(d) for c in cells for d in c.cgroup_dirs}
    lay = layout()
    hierarchies = [h.own for h in lay.v1.values()] + ([lay.v2.own] if lay.v2 is not None else [])
    parents |= {os.path.join(own, "stockade") for own in hierarchies}
    me = f"@{os.getpid()}"
    for parent in sorted(parents):
        left = sorted(n for n in listing(parent) if n.endswith(me) or n.split("@")[0] in names)
        if left:
            problems.append(f"cgroups left in {parent}: {left[:10]}{' …' if len(left) > 10 else ''}")
    # Mounts: the host's mount table is what it was.
    # Network namespaces that tests name under /run/netns (tests/_netns.py)
    # come and go with other tests on the host; cells never make one there.
    before_mounts = {m for m in before.mounts if " /run/netns/sk-" not in m}
    after_mounts = {m for m in after.mounts if " /run/netns/sk-" not in m}
    if after_mounts != before_mounts:
        added = sorted(after_mounts - before_mounts)
        removed = sorted(before_mounts - after_mounts)
        problems.append(f"the mount table changed: added {added[:5]}, removed {removed[:5]}")
    # Directories: every fresh workspace is gone (by path: other processes on
    # this host may be making workspaces of their own meanwhile).
    kept = [c.workspace for c in cells if c.workspace and os.path.exists(c.workspace)]
    if kept:
        problems.append(f"{len(kept)} workspaces left, e.g. {kept[:5]}")
    missing = [c.index for c in cells if c.result is not None and not c.workspace]
    if missing:
        problems.append(f"cells whose workspace was never known: {missing[:10]}")
    # Descriptors: this process holds nothing it did not hold before the wave.
    added_fds = {fd: t for fd, t in after.fds.items() if before.fds.get(fd) != t}
    if added_fds:
        kinds: dict[str, int] = {}
        for target in added_fds.values():
            kind = (
                "O_PATH of a removed directory"
                if target.endswith("(deleted)")
                else target.split(":[")[0]
                if ":[" in target
                else target
            )
            kinds[kind] = kinds.get(kind, 0) + 1
        problems.append(
            f"{len(added_fds)} descriptors of the test process were not there before the wave "
            f"({len(before.fds)} before, {len(after.fds)} after): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:8])
        )
    return problems
