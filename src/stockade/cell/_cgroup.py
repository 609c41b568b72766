"""One cgroup per cell: its limits, its statistics, and killing all of it at once.

A cell's cgroup is really a set of directories, one per hierarchy it uses, each
nested under this process's own cgroup in that hierarchy
(``<own>/stockade/<cell_id>@<owner pid>``):

* the cgroup v2 hierarchy, always, even when it has no controllers: every
  process is in exactly one v2 cgroup, so ``cgroup.kill`` (Linux 5.14) ends the
  whole cell, double-forked daemons included, and ``cgroup.events`` says when it
  is empty;
* for each limit the policy sets (memory, pids, cpu), the v2 controller when the
  host delegates it to us, else the v1 hierarchy of that controller;
* a v1 ``freezer`` only on hosts whose v2 hierarchy cannot kill or freeze, so
  that killing stays atomic (freeze, SIGKILL every pid, thaw).

A limit that no hierarchy can enforce is a ``HostError``: a cell never runs with
less than its policy asked for. The owner's pid in the directory name lets
``sweep_stale`` tell a crashed run's leftovers from a live process's cells.

This module is on the launch path: no imports beyond ``os`` and the policy model
at import time, and creating plus destroying a cell's cgroups is a handful of
``mkdir``/``write``/``rmdir`` calls.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Mapping
from typing import Literal

from stockade._slots import Frozen
from stockade.errors import CellError, HostError
from stockade.policy._model import Limits

CFS_PERIOD_US = 100_000
"""CFS bandwidth period for ``cpu.max`` / ``cpu.cfs_period_us`` (the kernel's default)."""
CFS_MIN_QUOTA_US = 1_000
"""The kernel refuses a CFS quota below 1 ms (``cpu.cfs_quota_us``, kernel/sched/core.c)."""
PARENT = "stockade"
"""The directory under this process's own cgroup that holds every cell's cgroup."""
LEAF = "stockade-supervisor"
"""Where this process moves itself, under its own v2 cgroup, when it must enable
controllers there; its own cgroup stays the parent of that leaf."""

KillMechanism = Literal["cgroup.kill", "cgroup.freeze", "freezer", "signals"]

_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_MAX_ID = 64


# --------------------------------------------------------------------------- layout


class Hierarchy(Frozen):
    """One mounted cgroup hierarchy and this process's own cgroup in it."""

    _fields = ("version", "mount", "own", "controllers", "enabled", "is_root")
    __slots__ = _fields
    version: Literal[1, 2]
    mount: str
    """Where the hierarchy is mounted."""
    own: str
    """Absolute directory of this process's own cgroup in the hierarchy."""
    controllers: tuple[str, ...]
    """v1: the controllers bound to this hierarchy. v2: the controllers listed
    in the own cgroup's ``cgroup.controllers`` (available to it)."""
    enabled: tuple[str, ...]
    """v2 only: the controllers in the own cgroup's ``cgroup.subtree_control``
    (already enabled for its children)."""
    is_root: bool
    """The own cgroup is the hierarchy's root (exempt from the v2 rule that a
    cgroup with processes may not enable controllers for its children)."""

    def __init__(
        self,
        version: Literal[1, 2],
        mount: str,
        own: str,
        controllers: tuple[str, ...],
        enabled: tuple[str, ...] = (),
        is_root: bool = False,
    ) -> None:
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "mount", mount)
        object.__setattr__(self, "own", own)
        object.__setattr__(self, "controllers", controllers)
        object.__setattr__(self, "enabled", enabled)
        object.__setattr__(self, "is_root", is_root)


class CgroupLayout(Frozen):
    """The cgroup hierarchies this process can see, from ``/proc/self/mountinfo``
    and ``/proc/self/cgroup``."""

    _fields = ("v2", "v1")
    __slots__ = _fields
    v2: Hierarchy | None
    v1: dict[str, Hierarchy]
    """Controller name (``memory``, ``cpu``, ``name=systemd``, ...) to its v1 hierarchy."""

    def __init__(self, v2: Hierarchy | None, v1: dict[str, Hierarchy] | None = None) -> None:
        object.__setattr__(self, "v2", v2)
        object.__setattr__(self, "v1", {} if v1 is None else v1)


