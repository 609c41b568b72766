"""Launch one cell: fork, namespaces, the filesystem view, then exec.

The sequence, from a warm parent process (P)::

    P ──fork──▶ C1: death signal, new session, audit session (loginuid),
                    joins the cell's cgroups, drops supplementary groups,
                    becomes the cell's own namespace owner (an unprivileged
                    host uid, ``_owners``), unshare(user, mount, pid, net,
                    ipc, uts, cgroup)
    P writes C1's uid/gid maps (cell uid 1000 → an unprivileged host uid)
                C1 ──fork──▶ C2 (pid 1 of the cell, its init): builds the
                    filesystem view on a tmpfs, pivots into it, brings up
                    loopback, drops every capability, no_new_privs, Landlock,
                    seccomp;
                    C2 ──fork──▶ C3 (pid 2): a process group of its own, execve
                    of the command.
                C2 reaps every process the namespace hands it, passes every
                signal it gets on to C3 and exits with C3's status; C1 waits
                for C2 and exits with its status.

C2 is the cell's init, as ``docker --init`` (tini) is a container's: the
command is not pid 1, so its default signal actions hold (``sh -c 'kill -TERM
$$'`` ends with 143, and a SIGTERM from ``stop`` ends an agent that installed
no handler at once). When C2 exits the kernel kills every other process of the
cell's pid namespace, and if P dies, C1 and then C2 get SIGKILL from their
death signals, so nothing outlives its cell. The parent also kills the cell's
cgroup when it ends.

Why by hand and not bubblewrap: the cell must cost no more than 1.5 times what
``bwrap`` alone costs, and bwrap cannot apply Landlock (it must be applied
inside, after bwrap's mounts), so bwrap plus a launcher costs two program
starts. Forking a warm Python process and replaying a precomputed plan costs
one. The children are C (``_native.c``): everything they need is computed here
and handed to ``_native.spawn``, which converts it to C data before it forks;
the children then make only syscalls, with no interpreter around them. This
module keeps the parent's side: the pipes, the uid/gid maps, the reports.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from stockade._slots import Frozen
from stockade.cell import _native
from stockade.cell._plan import CELL_UID, SYSTEM_DEVICES, CellPlan, MountOp
from stockade.errors import CellError

_DECOY_TEMPLATES = hasattr(_native, "DECOY_TEMPLATES")
"""Whether this build of ``_native`` takes ``decoys=`` (an older one, loaded
by ``benchmarks/with_native.py`` to compare, does not)."""

ID_COUNT = 65535
"""Ids a workbench maps (``_workbench.ID_COUNT``, repeated here so that a
launch imports no more than it needs)."""


class LaunchSpec(Frozen):
    """What the child needs beyond the plan: the command and the prepared layers."""

    _fields = (
        "argv",
        "plan",
        "cgroup_procs",
        "landlock",
        "seccomp",
        "audit_loginuid",
        "stdin",
        "stdout",
        "stderr",
        "cap_last",
        "keep_fds",
        "idmap_userns",
        "notify",
        "on_namespaces",
        "userns_owner",
        "session",
        "id_base",
        "range_userns",
        "upper",
        "pin_mounts",
    )
    __slots__ = _fields

    argv: tuple[str, ...]
    plan: CellPlan
    cgroup_procs: tuple[str, ...]
    landlock: Any
    """A prepared Landlock ruleset (``_landlock.PreparedLandlock``) or None."""
    seccomp: tuple[tuple[bytes, bool], ...]
    """Filters to load in order, each with its log flag."""
    audit_loginuid: int | None
    stdin: int
    stdout: int
    stderr: int
    cap_last: int
    keep_fds: tuple[int, ...]
    idmap_userns: tuple[tuple[int, int, int], ...]
    """(owner uid, owner gid, user namespace fd) for each idmapped grant."""
    notify: tuple[bytes, int] | None
    """The connect supervisor's seccomp filter and the socket on which the
    cell's init sends its listener (``_unotify``), or None for none."""
    on_namespaces: Callable[[int], None] | None
    """Called with C1's pid once the cell's namespaces exist and before the
    command runs (the gateway opens its sockets in the cell's network
    namespace then); an exception aborts the launch."""
    userns_owner: tuple[int, int] | None
    """The host (uid, gid) that creates the cell's user namespace (``_owners``:
    its per-user kernel counters are then that uid's, not the caller's), or
    None to create it as the caller. C1 takes these ids after everything that
    needs the caller's privileges and just before ``unshare``; the caller,
    still privileged, writes the maps."""
    session: int | None
    """A descriptor (also in ``keep_fds``) on which the cell's init serves
    session calls instead of running ``argv`` (``_session``), or None."""
    id_base: int | None
    """For a plan with ``id_range``: the host id of the cell's id 0 (the
    leased slot's second id, ``_workbench.ID_COUNT`` ids from it)."""
    range_userns: int
    """A user namespace fd with that range (``_workbench.range_userns``), for
    the idmapped layers of a workbench's overlay."""
    upper: tuple[str, str, str] | None
    """A workbench's upper layer: (the directory holding both, the upper's
    name in it, overlay's work directory's name, or "" where the upper is a
    copy of the whole image shown as the root: no overlayfs here)."""
    pin_mounts: bool
    """Hold the cell's mount namespace (``Launched.mount_ns``), so that its
    teardown is not part of C1's exit (``release_mounts``)."""

    def __init__(
        self,
        argv: tuple[str, ...],
        plan: CellPlan,
        cgroup_procs: tuple[str, ...],
        landlock: Any,
        seccomp: tuple[tuple[bytes, bool], ...],
        audit_loginuid: int | None,
        stdin: int,
        stdout: int,
        stderr: int,
        cap_last: int,
        keep_fds: tuple[int, ...] = (),
        idmap_userns: tuple[tuple[int, int, int], ...] = (),
        notify: tuple[bytes, int] | None = None,
        on_namespaces: Callable[[int], None] | None = None,
        userns_owner: tuple[int, int] | None = None,
        session: int | None = None,
        id_base: int | None = None,
        range_userns: int = -1,
        upper: tuple[str, str, str] | None = None,
        pin_mounts: bool = False,
    ) -> None:
        object.__setattr__(self, "argv", argv)
        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "cgroup_procs", cgroup_procs)
        object.__setattr__(self, "landlock", landlock)
        object.__setattr__(self, "seccomp", seccomp)
        object.__setattr__(self, "audit_loginuid", audit_loginuid)
        object.__setattr__(self, "stdin", stdin)
        object.__setattr__(self, "stdout", stdout)
        object.__setattr__(self, "stderr", stderr)
        object.__setattr__(self, "cap_last", cap_last)
        object.__setattr__(self, "keep_fds", keep_fds)
        object.__setattr__(self, "idmap_userns", idmap_userns)
        object.__setattr__(self, "notify", notify)
        object.__setattr__(self, "on_namespaces", on_namespaces)
        object.__setattr__(self, "userns_owner", userns_owner)
        object.__setattr__(self, "session", session)
        object.__setattr__(self, "id_base", id_base)
        object.__setattr__(self, "range_userns", range_userns)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "pin_mounts", pin_mounts)


