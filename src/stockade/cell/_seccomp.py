"""The cell's seccomp filters: a short deny list of syscalls an agent never needs.

Written as classic BPF by hand, not with a library: libseccomp's Python bindings
are not on PyPI (only distribution packages built against one CPython), and
``pyseccomp`` is an unmaintained 2021 ctypes shim over the same C library. The
filter is a deny list of a few dozen comparisons, assembled once per process
(:func:`build_filters` is cached) and loaded by the launcher's child with one
``seccomp(2)`` call each (:func:`apply`).

Two filters are stacked, because the kernel logs an action only when the filter
that produced it was installed with ``SECCOMP_FILTER_FLAG_LOG``:

1. the *deny* filter, installed with ``SECCOMP_FILTER_FLAG_LOG`` so that every
   refusal reaches the kernel audit log (AUDIT_SECCOMP, type 1326, with
   ``syscall=NR``). A foreign architecture (i386 ``int 0x80``) kills the process;
   x32 calls and the syscalls of :data:`REFUSED` fail with EPERM in ``enforce``
   mode and are let through but logged (``SECCOMP_RET_LOG``) in ``audit`` mode.
2. the *clone3* filter, installed without the flag: ``clone3`` keeps its flags
   behind a pointer that seccomp cannot read, so it fails with ENOSYS and the C
   library falls back to ``clone``, whose flags the deny filter checks. That
   fallback happens on every thread creation, so it is not logged.

Every allowed syscall is decided from its number alone, so the kernel's seccomp
action cache (Linux 5.11) lets it through without running either filter; the
numbers are searched as a binary tree, so that the few calls whose arguments are
checked (ioctl, socket, clone, personality) run a handful of instructions.

Argument checks compare only the low 32 bits of an argument: the kernel
truncates ``int`` arguments (ioctl's request, socket's domain and type, clone's
flags, personality's persona), and comparing 64 bits would let a caller slip
past a check by setting high bits the kernel then ignores.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Literal

from stockade.cell._syscall import SYS_SECCOMP, set_no_new_privs, syscall
from stockade.cell._syscall_table import AUDIT_ARCH_X86_64, SYSCALL_NAMES, SYSCALLS, X32_SYSCALL_BIT
from stockade.errors import HostError

Mode = Literal["enforce", "audit"]

# --- <linux/seccomp.h>, seccomp(2) ---------------------------------------------
S_ISUID_ISGID = 0o6000
"""<sys/stat.h> S_ISUID | S_ISGID: a file that runs as its owner or group."""

MODE_ARG = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "open": 2,
    "openat": 3,
    "creat": 1,
    "mknod": 1,
    "mknodat": 2,
}
"""Calls that set a file's mode, and which argument holds it. A cell must not
make a set-id file: through an idmapped workspace the file belongs to its owner
on the host (root, say), and the host could later run it."""

MSG_FASTOPEN = 0x2000_0000
"""<linux/socket.h>: send data with the SYN of a TCP Fast Open connect."""

SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_LOG = 1 << 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
"""Linux 5.0: seccomp(2) returns a listener for this filter's SECCOMP_RET_USER_NOTIF."""
"""Linux 4.14: log every action of this filter but ALLOW (subject to actions_logged)."""
SECCOMP_RET_KILL_PROCESS = 0x8000_0000
"""Linux 4.14: kill the whole process with SIGSYS (core dump)."""
SECCOMP_RET_ERRNO = 0x0005_0000
"""Fail the call with the errno in the low 16 bits."""
SECCOMP_RET_USER_NOTIF = 0x7FC0_0000
"""Linux 5.0: the call waits for the listener's answer (seccomp_unotify(2))."""
SECCOMP_RET_LOG = 0x7FFC_0000
"""Linux 4.14: allow the call and log it."""
SECCOMP_RET_ALLOW = 0x7FFF_0000

# struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
_OFF_NR = 0
_OFF_ARCH = 4


def _arg_low(i: int) -> int:
    """Offset of the low 32 bits of args[i] (x86-64 is little-endian)."""
    return 16 + 8 * i