def _unescape(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (fs/proc_namespace.c).
    if "\\" not in path:
        return path
    out: list[str] = []
    i = 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1 : i + 4].isdigit() and len(path[i + 1 : i + 4]) == 3:
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _join(mount: str, root: str, path: str) -> str:
    # The mount shows the cgroup ``root`` at ``mount``; ``path`` (from
    # /proc/self/cgroup) is relative to the same hierarchy (or cgroup namespace).
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    path = path.strip("/")
    return f"{mount}/{path}" if path else mount


def discover_layout() -> CgroupLayout:
    """Read which cgroup hierarchies are mounted and where this process sits in each."""
    own: dict[str, str] = {}
    for line in _read("/proc/self/cgroup").splitlines():
        hid, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if hid == "0" and not names:
            # After _move_self_to_leaf, cells still nest under the leaf's parent.
            own["<v2>"] = path[: -len(LEAF) - 1] if path.endswith(f"/{LEAF}") else path
        else:
            for name in names.split(","):
                if name:
                    own[name] = path
    v2: Hierarchy | None = None
    v1: dict[str, Hierarchy] = {}
    for line in _read("/proc/self/mountinfo").splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            if v2 is not None or "<v2>" not in own:
                continue
            own_dir = _join(mount, root, own["<v2>"])
            try:
                available = tuple(_read(f"{own_dir}/cgroup.controllers").split())
                enabled = tuple(_read(f"{own_dir}/cgroup.subtree_control").split())
            except OSError:
                continue
            v2 = Hierarchy(2, mount, own_dir, available, enabled, is_root=own["<v2>"].strip("/") == "")
        else:
            opts = fields[sep + 3].split(",")
            bound = [o for o in opts if o in own and o != "<v2>"]
            if not bound or any(n in v1 for n in bound):
                continue
            own_dir = _join(mount, root, own[bound[0]])
            if not os.path.isdir(own_dir):
                continue
            h = Hierarchy(1, mount, own_dir, tuple(bound), is_root=own[bound[0]].strip("/") == "")
            for n in bound:
                v1[n] = h
    return CgroupLayout(v2, v1)


_layout_cache: tuple[int, CgroupLayout] | None = None


def layout() -> CgroupLayout:
    """``discover_layout()``, cached per process (a forked child reads its own)."""
    global _layout_cache
    pid = os.getpid()
    if _layout_cache is None or _layout_cache[0] != pid:
        _layout_cache = (pid, discover_layout())
    return _layout_cache[1]


def _swap_active() -> bool:
    try:
        return len(_read("/proc/swaps").splitlines()) > 1
    except OSError:
        return False


# --------------------------------------------------------------------------- the plan


class _Dir:
    """One directory of a cell's cgroup: its hierarchy and what it does there.

    A plain class, not a dataclass: it is internal, and a dataclass costs
    import time on the launch path."""

    __slots__ = ("controllers", "path", "version")

    def __init__(self, path: str, version: Literal[1, 2], controllers: tuple[str, ...]) -> None:
        self.path = path
        self.version = version
        self.controllers = controllers
        """Controllers whose files this cell uses in this directory."""


