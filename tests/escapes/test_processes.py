"""Process and privilege escapes (THREATS.md, "Processes and privilege"),
tried for real inside cells.

Each test asserts (a) the attempt failed, with the errno the refusing layer
gives, (b) the record says what was tried (seccomp: the syscall; Landlock:
the blockers and target; cgroup/timeout: a ``cell.limit``), and (c) the
legitimate neighbour still works. Where the refusing layer is one the kernel
does not log (the pid namespace hiding a pid, a capability check, a setuid
bit ignored), the docstring says so and the test asserts the strongest
evidence there is instead.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stockade.cell import Cell, CellResult
from stockade.cell._cgroup import sweep_stale
from stockade.errors import PolicyError
from stockade.policy import EnvPolicy, Limits, LlmPolicy, Policy, default_policy
from tests.escapes._probes import (
    PYTHON,
    Attempt,
    assert_landlock_denial,
    assert_refused,
    assert_seccomp_denial,
    assert_works,
    leaked,
    run_probe,
)
from tests.escapes._prochost import (
    BOUND,
    Watched,
    cgroup_dirs,
    cgroup_name_of,
    children_of,
    pids_with_marker,
    spawn_time,
)

EPERM, ENOSYS, ESRCH, EINVAL, EAGAIN = errno.EPERM, errno.ENOSYS, errno.ESRCH, errno.EINVAL, errno.EAGAIN

# --------------------------------------------------------------------- seccomp

_CHILD = """
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)
    os._exit(0)