class Launched(Frozen):
    """A running cell, as its parent sees it."""

    _fields = ("pid", "init_pid", "session", "exec_error", "mount_ns")
    __slots__ = _fields

    pid: int
    """Host pid of C1, whose exit status is the cell's."""
    init_pid: int
    """Host pid of the cell's pid 1, its init (the command is its child): the
    process that creates the cell's Landlock domain, and the one to signal to
    stop the cell (it passes the signal on to the command)."""
    session: int | None
    """The cell's audit session id (``ses=`` in audit records)."""
    exec_error: tuple[str, int, str] | None
    """Set when the command itself could not be executed (stage, errno, message)."""
    mount_ns: int
    """With ``LaunchSpec.pin_mounts``: a descriptor of the cell's mount
    namespace, for the caller to hand to ``release_mounts`` once the cell
    has ended; else -1."""

    def __init__(
        self,
        pid: int,
        init_pid: int,
        session: int | None,
        exec_error: tuple[str, int, str] | None,
        mount_ns: int = -1,
    ) -> None:
        object.__setattr__(self, "pid", pid)
        object.__setattr__(self, "init_pid", init_pid)
        object.__setattr__(self, "session", session)
        object.__setattr__(self, "exec_error", exec_error)
        object.__setattr__(self, "mount_ns", mount_ns)