# --- classic BPF, <linux/bpf_common.h> ------------------------------------------
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
BPF_ALU_AND_K = 0x04 | 0x50 | 0x00
BPF_JMP_JEQ_K = 0x05 | 0x10 | 0x00
BPF_JMP_JGE_K = 0x05 | 0x30 | 0x00
BPF_JMP_JSET_K = 0x05 | 0x40 | 0x00
BPF_RET_K = 0x06 | 0x00
BPF_MAXINSNS = 4096

# --- values the filter compares --------------------------------------------------
EPERM = 1
ENOSYS = 38
EAFNOSUPPORT = 97
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
AF_NETLINK = 16
SOCK_STREAM = 1
SOCK_DGRAM = 2
SOCK_RAW = 3
SOCK_TYPE_MASK = 0xF
"""include/linux/net.h: the type without SOCK_NONBLOCK and SOCK_CLOEXEC."""
IPPROTO_TCP = 6
TIOCSTI = 0x5412
"""asm-generic/ioctls.h: push a byte into the terminal's input queue."""
TIOCLINUX = 0x541C
"""Linux console multiplexer; subcode 2/3 pastes the selection into the input."""
PER_LINUX = 0
PERSONALITY_QUERY = 0xFFFF_FFFF
CLONE_NEW_FLAGS = (
    0x0002_0000  # CLONE_NEWNS
    | 0x0200_0000  # CLONE_NEWCGROUP
    | 0x0400_0000  # CLONE_NEWUTS
    | 0x0800_0000  # CLONE_NEWIPC
    | 0x1000_0000  # CLONE_NEWUSER
    | 0x2000_0000  # CLONE_NEWPID
    | 0x4000_0000  # CLONE_NEWNET
)
"""<linux/sched.h>. CLONE_NEWTIME (0x80) is not here: clone(2) reads those bits as
the exit signal; only unshare(2) and clone3(2) take it, and both are refused."""

# --- what is refused, and why ----------------------------------------------------
_MOUNT = "changes the cell's filesystem view, which the launcher fixed"
_CLOCK = "sets the host's clock, which no namespace isolates"
_KEYS = "uses the kernel keyring, which is not isolated between containers"
_MODULE = "loads or unloads kernel code"
_KEXEC = "replaces the running kernel"
_URING = (
    "io_uring does I/O that seccomp and parts of audit never see, and is a frequent source of kernel bugs"
)

