"""Launch one cell: fork, namespaces, the filesystem view, then exec.

The sequence, from a warm parent process (P)::

    P ──fork──▶ C1: death signal, new session, audit session (loginuid),
                    joins the cell's cgroups, drops supplementary groups,
                    unshare(user, mount, pid, net, ipc, uts, cgroup)
    P writes C1's uid/gid maps (cell uid 1000 → an unprivileged host uid)
                C1 ──fork──▶ C2 (pid 1 of the cell): builds the filesystem view
                    on a tmpfs, pivots into it, brings up loopback, drops every
                    capability, no_new_privs, Landlock, seccomp, execve.
                C1 waits for C2 and exits with its status.

C2 is the cell's pid 1: when it exits the kernel kills every other process of
the cell's pid namespace, and if P dies, C1 and then C2 get SIGKILL from their
death signals, so nothing outlives its cell. The parent also kills the cell's
cgroup when it ends.

Why by hand and not bubblewrap: the cell must cost no more than 1.5 times what
``bwrap`` alone costs, and bwrap cannot apply Landlock (it must be applied
inside, after bwrap's mounts), so bwrap plus a launcher costs two program
starts. Forking a warm Python process and replaying a precomputed plan costs
one. The child runs only syscalls on data prepared in the parent: no imports,
no allocation-heavy work, no threads.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import stat
import struct
from dataclasses import dataclass
from typing import Any

from stockade.cell._plan import CELL_UID, SYSTEM_DEVICES, CellPlan, MountOp
from stockade.errors import CellError

_libc = ctypes.CDLL(None, use_errno=True)

# <sched.h> clone flags (clone(2)).
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CELL_NAMESPACES = (
    CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
)

# <sys/mount.h> (mount(2)).
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

# mount_setattr(2), Linux 5.12: recursive read-only without remounting each submount.
SYS_mount_setattr = 442
SYS_pivot_root = 155
SYS_capset = 126
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

# open_tree(2)/move_mount(2), Linux 5.2; MOUNT_ATTR_IDMAP, Linux 5.12.
SYS_open_tree = 428
SYS_move_mount = 429
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
MOUNT_ATTR_IDMAP = 0x00100000
MOVE_MOUNT_F_EMPTY_PATH = 0x00000004

# <linux/prctl.h>.
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# <linux/securebits.h>: root gets no capabilities from exec, setuid does not
# fix them up, ambient raising is off, and each of these is locked.
SECURE_BITS_LOCKED_NOROOT = 0x01 | 0x02 | 0x04 | 0x08 | 0x40 | 0x80
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# <linux/sockios.h>, <net/if.h>: bring loopback up in the new netns.
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

STAGE = "/tmp"
"""Where the child mounts its staging tmpfs before the first pivot. It is the
host's /tmp only inside the child's own mount namespace, and the host's /tmp
stays reachable as /oldroot/tmp (the same trick bubblewrap uses)."""


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class _SetupFailed(Exception):
    def __init__(self, stage: str, err: int, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.err = err


def _check(result: int, stage: str, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise _SetupFailed(stage, err, f"{what}: {os.strerror(err)}")
    return result


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None, stage: str) -> None:
    _check(
        _libc.mount(
            src.encode() if src else None,
            dst.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        stage,
        f"mount {src or fstype} on {dst}",
    )


def _set_attr(path: str, attrs: int, recursive: bool, stage: str) -> None:
    attr = _MountAttr(attrs, 0, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    _check(
        _libc.syscall(
            SYS_mount_setattr, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)
        ),
        stage,
        f"mount_setattr {path}",
    )


def _makedirs(path: str) -> None:
    # os.makedirs stats every component; here parents are usually there already.
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        return
    except FileNotFoundError:
        _makedirs(os.path.dirname(path))
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            return


def _touch(path: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        _makedirs(os.path.dirname(path))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return  # a directory or a read-only mount: the bind will say if it matters
    os.close(fd)


@dataclass(frozen=True)
class LaunchSpec:
    """What the child needs beyond the plan: the command and the prepared layers."""

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
    keep_fds: tuple[int, ...] = ()
    idmap_userns: tuple[tuple[int, int, int], ...] = ()
    """(owner uid, owner gid, user namespace fd) for each idmapped grant."""


@dataclass(frozen=True)
class Launched:
    """A running cell, as its parent sees it."""

    pid: int
    """Host pid of C1, whose exit status is the cell's."""
    init_pid: int
    """Host pid of the cell's pid 1 (the command)."""
    session: int | None
    """The cell's audit session id (``ses=`` in audit records)."""
    exec_error: tuple[str, int, str] | None
    """Set when the command itself could not be executed (stage, errno, message)."""


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
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - a placeholder process that only holds the namespace
        try:
            ok = _libc.unshare(CLONE_NEWUSER) == 0
            os.write(ready_w, b"1" if ok else b"0")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise CellError("could not create a user namespace for an idmapped mount; run `stockade doctor`")
        try:
            with open(f"/proc/{pid}/uid_map", "w") as f:
                f.write(f"{owner_uid} {host_uid} 1\n")
            with open(f"/proc/{pid}/setgroups", "w") as f:
                f.write("deny")
            with open(f"/proc/{pid}/gid_map", "w") as f:
                f.write(f"{owner_gid} {host_gid} 1\n")
            fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise CellError(f"could not map uid {owner_uid} for an idmapped mount: {exc}") from exc
    finally:
        os.write(done_w, b"x")
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)
    _USERNS_FDS[key] = fd
    return fd