class CgroupStats(Frozen):
    """What a cell's cgroup saw; read it before ``destroy``."""

    _fields = (
        "oom_killed",
        "pids_limit_hit",
        "memory_peak",
        "cpu_usage_ns",
        "cpu_throttled",
        "pids_peak_at_max",
    )
    __slots__ = _fields
    oom_killed: bool
    """The kernel OOM-killed a process of the cell at its memory limit."""
    pids_limit_hit: bool
    """A fork or clone failed (EAGAIN) because the cell was at its pids limit."""
    memory_peak: int | None
    """Most bytes of memory the cell used at once, when the host reports it."""
    cpu_usage_ns: int | None
    """CPU time used by the cell's processes, in nanoseconds."""
    cpu_throttled: bool
    """The CPU quota throttled the cell at least once."""
    pids_peak_at_max: bool | None
    """The most processes the cell held at once reached its own ``pids.max``
    (None: unknown, no ``pids.peak``). The kernel counts a refused fork in
    the forking cell's ``pids.events`` whichever ancestor's limit refused it
    (a family's: ``create(within=…)``); this tells whether it was its own."""

    def __init__(
        self,
        oom_killed: bool,
        pids_limit_hit: bool,
        memory_peak: int | None,
        cpu_usage_ns: int | None,
        cpu_throttled: bool,
        pids_peak_at_max: bool | None = None,
    ) -> None:
        object.__setattr__(self, "oom_killed", oom_killed)
        object.__setattr__(self, "pids_limit_hit", pids_limit_hit)
        object.__setattr__(self, "memory_peak", memory_peak)
        object.__setattr__(self, "cpu_usage_ns", cpu_usage_ns)
        object.__setattr__(self, "cpu_throttled", cpu_throttled)
        object.__setattr__(self, "pids_peak_at_max", pids_peak_at_max)


def _missing(feature: str, what: str, lay: CgroupLayout, reason: str | None) -> HostError:
    v2 = (
        f"cgroup v2 at {lay.v2.own} has no delegated {feature} controller"
        + (f" ({reason})" if reason else "")
        if lay.v2
        else "no cgroup v2 hierarchy is mounted"
    )
    return HostError(
        f"the policy's {what} cannot be enforced: {v2} and no cgroup v1 {feature} hierarchy "
        f"is mounted; enable the {feature} controller in the cgroup.subtree_control of "
        f"stockade's cgroup (systemd: Delegate=yes), mount the v1 {feature} hierarchy, "
        f"or remove that limit from the policy",
        feature=f"cgroup.{feature}",
    )


_v2_ready: set[tuple[str, str]] = set()
"""(own dir, controller) pairs already enabled for ``<own>/stockade`` in this process."""


def _v2_enable(h: Hierarchy, controller: str) -> str | None:
    """Enable ``controller`` for cells below ``h.own/stockade``; the reason when it cannot."""
    if (h.own, controller) in _v2_ready:
        return None
    if controller not in h.controllers:
        return f"cgroup.controllers of {h.own} lacks it"
    parent = f"{h.own}/{PARENT}"
    try:
        if controller not in h.enabled:
            try:
                _write(f"{h.own}/cgroup.subtree_control", f"+{controller}")
            except OSError as exc:
                # A non-root cgroup that holds processes cannot enable controllers
                # for its children (EBUSY, the "no internal processes" rule of
                # cgroup v2). When this process is all it holds, as in a systemd
                # unit or scope with Delegate=yes, move it to a leaf and retry.
                if exc.errno != errno.EBUSY or not _move_self_to_leaf(h.own):
                    raise
                _write(f"{h.own}/cgroup.subtree_control", f"+{controller}")
        _mkdir_parent(parent)
        _write(f"{parent}/cgroup.subtree_control", f"+{controller}")
    except OSError as exc:
        return f"enabling it in cgroup.subtree_control failed: {os.strerror(exc.errno or 0)}"
    _v2_ready.add((h.own, controller))
    return None


def _move_self_to_leaf(own: str) -> bool:
    """Move this process from ``own`` into ``own/stockade-supervisor`` if it is the
    only process there (so nobody else is moved); whether it did."""
    try:
        if _read(f"{own}/cgroup.procs").split() != [str(os.getpid())]:
            return False
        _mkdir_parent(f"{own}/{LEAF}")
        _write(f"{own}/{LEAF}/cgroup.procs", "0")
    except OSError:
        return False
    return True


def _mkdir_parent(path: str) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)


