"""Refusals by the cell's view and by file permissions, from the kernel audit log (sans-I/O).

A cell's protected files (``.git/hooks``, ``.bashrc``, the policy file…) and
read-only grants inside a writable tree are read-only mounts. A write there
fails with ``EROFS`` in the VFS (``mnt_want_write``), and a rename or removal
of one of their mount points with ``EBUSY``, before any security hook runs:
Landlock never sees them, so they leave no Landlock record. Nor does a
refusal by file permissions (``EACCES``, ``EPERM``): the permission check of
an open runs before Landlock's hook, and chmod or chown have no Landlock right
at all; an overwrite of a root-owned system file ends there. To record them
anyway, the audit reader installs nine kernel audit rules on the syscall-exit
filter (``rule_payloads``), the equivalent of::

    -a always,exit -F arch=b64 -S open,openat,… (every call that changes a file) \\
        -F exit=-EROFS -F auid=1398033220 -k stockade-vfs
    -a always,exit -F arch=b64 -S rename,renameat,renameat2,unlink,unlinkat,rmdir \\
        -F exit=-EBUSY -F auid=1398033220 -k stockade-vfs
    -a always,exit -F arch=b64 -S rename,renameat,renameat2,link,linkat \\
        -F exit=-EXDEV -F auid=1398033220 -k stockade-vfs
    -a always,exit -F arch=b64 -S connect -F exit=-ECONNREFUSED -F auid=1398033220 -k stockade-vfs
    -a always,exit -F arch=b64 -S openat -F a2&0x243 -F exit=-EACCES -F auid=1398033220 -k stockade-vfs
    -a always,exit -F arch=b64 -S open -F a1&0x243 -F exit=-EACCES -F auid=1398033220 -k stockade-vfs
    -a always,exit -F arch=b64 -S creat,truncate,… -F exit=-EACCES -F auid=1398033220 -k stockade-vfs
    -a always,exit -F arch=b64 -S creat,truncate,… -F exit=-EPERM -F auid=1398033220 -k stockade-vfs
    -a always,exit -F arch=b64 -S open,statx,execve,… -F exit=-EACCES -F auid=1398033220 -k stockade-vfs

The last records a reach into a decoy that file permissions refuse: a decoy
for a path that exists nowhere (``/tests``, ``/solution``: a ``deny`` entry)
is ``DIR_DECOY`` bound there, a directory of host root's with mode 0000, so
that a lookup of any name in it (``cat /tests/test_outputs.py``, ``stat
/solution/solve.sh``) fails with ``EACCES`` in the path walk, where it would
otherwise be a silent ``ENOENT`` that no Landlock rule sees (Landlock has no
right for a lookup). Its owner is no id of the cell's user namespace, so even
a workbench's root, whose capabilities hold only inside it, is refused
(``capable_wrt_inode_uidgid``). A failed walk logs the name but no inode, so
the rule cannot name the decoy: it matches every refused lookup of a cell,
and the cell keeps only those inside its decoys (``_attempts``, which knows
the plan); an event says ``reach`` for such a call.

The rule on connect records a connect to a host socket the cell sees as a decoy
(``/run/docker.sock``, the daemon's own socket, a socket found in a grant: an
empty file in the cell's view). Landlock has no right for connecting to a
pathname socket, so nothing else records it. Only connects that name a path
are kept (a TCP connect with nothing listening is not a decoy).

An ``EXDEV`` (a rename or link across mounts) is also what an ordinary ``mv``
between two writable mounts meets before it copies instead; the cell keeps
only those whose destination is not a place it may write (``Cell``'s filter,
which knows the plan), so a rename into a protected directory is on record
and a ``mv`` from ``/tmp`` to the workspace is not.

Every cell runs in an audit session of its own: the launcher sets its login
uid to ``CELL_LOGINUID``, a value no person logs in with, so the rules match
cells' processes and nothing else of the host (an ``mv`` across filesystems
by a logged-in user makes no record); the correlator then attributes each
record to its cell by ``ses``.

While the host has no audit rule of its own, one more (``task_rule``) on the
task filter spares every task outside a cell what these rules cost it.

For each matching system call the kernel sends, under one serial, a
``1300 SYSCALL`` record (``success=no exit=-30 … ses= comm= exe= key="stockade-vfs"``),
``1307 CWD``, one ``1302 PATH`` record per name the call looked up
(``name=`` as the process passed it, ``nametype=PARENT|NORMAL|CREATE|DELETE``),
``1327 PROCTITLE`` (never read: it may hold a token) and ``1320 EOE``.
``MountRefusal`` gathers them; ``mount_event`` makes the event.

Written by hand because no library builds ``struct audit_rule_data``
(``<linux/audit.h>``) short of linking libaudit.
"""