class _Releaser:
    """One thread that closes the mount namespaces of ended cells.

    The last reference to a cell's mount namespace unmounts its view and
    frees its tmpfs and sysfs instances (cleanup_mnt, ~0.7 ms of a default
    cell). Left to C1's exit, that delayed the exit the caller waits for;
    held by the caller and closed here, it runs beside the caller's own end
    of the cell (its cgroup's figures, the audit barrier), and ``Cell.run``
    waits for it before it returns, so nothing of the cell outlives the call.
    """

    def __init__(self) -> None:
        # A list and a condition, not the queue module: four more imports
        # on every `stockade exec` (tests/cli/test_exec_imports.py).
        self._pending: list[tuple[int, threading.Event]] = []
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None

    def release(self, fd: int) -> Callable[[], None]:
        """Close ``fd`` on the thread; returns the wait for it."""
        done = threading.Event()

        def wait() -> None:
            done.wait()

        if fd < 0:
            done.set()
            return wait
        with self._ready:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stockade-mounts", daemon=True)
                self._thread.start()
            self._pending.append((fd, done))
            self._ready.notify()
        return wait

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending:
                    self._ready.wait()
                fd, done = self._pending.pop(0)
            try:
                os.close(fd)
            except OSError:
                pass
            done.set()

    def _after_fork(self) -> None:
        # The thread did not come along into a forked child: start another.
        self._pending = []
        self._ready = threading.Condition()
        self._thread = None


_RELEASER = _Releaser()
os.register_at_fork(after_in_child=_RELEASER._after_fork)


def release_mounts(fd: int) -> Callable[[], None]:
    """Close a ``Launched.mount_ns`` beside the caller's other work; call
    the returned function to wait until the cell's view is unmounted."""
    return _RELEASER.release(fd)


_USERNS_FDS: dict[tuple[int, int, int, int], int] = {}


def idmap_userns(owner_uid: int, owner_gid: int, host_uid: int, host_gid: int) -> int:
    """A user namespace fd mapping ``owner`` to the cell's host ids, for
    idmapped mounts. Made once per process and kept (an fd is all it costs).

    Raises:
        CellError: the namespace could not be made (see ``stockade doctor``).
    """
    key = (owner_uid, owner_gid, host_uid, host_gid)
    fd = _USERNS_FDS.get(key)
    if fd is not None:
        return fd
    try:
        fd = userns_with_maps(f"{owner_uid} {host_uid} 1\n", f"{owner_gid} {host_gid} 1\n")
    except CellError as exc:
        raise CellError(f"could not map uid {owner_uid} for an idmapped mount: {exc}") from exc
    _USERNS_FDS[key] = fd
    return fd


def userns_with_maps(uid_map: str, gid_map: str) -> int:
    """The fd of a fresh user namespace with these maps, held by nothing else
    (for ``mount_setattr(MOUNT_ATTR_IDMAP)``, which only reads its maps).

    Raises:
        CellError: the namespace could not be made (see ``stockade doctor``).
    """
    # Made by a CLONE_VM child in C (``_native.userns``): 0.1 ms, where a
    # fork of this process cost 4 ms, twice for every workbench's run.
    try:
        return _native.userns(uid_map.encode(), gid_map.encode())
    except OSError as exc:
        raise CellError(
            f"could not make a user namespace with the maps {uid_map.strip()!r}: {exc.strerror}; "
            "run `stockade doctor`"
        ) from exc


