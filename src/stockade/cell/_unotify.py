"""The connect supervisor: no host unix socket is reachable from a cell, wherever
it lies and whenever it was made, without looking for any.

Two kernel mechanisms, each covering what the other cannot:

1. **A cgroup BPF guard** (``cgroup/connect_unix`` and ``cgroup/sendmsg_unix``,
   Linux 6.7), attached to every cell's cgroup: a unix socket created in the
   cell may not connect, or send to an address, unless the calling thread
   belongs to this process (the supervisor). The kernel runs it on its own copy
   of the address, so nothing the agent does to its memory gets around it; it
   refuses with EPERM and records nothing.
2. **Seccomp user notification** on ``connect(2)`` (Linux 5.0; the filter of
   :func:`stockade.cell._seccomp.build_notify_filter`, loaded by the cell's init
   with ``SECCOMP_FILTER_FLAG_NEW_LISTENER``): every connect of the cell waits
   for :class:`Supervisor`. It copies the caller's socket (``pidfd_getfd``, the
   same open file description) and reads its family with ``SO_DOMAIN``, which
   the agent cannot change. Not a unix socket: the kernel carries on with the
   call (``SECCOMP_USER_NOTIF_FLAG_CONTINUE``), and TCP stays under Landlock and
   the network namespace. Should the agent swap a unix socket onto that
   descriptor number before the call resumes, the guard refuses it. A unix
   socket: the address is read once, resolved in the cell's view to an inode,
   and the supervisor connects the copy itself, to that inode, if it is a
   socket stockade offers the cell (the broker's) or one a process of the cell
   bound (in the cell's network namespace, by the cell's uid: ``sock_diag``).
   Anything else is refused with EACCES and an event naming the path.

Never enforced on the agent's memory by CONTINUE (seccomp_unotify(2), NOTES):
the decision is made on the supervisor's copy of the address, and the connect
is made by the supervisor on an inode it holds open, so changing the address
afterwards changes nothing.

One :class:`Supervisor` thread per process serves every cell (epoll over their
listeners); connects are made in short threads of their own, so that one that
blocks (a full backlog) holds up only its caller. If this process dies, the
listeners close and the cell's connects fail with ENOSYS: closed, not open.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import socket
import stat
import struct
import threading
from collections.abc import Callable

from stockade._slots import Mutable
from stockade.cell._syscall import libc
from stockade.cell._syscall_table import AUDIT_ARCH_X86_64
from stockade.errors import HostError
from stockade.record import Event

# --- <linux/seccomp.h>: the notification ioctls (seccomp_unotify(2)) ---------------
_NOTIF = struct.Struct("=QIIiIQ6Q")
"""struct seccomp_notif: id, pid, flags, then seccomp_data (nr, arch, ip, args)."""
_RESP = struct.Struct("=QqiI")
"""struct seccomp_notif_resp: id, val, error, flags."""
SECCOMP_IOCTL_NOTIF_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif)
SECCOMP_IOCTL_NOTIF_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp)
SECCOMP_IOCTL_NOTIF_ID_VALID = 0x40082102  # _IOW('!', 2, __u64)
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
"""Linux 5.5: let the call run as if no filter had stopped it."""

# --- syscalls (x86-64) and their flags ------------------------------------------------
_SYS_BPF = 321
_SYS_PIDFD_OPEN = 434
_SYS_OPENAT2 = 437
_SYS_PIDFD_GETFD = 438
PIDFD_THREAD = os.O_EXCL
"""Linux 6.9: a pidfd of one thread (the notifying one), not of a thread-group leader."""
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
"""openat2(2): resolve as if the directory were the root (the cell's)."""
SO_DOMAIN = 39
"""<asm-generic/socket.h>: a socket's family, fixed when it was made."""

# --- <linux/bpf.h> ----------------------------------------------------------------------
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_TYPE_CGROUP_SOCK_ADDR = 18
BPF_CGROUP_UNIX_CONNECT = 49
"""Linux 6.7 (enum bpf_attach_type), as BPF_CGROUP_UNIX_SENDMSG."""
BPF_CGROUP_UNIX_SENDMSG = 50
BPF_F_ALLOW_MULTI = 2
BPF_FUNC_GET_CURRENT_PID_TGID = 14

# --- <linux/sock_diag.h>, <linux/unix_diag.h> -------------------------------------------
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_NAME, UDIAG_SHOW_VFS, UDIAG_SHOW_UID = 0x01, 0x02, 0x40
UNIX_DIAG_NAME, UNIX_DIAG_VFS, UNIX_DIAG_UID = 0, 1, 7
CLONE_NEWNET = 0x4000_0000

REFUSAL_ERRNO = errno.EACCES
"""What a refused connect returns: permission denied, as Landlock's refusals do
(a decoy's ECONNREFUSED would say nothing is there, which is not the reason)."""
MAX_CONNECTS_PER_CELL = 16
"""Connects of one cell the supervisor makes at once; beyond, EAGAIN (what a
unix socket's full backlog gives a non-blocking caller). A cell whose
listeners never accept cannot tie up threads without bound."""
SUN_PATH = 108

_libc_pvr = libc.process_vm_readv
_libc_pvr.restype = ctypes.c_ssize_t


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _sys(nr: int, *args: object) -> int:
    r = int(libc.syscall(ctypes.c_long(nr), *args))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


# --------------------------------------------------------------------------- the guard

_guard: tuple[int, int] | None = None
"""(pid, program fd): the guard program, loaded once per process (its pid is in it)."""
_guard_lock = threading.Lock()


def _insn(code: int, dst: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, dst, off, imm)


def _guard_program(tgid: int) -> int:
    # Allow (1) only when the calling thread is of process ``tgid``, else deny
    # (0: EPERM). bpf_get_current_pid_tgid() gives the tgid in the upper half,
    # in the initial pid namespace, where os.getpid() of this process lives too
    # (stockade's daemon runs in it).
    program = b"".join(
        (
            _insn(0x85, imm=BPF_FUNC_GET_CURRENT_PID_TGID),  # call
            _insn(0x77, dst=0, imm=32),  # r0 >>= 32
            _insn(0x15, dst=0, off=2, imm=tgid),  # if r0 == tgid goto allow
            _insn(0xB7, dst=0, imm=0),  # r0 = 0
            _insn(0x95),  # exit
            _insn(0xB7, dst=0, imm=1),  # allow: r0 = 1
            _insn(0x95),
        )
    )
    code = ctypes.create_string_buffer(program, len(program))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = ctypes.create_string_buffer(128)
    struct.pack_into(
        "<IIQQIIQII16sII",
        attr,
        0,
        BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
        len(program) // 8,
        ctypes.addressof(code),
        ctypes.addressof(license_),
        1,
        len(log),
        ctypes.addressof(log),
        0,
        0,
        b"stockade_unix",
        0,
        BPF_CGROUP_UNIX_CONNECT,
    )
    # One program serves both hooks: each load names the one hook it is for,
    # so a second load for sendmsg.
    try:
        connect_fd = _sys(_SYS_BPF, BPF_PROG_LOAD, attr, 128)
        struct.pack_into("<I", attr, 68, BPF_CGROUP_UNIX_SENDMSG)
        sendmsg_fd = _sys(_SYS_BPF, BPF_PROG_LOAD, attr, 128)
    except OSError as exc:
        raise HostError(
            f"cannot load the cgroup BPF program that keeps cells off the host's unix sockets "
            f"({exc.strerror}: {log.value.decode(errors='replace')[:200] or 'no verifier log'}); "
            "run stockade as root on Linux ≥ 6.7 (cgroup/connect_unix)",
            feature="cgroup.bpf",
        ) from exc
    os.set_inheritable(connect_fd, False)
    os.set_inheritable(sendmsg_fd, False)
    return connect_fd | (sendmsg_fd << 32)


def attach_guard(cgroup_dir: str) -> None:
    """Attach the unix-socket guard to the cell's cgroup v2 directory ``cgroup_dir``
    (before any process joins it). Detached by the kernel when the cgroup is removed.

    Raises:
        HostError: this kernel cannot load or attach the program.
    """
    global _guard
    with _guard_lock:
        if _guard is None or _guard[0] != os.getpid():
            _guard = (os.getpid(), _guard_program(os.getpid()))
        both = _guard[1]
    fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        attr = ctypes.create_string_buffer(128)
        hooks = ((both & 0xFFFF_FFFF, BPF_CGROUP_UNIX_CONNECT), (both >> 32, BPF_CGROUP_UNIX_SENDMSG))
        for prog, hook in hooks:
            struct.pack_into("<IIII", attr, 0, fd, prog, hook, BPF_F_ALLOW_MULTI)
            try:
                _sys(_SYS_BPF, BPF_PROG_ATTACH, attr, 128)
            except OSError as exc:
                raise HostError(
                    f"cannot attach the unix-socket guard to cgroup {cgroup_dir}: {exc.strerror}; "
                    "run stockade as root on Linux ≥ 6.7 with cgroup v2",
                    feature="cgroup.bpf",
                ) from exc
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- one cell


class CellWatch(Mutable):
    """What the supervisor knows of one cell, and the events it made for it."""

    _fields = (
        "cell_id",
        "listener",
        "offered",
        "host_uid",
        "netns_fd",
        "audit",
        "on_event",
        "events",
        "connects",
        "closed",
        "lock",
        "_diag",
    )
    __slots__ = _fields
    cell_id: str
    listener: int
    offered: dict[tuple[int, int], tuple[str, int]]
    """(st_dev, st_ino) of each socket stockade offers the cell → (path inside, O_PATH fd)."""
    host_uid: int
    netns_fd: int
    audit: bool
    """The policy's mode is ``audit``: a refusal is recorded and the connect made."""
    on_event: Callable[[Event], None] | None
    """Called with each event as it is made (from the supervisor's thread)."""
    events: list[Event]
    connects: int
    """Connects being made for the cell right now."""
    closed: bool
    lock: threading.Lock
    _diag: socket.socket | None

    def __init__(
        self,
        cell_id: str,
        listener: int,
        offered: dict[tuple[int, int], tuple[str, int]],
        host_uid: int,
        netns_fd: int,
        audit: bool,
        on_event: Callable[[Event], None] | None = None,
        events: list[Event] | None = None,
        connects: int = 0,
        closed: bool = False,
        lock: threading.Lock | None = None,
        _diag: socket.socket | None = None,
    ) -> None:
        self.cell_id = cell_id
        self.listener = listener
        self.offered = offered
        self.host_uid = host_uid
        self.netns_fd = netns_fd
        self.audit = audit
        self.on_event = on_event
        self.events = [] if events is None else events
        self.connects = connects
        self.closed = closed
        self.lock = threading.Lock() if lock is None else lock
        self._diag = _diag

    def diag(self) -> socket.socket:
        """A sock_diag socket in the cell's network namespace, made once, on first need."""
        if self._diag is None:
            if self.netns_fd < 0:
                raise OSError(errno.ESRCH, "the cell's network namespace is gone")
            self._diag = _socket_in_netns(
                self.netns_fd, socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG
            )
        return self._diag

    def record(self, event: Event) -> None:
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def release(self) -> None:
        os.close(self.listener)
        if self.netns_fd >= 0:
            os.close(self.netns_fd)
        for _path, fd in self.offered.values():
            os.close(fd)
        if self._diag is not None:
            self._diag.close()


def _socket_in_netns(netns_fd: int, family: int, type_: int, proto: int) -> socket.socket:
    # setns(2) on a thread changes only that thread; the socket keeps the
    # namespace it was made in.
    box: list[socket.socket | BaseException] = []

    def worker() -> None:
        try:
            if libc.setns(netns_fd, CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"setns into the cell's network namespace: {os.strerror(e)}")
            box.append(socket.socket(family, type_ | socket.SOCK_CLOEXEC, proto))
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=worker, name="stockade-unotify-setns")
    t.start()
    t.join()
    got = box[0]
    if isinstance(got, BaseException):
        raise got
    return got