from __future__ import annotations

import os.path
import struct
from typing import Any, Final

from stockade._slots import Mutable
from stockade.cell._syscall_table import AUDIT_ARCH_X86_64, SYSCALL_NAMES

AUDIT_PATH: Final = 1302
AUDIT_CWD: Final = 1307
AUDIT_ADD_RULE: Final = 1011
AUDIT_DEL_RULE: Final = 1012
RULE_KEY: Final = "stockade-vfs"
KEY_FIELD: Final = f'key="{RULE_KEY}"'
"""How the key appears in a SYSCALL record's body: a cheap test before parsing."""

CELL_LOGINUID: Final = 0x53544B44
"""The login uid of every cell's processes ("STKD", 1398033220): no account
has it, so the rules above match cells only. Each cell still gets its own
audit session (``ses``): the kernel starts one at every write of a login uid."""

_AUDIT_FILTER_EXIT: Final = 0x04
_AUDIT_ALWAYS: Final = 2
_AUDIT_EQUAL: Final = 0x40000000
_AUDIT_ARCH: Final = 11
_AUDIT_LOGINUID: Final = 9
_AUDIT_EXIT: Final = 103
_AUDIT_FILTERKEY: Final = 210
_AUDIT_ARG0: Final = 200
_AUDIT_BIT_MASK: Final = 0x08000000
_AUDIT_BITMASK_SIZE: Final = 64
_AUDIT_MAX_FIELDS: Final = 64

EPERM: Final = 1
EACCES: Final = 13
EROFS: Final = 30
EBUSY: Final = 16
EXDEV: Final = 18
ECONNREFUSED: Final = 111
_ERRNO_NAMES: Final = {
    EPERM: "EPERM",
    EACCES: "EACCES",
    EROFS: "EROFS",
    EBUSY: "EBUSY",
    EXDEV: "EXDEV",
    ECONNREFUSED: "ECONNREFUSED",
}
_WHY: Final = {
    EPERM: "file permissions (not the owner)",
    EACCES: "file permissions",
    EROFS: "a read-only mount",
    EBUSY: "a mount point",
    EXDEV: "another mount",
    ECONNREFUSED: "no socket there (a decoy of the cell's view)",
}
_WRITE_FLAGS: Final = 0o1 | 0o2 | 0o100 | 0o1000
"""O_WRONLY | O_RDWR | O_CREAT | O_TRUNC: an open that would change something."""
_MOUNT_POINT_CALLS: Final = ("rename", "renameat", "renameat2", "unlink", "unlinkat", "rmdir")
_CROSSING_CALLS: Final = ("rename", "renameat", "renameat2", "link", "linkat")
_WRITING_CALLS: Final = (
    *("open", "openat", "openat2", "creat", "truncate", "ftruncate"),
    *("mkdir", "mkdirat", "rmdir", "mknod", "mknodat", "symlink", "symlinkat"),
    *("rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat"),
    *("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat"),
    *("utime", "utimes", "utimensat", "futimesat"),
    *("setxattr", "lsetxattr", "fsetxattr", "setxattrat"),
    *("removexattr", "lremovexattr", "fremovexattr", "removexattrat"),
)
"""The calls that change a file or a directory. Not ``access``/``faccessat``:
asking whether a read-only file is writable (``test -w``) is no attempt."""