"""
"""Module-level set-up shared by attempts on a sibling process: a child that
waits on a pipe (so that it is alive, same uid, dumpable: attachable but for
the filter)."""

_RELEASE = "os.write(w, b'x'); os.waitpid(pid, 0)"

_IOVEC = """
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
"""

_CONTROLS = {
    "signal-own-child": (
        "p = os.fork()\n"
        "if p == 0:\n"
        "    os.read(os.pipe()[0], 1)\n"
        "os.kill(p, 15); return os.waitpid(p, 0)[1] & 0x7f",
        15,
    ),
    "fork": ("p = os.fork()\nif p == 0:\n    os._exit(3)\nreturn os.waitpid(p, 0)[1] >> 8", 3),
    "thread": (
        "import threading\nbox = []\nt = threading.Thread(target=lambda: box.append(1))\n"
        "t.start(); t.join(); return box",
        [1],
    ),
    "namespaces-readable": ("return os.readlink('/proc/self/ns/net').startswith('net:[')", True),
    "mountinfo": (
        "return os.statvfs('/tmp').f_bsize > 0 and '/proc' in open('/proc/self/mountinfo').read()",
        True,
    ),
    "chdir": ("os.chdir('/tmp'); return os.getcwd()", "/tmp"),
    "io": ("r, w = os.pipe(); os.write(w, b'ok'); return os.read(r, 2).decode()", "ok"),
    "mmap": ("import mmap\nm = mmap.mmap(-1, 4096); m[0:2] = b'ok'; return m[0:2].decode()", "ok"),
    "random": ("return len(os.urandom(16))", 16),
    "uname": ("return os.uname().sysname", "Linux"),
    "clock": (
        "import time\nreturn time.time() > 1e9 and time.clock_gettime(time.CLOCK_REALTIME) > 1e9",
        True,
    ),
}

SECCOMP = {
    "ptrace": (
        _CHILD,
        f"try:\n    sys_call('ptrace', 16, pid, 0, 0)  # PTRACE_ATTACH\nfinally:\n    {_RELEASE}",
        "signal-own-child",
    ),
    "process_vm_readv": (
        _CHILD + _IOVEC + "theirs = ctypes.create_string_buffer(b'secret of the child', 32)\n",
        "mine = ctypes.create_string_buffer(32)\n"
        "local = iovec(ctypes.addressof(mine), 32); remote = iovec(ctypes.addressof(theirs), 32)\n"
        "try:\n"
        "    sys_call('process_vm_readv', pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)\n"
        f"finally:\n    {_RELEASE}",
        "signal-own-child",
    ),
    "unshare": ("", "sys_call('unshare', 0x10000000)  # CLONE_NEWUSER", "fork"),
    "setns": (
        "",
        "fd = os.open('/proc/self/ns/net', os.O_RDONLY)\nsys_call('setns', fd, 0x40000000)",
        "namespaces-readable",
    ),
    "mount": ("", "sys_call('mount', b'none', b'/tmp', b'tmpfs', 0, 0)", "mountinfo"),
    "umount2": ("", "sys_call('umount2', b'/proc', 2)  # MNT_DETACH", "mountinfo"),
    "pivot_root": ("", "os.chdir('/tmp'); sys_call('pivot_root', b'.', b'.')", "chdir"),
    "chroot": ("", "sys_call('chroot', b'/tmp')", "chdir"),
    "bpf": (
        "",
        # BPF_MAP_CREATE of a 1-entry array map: union bpf_attr's first fields.
        "attr = ctypes.create_string_buffer((2).to_bytes(4, 'little') + (4).to_bytes(4, 'little')"
        " + (8).to_bytes(4, 'little') + (1).to_bytes(4, 'little'), 128)\n"
        "sys_call('bpf', 0, attr, 128)",
        "io",
    ),
    "perf_event_open": (
        "",
        # struct perf_event_attr: type PERF_TYPE_SOFTWARE, size 128, config CPU_CLOCK.
        "attr = ctypes.create_string_buffer((1).to_bytes(4, 'little') + (128).to_bytes(4, 'little'), 128)\n"
        "sys_call('perf_event_open', attr, 0, -1, -1, 0)",
        "clock",
    ),
    "io_uring_setup": (
        "",
        "params = ctypes.create_string_buffer(120)\nsys_call('io_uring_setup', 8, params)",
        "io",
    ),
    "userfaultfd": ("", "sys_call('userfaultfd', os.O_CLOEXEC)", "mmap"),
    "keyctl": ("", "sys_call('keyctl', 0, -3, 0)  # KEYCTL_GET_KEYRING_ID, session keyring", "random"),
    "add_key": ("", "sys_call('add_key', b'user', b'stolen', b'payload', 7, -2)", "random"),
    "init_module": (
        "",
        "image = ctypes.create_string_buffer(64)\nsys_call('init_module', image, 64, b'')",
        "uname",
    ),
    "kexec_load": ("", "sys_call('kexec_load', 0, 0, 0, 0)", "uname"),
    "reboot": (
        "",
        "sys_call('reboot', 0xfee1dead, 672274793, 0, 0)  # LINUX_REBOOT_CMD_CAD_OFF",
        "uname",
    ),
    "swapon": ("", "open('/tmp/swap', 'wb').close(); sys_call('swapon', b'/tmp/swap', 0)", "io"),
    "settimeofday": (
        "",
        # Today's time, so that the call would change nothing even if it got through.
        "import time\nclass timeval(ctypes.Structure):\n"
        "    _fields_ = [('sec', ctypes.c_long), ('usec', ctypes.c_long)]\n"
        "now = time.time(); tv = timeval(int(now), int(now % 1 * 1e6))\n"
        "sys_call('settimeofday', ctypes.byref(tv), 0)",
        "clock",
    ),
}


@pytest.mark.parametrize("syscall", SECCOMP)
def test_refused_syscall(cell: Cell, syscall: str) -> None:
    """Each syscall of the THREATS list is refused by the seccomp deny filter
    with EPERM and logged (SECCOMP_FILTER_FLAG_LOG), so the record names it;
    the attempt is made for real (a live sibling to ptrace, a map to create,
    today's time to set). Its permitted neighbour still works."""
    setup, body, control = SECCOMP[syscall]
    control_body, expected = _CONTROLS[control]
    probe = run_probe(cell, [Attempt("attempt", body, setup=setup), Attempt("control", control_body)])
    assert_refused(probe["attempt"], EPERM)
    assert_seccomp_denial(probe, syscall)
    assert assert_works(probe["control"]) == expected


CLONE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


def test_clone_with_namespace_flags(cell: Cell) -> None:
    """clone(2) with any CLONE_NEW* flag (each tried alone, with SIGCHLD) is
    refused by seccomp and recorded once per attempt; a plain fork (clone
    without them) works."""
    attempts = [
        Attempt(
            name,
            f"r = sys_call('clone', {flag} | 17, 0, 0, 0, 0)\n"
            "if r == 0:\n    os._exit(0)  # only if the filter failed: never run the rest twice\n"
            "os.waitpid(r, 0)\nreturn r",
        )
        for name, flag in CLONE_FLAGS.items()
    ]
    body, expected = _CONTROLS["fork"]
    probe = run_probe(cell, [*attempts, Attempt("control", body)])
    for name in CLONE_FLAGS:
        assert_refused(probe[name], EPERM)
    assert len(probe.seccomp("clone")) == len(CLONE_FLAGS), probe.transcript()
    assert_seccomp_denial(probe, "clone")
    assert assert_works(probe["control"]) == expected


def test_clone3(cell: Cell) -> None:
    """clone3 keeps its flags behind a pointer seccomp cannot read, so a second
    filter fails every clone3 with ENOSYS, on purpose without a log: the C
    library falls back to clone (whose flags are checked and logged) on every
    thread it starts, and logging each would flood the record. So this attempt,
    with CLONE_NEWUSER, is refused and NOT recorded, by design. Threads still
    start (the control: glibc's fallback)."""
    probe = run_probe(
        cell,
        [
            Attempt(
                "attempt",
                # struct clone_args: flags = CLONE_NEWUSER, exit_signal = SIGCHLD.
                "args = ctypes.create_string_buffer((0x10000000).to_bytes(8, 'little') + bytes(24)"
                " + (17).to_bytes(8, 'little'), 88)\n"
                "r = sys_call('clone3', args, 88)\n"
                "if r == 0:\n    os._exit(0)\n"
                "os.waitpid(r, 0)",
            ),
            Attempt("control", _CONTROLS["thread"][0]),
        ],
    )
    assert_refused(probe["attempt"], ENOSYS)
    assert assert_works(probe["control"]) == [1]
    assert probe.seccomp("clone3") == []


OTHER_ABIS = {
    # i386 ptrace(PTRACE_TRACEME) through int 0x80: mov eax, 26; xor ebx, ebx; int 0x80; ret.
    "i386-int80": (
        "import mmap\ncode = bytes([0xB8, 26, 0, 0, 0, 0x31, 0xDB, 0xCD, 0x80, 0xC3])\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "    m[: len(code)] = code\n"
        "    fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
        "    os._exit(100 if fn() == 0 else 101)\n"
        "status = os.waitpid(pid, 0)[1]\n"
        "if os.WIFEXITED(status):\n"
        "    return os.WEXITSTATUS(status)\n"
        "raise OSError(errno.EPERM, f'killed by signal {os.WTERMSIG(status)}')"
    ),
    # x32 ptrace: the x32 bit on the number.
    "x32": "sys_call(0x40000000 | 521, 0, 0, 0, 0)",
}


@pytest.mark.parametrize("abi", OTHER_ABIS)
def test_seccomp_cannot_be_bypassed_through_another_abi(cell: Cell, abi: str) -> None:
    """The filter compares x86-64 syscall numbers, so a call through another
    ABI (ptrace as i386 ``int 0x80``, as x32) must not slip past it: an i386
    call kills the process (SIGSYS), an x32 call fails with EPERM, and each is
    recorded with its architecture and number. Ordinary calls still work."""
    probe = run_probe(cell, [Attempt("attempt", OTHER_ABIS[abi]), Attempt("control", "return os.getppid()")])
    assert_refused(probe["attempt"], EPERM)
    events = probe.denials("seccomp")
    assert len(events) == 1, probe.transcript()
    detail = events[0].detail
    if abi == "i386-int80":
        assert "killed by signal 31" in probe["attempt"].error
        assert (detail["arch"], detail["nr"], detail["action"]) == ("40000003", 26, "kill_process")
        assert "killed" in events[0].summary
    else:
        assert (detail["arch"], detail["nr"], detail["action"]) == ("x86_64", 0x40000000 | 521, "errno")
    assert assert_works(probe["control"]) == 1  # the cell's init


# --------------------------------------------------------------------- terminals


@pytest.fixture
def pty() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal (master, slave): the slave becomes the cell's stdin."""
    master, slave = os.openpty()
    try:
        yield master, slave
    finally:
        os.close(master)
        os.close(slave)


def _pending(fd: int) -> bytes:
    """What can be read from ``fd`` right now, without blocking."""
    ready, _, _ = select.select([fd], [], [], 0)
    return os.read(fd, 1024) if ready else b""


TERMINAL_IOCTLS = {
    # Push a command and a newline into the terminal's input queue.
    "TIOCSTI": "import fcntl\nfor c in b'id\\n':\n    fcntl.ioctl(0, 0x5412, bytes([c]))",
    # The same request with high bits set: the kernel reads it as an unsigned int.
    "TIOCSTI-high-bits": "c = ctypes.c_char(b'i')\nsys_call('ioctl', 0, 0x100005412, ctypes.byref(c))",
    # TIOCL_SETSEL then TIOCL_PASTESEL: paste the console selection as input.
    "TIOCLINUX": (
        "import fcntl\nfcntl.ioctl(0, 0x541C, bytes([2]) + bytes(10))\nfcntl.ioctl(0, 0x541C, bytes([3]))"
    ),
}


@pytest.mark.parametrize("request_name", TERMINAL_IOCTLS)
def test_terminal_injection(cell: Cell, pty: tuple[int, int], request_name: str) -> None:
    """CVE-2017-5226: typing into the terminal the cell shares with its caller.
    With a pty as the cell's stdin, TIOCSTI and TIOCLINUX are refused by
    seccomp (EPERM) and recorded as an ioctl. The record cannot say which
    request it was: an AUDIT_SECCOMP record carries no arguments. Nothing
    reaches the terminal's input queue. Other terminal ioctls work (the
    control: tcgetattr)."""
    master, slave = pty
    probe = run_probe(
        cell,
        [
            Attempt("attempt", TERMINAL_IOCTLS[request_name]),
            Attempt("control", "import termios\nreturn [os.isatty(0), len(termios.tcgetattr(0))]"),
        ],
        stdin=slave,
    )
    assert_refused(probe["attempt"], EPERM)
    assert_seccomp_denial(probe, "ioctl")
    assert assert_works(probe["control"]) == [True, 7]
    os.set_blocking(slave, False)
    try:
        assert _pending(slave) == b"", "input was injected into the caller's terminal"
    finally:
        os.set_blocking(slave, True)
    assert b"id" not in _pending(master)


# --------------------------------------------------------------------- privilege


# its control reads the agent's name, which the test image's passwd lacks (test_workbench_escapes:
# the image's setuid binary)
@pytest.mark.host_view
def test_setuid_binary_copied_into_the_workspace(cell: Cell) -> None:
    """A setuid-root copy of ``id`` in the workspace (made by host root, mode
    4755) runs without privilege: the workspace is mounted nosuid, the cell has
    no_new_privs, and host root is not even mapped in its user namespace. The
    kernel simply does not honour the bit, which it does not record. Evidence:
    the program reports uid and euid 1000 while its mode shows the bit."""
    copy = Path(cell.workspace, "suid-id")
    shutil.copy("/usr/bin/id", copy)
    os.chown(copy, 0, 0)
    copy.chmod(0o4755)
    probe = run_probe(
        cell,
        [
            Attempt(
                "attempt",
                "import subprocess\nr = subprocess.run(['./suid-id'], capture_output=True, text=True)\n"
                "return [r.returncode, r.stdout.strip()]",
            ),
            Attempt("mode", "return bool(os.stat('suid-id').st_mode & stat.S_ISUID)"),
            Attempt("control", "return [os.getuid(), os.geteuid()]"),
        ],
    )
    code, out = assert_works(probe["attempt"])
    assert code == 0 and out.startswith("uid=1000(agent)") and "euid" not in out, out
    assert assert_works(probe["mode"]) is True
    assert assert_works(probe["control"]) == [1000, 1000]


SETID_BITS = stat.S_ISUID | stat.S_ISGID


@pytest.mark.parametrize("workspace", ["root-owned", "fresh"])
def test_setuid_binary_made_by_the_agent_stays_harmless_on_the_host(host_dir: Path, workspace: str) -> None:
    """The reverse of the test above: the agent itself copies a program into
    its workspace and sets its setuid and setgid bits. Inside the cell the bits
    are inert (nosuid, no_new_privs), but the file stays on the host, where
    anyone who runs it would take its owner's identity: no file the agent
    leaves may carry a set-id bit on the host (or the chmod must be refused).

    ESCAPE (found by this test) with a root-owned workspace: it is idmapped so
    that what the agent makes belongs to the workspace's owner on disk, and
    chmod is its owner's right, so the agent leaves a setuid-root, setgid-root
    copy of ``id`` on the host; run by uid 65534 it reports ``euid=0(root)``.
    With a fresh workspace the file is setuid-nobody (every default cell's
    host identity), which lets any local user act as the owner of every other
    agent's fresh workspace."""
    ws: str | None = None
    if workspace == "root-owned":
        (host_dir / "ws").mkdir()
        ws = str(host_dir / "ws")
    with Cell(default_policy("escapes"), workspace=ws, environ={}) as cell:
        probe = run_probe(
            cell,
            [
                Attempt(
                    "attempt",
                    "import shutil\nshutil.copy('/usr/bin/id', 'rootme')\nos.chmod('rootme', 0o6755)",
                ),
                Attempt("control", "open('run.sh', 'w').write('#'); os.chmod('run.sh', 0o755)"),
            ],
        )
        on_host = Path(cell.workspace, "rootme")
        st = on_host.stat() if on_host.exists() else None
        assert_works(probe["control"])
        assert Path(cell.workspace, "run.sh").stat().st_mode & 0o777 == 0o755
    assert st is None or not st.st_mode & SETID_BITS, (
        f"ESCAPE: {probe['attempt']}; the host now holds {on_host} with mode {oct(st.st_mode)}, "
        f"owned by uid {st.st_uid} gid {st.st_gid}"
    )


@pytest.mark.host_view  # a workbench's /etc/shadow is the image's own (test_workbench_escapes: user root)
@pytest.mark.parametrize("tool", ["su", "sudo"])
def test_su_and_sudo(cell: Cell, tool: str) -> None:
    """``su -c 'id -u' root`` and ``sudo -n id -u`` get no root. su is setuid
    root on the host, but runs unprivileged here (nosuid, no_new_privs); it
    then reads /etc/shadow, which is a decoy, refused by Landlock and recorded.
    sudo is not installed on this host: then the attempt fails at exec (ENOENT,
    nothing to record); where it is installed, it must fail like su."""
    argv = ["su", "-c", "id -u", "root"] if tool == "su" else ["sudo", "-n", "id", "-u"]
    probe = run_probe(
        cell,
        [
            Attempt(
                "attempt",
                "import subprocess\n"
                f"r = subprocess.run({argv!r}, capture_output=True, text=True, stdin=subprocess.DEVNULL,"
                " timeout=20)\nreturn [r.returncode, r.stdout, r.stderr]",
            ),
            Attempt("control", "return os.geteuid()"),
        ],
    )
    installed = shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin") is not None
    if installed:
        code, out, _err = assert_works(probe["attempt"])
        assert code != 0 and "0" not in out.split(), (code, out)
    else:
        assert_refused(probe["attempt"], errno.ENOENT)
    if tool == "su":
        assert_landlock_denial(probe, "/etc/shadow", "fs.read_file")
    assert assert_works(probe["control"]) == 1000


def test_no_new_privs(cell: Cell) -> None:
    """NoNewPrivs is 1 in the cell's pid 1 and in what it executes, and cannot
    be cleared (prctl refuses with EINVAL; the kernel records nothing)."""
    probe = run_probe(
        cell,
        [
            Attempt(
                "attempt",
                "libc.prctl.restype = ctypes.c_int\n"
                "if libc.prctl(38, 0, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS 0\n"
                "    raise OSError(ctypes.get_errno(), 'prctl')",
            ),
            Attempt(
                "self",
                "return [l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs')]",
            ),
            Attempt(
                "exec",
                "import subprocess\nreturn subprocess.run(['/bin/grep', 'NoNewPrivs', '/proc/self/status'],"
                " capture_output=True, text=True).stdout.split()",
            ),
        ],
    )
    assert_refused(probe["attempt"], EINVAL)
    assert assert_works(probe["self"]) == ["1"]
    assert assert_works(probe["exec"]) == ["NoNewPrivs:", "1"]


CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def test_capability_sets_are_empty(cell: Cell) -> None:
    """Every capability set is empty, in the cell's pid 1 and after an exec;
    raising one fails: capset (EPERM), an ambient raise (EPERM), clearing the
    locked securebits (EPERM). Capability checks are not recorded by the
    kernel. Evidence: /proc/self/status."""
    probe = run_probe(
        cell,
        [
            Attempt(
                "capset",
                "hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)\n"
                "data = (ctypes.c_uint32 * 6)(1 << 21, 1 << 21, 0, 0, 0, 0)  # CAP_SYS_ADMIN\n"
                "sys_call('capset', hdr, data)",
            ),
            Attempt("ambient", "sys_call('prctl', 47, 2, 21, 0, 0)  # PR_CAP_AMBIENT_RAISE CAP_SYS_ADMIN"),
            Attempt("securebits", "sys_call('prctl', 28, 0, 0, 0, 0)  # PR_SET_SECUREBITS 0"),
            Attempt(
                "self",
                "return {l.split(':')[0]: l.split()[1] for l in open('/proc/self/status')"
                f" if l.startswith({CAP_FIELDS!r})}}",
            ),
            Attempt(
                "exec",
                "import subprocess\nout = subprocess.run(['/bin/grep', '^Cap', '/proc/self/status'],"
                " capture_output=True, text=True).stdout\n"
                "return {l.split(':')[0]: l.split()[1] for l in out.splitlines()}",
            ),
        ],
    )
    for name in ("capset", "ambient", "securebits"):
        assert_refused(probe[name], EPERM)
    zero = {field: "0000000000000000" for field in CAP_FIELDS}
    assert assert_works(probe["self"]) == zero
    assert assert_works(probe["exec"]) == zero


# --------------------------------------------------------------------- signals and /proc


@pytest.fixture
def host_victim() -> Iterator[subprocess.Popen[bytes]]:
    """A host process (outside every cell) that must survive every test."""
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    ) as proc:
        try:
            yield proc
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=BOUND)