REFUSED: dict[str, str] = {
    "ptrace": "reads and writes another process's memory and registers",
    "process_vm_readv": "reads another process's memory",
    "process_vm_writev": "writes another process's memory",
    "pidfd_getfd": "copies a file descriptor out of another process",
    "process_madvise": "acts on another process's memory",
    "unshare": (
        "creates namespaces: a new user namespace regains capabilities and widens the kernel's attack surface"
    ),
    "setns": "joins another namespace",
    "clone": ("only with a CLONE_NEW* flag, which creates namespaces; plain fork and threads are allowed"),
    "clone3": (
        "refused with ENOSYS and not logged: its flags lie behind a pointer seccomp cannot"
        " read, and the C library falls back to clone, which is checked"
    ),
    "mount": _MOUNT,
    "umount2": _MOUNT,
    "pivot_root": _MOUNT,
    "chroot": _MOUNT,
    "move_mount": _MOUNT,
    "open_tree": _MOUNT,
    "open_tree_attr": _MOUNT,
    "fsopen": _MOUNT,
    "fsconfig": _MOUNT,
    "fsmount": _MOUNT,
    "fspick": _MOUNT,
    "mount_setattr": _MOUNT,
    "bpf": "loads eBPF programs and maps: a large kernel attack surface",
    "perf_event_open": "profiling reaches kernel addresses and has had many exploitable bugs",
    "io_uring_setup": _URING,
    "io_uring_enter": _URING,
    "io_uring_register": _URING,
    "userfaultfd": "stalls the kernel on a page fault: the classic tool for winning kernel races",
    "keyctl": _KEYS,
    "add_key": _KEYS,
    "request_key": _KEYS,
    "init_module": _MODULE,
    "finit_module": _MODULE,
    "delete_module": _MODULE,
    "kexec_load": _KEXEC,
    "kexec_file_load": _KEXEC,
    "reboot": "reboots or halts the host",
    "swapon": "changes the host's swap",
    "swapoff": "changes the host's swap",
    "settimeofday": _CLOCK,
    "clock_settime": _CLOCK,
    "clock_adjtime": _CLOCK,
    "adjtimex": _CLOCK,
    "open_by_handle_at": "opens a file by handle, around the mount view (the 'shocker' escape)",
    "name_to_handle_at": "makes file handles for open_by_handle_at",
    "acct": "turns on host-wide process accounting into a file",
    "quotactl": "changes disk quotas of the host's filesystems",
    "quotactl_fd": "changes disk quotas of the host's filesystems",
    "lookup_dcookie": "exposes kernel directory cookies (gone since Linux 6.10)",
    "personality": (
        "anything but PER_LINUX or a query: other personalities turn off exploit"
        " mitigations (ASLR, non-executable data)"
    ),
    "ioctl": (
        "only TIOCSTI and TIOCLINUX, which type into the terminal the cell shares with its"
        " caller (CVE-2017-5226)"
    ),
    "socket": (
        "anything but AF_UNIX (stream or seqpacket) or TCP over AF_INET/AF_INET6: no UDP (DNS"
        " exfiltration), raw, packet, netlink (EAFNOSUPPORT, so that audit-aware tools carry on)"
        " or vsock socket; the cell reaches out only through"
        " the gateway. No unix datagram socket: it sends to any path without connect(2), which"
        " the connect supervisor sees"
    ),
    **{
        name: "only with a set-uid or set-gid bit in the mode: a set-id file made in the workspace"
        " would run as its owner on the host"
        for name in MODE_ARG
    },
    "openat2": (
        "refused with ENOSYS and not logged: its mode lies behind a pointer seccomp cannot read;"
        " the C library then uses openat, which the filter checks"
    ),
    "sendto": "only with MSG_FASTOPEN, which connects TCP without connect(2) and so past Landlock",
    "sendmsg": "only with MSG_FASTOPEN, which connects TCP without connect(2) and so past Landlock",
    "sendmmsg": "only with MSG_FASTOPEN, which connects TCP without connect(2) and so past Landlock",
}
"""Each syscall the filters refuse (some only with certain arguments), and why."""

_CONDITIONAL = (
    "ioctl",
    "socket",
    "clone",
    "personality",
    "clone3",
    "openat2",
    "sendto",
    "sendmsg",
    "sendmmsg",
    *MODE_ARG,
)
ALWAYS_REFUSED: tuple[str, ...] = tuple(
    name for name in REFUSED if name not in _CONDITIONAL and name in SYSCALLS
)
"""The syscalls the deny filter refuses whatever their arguments."""

X32_REASON = "an x32-ABI call: the cell runs x86-64 programs, and the filter checks x86-64 numbers"
FOREIGN_ARCH_REASON = "a call of another architecture (i386 int 0x80): killed in enforce mode"


def refusal_reason(nr: int, arch: int = AUDIT_ARCH_X86_64) -> str | None:
    """Why the filters refuse syscall ``nr`` of ``arch`` (as an AUDIT_SECCOMP
    record gives them), or None if they do not refuse it by number."""
    if arch != AUDIT_ARCH_X86_64:
        return FOREIGN_ARCH_REASON
    if nr & X32_SYSCALL_BIT:
        return X32_REASON
    name = SYSCALL_NAMES.get(nr)
    return REFUSED.get(name) if name else None


# --- the assembler ------------------------------------------------------------------

_Jump = str | int
_Insn = tuple[int, _Jump, _Jump, int]


