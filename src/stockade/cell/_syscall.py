"""The ctypes plumbing that the cell's kernel layers share: raw ``syscall(2)``,
``prctl(2)`` and the constants they need.

This module runs in the launcher's forked child between ``fork`` and ``execve``,
so its import stays cheap: ctypes, os and nothing that compiles or parses. It is
not a general syscall library; it holds what Landlock, seccomp and the launcher
use, each constant with the man page or UAPI header it comes from.
"""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeAlias

    SyscallArg: TypeAlias = "int | bytes | ctypes.Array[ctypes.c_char] | ctypes._CArgObject | None"
    """An argument of :func:`syscall`: an integer (passed as a full 64-bit long),
    ``None`` (NULL), ``bytes`` (a pointer to their contents), a ctypes char array,
    or ``ctypes.byref(...)`` of a structure."""

libc = ctypes.CDLL(None, use_errno=True)
"""The C library already mapped into this process (``dlopen(NULL)``)."""

_syscall = libc.syscall
_syscall.restype = ctypes.c_long
_prctl = libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

# --- prctl(2), <linux/prctl.h> -------------------------------------------------
PR_SET_PDEATHSIG = 1
"""Signal sent to this process when its parent thread dies (Linux 2.1.57)."""
PR_SET_DUMPABLE = 4
"""0 makes the process non-dumpable: no core, no ptrace by same-uid peers."""
PR_GET_SECCOMP = 21
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
"""Drop one capability from the bounding set (needs CAP_SETPCAP)."""
PR_SET_SECUREBITS = 28
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
"""Linux 3.5: execve never grants privileges again (setuid bits, file caps
ignored). Required before seccomp(2) or landlock_restrict_self(2) without
CAP_SYS_ADMIN; it cannot be unset."""
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# --- syscall numbers used here (x86-64, arch/x86/entry/syscalls/syscall_64.tbl)
SYS_SECCOMP = 317
"""seccomp(2), Linux 3.17."""
SYS_LANDLOCK_CREATE_RULESET = 444
"""landlock_create_ruleset(2), Linux 5.13."""
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446

# --- open(2) flags (asm-generic/fcntl.h); os exposes them, named here for one place
O_PATH = os.O_PATH
"""Linux 2.6.39: a handle on a path that grants no read or write; what
landlock_add_rule(2) wants as the parent of a path-beneath rule."""
O_CLOEXEC = os.O_CLOEXEC


def _arg(value: SyscallArg) -> object:
    # A bare Python int goes through varargs as a C int (32 bits): widen it so
    # that pointers, u64 masks and negative fds all arrive intact.
    if isinstance(value, int):
        return ctypes.c_ulong(value) if value > 0x7FFF_FFFF_FFFF_FFFF else ctypes.c_long(value)
    return value


def syscall(nr: int, *args: SyscallArg) -> int:
    """Call system call ``nr`` with up to six arguments; return its result.

    Raises:
        OSError: the kernel returned -1; ``errno`` is the kernel's error.
    """
    result: int = _syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    """``prctl(2)``; return its result.

    Raises:
        OSError: the kernel returned -1.
    """
    result: int = _prctl(option, arg2, arg3, arg4, arg5)
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def set_no_new_privs() -> None:
    """Set no_new_privs on the calling thread (idempotent; it cannot be unset).

    Raises:
        OSError: prctl failed (it does not on any kernel since 3.5).
    """
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def no_new_privs() -> bool:
    """Whether no_new_privs is set on the calling thread."""
    return prctl(PR_GET_NO_NEW_PRIVS) == 1


__all__ = [
    "O_CLOEXEC",
    "O_PATH",
    "PR_CAPBSET_DROP",
    "PR_CAP_AMBIENT",
    "PR_CAP_AMBIENT_CLEAR_ALL",
    "PR_GET_NO_NEW_PRIVS",
    "PR_GET_SECCOMP",
    "PR_SET_CHILD_SUBREAPER",
    "PR_SET_DUMPABLE",
    "PR_SET_NO_NEW_PRIVS",
    "PR_SET_PDEATHSIG",
    "PR_SET_SECCOMP",
    "PR_SET_SECUREBITS",
    "SYS_LANDLOCK_ADD_RULE",
    "SYS_LANDLOCK_CREATE_RULESET",
    "SYS_LANDLOCK_RESTRICT_SELF",
    "SYS_SECCOMP",
    "libc",
    "no_new_privs",
    "prctl",
    "set_no_new_privs",
    "syscall",
]