def test_signal_to_a_host_process_by_pid(cell: Cell, host_victim: subprocess.Popen[bytes]) -> None:
    """kill(<host pid>, SIGKILL): the host process is not in the cell's pid
    namespace, so the pid names nothing there (ESRCH); no security layer is
    asked and the kernel records nothing. Evidence: the host process is alive
    afterwards. Signalling the cell's own child works (the control)."""
    probe = run_probe(
        cell,
        [
            Attempt("attempt", f"os.kill({host_victim.pid}, 9)"),
            Attempt("group", f"os.killpg({host_victim.pid}, 9)"),
            Attempt("control", _CONTROLS["signal-own-child"][0]),
        ],
    )
    assert host_victim.pid > 1
    assert_refused(probe["attempt"], ESRCH)
    assert_refused(probe["group"], ESRCH)
    assert assert_works(probe["control"]) == 15
    assert host_victim.poll() is None


def test_signal_to_a_host_process_by_pidfd(cell: Cell, host_victim: subprocess.Popen[bytes]) -> None:
    """A pidfd of a host process handed to the cell (over a unix socket on its
    stdin, as a careless broker might): pidfd_send_signal refuses a process
    outside the caller's pid namespace (EINVAL) before Landlock's signal scope
    is asked, so the kernel records nothing. Evidence: it is alive afterwards."""
    import array
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pidfd = os.pidfd_open(host_victim.pid)
    try:
        ours.sendmsg([b"p"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))])
        probe = run_probe(
            cell,
            [
                Attempt(
                    "attempt",
                    "s = socket.socket(fileno=os.dup(0))\n"
                    "_, anc, _, _ = s.recvmsg(1, socket.CMSG_SPACE(4))\n"
                    "fd = int.from_bytes(anc[0][2][:4], 'little')\n"
                    "sys_call('pidfd_send_signal', fd, 9, 0, 0)",
                ),
                Attempt("control", _CONTROLS["signal-own-child"][0]),
            ],
            stdin=theirs.fileno(),
        )
    finally:
        os.close(pidfd)
        ours.close()
        theirs.close()
    assert_refused(probe["attempt"], EINVAL)
    assert assert_works(probe["control"]) == 15
    assert host_victim.poll() is None