def _plan(lay: CgroupLayout, limits: Limits) -> list[_Dir]:
    """Which hierarchies a cell with ``limits`` needs, and which controller in each."""
    wanted = {
        "memory": (limits.memory, "memory limit"),
        "pids": (limits.pids, "pids limit"),
        "cpu": (limits.cpu, "cpu limit"),
    }
    v2_controllers: list[str] = []
    v1_dirs: dict[str, list[str]] = {}
    for controller, (value, what) in wanted.items():
        if value is None:
            continue
        reason: str | None = None
        if lay.v2 is not None:
            reason = _v2_enable(lay.v2, controller)
            if reason is None:
                v2_controllers.append(controller)
                continue
        h1 = lay.v1.get(controller)
        if h1 is None:
            raise _missing(controller, what, lay, reason)
        v1_dirs.setdefault(h1.own, []).append(controller)
    dirs: list[_Dir] = []
    if lay.v2 is not None:
        dirs.append(_Dir(lay.v2.own, 2, tuple(v2_controllers)))
    for own, controllers in v1_dirs.items():
        dirs.append(_Dir(own, 1, tuple(controllers)))
    if lay.v2 is None or not _v2_can_kill_or_freeze(lay.v2):
        h = lay.v1.get("freezer")
        if h is not None and h.own not in v1_dirs:
            dirs.append(_Dir(h.own, 1, ("freezer",)))
        elif h is not None:
            dirs = [
                _Dir(d.path, d.version, (*d.controllers, "freezer")) if d.path == h.own else d for d in dirs
            ]
    if not dirs:
        raise HostError(
            "no cgroup hierarchy is mounted to hold the cell, so its processes could not "
            "all be ended together; mount cgroup2 (or the v1 freezer) under /sys/fs/cgroup",
            feature="cgroup",
        )
    return dirs


_v2_kill_cache: dict[str, tuple[bool, bool]] = {}


def _v2_features(h: Hierarchy) -> tuple[bool, bool]:
    """(cgroup.kill, cgroup.freeze) exist in non-root v2 cgroups of this kernel."""
    cached = _v2_kill_cache.get(h.own)
    if cached is None:
        # The root cgroup has neither file, so look in a child we own.
        parent = f"{h.own}/{PARENT}"
        try:
            _mkdir_parent(parent)
        except OSError:
            parent = h.own
        cached = (
            os.path.exists(f"{parent}/cgroup.kill"),
            os.path.exists(f"{parent}/cgroup.freeze"),
        )
        _v2_kill_cache[h.own] = cached
    return cached


def _v2_can_kill_or_freeze(h: Hierarchy) -> bool:
    kill, freeze = _v2_features(h)
    return kill or freeze


# --------------------------------------------------------------------------- the cell's cgroup


def _check_id(cell_id: str) -> None:
    if not cell_id or len(cell_id) > _MAX_ID or not set(cell_id) <= _ID_CHARS or cell_id[0] == ".":
        raise CellError(
            f"cell id {cell_id!r} is not usable as a cgroup name; use 1 to {_MAX_ID} letters, "
            "digits, '_', '-' or '.', not starting with '.'"
        )


def _int_field(text: str, key: str) -> int | None:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return None
    return None