def launch(spec: LaunchSpec) -> Launched:
    """Start a cell and return once its command is exec'd (or failed to be).

    Raises:
        CellError: a setup step before the command's exec failed.
    """
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reported through the pipe
        try:
            os.close(status_r)
            os.close(go_w)
            _first_child(spec, parent, status_w, go_r)
        except _SetupFailed as exc:
            _report(status_w, exc.stage, exc.err, str(exc))
        except BaseException as exc:
            _report(status_w, "setup", getattr(exc, "errno", 0) or 0, f"{type(exc).__name__}: {exc}")
        os._exit(127)
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


def _parent_side(spec: LaunchSpec, pid: int, status_r: int, go_w: int) -> Launched:
    buffer = bytearray()
    line = _read_line(status_r, buffer)
    if line != b"U":
        _raise_from(line, pid)
    plan = spec.plan
    try:
        if os.geteuid() != 0:
            # An unprivileged writer must give up setgroups before mapping gids.
            with open(f"/proc/{pid}/setgroups", "w") as f:
                f.write("deny")
        with open(f"/proc/{pid}/uid_map", "w") as f:
            f.write(f"{CELL_UID} {plan.host_uid} 1\n")
        if os.geteuid() == 0:
            with open(f"/proc/{pid}/setgroups", "w") as f:
                f.write("deny")
        with open(f"/proc/{pid}/gid_map", "w") as f:
            f.write(f"{CELL_UID} {plan.host_gid} 1\n")
    except OSError as exc:
        raise CellError(
            f"could not map the cell's user (uid {CELL_UID} to host uid {plan.host_uid}): {exc}; "
            "see `stockade doctor` for user namespace support"
        ) from exc
    session: int | None = None
    if spec.audit_loginuid is not None:
        try:
            with open(f"/proc/{pid}/sessionid") as f:
                session = int(f.read())
        except (OSError, ValueError):
            session = None
    os.write(go_w, b"G")
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
    return Launched(pid=pid, init_pid=init_pid, session=session, exec_error=exec_error)


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


def _report(fd: int, stage: str, err: int, message: str) -> None:
    text = message.replace("\n", " ").replace("\t", " ")
    try:
        os.write(fd, f"E{stage}\t{err}\t{text}\n".encode(errors="replace"))
    except OSError:
        pass


# ----------------------------------------------------------------- the children