def test_signal_scope_of_landlock(cell: Cell) -> None:
    """Landlock's signal scope (ABI 6), which the cell's domain carries, as
    seen from the only place a process outside a domain is visible to one
    inside it: a child that enters a nested domain tries to signal its parent.
    Landlock refuses (EPERM) and records scope.signal with the target. Signals
    within the child's own domain work (the control: it signals itself)."""
    probe = run_probe(
        cell,
        [
            Attempt(
                "attempt",
                "import struct\nr, w = os.pipe()\npid = os.fork()\n"
                "if pid == 0:\n"
                "    try:\n"
                "        attr = struct.pack('=QQQ', 0, 0, 2)  # scoped: LANDLOCK_SCOPE_SIGNAL\n"
                "        rs = sys_call('landlock_create_ruleset', attr, len(attr), 0)\n"
                "        sys_call('landlock_restrict_self', rs, 0)\n"
                "        os.kill(os.getpid(), 0)  # itself: same domain\n"
                "        try:\n"
                "            os.kill(os.getppid(), 10)\n"
                "            os.write(w, b'0')\n"
                "        except OSError as e:\n"
                "            os.write(w, str(e.errno).encode())\n"
                "    finally:\n"
                "        os._exit(0)\n"
                "os.close(w); got = int(os.read(r, 8)); os.waitpid(pid, 0)\n"
                "if got:\n    raise OSError(got, 'kill of the parent')",
            ),
            Attempt("control", "os.kill(os.getpid(), 0); return True"),
        ],
    )
    assert_refused(probe["attempt"], EPERM)
    event = next(e for e in probe.landlock(blocker="scope.signal"))
    assert event.detail.get("syscall") == "kill" and event.detail.get("target_pid")
    assert "signal" in event.summary
    assert assert_works(probe["control"]) is True