def _rule(
    errno_value: int,
    syscalls: tuple[str, ...],
    flags_arg: int | None = None,
    extra: tuple[tuple[int, int], ...] = (),
) -> bytes:
    """One ``struct audit_rule_data`` for the exit filter (see the module
    docstring); ``flags_arg``: the argument holding open(2) flags, which must
    have one of ``_WRITE_FLAGS`` set."""
    mask = [0] * _AUDIT_BITMASK_SIZE
    numbers = {name: nr for nr, name in SYSCALL_NAMES.items()}
    for name in syscalls:
        nr = numbers[name]
        mask[nr // 32] |= 1 << (nr % 32)
    key = RULE_KEY.encode()
    pairs = [
        (_AUDIT_ARCH, AUDIT_ARCH_X86_64),
        (_AUDIT_EXIT, (-errno_value) & 0xFFFFFFFF),
        (_AUDIT_LOGINUID, CELL_LOGINUID),
    ]
    ops = [_AUDIT_EQUAL] * len(pairs)
    if flags_arg is not None:
        pairs.append((_AUDIT_ARG0 + flags_arg, _WRITE_FLAGS))
        ops.append(_AUDIT_BIT_MASK)
    for field_id, value in extra:  # equalities (decoy_rule's inode and device)
        pairs.append((field_id, value & 0xFFFFFFFF))
        ops.append(_AUDIT_EQUAL)
    pairs.append((_AUDIT_FILTERKEY, len(key)))
    ops.append(_AUDIT_EQUAL)
    pad = [0] * (_AUDIT_MAX_FIELDS - len(pairs))
    return (
        struct.pack(
            f"=III{_AUDIT_BITMASK_SIZE}I{_AUDIT_MAX_FIELDS}I{_AUDIT_MAX_FIELDS}I{_AUDIT_MAX_FIELDS}II",
            _AUDIT_FILTER_EXIT,
            _AUDIT_ALWAYS,
            len(pairs),
            *mask,
            *[f for f, _ in pairs],
            *pad,
            *[v for _, v in pairs],
            *pad,
            *ops,
            *pad,
            len(key),
        )
        + key
    )


_CHANGING_CALLS: Final = tuple(c for c in _WRITING_CALLS if c not in ("open", "openat", "openat2"))
"""The writing calls whose every use changes something (an open may only read)."""


PROC_DECOY: Final = "/var/lib/stockade/.proc-decoy"
"""An empty host file, root's, mode 0000, that a cell sees in place of host
files of its /proc (``/proc/cmdline``, the boot id…: cell/_plan.py). The
cell's uid cannot open it (EACCES by file permissions), and the rule of
``decoy_rule`` records every such open, naming the path the cell asked
for: Landlock cannot, since /proc is granted whole."""

_AUDIT_DEVMAJOR: Final = 100
_AUDIT_DEVMINOR: Final = 101
_AUDIT_INODE: Final = 102


def decoy_rule(inode: int, dev: int) -> bytes:
    """The ``AUDIT_ADD_RULE`` payload that records a cell's refused opens of
    the file ``inode`` on device ``dev`` (``PROC_DECOY``), reads included::

        -a always,exit -F arch=b64 -S open,openat,openat2 -F exit=-EACCES \\
            -F inode=N -F devmajor=M -F devminor=m -F auid=1398033220 -k stockade-vfs
    """
    extra = ((_AUDIT_INODE, inode), (_AUDIT_DEVMAJOR, os.major(dev)), (_AUDIT_DEVMINOR, os.minor(dev)))
    return _rule(EACCES, ("open", "openat", "openat2"), extra=extra)


def ensure_proc_decoy(path: str = PROC_DECOY) -> os.stat_result | None:
    """Make ``path`` (empty, root's, mode 0000) if it is missing; its stat, or
    None when it cannot be had as that (not root, or something else stands
    there: it is then not used)."""
    import stat as stat_module

    try:
        os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0))
        except FileExistsError:
            pass
        st = os.lstat(path)
    except OSError:
        return None
    if not stat_module.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_size or st.st_mode & 0o7777:
        return None
    return st