def _first_child(spec: LaunchSpec, parent: int, status_w: int, go_r: int) -> None:  # pragma: no cover
    stage = "preparing"
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), stage, "death signal")
    if os.getppid() != parent:
        os._exit(127)  # the parent died before we could watch it
    # Python's handlers are meaningless here; the defaults make the cell killable.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    os.setsid()  # no controlling terminal: TIOCSTI has nothing to inject into
    for target, source in ((0, spec.stdin), (1, spec.stdout), (2, spec.stderr)):
        if source != target:
            os.dup2(source, target)
    if spec.audit_loginuid is not None:
        stage = "setting the audit session"
        fd = os.open("/proc/self/loginuid", os.O_WRONLY | os.O_CLOEXEC)
        os.write(fd, str(spec.audit_loginuid).encode())
        os.close(fd)
    stage = "joining cgroups"
    for procs in spec.cgroup_procs:
        fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
        os.write(fd, b"0")
        os.close(fd)
    trees = _detached_trees(spec)
    if os.geteuid() == 0:
        os.setgroups([])
    _check(_libc.unshare(CELL_NAMESPACES), "unshare", "unshare namespaces")
    os.write(status_w, b"U\n")
    if os.read(go_r, 1) != b"G":
        os._exit(127)
    os.close(go_r)
    os.setresgid(CELL_UID, CELL_UID, CELL_UID)
    os.setresuid(CELL_UID, CELL_UID, CELL_UID)
    pid = os.fork()
    if pid == 0:
        try:
            _cell_init(spec, status_w, trees)
        except _SetupFailed as exc:
            _report(status_w, exc.stage, exc.err, str(exc))
        except OSError as exc:
            _report(status_w, "setup", exc.errno or 0, f"{exc}")
        except BaseException as exc:
            _report(status_w, "setup", 0, f"{type(exc).__name__}: {exc}")
        os._exit(127)
    os.write(status_w, b"P%d\n" % pid)
    os.close(status_w)
    for fd in (0, 1, 2):
        os.close(fd)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def _detached_trees(spec: LaunchSpec) -> dict[int, tuple[int, bool]]:  # pragma: no cover
    """Detached copies (``open_tree``) of every host path the view binds, made
    while this process is still host root.

    The cell's pid 1 could not reach them itself: it acts as an unprivileged
    host uid and would be stopped by any parent directory it may not traverse
    (a 0700 home, pytest's /tmp/pytest-of-root). The copies are moved into the
    view by file descriptor. Writable grants whose owner is not the cell's
    host uid are idmapped here too (only the initial namespace may idmap an
    ext4 mount). Returns {op index: (tree fd, is a directory)}.
    """
    trees: dict[int, tuple[int, bool]] = {}
    users = {uid: fd for uid, _gid, fd in spec.idmap_userns}
    stage = "preparing the grants"
    for index, op in enumerate(spec.plan.mounts):
        if op.kind != "bind" or op.from_view:
            continue
        fd = _libc.syscall(
            SYS_open_tree,
            ctypes.c_int(AT_FDCWD),
            op.src.encode(),
            ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
        )
        if fd < 0:
            if ctypes.get_errno() in (2, 20):  # ENOENT, ENOTDIR: gone since planning
                continue
            _check(fd, stage, f"open_tree {op.src}")
        attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
        userns = 0
        if op.idmap_owner is not None and op.idmap_owner in users:
            attrs |= MOUNT_ATTR_IDMAP
            userns = users[op.idmap_owner]
        attr = _MountAttr(attrs, 0, 0, userns)
        _check(
            _libc.syscall(
                SYS_mount_setattr,
                ctypes.c_int(fd),
                b"",
                ctypes.c_uint(AT_EMPTY_PATH),
                ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr)),
            ),
            stage,
            f"mount attributes of {op.src}",
        )
        trees[index] = (fd, stat.S_ISDIR(os.fstat(fd).st_mode))
    return trees


def _cell_init(
    spec: LaunchSpec, status_w: int, trees: dict[int, tuple[int, bool]]
) -> None:  # pragma: no cover
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "preparing", "death signal")
    plan = spec.plan
    _build_view(plan.mounts, trees)
    _check(_libc.sethostname(b"stockade", 8), "naming the host", "sethostname")
    _loopback_up()
    stage = "entering the workdir"
    try:
        os.chdir(plan.workdir)
    except OSError as exc:
        raise _SetupFailed(stage, exc.errno or 0, f"workdir {plan.workdir}: {exc.strerror}") from None
    _drop_privileges(spec.cap_last)
    if spec.landlock is not None:
        from stockade.cell import _landlock  # already imported by the parent: a dict lookup

        try:
            _landlock.apply(spec.landlock)
        except OSError as exc:
            raise _SetupFailed("applying landlock", exc.errno or 0, f"landlock: {exc}") from None
    # Nothing the launcher holds may leak into the cell (close_range(2) under
    # os.closerange). The status pipe is close-on-exec and reports exec errors.
    keep = sorted({status_w, *spec.keep_fds})
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)
    if spec.seccomp:
        from stockade.cell import _seccomp

        for program, log in spec.seccomp:
            try:
                _seccomp.load(program, log=log)
            except OSError as exc:
                raise _SetupFailed("loading seccomp", exc.errno or 0, f"seccomp: {exc}") from None
    env = dict(plan.env)
    try:
        os.execvpe(spec.argv[0], list(spec.argv), env)
    except OSError as exc:
        raise _SetupFailed("exec", exc.errno or 0, f"{spec.argv[0]}: {exc.strerror}") from None