def test_only_the_cells_processes_are_visible(cell: Cell, host_victim: subprocess.Popen[bytes]) -> None:
    """The cell's /proc lists its own processes only: its init (pid 1), the
    probe and the two children it started, nothing of the host (a host pid is ENOENT there,
    decided by the pid namespace, unrecorded)."""
    probe = run_probe(
        cell,
        [
            Attempt(
                "listing",
                "r, w = os.pipe(); kids = []\n"
                "for _ in range(2):\n"
                "    p = os.fork()\n"
                "    if p == 0:\n"
                "        os.close(w); os.read(r, 1); os._exit(0)\n"
                "    kids.append(p)\n"
                "seen = sorted(int(n) for n in os.listdir('/proc') if n.isdigit())\n"
                "os.close(w)\nfor p in kids:\n    os.waitpid(p, 0)\n"
                "return [seen, sorted([1, os.getpid(), *kids])]",
            ),
            Attempt("attempt", f"return open('/proc/{host_victim.pid}/status').read()"),
        ],
    )
    seen, own = assert_works(probe["listing"])
    assert seen == own
    assert_refused(probe["attempt"], errno.ENOENT)


# --------------------------------------------------------------------- limits


def _limited() -> Policy:
    """The default policy with the limits the THREATS tests name: 64 MiB, 64 tasks."""
    return dataclasses.replace(
        default_policy("escapes"), limits=Limits(memory=64 << 20, pids=64, timeout=60.0)
    )


class _Gate:
    """Runs ``check`` once when the cell prints ``marker``, then releases the
    cell by writing to its stdin (a pipe)."""

    def __init__(self, marker: bytes, check: Callable[[bytes], None], *, hold: bool = False) -> None:
        self.marker = marker
        self.check = check
        self.hold = hold
        """Never release the cell (a timeout must end it)."""
        self.read_fd, self.write_fd = os.pipe()
        self.seen = b""
        self.fired = False

    def __call__(self, stream: int, chunk: bytes) -> None:
        if stream != 1 or self.fired:
            return
        self.seen += chunk
        if self.marker in self.seen:
            self.fired = True
            try:
                self.check(self.seen)
            finally:
                if not self.hold:
                    self.release()

    def release(self) -> None:
        if self.write_fd >= 0:
            os.write(self.write_fd, b"\n")
            os.close(self.write_fd)
            self.write_fd = -1

    def close(self) -> None:
        self.release()
        os.close(self.read_fd)


FORK_BOMB = r"""
import os, sys
top = os.getpid()  # the command (pid 2: the cell's init is pid 1)
while True:
    try:
        pid = os.fork()
    except OSError as exc:
        if os.getpid() != top:
            continue  # every process keeps forking: a real bomb
        alive = sum(1 for n in os.listdir('/proc') if n.isdigit())
        print(f"saturated {exc.errno} {alive}", flush=True)
        break
sys.stdin.read(1)
"""