def _assemble(program: list[_Insn | str]) -> bytes:
    """Pack ``program`` (instructions and label names) as struct sock_filter[].

    Jump targets are labels or 0 (the next instruction); each must lie ahead
    within 255 instructions, as classic BPF requires.
    """
    labels: dict[str, int] = {}
    insns: list[_Insn] = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)
    if len(insns) > BPF_MAXINSNS:
        raise ValueError(f"seccomp program of {len(insns)} instructions exceeds {BPF_MAXINSNS}")
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(insns):
        offsets = []
        for target in (jt, jf):
            off = labels[target] - i - 1 if isinstance(target, str) else target
            if not 0 <= off <= 255:
                raise ValueError(f"seccomp jump from {i} to {target!r} is out of range")
            offsets.append(off)
        out += struct.pack("=HBBI", code, offsets[0], offsets[1], k)
    return bytes(out)


def _ld(offset: int) -> _Insn:
    return (BPF_LD_W_ABS, 0, 0, offset)


def _jeq(k: int, jt: _Jump, jf: _Jump = 0) -> _Insn:
    return (BPF_JMP_JEQ_K, jt, jf, k)


def _jset(k: int, jt: _Jump, jf: _Jump = 0) -> _Insn:
    return (BPF_JMP_JSET_K, jt, jf, k)


def _ret(k: int) -> _Insn:
    return (BPF_RET_K, 0, 0, k)


def _dispatch(targets: list[tuple[int, str]]) -> list[_Insn | str]:
    """A binary search over syscall numbers (sorted ``targets``): each number jumps
    to its label, any other number to ``allow``. About log2(n) comparisons
    instead of n: both the kernel's action-cache emulation at load time (~2 µs
    per instruction walked) and every filtered call are shorter."""
    if len(targets) <= 3:
        *head, (last_nr, last_label) = targets
        return [*(_jeq(nr, label) for nr, label in head), _jeq(last_nr, last_label, "allow")]
    middle = len(targets) // 2
    upper = f"nr>={targets[middle][0]}"
    return [
        (BPF_JMP_JGE_K, upper, 0, targets[middle][0]),
        *_dispatch(targets[:middle]),
        upper,
        *_dispatch(targets[middle:]),
    ]


_cache: dict[tuple[Mode, bool], tuple[bytes, bytes]] = {}