# --------------------------------------------------------------------------- the supervisor


class Supervisor:
    """One thread serving the connect notifications of every cell of this process."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._watches: dict[int, CellWatch] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="stockade-unotify", daemon=True)
        self._thread.start()

    def watch(
        self,
        listener: int,
        *,
        cell_id: str,
        init_pid: int,
        offered: dict[str, str],
        host_uid: int,
        audit: bool,
        on_event: Callable[[Event], None] | None = None,
    ) -> CellWatch:
        """Serve the cell whose listener is ``listener`` (taken over: closed by
        :meth:`unwatch`). ``offered`` maps paths inside the cell to the host
        sockets they show (the broker's).

        """
        identities: dict[tuple[int, int], tuple[str, int]] = {}
        for inside, host in offered.items():
            try:
                fd = os.open(host, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not there (any more): nothing to connect to
            st = os.fstat(fd)
            identities[(st.st_dev, st.st_ino)] = (inside, fd)
        try:
            netns = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            # The cell ended already (a command that exits at once): it will
            # connect nowhere, and a check that needed the namespace refuses.
            netns = -1
        w = CellWatch(cell_id, listener, identities, host_uid, netns, audit, on_event)
        with self._lock:
            self._watches[listener] = w
        if netns >= 0:
            with _supervisor_lock:
                _by_netns[os.fstat(netns).st_ino] = cell_id
        self._epoll.register(listener, select.EPOLLIN)
        return w

    def unwatch(self, w: CellWatch) -> list[Event]:
        """Stop serving the cell; its events. Connects still waiting fail with ENOSYS."""
        with self._lock:
            self._watches.pop(w.listener, None)
        if w.netns_fd >= 0:
            with _supervisor_lock:
                _by_netns.pop(os.fstat(w.netns_fd).st_ino, None)
        with w.lock:
            if not w.closed:
                w.closed = True
                try:
                    self._epoll.unregister(w.listener)
                except (OSError, ValueError):
                    pass
                if w.connects == 0:
                    w.release()
            return list(w.events)

    # -- the loop

    def _loop(self) -> None:
        while True:
            try:
                ready = self._epoll.poll()
            except InterruptedError:
                continue
            for fd, mask in ready:
                with self._lock:
                    w = self._watches.get(fd)
                if w is None:
                    continue
                with w.lock:
                    if w.closed:
                        continue
                    if mask & (select.EPOLLHUP | select.EPOLLERR) and not mask & select.EPOLLIN:
                        # Every process of the filter is gone: nothing more will come.
                        self._epoll.unregister(fd)
                        continue
                    try:
                        self._serve(w)
                    except Exception as exc:  # the thread must go on serving the other cells
                        w.record(_failure_event(w.cell_id, exc))

    def _serve(self, w: CellWatch) -> None:
        buf = bytearray(_NOTIF.size)
        try:
            _ioctl(w.listener, SECCOMP_IOCTL_NOTIF_RECV, buf)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EINTR):
                return  # the caller died or was interrupted before we took it
            raise
        nid, pid, _flags, _nr, arch, _ip, *args = _NOTIF.unpack(buf)
        if arch != AUDIT_ARCH_X86_64:
            _respond(w.listener, nid, error=errno.ENOSYS)
            return
        try:
            decision = _decide(w, nid, pid, args[0] & 0xFFFF_FFFF, args[1], args[2] & 0xFFFF_FFFF)
        except BaseException:
            # A supervisor that cannot decide refuses: never an open door, never a hung caller.
            _respond(w.listener, nid, error=REFUSAL_ERRNO)
            raise
        if decision is None:
            _respond(w.listener, nid, cont=True)
        elif isinstance(decision, int):
            _respond(w.listener, nid, error=decision)
        else:
            dup, target = decision
            if w.connects >= MAX_CONNECTS_PER_CELL:
                dup.close()
                if isinstance(target, _Held):
                    os.close(target.fd)
                _respond(w.listener, nid, error=errno.EAGAIN)
                return
            w.connects += 1
            threading.Thread(
                target=self._connect, args=(w, nid, dup, target), name="stockade-unotify-connect", daemon=True
            ).start()

    def _connect(self, w: CellWatch, nid: int, dup: socket.socket, target: bytes | str) -> None:
        error = 0
        try:
            dup.connect(target)
        except OSError as exc:
            error = exc.errno or errno.EIO
        finally:
            dup.close()  # the caller's own descriptor is untouched
            if isinstance(target, _Held):
                os.close(target.fd)
        with w.lock:
            w.connects -= 1
            if not w.closed:
                try:
                    _respond(w.listener, nid, error=error)
                except OSError:
                    pass  # the caller is gone
            elif w.connects == 0:
                w.release()


def _ioctl(fd: int, request: int, buf: bytearray) -> None:
    import fcntl

    fcntl.ioctl(fd, request, buf, True)


def _respond(listener: int, nid: int, *, error: int = 0, cont: bool = False) -> None:
    resp = bytearray(_RESP.pack(nid, 0, -error, SECCOMP_USER_NOTIF_FLAG_CONTINUE if cont else 0))
    try:
        _ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, resp)
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # ENOENT: the caller died meanwhile
            raise


def _valid(listener: int, nid: int) -> bool:
    try:
        _ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, bytearray(struct.pack("=Q", nid)))
    except OSError:
        return False
    return True


Decision = None | int | tuple[socket.socket, bytes | str]
"""None: let the call run; an errno: fail it so; (socket, address): the
supervisor connects the caller's socket there and returns the result."""


def _decide(w: CellWatch, nid: int, pid: int, fd: int, addr_ptr: int, addrlen: int) -> Decision:
    try:
        pidfd = _sys(_SYS_PIDFD_OPEN, pid, PIDFD_THREAD)
    except OSError:
        return errno.ESRCH  # gone; the answer reaches nobody
    try:
        if not _valid(w.listener, nid):
            return errno.ESRCH  # the pid was reused: this is not the caller
        try:
            dup_fd = _sys(_SYS_PIDFD_GETFD, pidfd, fd, 0)
        except OSError:
            return None  # no such descriptor: the kernel says EBADF itself
    finally:
        os.close(pidfd)
    family = ctypes.c_int(-1)
    size = ctypes.c_uint32(4)
    if libc.getsockopt(dup_fd, socket.SOL_SOCKET, SO_DOMAIN, ctypes.byref(family), ctypes.byref(size)) != 0:
        os.close(dup_fd)
        return None  # not a socket: ENOTSOCK from the kernel
    if family.value != socket.AF_UNIX:
        # TCP (the only other family seccomp lets a cell make): Landlock's port
        # rules and the network namespace decide. A unix socket swapped onto the
        # number before the call resumes meets the cgroup guard.
        os.close(dup_fd)
        return None
    dup = socket.socket(fileno=dup_fd)
    try:
        verdict = _unix_verdict(w, pid, addr_ptr, addrlen)
    except BaseException:
        dup.close()
        raise
    if isinstance(verdict, int):
        dup.close()
        return verdict
    return dup, verdict


def _read_address(pid: int, addr_ptr: int, addrlen: int) -> bytes | int:
    if addrlen < 3 or addrlen > 2 + SUN_PATH:
        return errno.EINVAL  # unix_validate_addr: nothing past the family, or too long
    out = ctypes.create_string_buffer(addrlen)
    local = _Iovec(ctypes.addressof(out), addrlen)
    remote = _Iovec(addr_ptr, addrlen)
    n = _libc_pvr(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if n != addrlen:
        return errno.EFAULT
    return out.raw


def _unix_verdict(w: CellWatch, pid: int, addr_ptr: int, addrlen: int) -> int | bytes | str:
    """Where the supervisor connects the caller's unix socket, or the errno it gets."""
    raw = _read_address(pid, addr_ptr, addrlen)  # read once: nothing later looks again
    if isinstance(raw, int):
        return raw
    if struct.unpack_from("=H", raw)[0] != socket.AF_UNIX:
        return errno.EINVAL
    sun_path = raw[2:]
    if sun_path[0] == 0:
        name = sun_path[1:]
        owner = _abstract_owner(w, name)
        if owner is None:
            return errno.ECONNREFUSED  # nothing of that name: what the kernel says
        shown = "@" + name.decode(errors="backslashreplace")
        # Bound in the cell's namespace by another uid: by stockade or another
        # process of the host that joined it (what Landlock's abstract scope
        # refused before the guard made every unix connect the supervisor's).
        if owner == w.host_uid or _refused(w, pid, shown, "abstract"):
            return b"\0" + name
        return REFUSAL_ERRNO
    path = sun_path.split(b"\0", 1)[0]
    shown = path.decode(errors="backslashreplace")
    try:
        target = _resolve(pid, path)
    except OSError as exc:
        return exc.errno or errno.ENOENT  # what the kernel would say (ENOENT, ENOTDIR, ELOOP…)
    try:
        st = os.fstat(target)
        if not stat.S_ISSOCK(st.st_mode):
            # The kernel's answer for a path that is no socket. Recorded: it is
            # what a decoy of a hidden host socket (/run's) meets.
            _refused(w, pid, shown, "pathname", errno.ECONNREFUSED, "not a socket (a decoy, or a file)")
            return errno.ECONNREFUSED
        identity = (st.st_dev, st.st_ino)
        offered = w.offered.get(identity)
        if offered is not None:
            return f"/proc/self/fd/{offered[1]}"
        if _own_pathname(w, identity) or _refused(w, pid, shown, "pathname"):
            # Held open until the connect: the inode checked is the one connected.
            return _Held(os.dup(target))
        return REFUSAL_ERRNO
    finally:
        os.close(target)


class _Held(str):
    """A ``/proc/self/fd`` path whose descriptor stays open until the connect is made."""

    fd: int

    def __new__(cls, fd: int) -> _Held:
        self = super().__new__(cls, f"/proc/self/fd/{fd}")
        self.fd = fd
        return self


def _resolve(pid: int, path: bytes) -> int:
    """An O_PATH descriptor of ``path`` as the caller sees it: from its root
    (absolute) or its working directory (relative), never by a magic link."""
    if path.startswith(b"/"):
        base = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
    else:
        base = os.open(f"/proc/{pid}/cwd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        resolve = RESOLVE_NO_MAGICLINKS
    try:
        how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, resolve)
        return _sys(_SYS_OPENAT2, base, ctypes.c_char_p(path), ctypes.byref(how), ctypes.sizeof(how))
    finally:
        os.close(base)


def _unix_sockets(w: CellWatch) -> list[tuple[bytes | None, tuple[int, int] | None, int | None]]:
    """(name, (dev, ino) of its file, owner uid) of every unix socket in the cell's
    network namespace, by one sock_diag dump."""
    sock = w.diag()
    # struct unix_diag_req: family, protocol, pad, states (all), ino, show, cookie[2]
    show = UDIAG_SHOW_NAME | UDIAG_SHOW_VFS | UDIAG_SHOW_UID
    req = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFF_FFFF, 0, show, 0xFFFF_FFFF, 0xFFFF_FFFF)
    header = struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
    sock.send(header + req)
    found: list[tuple[bytes | None, tuple[int, int] | None, int | None]] = []
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            if kind == NLMSG_DONE:
                return found
            if kind == NLMSG_ERROR:
                code = struct.unpack_from("=i", data, offset + 16)[0]
                raise OSError(-code, f"sock_diag: {os.strerror(-code)}")
            name: bytes | None = None
            vfs: tuple[int, int] | None = None
            uid: int | None = None
            at = offset + 16 + 16  # nlmsghdr, unix_diag_msg
            end = offset + length
            while at + 4 <= end:
                alen, atype = struct.unpack_from("=HH", data, at)
                if alen < 4:
                    break
                value = data[at + 4 : at + alen]
                if atype == UNIX_DIAG_NAME:
                    name = value
                elif atype == UNIX_DIAG_VFS:
                    ino, kdev = struct.unpack("=II", value[:8])
                    # The kernel's own dev_t (MKDEV: 12 bits of major, 20 of
                    # minor), not stat's encoding.
                    vfs = (os.makedev(kdev >> 20, kdev & 0xFFFFF), ino)
                elif atype == UNIX_DIAG_UID:
                    uid = struct.unpack("=I", value[:4])[0]
                at += (alen + 3) & ~3
            found.append((name, vfs, uid))
            offset += (length + 3) & ~3


def _own_pathname(w: CellWatch, identity: tuple[int, int]) -> bool:
    return any(vfs == identity and uid == w.host_uid for _name, vfs, uid in _unix_sockets(w))


def _abstract_owner(w: CellWatch, name: bytes) -> int | None:
    """The uid that bound abstract ``name`` in the cell's network namespace, or
    None if nothing did (abstract names are per network namespace: the host's
    are not there at all)."""
    wanted = b"\0" + name
    for n, _vfs, uid in _unix_sockets(w):
        if n == wanted:
            return uid if uid is not None else -1
    return None


_NOT_OURS = "not a socket stockade offers the cell or one the cell made"


def _refused(
    w: CellWatch, pid: int, shown: str, kind: str, err: int = REFUSAL_ERRNO, why: str = _NOT_OURS
) -> bool:
    """Record the refusal; whether the connect is made all the same (audit mode)."""
    audited = w.audit and err == REFUSAL_ERRNO
    w.record(
        Event(
            kind="cell.audited" if audited else "cell.denied",
            cell=w.cell_id,
            layer="seccomp",
            outcome="audited" if audited else "denied",
            summary=(
                f"connect to unix socket {shown} "
                + ("would be refused (audit mode: allowed)" if audited else "refused")
                + f": {why}"
            ),
            detail={
                "syscall": "connect",
                "family": "unix",
                "address": kind,
                "path": shown,
                "action": "user_notif",
                "errno": errno.errorcode[err],
                "pid": pid,
                "comm": _comm(pid),
            },
        )
    )
    return audited


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _failure_event(cell_id: str, exc: BaseException) -> Event:
    return Event(
        kind="cell.error",
        cell=cell_id,
        layer="seccomp",
        outcome="info",
        summary=f"the connect supervisor failed on a notification: {exc}",
        detail={"error": repr(exc)},
    )


_supervisor: Supervisor | None = None
_supervisor_lock = threading.Lock()
_by_netns: dict[int, str] = {}
"""Network namespace inode of each watched cell → its id."""
SIOCGSKNS = 0x894C
"""<linux/sockios.h>, Linux 4.9: a descriptor of a socket's network namespace."""


def cell_of_peer(sock: socket.socket) -> str:
    """The cell at the other end of ``sock``, a server's end of a unix connection
    the supervisor made for a cell, or '' if it is none. A server that
    identifies cells by SO_PEERCRED sees this process for those connections.
    The server's end of a unix connection lives in the client's network
    namespace (unix_stream_connect creates it there), which is the cell's."""
    import fcntl

    try:
        ns = fcntl.ioctl(sock.fileno(), SIOCGSKNS)
    except OSError:
        return ""
    try:
        ino = os.fstat(ns).st_ino
    finally:
        os.close(ns)
    with _supervisor_lock:
        return _by_netns.get(ino, "")


def supervisor() -> Supervisor:
    """The process's supervisor, started on first use (and again after a fork)."""
    global _supervisor
    with _supervisor_lock:
        if _supervisor is None or not _supervisor._thread.is_alive():
            _supervisor = Supervisor()
        return _supervisor


__all__ = ["REFUSAL_ERRNO", "CellWatch", "Supervisor", "attach_guard", "cell_of_peer", "supervisor"]