def _build_view(mounts: tuple[MountOp, ...], trees: dict[int, tuple[int, bool]]) -> None:  # pragma: no cover
    stage = "building the filesystem view"
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None, stage)
    _mount("tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700", stage)
    os.mkdir(STAGE + "/newroot")
    os.mkdir(STAGE + "/oldroot")
    _check(_libc.syscall(SYS_pivot_root, STAGE.encode(), (STAGE + "/oldroot").encode()), stage, "pivot_root")
    os.chdir("/")
    _mount("tmpfs", "/newroot", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755", stage)
    # Decoys are writable by file mode on purpose: Landlock, not the file
    # mode, must be what refuses an attempt, so that the kernel records it.
    _touch("/empty")
    for index, op in enumerate(mounts):
        dst = "/newroot" + op.dst
        kind = op.kind
        if kind == "bind" and not op.from_view:
            tree = trees.get(index)
            if tree is None:
                continue  # gone since planning: nothing to show
            fd, is_dir = tree
            if is_dir:
                _makedirs(dst)
            else:
                _touch(dst)
            _check(
                _libc.syscall(
                    SYS_move_mount,
                    ctypes.c_int(fd),
                    b"",
                    ctypes.c_int(AT_FDCWD),
                    dst.encode(),
                    ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
                ),
                stage,
                f"move_mount {op.src}",
            )
            os.close(fd)
            # Grants are not read-only mounts even when read-only: such a mount
            # refuses a write before Landlock sees it, and so without a record;
            # Landlock refuses it instead and the kernel logs what was tried.
        elif kind == "bind":
            # A protected path inside a writable grant, as the cell sees it: no
            # Landlock rule can carve a name out of a writable tree, so a
            # read-only mount refuses it (EROFS); the directories leading to it
            # are mount points so that they cannot be renamed away (EBUSY).
            src = "/newroot" + op.src
            if not os.path.lexists(src):
                continue
            _mount(src, dst, None, MS_BIND, None, stage)
            attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
            if not op.writable:
                attrs |= MOUNT_ATTR_RDONLY
            _set_attr(dst, attrs, False, stage)
        elif kind == "tmpfs":
            _makedirs(dst)
            _mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", stage)
        elif kind == "decoy_file":
            _touch(dst)
            _mount("/empty", dst, None, MS_BIND, None, stage)
            _set_attr(dst, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, False, stage)
        elif kind == "decoy_dir":
            _makedirs(dst)
            if op.writable:
                # Inside a bind mount of the host: cover it with a tmpfs. A
                # decoy in the cell's own root needs no mount of its own.
                _mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755", stage)
            for name in op.names:
                try:
                    if name.endswith("/"):
                        os.mkdir(dst + "/" + name[:-1], 0o755)
                    else:
                        os.close(os.open(dst + "/" + name, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
                except FileExistsError:
                    pass  # nested hidden places (/var/lib/stockade and its workspaces)
            # Left writable, like the cell's root: Landlock grants nothing
            # here, so every attempt is refused and recorded by the kernel.
        elif kind == "file":
            staged = f"/file{index}"
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.write(fd, op.data)
            os.close(fd)
            _touch(dst)
            _mount(staged, dst, None, MS_BIND, None, stage)
        elif kind == "symlink":
            _makedirs(os.path.dirname(dst))
            if not os.path.lexists(dst):
                os.symlink(op.src, dst)
        elif kind == "dir":
            _makedirs(dst)
        elif kind == "proc":
            _makedirs(dst)
            _mount("proc", dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, stage)
            # The kernel knobs stay read-only (the rest of /proc that is not
            # the cell's own belongs to host root, which the cell is not).
            for sub in ("sys", "sysrq-trigger"):
                path = dst + "/" + sub
                if os.path.exists(path):
                    _mount(path, path, None, MS_BIND | MS_REC, None, stage)
                    _set_attr(path, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, True, stage)
        elif kind == "dev":
            _build_dev(dst, stage)
    os.chdir("/newroot")
    _check(_libc.syscall(SYS_pivot_root, b".", b"."), stage, "pivot_root into the cell")
    _check(_libc.umount2(b".", MNT_DETACH), stage, "detaching the host's root")
    os.chdir("/")


def _build_dev(dst: str, stage: str) -> None:  # pragma: no cover
    _makedirs(dst)
    _mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755", stage)
    for name in SYSTEM_DEVICES:
        node = dst + "/" + name
        _touch(node)
        _mount("/oldroot/dev/" + name, node, None, MS_BIND, None, stage)
    os.mkdir(dst + "/pts")
    _mount(
        "devpts", dst + "/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620", stage
    )
    os.symlink("pts/ptmx", dst + "/ptmx")
    os.mkdir(dst + "/shm")
    _mount("tmpfs", dst + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", stage)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("core", "/proc/kcore"),
    ):
        os.symlink(target, dst + "/" + name)


def _loopback_up() -> None:  # pragma: no cover
    stage = "bringing up loopback"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            ifreq = struct.pack("16sH14x", b"lo", 0)
            flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, ifreq))[1]
            fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
    except OSError as exc:
        raise _SetupFailed(stage, exc.errno or 0, f"loopback: {exc.strerror}") from None


def _drop_privileges(cap_last: int) -> None:  # pragma: no cover
    stage = "dropping privileges"
    _check(_libc.prctl(PR_SET_SECUREBITS, SECURE_BITS_LOCKED_NOROOT, 0, 0, 0), stage, "securebits")
    for cap in range(cap_last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), stage, f"dropping capability {cap}")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), stage, "ambient capabilities")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.syscall(SYS_capset, ctypes.byref(header), ctypes.byref(data)), stage, "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), stage, "no_new_privs")