def build_filters(mode: Mode, *, setid: bool = False) -> tuple[bytes, bytes]:
    """The (deny, clone3) filter programs for ``mode``, as struct sock_filter arrays.

    Load the first with ``log=True`` and the second with ``log=False`` (or call
    :func:`apply`). Built once per process, mode and ``setid``.

    ``setid``: the calls of :data:`MODE_ARG` are not checked for set-id bits.
    Only for a workbench whose writable host places no other host user can
    reach (``CellPlan.setid``): in its own overlay a set-id file is as inert
    as the image's own (``nosuid``, ``no_new_privs``, no host ids), and one
    in such a place runs, on the host, for no one but its owner and root,
    whom it gives nothing. ``chmod 4755`` is routine in Dockerfiles.
    """
    cached = _cache.get((mode, setid))
    if cached is not None:
        return cached
    refuse = SECCOMP_RET_ERRNO | EPERM if mode == "enforce" else SECCOMP_RET_LOG
    nofamily = SECCOMP_RET_ERRNO | EAFNOSUPPORT if mode == "enforce" else SECCOMP_RET_LOG
    foreign = SECCOMP_RET_KILL_PROCESS if mode == "enforce" else SECCOMP_RET_LOG
    deny: list[_Insn | str] = [
        _ld(_OFF_ARCH),
        _jeq(AUDIT_ARCH_X86_64, 0, "foreign"),
        _ld(_OFF_NR),
        _jset(X32_SYSCALL_BIT, "refuse"),
        *_dispatch(
            sorted(
                [(SYSCALLS[name], "refuse") for name in ALWAYS_REFUSED]
                + [(SYSCALLS[name], name) for name in ("ioctl", "socket", "clone", "personality")]
                + [(SYSCALLS["sendto"], "flags3"), (SYSCALLS["sendmmsg"], "flags3")]
                + [(SYSCALLS["sendmsg"], "flags2")]
                + [(SYSCALLS[name], f"mode{arg}") for name, arg in MODE_ARG.items() if not setid]
            )
        ),
        "ioctl",
        _ld(_arg_low(1)),
        _jeq(TIOCSTI, "refuse"),
        _jeq(TIOCLINUX, "refuse", "allow"),
        "socket",
        # Netlink first, whatever its type, with the errno of a kernel built
        # without it: audit-aware tools (shadow's useradd, sudo, PAM) open an
        # audit netlink socket and carry on only on EAFNOSUPPORT, EPROTONOSUPPORT
        # or EINVAL; on EPERM useradd aborts ("Cannot open audit interface").
        # Still a refusal of the deny filter, so still logged and recorded.
        _ld(_arg_low(0)),
        _jeq(AF_NETLINK, "nofamily"),
        _ld(_arg_low(1)),
        (BPF_ALU_AND_K, 0, 0, SOCK_TYPE_MASK),
        _jeq(SOCK_RAW, "refuse"),
        _ld(_arg_low(0)),
        _jeq(AF_UNIX, "unix"),
        _jeq(AF_INET, "inet"),
        _jeq(AF_INET6, "inet", "refuse"),
        "unix",
        _ld(_arg_low(1)),
        (BPF_ALU_AND_K, 0, 0, SOCK_TYPE_MASK),
        _jeq(SOCK_DGRAM, "refuse", "allow"),
        "inet",
        _ld(_arg_low(1)),
        (BPF_ALU_AND_K, 0, 0, SOCK_TYPE_MASK),
        _jeq(SOCK_STREAM, 0, "refuse"),
        _ld(_arg_low(2)),
        _jeq(0, "allow"),
        _jeq(IPPROTO_TCP, "allow", "refuse"),
        "clone",
        _ld(_arg_low(0)),
        _jset(CLONE_NEW_FLAGS, "refuse", "allow"),
        "personality",
        _ld(_arg_low(0)),
        _jeq(PER_LINUX, "allow"),
        _jeq(PERSONALITY_QUERY, "allow", "refuse"),
        # MSG_FASTOPEN connects a TCP socket inside sendto/sendmsg without
        # going through connect(2), where Landlock's TCP rule is checked.
        "flags3",
        _ld(_arg_low(3)),
        _jset(MSG_FASTOPEN, "refuse", "allow"),
        "flags2",
        _ld(_arg_low(2)),
        _jset(MSG_FASTOPEN, "refuse", "allow"),
        *(
            insn
            for arg in sorted(set(MODE_ARG.values()))
            for insn in (f"mode{arg}", _ld(_arg_low(arg)), _jset(S_ISUID_ISGID, "refuse", "allow"))
        ),
        "allow",
        _ret(SECCOMP_RET_ALLOW),
        "refuse",
        _ret(refuse),
        "nofamily",
        _ret(nofamily),
        "foreign",
        _ret(foreign),
    ]
    clone3: list[_Insn | str] = [
        _ld(_OFF_ARCH),
        _jeq(AUDIT_ARCH_X86_64, 0, "allow"),  # the deny filter handles other arches
        _ld(_OFF_NR),
        _jeq(SYSCALLS["clone3"], "enosys"),
        _jeq(SYSCALLS["openat2"], "enosys", "allow"),
        "enosys",
        _ret(SECCOMP_RET_ERRNO | ENOSYS),
        "allow",
        _ret(SECCOMP_RET_ALLOW),
    ]
    built = (_assemble(deny), _assemble(clone3))
    for program in built:
        _fprog(program)
    _cache[(mode, setid)] = built
    return built


_notify_cache: list[bytes] = []


def build_notify_filter() -> bytes:
    """The filter that sends every x86-64 ``connect(2)`` to the connect supervisor
    (``_unotify``), to be loaded with ``SECCOMP_FILTER_FLAG_NEW_LISTENER``.

    Only connect: a unix stream or seqpacket socket reaches a peer by no other
    call (sendto/sendmsg with an address fail on them, EISCONN or EOPNOTSUPP,
    and datagram sockets are refused by the deny filter), and TCP's other way,
    MSG_FASTOPEN, is refused too. Foreign and x32 calls are the deny filter's.
    """
    if not _notify_cache:
        program: list[_Insn | str] = [
            _ld(_OFF_ARCH),
            _jeq(AUDIT_ARCH_X86_64, 0, "allow"),
            _ld(_OFF_NR),
            _jeq(SYSCALLS["connect"], "notify", "allow"),
            "notify",
            _ret(SECCOMP_RET_USER_NOTIF),
            "allow",
            _ret(SECCOMP_RET_ALLOW),
        ]
        _notify_cache.append(_assemble(program))
    return _notify_cache[0]