def test_fork_bomb_stops_at_the_pids_limit() -> None:
    """A fork bomb (every process forks forever) with ``limits.pids = 64``:
    fork fails with EAGAIN once the cell holds 64 tasks, the run records a
    ``cell.limit`` (cgroup), and while the bomb spins the host still starts a
    process promptly. Everything ends with the cell."""
    timings: list[float] = []
    gate = _Gate(b"saturated", lambda _seen: timings.append(spawn_time(["/bin/true"])))
    try:
        with Cell(_limited(), environ={}) as cell:
            result = cell.run(
                [PYTHON, "-I", "-c", FORK_BOMB], stdin=gate.read_fd, on_output=gate, timeout=BOUND * 3
            )
    finally:
        gate.close()
    assert gate.fired, f"the bomb never saturated: {result.stdout!r} {result.stderr!r}"
    _, err, alive = gate.seen.decode().split()[:3]
    assert int(err) == EAGAIN
    assert 1 < int(alive) <= 64
    assert "pids" in result.limits_hit
    limit = [e for e in result.events if e.kind == "cell.limit"]
    assert limit and limit[0].layer == "cgroup" and "process limit of 64" in limit[0].summary
    assert not result.timed_out
    assert timings and timings[0] < 2.0, f"the host took {timings} s to start /bin/true"


MEMORY_HOG = r"""
import sys
small = bytearray(16 << 20)  # the control: 16 MiB under a 64 MiB limit
print("small ok", flush=True)
hoard = []
while True:
    hoard.append(bytearray(8 << 20))  # zero-filled: every page is touched
"""


def test_memory_hog_is_killed_at_the_memory_limit() -> None:
    """A process that allocates without end under ``limits.memory = 64M`` is
    killed by the OOM killer (exit 137, SIGKILL) once the cell reaches 64 MiB;
    the run records a ``cell.limit`` (cgroup) and its peak never passes the
    limit. An allocation under the limit works (the control), and the host
    starts a process promptly right after."""
    with Cell(_limited(), environ={}) as cell:
        result = cell.run([PYTHON, "-I", "-c", MEMORY_HOG], timeout=BOUND * 3)
    assert result.stdout == b"small ok\n"
    assert result.exit_code == 128 + signal.SIGKILL
    assert "memory" in result.limits_hit
    limit = [e for e in result.events if e.kind == "cell.limit"]
    assert limit and limit[0].layer == "cgroup" and "memory limit" in limit[0].summary
    peak = result.events[-1].detail["memory_peak"]
    assert peak is None or peak <= 64 << 20
    assert not result.timed_out and result.duration < BOUND
    assert spawn_time(["/bin/true"]) < 2.0


DENIAL_FLOOD = r"""
import os, time
end = time.monotonic() + 5
n = 0
while time.monotonic() < end:
    for _ in range(500):
        try:
            os.open('/etc/shadow', os.O_RDONLY)
        except OSError:
            n += 1
print(n)
"""


def _rss_mib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) >> 10


def test_denial_flood_cannot_make_the_host_hold_more_than_the_cell_may() -> None:
    """A cell limited to 64 MiB that does nothing but fail to open /etc/shadow
    for five seconds (tens of thousands of Landlock denials a second) must not
    make the process that runs it grow by more than the cell's own limit: the
    record may count, sample or aggregate repeated denials, but what one cell
    costs the host has to be bounded like the cell itself.

    ESCAPE (found by this test): every kernel record becomes an ``Event`` kept
    in ``CellResult.events``; five seconds of flood cost the launcher ~120 MiB
    while the cell's peak stays under 10 MiB, and the growth is linear in the
    run's length (a default one-hour timeout is tens of GiB on the host)."""
    with Cell(_limited(), environ={}) as cell:
        cell.run([PYTHON, "-I", "-c", "pass"])  # warm: imports, the audit reader
        before = _rss_mib()
        result = cell.run([PYTHON, "-I", "-c", DENIAL_FLOOD], timeout=BOUND * 3)
        grown = _rss_mib() - before
    assert result.exit_code == 0 and int(result.stdout) > 0
    denied = sum(1 for e in result.events if e.kind == "cell.denied")
    assert denied > 0, "the flood left no record at all"
    assert grown < 64, (
        f"ESCAPE: the launcher grew by {grown} MiB ({len(result.events)} events kept) for a cell "
        f"limited to 64 MiB whose peak was {result.events[-1].detail['memory_peak']} bytes"
    )


# --------------------------------------------------------------------- nothing outlives its cell


DAEMONS = r"""
import os, signal, sys
MARK = "{marker}"
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
if os.fork() == 0:                 # a background child
    signal.pause(); os._exit(0)
if os.fork() == 0:                 # a double-forked daemon in a session of its own
    os.setsid()
    if os.fork() == 0:
        signal.pause(); os._exit(0)
    os._exit(0)
os.wait()
print("ready", flush=True)
sys.stdin.read(1)
"""


def _daemon_script(marker: str) -> str:
    return DAEMONS.replace("{marker}", marker)


