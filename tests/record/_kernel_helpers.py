"""A minimal cell for the audit reader's tests: loginuid, Landlock and seccomp via ctypes.

The production versions live in ``stockade.cell`` (another engineer's work);
this one does only what the audit records depend on, the way the launcher will:

1. a fresh process (a subprocess, so that the test process never forks while
   the reader's thread runs) writes ``/proc/self/loginuid``, which gives it a
   new audit session id, and reports ``pid session`` on stdout;
2. it waits for a line on stdin, so the test can ``watch`` it before it can be
   denied anything;
3. it creates one Landlock domain with ``LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON``
   (without it, denials after ``execve`` are never logged), loads a seccomp
   deny-list filter with ``SECCOMP_FILTER_FLAG_LOG``, and ``execve``'s Python
   running the test's script.

Run as a script, this module is that process; imported, it offers
:func:`start_cell` to the tests.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

SYS_landlock_create_ruleset = 444
SYS_landlock_add_rule = 445
SYS_landlock_restrict_self = 446
SYS_seccomp = 317
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_RULE_NET_PORT = 2
LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON = 1 << 1  # ABI 7, Linux 6.15
FS_EXECUTE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3
FS_ALL = (1 << 16) - 1  # every right up to IOCTL_DEV (ABI 5)
NET_ALL = (1 << 2) - 1  # BIND_TCP | CONNECT_TCP (ABI 4)
NET_CONNECT_TCP = 1 << 1
SCOPE_ALL = (1 << 2) - 1  # ABSTRACT_UNIX_SOCKET | SIGNAL (ABI 6)
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
CELL_LOGINUID = 0x53544B44
"""``stockade.cell._audit_mount.CELL_LOGINUID`` (this file runs with ``-I -S``)."""
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_LOG = 1 << 1
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_LOG = 0x7FFC0000
SECCOMP_RET_ALLOW = 0x7FFF0000
AUDIT_ARCH_X86_64 = 0xC000003E
EPERM = 1


@dataclass
class CellSpec:
    """What the mini-cell allows, refuses and runs."""

    script: str
    """Python source run after execve (``python -I -S -c``)."""
    writable: list[str] = field(default_factory=list)
    """Directories with every filesystem right; everything else is read/execute only."""
    connect_ports: list[int] = field(default_factory=list)
    deny_syscalls: list[int] = field(default_factory=lambda: [101])  # ptrace
    seccomp_log_only: bool = False
    """SECCOMP_RET_LOG (audit mode) instead of SECCOMP_RET_ERRNO(EPERM)."""
    landlock_flags: int = LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(
        ctypes.c_long(SYS_landlock_create_ruleset),
        None,
        ctypes.c_long(0),
        ctypes.c_long(LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(int(abi), 0)


class Cell:
    """A running mini-cell: its host pid, its audit session, and its process."""

    def __init__(self, spec: CellSpec) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, json.dumps(asdict(spec))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"mini-cell did not start: {line!r}")
        self.pid, self.session = int(line[0]), int(line[1])

    def go(self) -> None:
        """Let the cell apply its rules and run its script."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.close()
        self.proc.stdin = None  # so that communicate() does not flush it

    def readline(self) -> str:
        """The next line the script prints (the test's proof that it did something)."""
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def finish(self, timeout: float = 30.0) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


def start_cell(spec: CellSpec) -> Cell:
    return Cell(spec)


# --- the child side -----------------------------------------------------------------------


def _syscall(libc: Any, nr: int, *args: Any) -> int:
    ret = int(libc.syscall(ctypes.c_long(nr), *args))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syscall {nr}: {os.strerror(err)}")
    return ret


def _apply_landlock(libc: Any, spec: CellSpec) -> None:
    attr = ctypes.create_string_buffer(struct.pack("=QQQ", FS_ALL, NET_ALL, SCOPE_ALL))
    ruleset = _syscall(libc, SYS_landlock_create_ruleset, attr, ctypes.c_size_t(24), 0)
    rules: list[tuple[str, int]] = [("/", FS_EXECUTE | FS_READ_FILE | FS_READ_DIR)]
    rules += [(path, FS_ALL) for path in spec.writable]
    for path, access in rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        # struct landlock_path_beneath_attr is packed: u64 then s32.
        rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd))
        _syscall(libc, SYS_landlock_add_rule, ctypes.c_int(ruleset), LANDLOCK_RULE_PATH_BENEATH, rule, 0)
        os.close(fd)
    for port in spec.connect_ports:
        rule = ctypes.create_string_buffer(struct.pack("=QQ", NET_CONNECT_TCP, port))
        _syscall(libc, SYS_landlock_add_rule, ctypes.c_int(ruleset), LANDLOCK_RULE_NET_PORT, rule, 0)
    _syscall(libc, SYS_landlock_restrict_self, ctypes.c_int(ruleset), ctypes.c_int(spec.landlock_flags))
    os.close(ruleset)


def _apply_seccomp(libc: Any, spec: CellSpec) -> None:
    def stmt(code: int, k: int) -> bytes:
        return struct.pack("=HBBI", code, 0, 0, k)

    def jeq(k: int, jt: int, jf: int) -> bytes:
        return struct.pack("=HBBI", 0x15, jt, jf, k)  # BPF_JMP|BPF_JEQ|BPF_K

    refuse = SECCOMP_RET_LOG if spec.seccomp_log_only else SECCOMP_RET_ERRNO | EPERM
    prog = [stmt(0x20, 4), jeq(AUDIT_ARCH_X86_64, 1, 0), stmt(0x06, SECCOMP_RET_KILL_PROCESS)]
    prog.append(stmt(0x20, 0))  # BPF_LD|BPF_W|BPF_ABS: seccomp_data.nr
    for nr in spec.deny_syscalls:
        prog += [jeq(nr, 0, 1), stmt(0x06, refuse)]
    prog.append(stmt(0x06, SECCOMP_RET_ALLOW))
    code = ctypes.create_string_buffer(b"".join(prog))
    fprog = ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", len(prog), ctypes.addressof(code)))
    _syscall(libc, SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_LOG, fprog)


def _child(spec: CellSpec) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    with open("/proc/self/loginuid", "w") as f:
        # A cell's login uid: a fresh audit session id, immutable without
        # CAP_AUDIT_CONTROL, which stockade's audit rules match.
        f.write(str(CELL_LOGINUID))
    # The kernel's task filter decides at fork whether a task is audited at
    # all (``_audit_mount.task_rule`` spares every task whose login uid is
    # not a cell's): like a real cell's processes, the mini-cell is forked
    # after its login uid is written, or its refusals would leave no record.
    child = os.fork()
    if child:
        os.close(0)
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() == 1:
        os._exit(3)  # killed with the mini-cell (Cell.kill), or its parent already gone
    with open("/proc/self/sessionid") as f:
        session = f.read().strip()
    print(os.getpid(), session, flush=True)
    if sys.stdin.readline().strip() != "go":
        os._exit(3)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    _apply_landlock(libc, spec)
    _apply_seccomp(libc, spec)
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", spec.script])


if __name__ == "__main__":
    _child(CellSpec(**json.loads(sys.argv[1])))