def launch(spec: LaunchSpec) -> Launched:
    """Start a cell and return once its command is exec'd (or failed to be).

    Raises:
        CellError: a setup step before the command's exec failed.
    """
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = _spawn(spec, (status_r, status_w), (go_r, go_w))
    except BaseException as exc:
        for fd in (status_r, status_w, go_r, go_w):
            os.close(fd)
        if isinstance(exc, ValueError):
            # A value the kernel cannot take (a NUL byte in an argument or the
            # environment, an over-long path): nothing was forked.
            raise CellError(f"cannot start the cell: {exc}") from exc
        raise
    os.close(status_w)
    os.close(go_r)
    try:
        return _parent_side(spec, pid, status_r, go_w)
    except BaseException:
        _kill_and_reap(pid)
        raise
    finally:
        os.close(status_r)
        try:
            os.close(go_w)
        except OSError:
            pass


def _spawn(spec: LaunchSpec, status_pipe: tuple[int, int], go_pipe: tuple[int, int]) -> int:
    """Fork C1 through ``_native.spawn``; returns its pid.

    Raises:
        TypeError, ValueError: a value ``_native.spawn`` refuses (before forking).
        OSError: fork failed.
    """
    plan = spec.plan
    users = {uid: fd for uid, _gid, fd in spec.idmap_userns}

    def native(op: MountOp) -> tuple[str, str, str, bool, bytes, tuple[str, ...], int, bool]:
        if op.kind == "overlay":
            if spec.upper is None:
                raise ValueError("a workbench's overlay needs its upper layer (LaunchSpec.upper)")
            base, upper, work = spec.upper
            names = (upper, work) if work else (upper,)  # no work directory: a copy of the image
            return (op.kind, op.dst, op.src, True, base.encode(), names, spec.range_userns, False)
        return (
            op.kind,
            op.dst,
            op.src,
            op.writable,
            op.data,
            SYSTEM_DEVICES if op.kind == "dev" else op.names,
            users.get(op.idmap_owner, -1) if op.idmap_owner is not None else -1,
            op.from_view,
        )

    mounts = tuple(native(op) for op in plan.mounts)
    prepared = spec.landlock
    landlock = (
        None
        if prepared is None
        else (prepared.ruleset_attr, prepared.rules, prepared.paths, prepared.ports, prepared.restrict_flags)
    )
    extra: dict[str, Any] = {}
    if _DECOY_TEMPLATES and not plan.id_range:
        # The decoys are owned by the host ids of the cell's uid, and no
        # decoy beneath a path the cell may write is a copy of the shared
        # template (``_native.decoy_template``). A workbench's ids change
        # every run: it makes its decoys itself.
        grants = plan.grants
        extra["decoys"] = (plan.host_uid, plan.host_gid, (*grants.write, *grants.write_exec, *grants.devices))
    return _native.spawn(
        argv=spec.argv,
        env=plan.env,
        workdir=plan.workdir,
        mounts=mounts,
        landlock=landlock,
        seccomp=spec.seccomp,
        cgroup_procs=spec.cgroup_procs,
        loginuid=spec.audit_loginuid,
        stdio=(spec.stdin, spec.stdout, spec.stderr),
        status_pipe=status_pipe,
        go_pipe=go_pipe,
        cap_last=spec.cap_last,
        keep_fds=spec.keep_fds,
        userns_owner=spec.userns_owner,
        notify=spec.notify,
        session=spec.session,
        identity=(plan.uid, plan.gid, plan.keep_caps) if plan.id_range else None,
        **extra,
    )


def _kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _read_line(fd: int, buffer: bytearray) -> bytes | None:
    while b"\n" not in buffer:
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        buffer.extend(chunk)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