class _Spy:
    """Seen from the host when the cell prints ``ready``: its processes
    (pidfds on them) and its cgroup's name."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.watched: Watched | None = None
        self.cgroup = ""
        self.cgroup_dirs: list[str] = []

    def look(self, *, also: tuple[int, ...] = ()) -> None:
        """``also``: more host pids of the cell (its C1, outside its pid namespace)."""
        pids = pids_with_marker(self.marker)
        assert len(pids) == 3, f"expected the cell's pid 1, a child and a daemon, found {pids}"
        self.cgroup = cgroup_name_of(pids[0])
        self.cgroup_dirs = [d for d in cgroup_dirs(self.cgroup) if os.path.isdir(d)]
        assert self.cgroup_dirs, f"no directory of cgroup {self.cgroup} found"
        self.watched = Watched([*pids, *also])

    def assert_all_gone(self) -> None:
        assert self.watched is not None, "the cell never got ready"
        survivors = self.watched.wait_gone()
        assert survivors == [], f"processes {survivors} outlived their cell"
        assert pids_with_marker(self.marker) == []
        self.watched.close()


@pytest.fixture
def spy() -> Iterator[_Spy]:
    s = _Spy("stockade-escape-" + secrets.token_hex(6))
    yield s
    if s.watched is not None:
        s.watched.kill_all()  # never leave a stray behind, even when failing
        s.watched.close()


class _Stop(KeyboardInterrupt):
    """The caller abandons the run, as Ctrl-C does."""


@pytest.mark.parametrize("how", ["cell-ends", "timeout", "stop"])
def test_background_processes_die_with_the_cell(spy: _Spy, how: str) -> None:
    """A background child and a double-forked daemon (new session, parent
    gone, SIGTERM/SIGHUP ignored) are killed when the cell's command exits, when
    the timeout strikes (recorded as a ``cell.limit`` of layer timeout) and when
    the caller stops the run; afterwards no process of the cell exists (pidfds
    taken while they ran) and its cgroup directories are gone."""
    script = _daemon_script(spy.marker)

    def on_ready(_seen: bytes) -> None:
        spy.look()
        if how == "stop":
            raise _Stop()

    gate = _Gate(b"ready", on_ready, hold=how == "timeout")
    result: CellResult | None = None
    try:
        with Cell(default_policy("escapes"), environ={}) as cell:
            if how == "stop":
                with pytest.raises(_Stop):
                    cell.run([PYTHON, "-I", "-c", script], stdin=gate.read_fd, on_output=gate, timeout=BOUND)
            else:
                result = cell.run(
                    [PYTHON, "-I", "-c", script],
                    stdin=gate.read_fd,
                    on_output=gate,
                    timeout=2.0 if how == "timeout" else BOUND,
                )
    finally:
        gate.close()
    spy.assert_all_gone()
    assert not [d for d in cgroup_dirs(spy.cgroup) if os.path.exists(d)]
    if how == "timeout":
        assert result is not None and result.timed_out and "timeout" in result.limits_hit
        assert any(e.kind == "cell.limit" and e.layer == "timeout" for e in result.events)
    elif how == "cell-ends":
        assert result is not None and result.exit_code == 0 and not result.timed_out


LAUNCHER = r"""
import os, sys
from stockade.cell import Cell
from stockade.policy import default_policy

def out(stream, chunk):
    os.write(1, chunk)

with Cell(default_policy("escapes"), workspace=sys.argv[1], environ={}, audit=None) as cell:
    cell.run(["/usr/bin/python3", "-I", "-c", sys.argv[2]], on_output=out, stdin=0)
"""


def test_background_processes_die_when_the_launcher_is_killed(spy: _Spy, tmp_path: Path) -> None:
    """The process that runs the cell (a daemon, say) is SIGKILLed while the
    cell has a background child and a double-forked daemon: the death signals
    (C1 follows the launcher, the cell's pid 1 follows C1, the pid namespace
    follows its pid 1) take every process with it. The launcher could not
    remove the cell's cgroups; the sweep of stale cells does, and finds them
    empty."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(ws), _daemon_script(spy.marker)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as launcher:
        assert launcher.stdout is not None and launcher.stdin is not None
        try:
            ready, _, _ = select.select([launcher.stdout], [], [], BOUND)
            assert ready, "the launcher's cell never got ready"
            line = launcher.stdout.readline()
            assert line == b"ready\n", line
            # C1, the launcher's child outside the cell's pid namespace, is in
            # the cell's cgroup too: the sweep finds the cgroup empty only once
            # it is gone.
            spy.look(also=tuple(children_of(launcher.pid)))
        finally:
            launcher.kill()
            launcher.wait(timeout=BOUND)
            launcher.stdin.close()
            launcher.stdout.close()
    spy.assert_all_gone()
    swept = sweep_stale()
    assert spy.cgroup in swept
    assert not [d for d in cgroup_dirs(spy.cgroup) if os.path.exists(d)]


# --------------------------------------------------------------------- environment


def _hostile_environ(secret: str) -> dict[str, str]:
    return {
        "HOME": "/root",
        "TERM": "xterm-escape",
        "PATH": "/opt/evil/bin",
        "LD_PRELOAD": "/opt/evil/hook.so",
        "PYTHONSTARTUP": "/opt/evil/startup.py",
        "AWS_SECRET_ACCESS_KEY": secret,
        "GITHUB_TOKEN": secret,
        "OPENAI_API_KEY": secret,
        "SSH_AUTH_SOCK": "/run/user/0/ssh-agent.sock",
        "STOCKADE_FAKE_SECRET": secret,
    }


_ENV_PROBE = [
    Attempt("environ", "return dict(os.environ)"),
    Attempt("proc", "return open('/proc/self/environ', 'rb').read().decode(errors='replace')"),
    Attempt(
        "exec",
        "import subprocess\nreturn subprocess.run(['/usr/bin/env'], capture_output=True, text=True).stdout",
    ),
]