def build_filter(mode: Mode) -> bytes:
    """The deny filter alone (the first of :func:`build_filters`)."""
    return build_filters(mode)[0]


class _SockFprog(ctypes.Structure):
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; }
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


# The ctypes side of each program, made in the parent by build_filters: creating
# ctypes objects in a freshly forked child costs ~0.2 ms, the syscall itself far less.
_fprogs: dict[bytes, tuple[ctypes.Array[ctypes.c_char], _SockFprog]] = {}


def _fprog(program: bytes) -> _SockFprog:
    entry = _fprogs.get(program)
    if entry is None:
        buffer = ctypes.create_string_buffer(program, len(program))
        entry = (buffer, _SockFprog(len(program) // 8, ctypes.addressof(buffer)))
        _fprogs[program] = entry
    return entry[1]


def load(program: bytes, *, log: bool) -> None:
    """Install ``program`` on the calling thread with ``seccomp(2)``.

    ``log`` sets SECCOMP_FILTER_FLAG_LOG. The thread needs no_new_privs (or
    CAP_SYS_ADMIN in its user namespace).

    Raises:
        OSError: the kernel refused the filter (EINVAL: malformed; EACCES: no
            no_new_privs; ENOMEM: too many filters).
    """
    flags = SECCOMP_FILTER_FLAG_LOG if log else 0
    syscall(SYS_SECCOMP, SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(_fprog(program)))


def apply(filters: tuple[bytes, bytes]) -> None:
    """Set no_new_privs and install the (deny, clone3) filters of :func:`build_filters`.

    Raises:
        OSError: as :func:`load`.
    """
    set_no_new_privs()
    load(filters[0], log=True)
    load(filters[1], log=False)


_SECCOMP_PROC = "/proc/sys/kernel/seccomp"


def check_host(mode: Mode) -> None:
    """Make sure this kernel can run the filters of ``mode`` and log what they do.

    Raises:
        HostError: seccomp filtering or an action is missing (``feature='seccomp'``),
            or the kernel would not log the refusals (``feature='seccomp.log'``).
    """
    try:
        with open(f"{_SECCOMP_PROC}/actions_avail") as f:
            avail = f.read().split()
        with open(f"{_SECCOMP_PROC}/actions_logged") as f:
            logged = f.read().split()
    except OSError as exc:
        raise HostError(
            f"seccomp filtering is not available ({_SECCOMP_PROC} unreadable: {exc.strerror}); "
            "run on a kernel built with CONFIG_SECCOMP_FILTER",
            feature="seccomp",
        ) from exc
    missing = [a for a in ("kill_process", "errno", "log", "allow") if a not in avail]
    if missing:
        raise HostError(
            f"seccomp actions {', '.join(missing)} are not available on this kernel; run on Linux ≥ 4.14",
            feature="seccomp",
        )
    needed = ("errno", "kill_process") if mode == "enforce" else ("log",)
    unlogged = [a for a in needed if a not in logged]
    if unlogged:
        want = " ".join(dict.fromkeys([*logged, *unlogged]))
        raise HostError(
            f"the kernel does not log seccomp action {', '.join(unlogged)} "
            f"({_SECCOMP_PROC}/actions_logged is {' '.join(logged)!r}); "
            f"run: echo '{want}' > {_SECCOMP_PROC}/actions_logged",
            feature="seccomp.log",
        )


__all__ = [
    "ALWAYS_REFUSED",
    "REFUSED",
    "Mode",
    "apply",
    "build_filter",
    "build_filters",
    "build_notify_filter",
    "check_host",
    "load",
    "refusal_reason",
]