def _write_proc(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _parent_side(spec: LaunchSpec, pid: int, status_r: int, go_w: int) -> Launched:
    buffer = bytearray()
    line = _read_line(status_r, buffer)
    if line != b"U":
        _raise_from(line, pid)
    plan = spec.plan
    # Raw os.open/os.write: these few writes are on every launch's path, and
    # open() with its text layer costs several times the syscalls themselves.
    proc = f"/proc/{pid}/"
    try:
        # setgroups must be denied before gid_map is written, except by a
        # writer with CAP_SETGID in the parent namespace (root); denying it
        # first is right for both.
        if spec.id_base is not None:
            # A workbench's whole range (root inside for apt-get and dpkg):
            # setgroups stays allowed, since every group it could name is
            # the cell's own (C1 dropped the caller's supplementary groups).
            ids = f"0 {spec.id_base} {ID_COUNT}\n".encode()
            _write_proc(proc + "uid_map", ids)
            _write_proc(proc + "gid_map", ids)
        else:
            _write_proc(proc + "uid_map", f"{CELL_UID} {plan.host_uid} 1\n".encode())
            _write_proc(proc + "setgroups", b"deny")
            _write_proc(proc + "gid_map", f"{CELL_UID} {plan.host_gid} 1\n".encode())
    except OSError as exc:
        raise CellError(
            f"could not map the cell's user (uid {CELL_UID} to host uid {plan.host_uid}): {exc}; "
            "see `stockade doctor` for user namespace support"
        ) from exc
    session: int | None = None
    if spec.audit_loginuid is not None:
        try:
            fd = os.open(proc + "sessionid", os.O_RDONLY | os.O_CLOEXEC)
            try:
                session = int(os.read(fd, 32))
            finally:
                os.close(fd)
        except (OSError, ValueError):
            session = None
    mount_ns = -1
    if spec.pin_mounts:
        try:
            mount_ns = os.open(proc + "ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            mount_ns = -1  # only a matter of speed: C1's exit tears it down then
    try:
        if spec.on_namespaces is not None:
            spec.on_namespaces(pid)
        os.write(go_w, b"G")
    except BaseException:
        if mount_ns >= 0:
            os.close(mount_ns)
        raise
    try:
        line = _read_line(status_r, buffer)
        if line is None or not line.startswith(b"P"):
            _raise_from(line, pid)
            raise AssertionError("unreachable")
        init_pid = int(line[1:])
        # EOF means the command was exec'd (the pipe is close-on-exec); anything
        # else is a report of the step that failed.
        line = _read_line(status_r, buffer)
        exec_error: tuple[str, int, str] | None = None
        if line is not None:
            stage, err, message = _parse_error(line)
            if stage != "exec":
                _kill_and_reap(pid)
                raise CellError(f"cell setup failed while {stage}: {message}")
            exec_error = (stage, err, message)
    except BaseException:
        if mount_ns >= 0:
            os.close(mount_ns)
        raise
    return Launched(pid=pid, init_pid=init_pid, session=session, exec_error=exec_error, mount_ns=mount_ns)


def _parse_error(line: bytes) -> tuple[str, int, str]:
    if not line.startswith(b"E"):
        return "setup", 0, line.decode(errors="replace")
    parts = line[1:].decode(errors="replace").split("\t", 2)
    if len(parts) != 3:
        return "setup", 0, line.decode(errors="replace")
    return parts[0], int(parts[1] or 0), parts[2]


def _raise_from(line: bytes | None, pid: int) -> None:
    _kill_and_reap(pid)
    if line is None:
        raise CellError("cell setup failed: the launcher exited without a report")
    stage, _err, message = _parse_error(line)
    hint = ""
    if stage == "unshare":
        hint = "; this host may forbid user namespaces: run `stockade doctor`"
    raise CellError(f"cell setup failed while {stage}: {message}{hint}")