DIR_DECOY: Final = "/var/lib/stockade/.dir-decoy"
"""An empty host directory, root's, mode 0000, bound where a decoy directory
must refuse every lookup inside it by file permissions (see the module
docstring): made by the audit reader beside ``PROC_DECOY``."""

_REACHING_CALLS: Final = (
    *("open", "openat", "openat2", "stat", "lstat", "newfstatat", "statx"),
    *("access", "faccessat", "faccessat2", "execve", "execveat", "chdir"),
    *("readlink", "readlinkat", "getxattr", "lgetxattr", "listxattr", "llistxattr"),
    *("getxattrat", "listxattrat", "statfs", "name_to_handle_at", "inotify_add_watch"),
)
"""The calls that look a path up and change nothing, whose ``EACCES`` may be
a walk into a decoy directory (see the module docstring); a refused change
is on record by the rules above."""


def ensure_dir_decoy(path: str = DIR_DECOY) -> os.stat_result | None:
    """Make ``path`` (an empty directory, root's, mode 0000) if it is missing;
    its stat, or None when it cannot be had as that (not root, or something
    else stands there: decoys are then what they were, Landlock's)."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
        try:
            os.mkdir(path, 0)
        except FileExistsError:
            pass
        st = os.lstat(path)
    except OSError:
        return None
    return st if is_dir_decoy(st) else None


def is_dir_decoy(st: os.stat_result) -> bool:
    """Whether ``st`` is what a directory decoy must be: a directory of host
    root's with mode 0000, which nobody in a cell can look inside."""
    import stat as stat_module

    return stat_module.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o7777


def rule_payloads() -> tuple[bytes, ...]:
    """The ``AUDIT_ADD_RULE`` payloads (see the module docstring)."""
    return (
        _rule(EROFS, _WRITING_CALLS),
        _rule(EBUSY, _MOUNT_POINT_CALLS),
        _rule(EXDEV, _CROSSING_CALLS),
        _rule(ECONNREFUSED, ("connect",)),
        # File permissions (after Landlock let it through, or before Landlock
        # looked: the permission check of an open runs first). A refusal
        # Landlock records too is one event: its group takes the SYSCALL record.
        _rule(EACCES, ("openat",), flags_arg=2),
        _rule(EACCES, ("open",), flags_arg=1),
        _rule(EACCES, _CHANGING_CALLS),
        _rule(EPERM, _CHANGING_CALLS),
        # Reads too, for the walks into a decoy directory (DIR_DECOY).
        _rule(EACCES, _REACHING_CALLS),
    )


_AUDIT_FILTER_TASK: Final = 0x01
_AUDIT_NEVER: Final = 0
_AUDIT_NOT_EQUAL: Final = 0x30000000
_RULE_FIXED: Final = 4 * (3 + _AUDIT_BITMASK_SIZE + 3 * _AUDIT_MAX_FIELDS + 1)
"""The bytes of a ``struct audit_rule_data`` before its strings (``buf``)."""