def test_environment_of_the_caller_does_not_reach_the_cell() -> None:
    """The caller's environment holds secrets and hijackers (LD_PRELOAD, PATH,
    PYTHONSTARTUP, SSH_AUTH_SOCK). Only what the default policy names crosses:
    TERM passes through (the control), PATH and HOME are the policy's, and no
    secret shows in the environment, /proc/self/environ, an exec'd program's
    environment, the output or the record. Not a refusal, so not recorded:
    the evidence is the environment itself."""
    secret = "sk-" + secrets.token_hex(12)
    with Cell(default_policy("escapes"), environ=_hostile_environ(secret)) as cell:
        probe = run_probe(cell, _ENV_PROBE)
    env = assert_works(probe["environ"])
    assert not leaked(probe, secret)
    assert env["TERM"] == "xterm-escape"
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["HOME"] == cell.workspace
    # LC_CTYPE is Python's own doing (PEP 538 locale coercion), not the caller's.
    allowed = {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "TMPDIR",
        "STOCKADE_CELL",
        "PYTHONDONTWRITEBYTECODE",
        "TERM",
        "LANG",
        "LC_ALL",
        "TZ",
        "LC_CTYPE",
    }
    assert set(env) <= allowed
    for name in ("LD_PRELOAD", "PYTHONSTARTUP", "SSH_AUTH_SOCK", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN"):
        assert name not in env and name not in assert_works(probe["proc"]) + assert_works(probe["exec"])


def test_a_variable_the_policy_names_does_reach_the_cell() -> None:
    """The neighbour of the test above: a variable named in ``env.pass``
    crosses, taken from the environment the caller gave (not the test's own)."""
    policy = dataclasses.replace(
        default_policy("escapes"),
        env=EnvPolicy(passthrough=("PROJECT_MODE",), set=(("PATH", "/usr/bin:/bin"),)),
    )
    with Cell(policy, environ={"PROJECT_MODE": "ci", "OTHER": "x"}) as cell:
        probe = run_probe(cell, _ENV_PROBE[:1])
    env = assert_works(probe["environ"])
    assert env["PROJECT_MODE"] == "ci" and "OTHER" not in env


def test_the_llm_key_never_reaches_the_cell_even_when_named() -> None:
    """The LLM API key (``llm.api_key_env``) belongs to the broker, which calls
    the model itself: "secrets never do" reach the cell, even when a policy
    also lists the variable in ``env.pass``. Refusing such a policy (a
    PolicyError) is as good as dropping the variable.

    ESCAPE (found by this test): neither the loader nor the planner refuses
    it, and the key is in the agent's environment."""
    secret = "sk-" + secrets.token_hex(12)
    policy = dataclasses.replace(
        default_policy("escapes"),
        env=EnvPolicy(passthrough=("OPENAI_API_KEY",), set=(("PATH", "/usr/bin:/bin"),)),
        llm=LlmPolicy(provider="openai", api_key_env="OPENAI_API_KEY"),
    )
    try:
        with Cell(policy, environ={"OPENAI_API_KEY": secret}) as cell:
            probe = run_probe(cell, _ENV_PROBE)
    except PolicyError:
        return  # refused up front: fine
    assert not leaked(probe, secret), (
        f"ESCAPE: the LLM key named by llm.api_key_env is in the cell: {assert_works(probe['environ'])}"
    )


# --------------------------------------------------------------------- host root's per-user counters

INOTIFY_HOG = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
held = 0
while libc.inotify_init1(0) >= 0:  # each kept open: an instance charged until the cell ends
    held += 1
print(f"full {held} {ctypes.get_errno()}", flush=True)
sys.stdin.read(1)
"""

FANOTIFY_HOG = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
held = 0
# fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_FID, O_RDONLY): unprivileged since Linux 5.13
while libc.syscall(300, 0x200, os.O_RDONLY) >= 0:
    held += 1
print(f"full {held} {ctypes.get_errno()}", flush=True)
sys.stdin.read(1)
"""

SIGNAL_HOG = r"""
import os, signal, sys, threading
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
me = threading.get_ident()
queued = 0
try:
    while True:  # each blocked real-time signal is queued, and charged, until taken
        signal.pthread_kill(me, signal.SIGRTMIN)
        queued += 1
except OSError as exc:
    err = exc.errno
print(f"full {queued} {err}", flush=True)
sys.stdin.read(1)
"""


def _host_root_can_queue_a_signal() -> bool:
    """Queue one real-time signal to this thread (blocked, then taken back):
    what fails with EAGAIN once host root's queued signals are used up."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
    try:
        try:
            signal.pthread_kill(threading.get_ident(), signal.SIGRTMIN)
        except OSError as exc:
            assert exc.errno == EAGAIN, exc
            return False
        assert signal.sigtimedwait({signal.SIGRTMIN}, 0) is not None
        return True
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _host_root_can_inotify() -> bool:
    fd = _libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        assert ctypes.get_errno() == errno.EMFILE
        return False
    os.close(fd)
    return True


def _host_root_can_fanotify() -> bool:
    fd = _libc.syscall(_SYS_FANOTIFY_INIT, 0x200, os.O_RDONLY | os.O_CLOEXEC)
    if fd < 0:
        assert ctypes.get_errno() == errno.EMFILE
        return False
    os.close(fd)
    return True


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_FANOTIFY_INIT = 300
"""x86-64 (arch/x86/entry/syscalls/syscall_64.tbl)."""


@pytest.mark.parametrize(
    ("hog", "check", "err"),
    [
        pytest.param(INOTIFY_HOG, _host_root_can_inotify, errno.EMFILE, id="inotify-instances"),
        pytest.param(FANOTIFY_HOG, _host_root_can_fanotify, errno.EMFILE, id="fanotify-groups"),
        pytest.param(SIGNAL_HOG, _host_root_can_queue_a_signal, EAGAIN, id="queued-signals"),
    ],
)
def test_a_cell_cannot_use_up_host_roots_kernel_counters(
    hog: str, check: Callable[[], bool], err: int
) -> None:
    """A cell takes inotify instances or fanotify groups (128 per user here)
    or queues real-time signals (RLIMIT_SIGPENDING, ~96,000) until the kernel
    refuses; while it holds them all, host root still gets one. The kernel charges these to
    the uid that created the cell's user namespace (kernel/ucount.c), which
    is a host uid of the cell's own (cell/_owners.py), not root.

    No layer records this refusal (a per-user count, not a policy decision):
    the evidence is the cell's own refusal at its own limit, with the errno
    the kernel gives, and root's allocation succeeding meanwhile. The control
    is the cell's own first allocations (``held`` > 0).

    ESCAPE (found by this test, fixed): with the namespace created by host
    root, 128 instances in one cell made host root's ``inotify_init`` fail,
    128 groups its ``fanotify_init``, and a cell's queued signals its
    ``rt_sigqueueinfo``."""
    seen: list[bool] = []
    gate = _Gate(b"full", lambda _seen: seen.append(check()))
    try:
        with Cell(default_policy("escapes"), environ={}) as cell:
            result = cell.run(
                [PYTHON, "-I", "-c", hog], stdin=gate.read_fd, on_output=gate, timeout=BOUND * 3
            )
    finally:
        gate.close()
    assert gate.fired, f"the cell never filled its counter: {result.stdout!r} {result.stderr!r}"
    _, held, cell_err = gate.seen.decode().split()[:3]
    assert int(held) > 0 and int(cell_err) == err, gate.seen
    assert seen == [True], f"ESCAPE: host root's counter was used up by the cell ({held} held by it)"
    assert result.exit_code == 0, result.stderr