class CellCgroup:
    """The cgroups of one cell, one directory per hierarchy it uses.

    Build it with ``CellCgroup.create``; put processes in it by writing ``0`` to
    each of ``procs_files()`` from the forked child (before it unshares its
    namespaces) or with ``add(pid)``; end it with ``destroy()``.
    """

    __slots__ = ("_destroyed", "_dirs", "cell_id", "name")

    def __init__(self, cell_id: str, name: str, dirs: tuple[_Dir, ...]) -> None:
        self.cell_id = cell_id
        self.name = name
        """The directory name in every hierarchy: ``<cell_id>@<owner pid>``."""
        self._dirs = dirs
        self._destroyed = False

    # -- lifecycle

    @classmethod
    def create(
        cls,
        cell_id: str,
        limits: Limits,
        *,
        within: Mapping[str, str] | None = None,
        _layout: CgroupLayout | None = None,
    ) -> CellCgroup:
        """Make the cell's cgroups under this process's own cgroups and set ``limits``.

        ``within`` (a family's ``nest()``): in each hierarchy it names, the
        cgroup is made inside that directory instead, so that the kernel
        holds the cell to the family's limits as well as to its own (a
        cgroup's limit bounds everything below it, in v1 and v2 alike).

        Raises:
            HostError: a limit is set that no mounted hierarchy can enforce, or the
                host has no cgroup hierarchy at all.
            CellError: ``cell_id`` is not a valid name, or the kernel refused to
                create a directory or write a limit.
        """
        _check_id(cell_id)
        lay = layout() if _layout is None else _layout
        plan = _plan(lay, limits)
        name = f"{cell_id}@{os.getpid()}"
        made: list[_Dir] = []
        try:
            for d in plan:
                inside = (within or {}).get(d.path)
                path = f"{inside}/{name}" if inside is not None else f"{d.path}/{PARENT}/{name}"
                try:
                    os.mkdir(path)
                except FileNotFoundError:
                    _mkdir_parent(f"{d.path}/{PARENT}")
                    os.mkdir(path)
                made.append(_Dir(path, d.version, d.controllers))
                _apply(made[-1], limits)
        except BaseException as exc:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(d.path)
            if isinstance(exc, OSError):
                if exc.errno == errno.EEXIST:
                    raise CellError(
                        f"a cgroup for cell {cell_id!r} already exists at {exc.filename}; "
                        "cell ids must be unique within a process"
                    ) from exc
                if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise HostError(
                        f"cannot create the cell's cgroup {exc.filename}: "
                        f"{os.strerror(exc.errno)}; run stockade as root or in a cgroup "
                        "delegated to its user (systemd: Delegate=yes)",
                        feature="cgroup",
                    ) from exc
                raise CellError(
                    f"setting up the cgroup of cell {cell_id!r} failed at {exc.filename}: "
                    f"{os.strerror(exc.errno or 0)}"
                ) from exc
            raise
        return cls(cell_id, name, tuple(made))

    def nest(self) -> dict[str, str]:
        """For ``create(within=…)``: each hierarchy of this cgroup (its
        process's own directory there) and this cgroup's directory in it.
        In v2, the controllers it limits are first enabled for its children
        (``cgroup.subtree_control``), without which they would not be limited
        below it. It must hold no process of its own (v2's rule)."""
        nest: dict[str, str] = {}
        for d in self._dirs:
            if d.version == 2 and d.controllers:
                with contextlib.suppress(OSError):  # then the children get no controller: create says so
                    _write(f"{d.path}/cgroup.subtree_control", " ".join(f"+{c}" for c in d.controllers))
            nest[d.path.rsplit(f"/{PARENT}/", 1)[0]] = d.path
        return nest

    def procs_files(self) -> tuple[str, ...]:
        """The ``cgroup.procs`` of every directory of the cell: write ``0`` to each
        to move the writing process (and its future children) into the cell."""
        return tuple(f"{d.path}/cgroup.procs" for d in self._dirs)

    @property
    def paths(self) -> tuple[str, ...]:
        """The cell's cgroup directories, v2 first."""
        return tuple(d.path for d in self._dirs)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into every cgroup of the cell.

        Raises:
            CellError: the kernel refused (the process is gone, say).
        """
        for f in self.procs_files():
            try:
                _write(f, str(pid))
            except OSError as exc:
                raise CellError(f"cannot move pid {pid} into {f}: {os.strerror(exc.errno or 0)}") from exc

    def pids(self) -> list[int]:
        """The processes now in the cell (pids as this process sees them)."""
        seen: set[int] = set()
        for d in self._dirs:
            try:
                seen.update(int(p) for p in _read(f"{d.path}/cgroup.procs").split())
            except FileNotFoundError:
                continue
        return sorted(seen)

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL every process of the cell at once and wait until it is empty.

        Uses v2 ``cgroup.kill``; without it, freezes the cell (v2 ``cgroup.freeze``
        or the v1 freezer), SIGKILLs each pid and thaws, so nothing forks past it.

        Raises:
            CellError: processes were still in the cell after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        how = self._kill_mechanism()
        v2 = self._v2()
        if how == "cgroup.kill" and v2 is not None:
            try:
                _write(f"{v2}/cgroup.kill", "1")
            except FileNotFoundError:
                return
        elif how == "cgroup.freeze" and v2 is not None:
            self._freeze_kill_thaw(f"{v2}/cgroup.freeze", "1", "0", deadline)
        elif how == "freezer" and (fz := self._dir_with("freezer")) is not None:
            self._freeze_kill_thaw(f"{fz}/freezer.state", "FROZEN", "THAWED", deadline)
        else:
            # No way to freeze: kill what is there, round after round, until a
            # round finds nobody (a fork between rounds is caught by the next).
            while self.pids() and time.monotonic() < deadline:
                self._sigkill_all()
                self._wait_empty(min(deadline, time.monotonic() + 0.05))
        if not self._wait_empty(deadline) and (left := self.pids()):
            raise CellError(
                f"processes {left} of cell {self.cell_id!r} survived SIGKILL for "
                f"{timeout}s (stuck in uninterruptible sleep?); its cgroups are left at "
                f"{', '.join(self.paths)}"
            )

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill every process of the cell and remove every directory ``create`` made.

        Idempotent: a second call (or a call after ``sweep_stale`` removed the
        directories) does nothing.

        Raises:
            CellError: processes survived ``timeout`` seconds, or a directory could
                not be removed.
        """
        if self._destroyed:
            return
        self.kill(timeout)
        failed: list[str] = []
        for d in reversed(self._dirs):
            try:
                _rmdir_children(d.path)  # a session's per-call cgroups (cell/_session.py)
                os.rmdir(d.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append(f"{d.path} ({os.strerror(exc.errno or 0)})")
        if failed:
            raise CellError(f"cannot remove the cgroups of cell {self.cell_id!r}: {', '.join(failed)}")
        self._destroyed = True

    # -- statistics

    def stats(self) -> CgroupStats:
        """Read what the cell's cgroups recorded (OOM kills, pids limit hits, usage)."""
        oom = pids_hit = throttled = False
        peak: int | None = None
        usage: int | None = None
        at_max: bool | None = None
        for d in self._dirs:
            p = d.path
            if "pids" in d.controllers:
                pids_peak, pids_max = _try_int(f"{p}/pids.peak"), _try_int(f"{p}/pids.max")
                if pids_peak is not None:
                    at_max = pids_max is not None and pids_peak >= pids_max  # "max": no limit, int fails
            if d.version == 2:
                cpu_stat = _try_read(f"{p}/cpu.stat")
                if cpu_stat:
                    usec = _int_field(cpu_stat, "usage_usec")
                    if usec is not None:
                        usage = usec * 1000
                    throttled |= (_int_field(cpu_stat, "nr_throttled") or 0) > 0
                if "memory" in d.controllers:
                    oom |= (_int_field(_try_read(f"{p}/memory.events"), "oom_kill") or 0) > 0
                    peak = _try_int(f"{p}/memory.peak")
                if "pids" in d.controllers:
                    pids_hit |= (_int_field(_try_read(f"{p}/pids.events"), "max") or 0) > 0
                continue
            if "memory" in d.controllers:
                kills = _int_field(_try_read(f"{p}/memory.oom_control"), "oom_kill")
                if kills is None:  # kernels before 4.13 have no oom_kill count
                    kills = _try_int(f"{p}/memory.failcnt")
                oom |= (kills or 0) > 0
                peak = _try_int(f"{p}/memory.max_usage_in_bytes")
            if "pids" in d.controllers:
                pids_hit |= (_int_field(_try_read(f"{p}/pids.events"), "max") or 0) > 0
            if "cpu" in d.controllers:
                throttled |= (_int_field(_try_read(f"{p}/cpu.stat"), "nr_throttled") or 0) > 0
                if usage is None:  # cpu,cpuacct co-mounted
                    usage = _try_int(f"{p}/cpuacct.usage")
        return CgroupStats(oom, pids_hit, peak, usage, throttled, at_max)

    # -- internals

    def _kill_mechanism(self) -> KillMechanism:
        """How ``kill`` ends the cell on this host, best first."""
        v2 = self._v2()
        if v2 is not None and os.path.exists(f"{v2}/cgroup.kill"):
            return "cgroup.kill"  # Linux 5.14
        if v2 is not None and os.path.exists(f"{v2}/cgroup.freeze"):
            return "cgroup.freeze"  # Linux 5.2
        if self._dir_with("freezer") is not None:
            return "freezer"
        return "signals"

    def _v2(self) -> str | None:
        for d in self._dirs:
            if d.version == 2:
                return d.path
        return None

    def _dir_with(self, controller: str) -> str | None:
        for d in self._dirs:
            if controller in d.controllers:
                return d.path
        return None

    def _sigkill_all(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _freeze_kill_thaw(self, state_file: str, frozen: str, thawed: str, deadline: float) -> None:
        try:
            _write(state_file, frozen)
        except FileNotFoundError:
            return
        try:
            # Wait (bounded) until every task is frozen, so that none forks
            # between reading the pid list and the SIGKILLs.
            if state_file.endswith("cgroup.freeze"):
                _wait_event(state_file[: -len("cgroup.freeze")] + "cgroup.events", "frozen", 1, deadline)
            else:
                delay = 0.0002
                while _try_read(state_file).strip() != "FROZEN" and time.monotonic() < deadline:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.02)
            self._sigkill_all()
        finally:
            with contextlib.suppress(FileNotFoundError):
                _write(state_file, thawed)

    def _wait_empty(self, deadline: float) -> bool:
        """Wait (bounded) until no process is left; whether none is."""
        v2 = self._v2()
        if v2 is not None:
            return _wait_event(f"{v2}/cgroup.events", "populated", 0, deadline)
        # v1 has no populated notification a non-root process can poll; poll
        # cgroup.procs with a growing interval, bounded by the deadline.
        delay = 0.0002
        while self.pids():
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return True

    def __repr__(self) -> str:
        return f"CellCgroup({self.cell_id!r}, paths={self.paths!r})"


def _rmdir_children(path: str) -> None:
    """Remove the (empty, killed) cgroups nested in ``path``, deepest first."""
    try:
        entries = [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for child in entries:
        _rmdir_children(child)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(child)


def _try_read(path: str) -> str:
    try:
        return _read(path)
    except OSError:
        return ""


def _try_int(path: str) -> int | None:
    try:
        return int(_read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _wait_event(events_file: str, key: str, want: int, deadline: float) -> bool:
    """Wait until ``key`` in a v2 ``cgroup.events`` reads ``want`` or the deadline
    passes; whether it does (a vanished file counts as yes).

    kernfs wakes ``poll`` on the file with POLLPRI|POLLERR when it changes
    (Documentation/admin-guide/cgroup-v2.rst, "cgroup.events").
    """
    try:
        fd = os.open(events_file, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        poller = None
        while True:
            value = _int_field(os.pread(fd, 4096, 0).decode(), key)
            if value is None or value == want:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if poller is None:
                import select  # only when there is something to wait for

                poller = select.poll()
                poller.register(fd, select.POLLPRI | select.POLLERR)
            poller.poll(max(1, int(left * 1000)))
    finally:
        os.close(fd)


def _apply(d: _Dir, limits: Limits) -> None:
    """Write ``limits`` into the controller files of one freshly made directory."""
    p = d.path
    if d.version == 2:
        if "memory" in d.controllers and limits.memory is not None:
            _write(f"{p}/memory.max", str(limits.memory))
            # Limits.memory is RAM + swap; with memory.max at the whole budget,
            # no swap at all keeps the sum within it.
            if os.path.exists(f"{p}/memory.swap.max"):
                _write(f"{p}/memory.swap.max", "0")
            elif _swap_active():
                raise HostError(
                    f"the memory limit cannot cover swap: {p} has no memory.swap.max (swap "
                    "accounting is off) and swap is on; boot with swapaccount=1 or turn swap off",
                    feature="cgroup.memory",
                )
        if "pids" in d.controllers and limits.pids is not None:
            _write(f"{p}/pids.max", str(limits.pids))
        if "cpu" in d.controllers and limits.cpu is not None:
            _write(f"{p}/cpu.max", f"{_quota(limits.cpu)} {CFS_PERIOD_US}")
        return
    if "memory" in d.controllers and limits.memory is not None:
        # memsw (RAM + swap) may not go below limit_in_bytes, so RAM first.
        _write(f"{p}/memory.limit_in_bytes", str(limits.memory))
        if os.path.exists(f"{p}/memory.memsw.limit_in_bytes"):
            _write(f"{p}/memory.memsw.limit_in_bytes", str(limits.memory))
        elif _swap_active():
            # Without swap accounting, a v1 memcg with swappiness 0 never swaps
            # anonymous memory, so RAM alone is the whole budget.
            _write(f"{p}/memory.swappiness", "0")
    if "pids" in d.controllers and limits.pids is not None:
        _write(f"{p}/pids.max", str(limits.pids))
    if "cpu" in d.controllers and limits.cpu is not None:
        _write(f"{p}/cpu.cfs_period_us", str(CFS_PERIOD_US))
        _write(f"{p}/cpu.cfs_quota_us", str(_quota(limits.cpu)))


def _quota(cores: float) -> int:
    return max(CFS_MIN_QUOTA_US, round(cores * CFS_PERIOD_US))


# --------------------------------------------------------------------------- leftovers


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(*, kill: bool = False, _layout: CgroupLayout | None = None) -> list[str]:
    """Remove the cell cgroups (``stockade/<cell_id>@<pid>``) left by processes
    that are gone, as after a crash; return their names.

    A leftover that still holds processes is kept unless ``kill`` is true, in
    which case its processes are killed first. Cells of live processes are never
    touched.
    """
    lay = layout() if _layout is None else _layout
    hierarchies: dict[str, Hierarchy] = {}
    if lay.v2 is not None:
        hierarchies[lay.v2.own] = lay.v2
    for h in lay.v1.values():
        hierarchies.setdefault(h.own, h)
    found: dict[str, list[_Dir]] = {}
    for own, h in hierarchies.items():
        parent = f"{own}/{PARENT}"
        try:
            entries = os.listdir(parent)
        except OSError:
            continue
        for entry in entries:
            _, at, pid = entry.rpartition("@")
            if not at or not pid.isdigit() or not os.path.isdir(f"{parent}/{entry}"):
                continue
            if _owner_alive(int(pid)):
                continue
            controllers = ("freezer",) if "freezer" in h.controllers else ()
            found.setdefault(entry, []).append(_Dir(f"{parent}/{entry}", h.version, controllers))
    removed: list[str] = []
    for name, dirs in sorted(found.items()):
        dirs.sort(key=lambda d: d.version, reverse=True)
        cg = CellCgroup(name.rpartition("@")[0], name, tuple(dirs))
        if cg.pids() and not kill:
            continue
        try:
            cg.destroy(timeout=2.0)
        except CellError:
            continue
        removed.append(name)
    return removed


__all__ = [
    "CellCgroup",
    "CgroupLayout",
    "CgroupStats",
    "Hierarchy",
    "discover_layout",
    "layout",
    "sweep_stale",
]