def task_rule() -> bytes:
    """The ``AUDIT_ADD_RULE`` payload that spares every task outside a cell
    the cost of the rules above, the equivalent of::

        -a never,task -F auid!=1398033220 -k stockade-vfs

    The task filter is evaluated once per task, when it is forked
    (``audit_alloc``, kernel/auditsc.c): a task it matches gets no audit
    context and its system calls skip auditing entirely, where with any
    syscall rule loaded every task of the host would collect the names it
    looks up and walk the exit filter at each call. A task is forked with
    its parent's login uid, and every process of a cell is forked by the
    cell's init, after the launcher wrote ``CELL_LOGINUID`` (``_native.c``,
    C1 before the clone of C2): cells keep their context and every record
    above; the launcher's C1 itself, forked before the write, runs no code
    of the cell. Landlock's and seccomp's records need no syscall context.

    Loaded only while the host has no audit rule but stockade's
    (``foreign_rules``): an operator's own syscall rules need every task's
    context, and a task forked while it is loaded has none for its life.
    """
    mask = [0xFFFFFFFF] * _AUDIT_BITMASK_SIZE  # as auditctl sets it: the task filter reads no mask
    key = RULE_KEY.encode()
    pairs = [(_AUDIT_LOGINUID, CELL_LOGINUID), (_AUDIT_FILTERKEY, len(key))]
    ops = [_AUDIT_NOT_EQUAL, _AUDIT_EQUAL]
    pad = [0] * (_AUDIT_MAX_FIELDS - len(pairs))
    return (
        struct.pack(
            f"=III{_AUDIT_BITMASK_SIZE}I{_AUDIT_MAX_FIELDS}I{_AUDIT_MAX_FIELDS}I{_AUDIT_MAX_FIELDS}II",
            _AUDIT_FILTER_TASK,
            _AUDIT_NEVER,
            len(pairs),
            *mask,
            *[f for f, _ in pairs],
            *pad,
            *[v for _, v in pairs],
            *pad,
            *ops,
            *pad,
            len(key),
        )
        + key
    )


def is_stockade_rule(rule: bytes) -> bool:
    """Whether one ``struct audit_rule_data`` of an ``AUDIT_LIST_RULES``
    answer is one of stockade's: its only string is the key ``RULE_KEY``
    (a watch or a path of another rule is a string too)."""
    if len(rule) < _RULE_FIXED:
        return False
    (buflen,) = struct.unpack_from("=I", rule, _RULE_FIXED - 4)
    return buflen == len(RULE_KEY) and rule[_RULE_FIXED : _RULE_FIXED + buflen] == RULE_KEY.encode()


def foreign_rules(listed: list[bytes]) -> int:
    """How many of the loaded rules ``listed`` are not stockade's."""
    return sum(1 for rule in listed if not is_stockade_rule(rule))


def refusal_layer(refusal: MountRefusal) -> str:
    """``dac`` for a refusal by file permissions, else ``mount`` (the view)."""
    return "dac" if refusal.syscall.get("exit") in ("-1", "-13") else "mount"


class MountRefusal(Mutable):
    """The records of one refused system call, gathered under its serial."""

    _fields = ("arrived", "time", "syscall", "cwd", "paths", "serial")
    __slots__ = _fields
    arrived: float
    time: float
    syscall: dict[str, str]
    cwd: str | None
    paths: list[tuple[str, str]]
    """(name, nametype) of each PATH record, in the kernel's order."""
    serial: int | None
    """The kernel's serial of the event (``audit(…:SERIAL)``): two readers'
    copies of one refusal share it (the daemon's audit relay matches by it)."""

    def __init__(
        self,
        arrived: float,
        time: float,
        syscall: dict[str, str],
        cwd: str | None = None,
        paths: list[tuple[str, str]] | None = None,
        serial: int | None = None,
    ) -> None:
        self.arrived = arrived
        self.time = time
        self.syscall = syscall
        self.cwd = cwd
        self.paths = [] if paths is None else paths
        self.serial = serial

    @property
    def session(self) -> int | None:
        try:
            return int(self.syscall.get("ses", ""))
        except ValueError:
            return None


def mount_event_detail(refusal: MountRefusal) -> tuple[dict[str, Any], str]:
    """The event's detail and summary for a gathered refusal."""
    s = refusal.syscall
    nr = int_field(s.get("syscall"))
    name = (
        SYSCALL_NAMES.get(nr)
        if nr is not None and int_field(s.get("arch"), 16) == AUDIT_ARCH_X86_64
        else None
    )
    code = -(int_field(s.get("exit")) or 0)
    # A call on a descriptor (fchmod, fchown, ftruncate, fsetxattr) is logged
    # with the file's inode but no name: "(null)", not a path to join to the cwd.
    logged = [(p, kind) for p, kind in refusal.paths if p != "(null)"]
    by_descriptor = len(logged) < len(refusal.paths)
    paths = [_absolute(p, refusal.cwd) for p, _kind in logged]
    named = [_absolute(p, refusal.cwd) for p, kind in logged if kind != "PARENT"]
    target = _target(code, paths, named)
    detail: dict[str, Any] = {
        "syscall": name,
        "nr": nr,
        "errno": _ERRNO_NAMES.get(code, code),
        "paths": paths,
        "pid": int_field(s.get("pid")),
        "comm": s.get("comm"),
        "exe": s.get("exe"),
    }
    if refusal.serial is not None:
        detail["serial"] = refusal.serial
    if code == EACCES and _reaches(name, s):
        # Only the rule on reaches matched it: an attempt only inside a decoy
        # (the cell knows its decoys: ``_attempts.not_an_attempt``).
        detail["reach"] = True
    call = name or f"system call {nr}"
    if target is not None:
        detail["path"] = target
        what = f"{call} into {target}" if code == EXDEV else f"{call} of {target}"
    elif by_descriptor:
        what = f"{call} of an open file (the kernel logs no name for it)"
    else:
        what = call
    why = _WHY.get(code, f"errno {code}")
    if detail.get("reach"):
        why = "a decoy, by file permissions"  # the only reaches a cell keeps
    return detail, f"{what} refused: {why} ({_ERRNO_NAMES.get(code, code)})"


_OPEN_FLAGS_ARG: Final = {"open": "a1", "openat": "a2"}


def _reaches(name: str | None, syscall: dict[str, str]) -> bool:
    """Whether a refused call matched no rule but the one on reaches: a call
    that changes nothing (``stat``, an open for reading), where a refused
    write is on record wherever it is."""
    if name in _CHANGING_CALLS:
        return False
    arg = _OPEN_FLAGS_ARG.get(name or "")
    if arg is not None:
        flags = int_field(syscall.get(arg), 16)
        return flags is not None and not flags & _WRITE_FLAGS
    return name in _REACHING_CALLS


def _target(code: int, paths: list[str], named: list[str]) -> str | None:
    """The path an event names: for EXDEV the first directory the kernel
    logged (the one it would have gone into, as this kernel logs a rename;
    ``paths`` has both); else the file itself, or (a name it would have
    created) its directory."""
    if code == EXDEV and paths:
        return paths[0]
    if named:
        return named[0]
    return paths[0] if paths else None


def _absolute(name: str, cwd: str | None) -> str:
    if os.path.isabs(name) or not cwd:
        return os.path.normpath(name) if os.path.isabs(name) else name
    return os.path.normpath(os.path.join(cwd, name))


def int_field(value: str | None, base: int = 10) -> int | None:
    """A record field as an integer; None when absent or not a number."""
    if value is None:
        return None
    try:
        return int(value, base)
    except ValueError:
        return None


__all__ = [
    "AUDIT_ADD_RULE",
    "AUDIT_CWD",
    "AUDIT_PATH",
    "CELL_LOGINUID",
    "DIR_DECOY",
    "KEY_FIELD",
    "PROC_DECOY",
    "RULE_KEY",
    "MountRefusal",
    "decoy_rule",
    "ensure_dir_decoy",
    "ensure_proc_decoy",
    "foreign_rules",
    "int_field",
    "is_stockade_rule",
    "mount_event_detail",
    "refusal_layer",
    "rule_payloads",
    "task_rule",
]
