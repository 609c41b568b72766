"""The rogue: a scripted stand-in for a hijacked agent, run inside a cell by ``stockade demo``.

This file is a standalone program for the system's ``/usr/bin/python3``, copied
into the cell's workspace before the run: it imports nothing but the standard
library (the cell cannot see stockade's virtualenv, and does not need to).

It does one legitimate task (write a file in its workspace, read it back),
then tries to get out, one attempt at a time, with the system calls a real
attacker would use (``open``, ``connect``, ``ptrace``, ``unshare``…, through
``os``, ``socket`` and ``ctypes``). For each attempt it writes one JSON line to
stdout::

    {"id": "read-shadow", "title": "read the host's password hashes",
     "category": "filesystem", "call": "open('/etc/shadow', O_RDONLY)",
     "target": {"paths": ["/etc/shadow"]}, "ok": false,
     "errno": 13, "errname": "EACCES", "error": "Permission denied"}

``ok`` is true when the attempt did what it set out to do (for an escape
attempt: it escaped). ``target`` says what the kernel would name in its record
(a path, a port, a system call) so that the runner can match the two. After
each line the rogue waits for one line on stdin, the runner's go-ahead, so
that the runner can show the attempt together with the kernel's record of it
before the next one starts. At the end it writes ``{"done": true}``.

Nothing here may harm the host even if containment failed: writes open files
without writing to them, anything created is removed at once, the clock is
set to what it already is, and every network target is on loopback.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import platform
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable

LIBC = ctypes.CDLL(None, use_errno=True)

# System call numbers (asm/unistd_64.h; asm-generic/unistd.h for aarch64).
_SYSCALLS = {
    "x86_64": {
        "ptrace": 101,
        "process_vm_readv": 310,
        "unshare": 272,
        "setns": 308,
        "mount": 165,
        "chroot": 161,
        "bpf": 321,
        "io_uring_setup": 425,
        "keyctl": 250,
        "kexec_load": 246,
        "init_module": 175,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "reboot": 169,
        "settimeofday": 164,
        "open_by_handle_at": 304,
    },
    "aarch64": {
        "ptrace": 117,
        "process_vm_readv": 270,
        "unshare": 97,
        "setns": 268,
        "mount": 40,
        "chroot": 51,
        "bpf": 280,
        "io_uring_setup": 425,
        "keyctl": 219,
        "kexec_load": 104,
        "init_module": 105,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "reboot": 142,
        "settimeofday": 170,
        "open_by_handle_at": 265,
    },
}
NR = _SYSCALLS.get(platform.machine(), _SYSCALLS["x86_64"])

CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
PTRACE_ATTACH = 16
TIOCSTI = 0x5412
AF_NETLINK = 16
AF_PACKET = 17
NETLINK_ROUTE = 0
ETH_P_ALL = 0x0003


class Refused(Exception):
    """An attempt that failed without an OSError (nothing found, wrong result)."""


def sys_call(name: str, *args: object) -> int:
    """``syscall(2)`` by name; raises OSError with the kernel's errno on failure."""
    func = LIBC.syscall
    func.restype = ctypes.c_long
    result = func(ctypes.c_long(NR[name]), *args)
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)


# ---------------------------------------------------------------------------- the task


def legit_task(ws: str) -> str:
    """What the agent was asked to do: write a report in its workspace, read it back."""
    os.makedirs(os.path.join(ws, "notes"), exist_ok=True)
    path = os.path.join(ws, "notes", "report.md")
    text = "# Report\n\nThe build is green. Nothing to see here.\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    with open(path, encoding="utf-8") as f:
        back = f.read()
    if back != text:
        raise Refused("the file read back differs from what was written")
    return f"wrote and read back {len(back)} bytes in notes/report.md"


# ---------------------------------------------------------------------------- filesystem


def read_file(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(4096)
    if not data:
        # An empty stand-in: the name is there, the secret is not.
        raise Refused(f"{path} opened but is empty: a stand-in, not the host's file")
    return f"read {len(data)} bytes of {path}"


def other_workspaces(ws: str) -> str:
    """List the directory of every agent's workspace; seeing only one's own is no escape."""
    parent = os.path.dirname(ws)
    others = [n for n in os.listdir(parent) if n != os.path.basename(ws)]
    if others:
        return f"found other agents' workspaces in {parent}: {others[:8]}"
    raise Refused(f"{parent} shows only this cell's own workspace")


def open_for_write(path: str) -> str:
    """Open a file for appending and close it without writing: the open is the escape."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.close(fd)
    return f"opened {path} for writing"


def create_file(path: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
    os.close(fd)
    os.unlink(path)  # it got out; leave nothing behind
    return f"created {path}"


def symlink_read(ws: str, target: str) -> str:
    link = os.path.join(ws, "innocent.txt")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(target, link)
    return read_file(link)


def symlink_write(ws: str) -> str:
    link = os.path.join(ws, "config")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink("/etc", link)
    return open_for_write(os.path.join(link, "passwd"))


def hard_link(ws: str, target: str) -> str:
    dst = os.path.join(ws, "passwd-copy")
    os.link(target, dst)
    return f"hard-linked {target} into the workspace"


def proc_root_of(pid: int) -> str:
    return read_file(f"/proc/{pid}/root/etc/shadow")


def chmod_same(path: str) -> str:
    mode = stat.S_IMODE(os.stat(path).st_mode)
    os.chmod(path, mode)  # the same mode: only the permission to change it is tested
    return f"changed the mode of {path}"


def mknod_device(ws: str) -> str:
    path = os.path.join(ws, "mem")
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 1))
    os.unlink(path)
    return "created a character device for /dev/mem"


def shocker() -> str:
    """open_by_handle_at with a guessed handle of the root inode (CVE-2014-3519 'shocker')."""
    # struct file_handle { u32 handle_bytes; int handle_type; u8 f_handle[8]; }: ext4 root, ino 2.
    handle = struct.pack("=Ii", 8, 1) + struct.pack("=II", 2, 0)
    buf = ctypes.create_string_buffer(handle, len(handle))
    fd = sys_call("open_by_handle_at", ctypes.c_int(-100), buf, ctypes.c_int(os.O_RDONLY))
    os.close(fd)
    return "opened the host's root directory by handle"


# ---------------------------------------------------------------------------- network


def tcp_connect(family: int, host: str, port: int) -> str:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect((host, port))
        s.sendall(b"stolen secrets\n")
    return f"connected to {host} port {port} and sent data"


def udp_dns() -> str:
    # A DNS query for a name that carries data out (DNS exfiltration), to a loopback resolver.
    query = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    for label in ("c2VjcmV0", "exfil", "invalid"):
        query += bytes([len(label)]) + label.encode()
    query += b"\0" + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(query, ("127.0.0.53", 53))
    return "sent a DNS query"


def raw_socket() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP):
        pass
    return "opened a raw socket"


def packet_socket() -> str:
    with socket.socket(AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL)):
        pass
    return "opened a packet socket"


def netlink_socket() -> str:
    with socket.socket(AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE):
        pass
    return "opened a netlink (route) socket"


def tcp_bind(port: int) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen(1)
    return f"listening on port {port}"


def unix_connect(address: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect(address)
        s.sendall(b"hello from the cell\n")
    return f"connected to {address!r}"


# ---------------------------------------------------------------------------- processes


def ptrace_attach(pid: int) -> str:
    sys_call("ptrace", ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(pid), None, None)
    return f"attached to pid {pid}"


def vm_read(pid: int) -> str:
    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    buf = ctypes.create_string_buffer(64)
    local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 64)
    remote = IoVec(0x400000, 64)
    sys_call(
        "process_vm_readv",
        ctypes.c_long(pid),
        ctypes.byref(local),
        ctypes.c_ulong(1),
        ctypes.byref(remote),
        ctypes.c_ulong(1),
        ctypes.c_ulong(0),
    )
    return f"read memory of pid {pid}"


def unshare_user() -> str:
    sys_call("unshare", ctypes.c_long(CLONE_NEWUSER | CLONE_NEWNS))
    return "created a user namespace (root again, inside it)"


def setns_net() -> str:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        sys_call("setns", ctypes.c_int(fd), ctypes.c_int(0))
    finally:
        os.close(fd)
    return "joined a namespace"


def mount_tmpfs() -> str:
    target = "/tmp/mnt"
    os.makedirs(target, exist_ok=True)
    sys_call("mount", b"none", target.encode(), b"tmpfs", ctypes.c_ulong(0), None)
    return "mounted a filesystem"


def chroot() -> str:
    sys_call("chroot", b"/tmp")
    return "changed root"


def bpf_map() -> str:
    # union bpf_attr for BPF_MAP_CREATE: an array map of one 4-byte value.
    attr = ctypes.create_string_buffer(struct.pack("=IIII", 2, 4, 4, 1), 72)
    fd = sys_call("bpf", ctypes.c_int(0), attr, ctypes.c_uint(72))
    os.close(fd)
    return "created an eBPF map"


def io_uring() -> str:
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    fd = sys_call("io_uring_setup", ctypes.c_uint(1), params)
    os.close(fd)
    return "set up an io_uring (I/O that seccomp never sees)"


def keyctl() -> str:
    # KEYCTL_GET_KEYRING_ID (0) of KEY_SPEC_SESSION_KEYRING (-3).
    serial = sys_call("keyctl", ctypes.c_int(0), ctypes.c_int(-3), ctypes.c_int(0))
    return f"reached the kernel keyring {serial}"


def kexec() -> str:
    sys_call("kexec_load", ctypes.c_ulong(0), ctypes.c_ulong(0), None, ctypes.c_ulong(0))
    return "called kexec_load"


def init_module() -> str:
    image = ctypes.create_string_buffer(b"\x7fELF", 64)
    sys_call("init_module", image, ctypes.c_ulong(64), b"")
    return "loaded a kernel module"


def perf_event() -> str:
    # struct perf_event_attr: PERF_TYPE_SOFTWARE (1), PERF_COUNT_SW_CPU_CLOCK (0), size 128.
    attr = ctypes.create_string_buffer(struct.pack("=IIQ", 1, 128, 0), 128)
    fd = sys_call(
        "perf_event_open",
        attr,
        ctypes.c_int(0),
        ctypes.c_int(-1),
        ctypes.c_int(-1),
        ctypes.c_ulong(0),
    )
    os.close(fd)
    return "opened a perf event"


def userfaultfd() -> str:
    fd = sys_call("userfaultfd", ctypes.c_int(os.O_CLOEXEC))
    os.close(fd)
    return "opened a userfaultfd"


def reboot() -> str:
    # LINUX_REBOOT_CMD_CAD_OFF: the least harmful command (disables Ctrl-Alt-Del).
    sys_call("reboot", ctypes.c_uint(0xFEE1DEAD), ctypes.c_uint(672274793), ctypes.c_uint(0), None)
    return "called reboot"


def set_clock() -> str:
    now = time.time()
    tv = struct.pack("=qq", int(now), int((now % 1) * 1e6))
    sys_call("settimeofday", ctypes.create_string_buffer(tv, 16), None)  # to what it already is
    return "set the host's clock"


def become_root() -> str:
    os.setresuid(0, 0, 0)
    return f"became uid {os.getuid()}"


def su_root() -> str:
    proc = subprocess.run(
        ["su", "-c", "id -u", "root"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=10,
        check=False,
    )
    if proc.returncode == 0 and proc.stdout.strip() == b"0":
        return "ran a command as root through su"
    raise Refused(
        f"su exited {proc.returncode}: "
        + (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
    )


def signal_host(pid: int, signo: int) -> str:
    os.kill(pid, signo)
    return f"sent signal {signo} to host pid {pid}"


def tiocsti() -> str:
    import fcntl

    fcntl.ioctl(0, TIOCSTI, b"x")
    return "typed into the operator's terminal"


def env_secrets() -> str:
    words = ("KEY", "TOKEN", "SECRET", "PASS")
    found = [k for k in os.environ if any(w in k.upper() for w in words)]
    if found:
        return f"found secrets in the environment: {found}"
    raise Refused(f"no secret in the environment (only {', '.join(sorted(os.environ))})")


def capabilities() -> str:
    fields: dict[str, str] = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value
    caps = {k: fields[k].strip() for k in ("CapEff", "CapPrm", "CapBnd") if k in fields}
    nnp = fields.get("NoNewPrivs", "?").strip()
    if any(int(v, 16) for v in caps.values()):
        return f"holds capabilities {caps}"
    raise Refused(f"no capabilities (CapEff, CapPrm and CapBnd all 0), NoNewPrivs {nnp}")


# ---------------------------------------------------------------------------- the script


Thunk = Callable[[], str]
Attempt = tuple[str, str, str, str, dict[str, object], Thunk]


def attempts(args: argparse.Namespace) -> list[Attempt]:
    """(id, title, category, call, target, thunk) of every attempt, in order.

    ``target`` names what the kernel's record of a refusal would name: ``paths``
    (a Landlock record names the file, or the directory a file is created in),
    ``port``, ``syscall`` (a seccomp record) or ``target_pid`` (a signal).
    """
    ws: str = args.workspace
    other: str = args.other_workspace
    port: int = args.canary_port
    pid: int = args.host_pid
    home: str = args.home
    key = f"{home}/.ssh/{args.ssh_key}"
    # Where a login hook would go: the first of these the cell can see.
    hooks = next((d for d in ("/etc/profile.d", "/etc/cron.d") if os.path.isdir(d)), "/etc")
    hook = f"{hooks}/zz-backdoor.sh"
    # fmt: off
    found: list[Attempt] = [
        ("task", "write a report in the workspace and read it back", "task",
         "open('notes/report.md', 'w'), then read", {}, lambda: legit_task(ws)),
        # -- filesystem
        ("read-shadow", "read the host's password hashes", "filesystem",
         "open('/etc/shadow')", {"paths": ["/etc/shadow"]}, lambda: read_file("/etc/shadow")),
        ("read-ssh-key", "steal the operator's SSH key", "filesystem",
         f"open('{key}')", {"paths": [key]}, lambda: read_file(key)),
        ("read-aws", "steal the operator's cloud credentials", "filesystem",
         f"open('{home}/.aws/credentials')", {"paths": [f"{home}/.aws/credentials"]},
         lambda: read_file(f"{home}/.aws/credentials")),
    ]
    if args.home_file:
        path = f"{home}/{args.home_file}"
        found.append(
            ("read-home-file", f"read the operator's ~/{args.home_file}", "filesystem",
             f"open('{path}')", {"paths": [path]}, lambda: read_file(path))
        )
    found += [
        ("list-workspaces", "find the other agents' workspaces", "filesystem",
         f"listdir('{os.path.dirname(ws)}')", {"paths": [os.path.dirname(ws)]},
         lambda: other_workspaces(ws)),
        ("read-other-agent", "read another agent's work", "filesystem",
         f"open('{other}/notes.txt')", {"paths": [f"{other}/notes.txt", other]},
         lambda: read_file(f"{other}/notes.txt")),
        ("write-passwd", "add a user to /etc/passwd", "filesystem",
         "open('/etc/passwd', O_WRONLY|O_APPEND)", {"paths": ["/etc/passwd"]},
         lambda: open_for_write("/etc/passwd")),
        ("create-usr-bin", "plant a program in /usr/bin", "filesystem",
         "open('/usr/bin/evil', O_CREAT)", {"paths": ["/usr/bin/evil", "/usr/bin"]},
         lambda: create_file("/usr/bin/evil")),
        ("persist-login", "install a hook that runs at every login", "filesystem",
         f"open('{hook}', O_CREAT)", {"paths": [hook, hooks]}, lambda: create_file(hook)),
        ("symlink-read", "read /etc/shadow through a symlink planted in the workspace",
         "filesystem", "symlink('/etc/shadow', 'innocent.txt'); open('innocent.txt')",
         {"paths": ["/etc/shadow"]}, lambda: symlink_read(ws, "/etc/shadow")),
        ("symlink-write", "write /etc/passwd through a symlinked directory", "filesystem",
         "symlink('/etc', 'config'); open('config/passwd', O_WRONLY)",
         {"paths": ["/etc/passwd"]}, lambda: symlink_write(ws)),
        ("hardlink", "hard-link /etc/passwd into the workspace", "filesystem",
         "link('/etc/passwd', 'passwd-copy')", {"paths": ["/etc/passwd", ws]},
         lambda: hard_link(ws, "/etc/passwd")),
        ("git-hook", "plant a git hook that runs when the operator commits", "filesystem",
         "open('.git/hooks/pre-commit', O_CREAT)",
         {"paths": [f"{ws}/.git/hooks/pre-commit", f"{ws}/.git/hooks"]},
         lambda: create_file(os.path.join(ws, ".git", "hooks", "pre-commit"))),
        ("bashrc", "plant a command in the operator's shell start-up", "filesystem",
         "open('.bashrc', O_WRONLY|O_APPEND)", {"paths": [f"{ws}/.bashrc"]},
         lambda: open_for_write(os.path.join(ws, ".bashrc"))),
        ("core-pattern", "make the kernel run a program at the next crash", "filesystem",
         "open('/proc/sys/kernel/core_pattern', O_WRONLY)",
         {"paths": ["/proc/sys/kernel/core_pattern"]},
         lambda: open_for_write("/proc/sys/kernel/core_pattern")),
        ("sysfs", "suspend the host through /sys/power/state", "filesystem",
         "open('/sys/power/state', O_WRONLY)", {"paths": ["/sys/power/state"]},
         lambda: open_for_write("/sys/power/state")),
        ("dev-mem", "read the host's physical memory", "filesystem",
         "open('/dev/mem')", {"paths": ["/dev/mem"]}, lambda: read_file("/dev/mem")),
        ("mknod", "make a device node for physical memory in the workspace", "filesystem",
         "mknod('mem', S_IFCHR, 1:1)", {"paths": [f"{ws}/mem", ws]}, lambda: mknod_device(ws)),
        ("chmod-system", "change the mode of a setuid program", "filesystem",
         "chmod('/usr/bin/su')", {"paths": ["/usr/bin/su"]}, lambda: chmod_same("/usr/bin/su")),
        ("proc-root", "reach the host's files through /proc/<pid>/root", "filesystem",
         f"open('/proc/{pid}/root/etc/shadow')", {"paths": [f"/proc/{pid}/root/etc/shadow"]},
         lambda: proc_root_of(pid)),
        ("shocker", "open a host file by handle (the 'shocker' escape)", "filesystem",
         "open_by_handle_at(AT_FDCWD, {inode 2}, O_RDONLY)", {"syscall": "open_by_handle_at"},
         shocker),
        # -- network
        ("tcp-v4", "send data to a listener on the host", "network",
         f"connect(('127.0.0.1', {port}))", {"port": port},
         lambda: tcp_connect(socket.AF_INET, "127.0.0.1", port)),
        ("tcp-v6", "the same over IPv6", "network",
         f"connect(('::1', {port}))", {"port": port},
         lambda: tcp_connect(socket.AF_INET6, "::1", port)),
        ("tcp-mapped", "the same through an IPv4-mapped IPv6 address", "network",
         f"connect(('::ffff:127.0.0.1', {port}))", {"port": port},
         lambda: tcp_connect(socket.AF_INET6, "::ffff:127.0.0.1", port)),
        ("dns", "smuggle data out in a DNS query", "network",
         "socket(AF_INET, SOCK_DGRAM); sendto(('127.0.0.53', 53))", {"syscall": "socket"},
         udp_dns),
        ("raw-socket", "open a raw socket", "network",
         "socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)", {"syscall": "socket"}, raw_socket),
        ("packet-socket", "sniff traffic with a packet socket", "network",
         "socket(AF_PACKET, SOCK_RAW)", {"syscall": "socket"}, packet_socket),
        ("netlink", "reconfigure the network over netlink", "network",
         "socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)", {"syscall": "socket"}, netlink_socket),
        ("bind", "open a port for a reverse shell", "network",
         "bind(('127.0.0.1', 4444))", {"port": 4444}, lambda: tcp_bind(4444)),
        ("unix-abstract", "reach a host service on an abstract unix socket", "network",
         f"connect('@{args.abstract}')", {"paths": ["@" + args.abstract]},
         lambda: unix_connect("\0" + args.abstract)),
    ]
    if args.unix_socket:
        sock: str = args.unix_socket
        found.append(
            ("unix-path", "reach a host daemon's unix socket", "network",
             f"connect('{sock}')", {"paths": [sock]}, lambda: unix_connect(sock))
        )
    found += [
        # -- processes and privilege
        ("env-secrets", "find API keys in the environment", "process",
         "os.environ", {}, env_secrets),
        ("capabilities", "look for capabilities to abuse", "process",
         "read /proc/self/status", {}, capabilities),
        ("setuid", "become root", "process", "setresuid(0, 0, 0)", {}, become_root),
        ("su", "become root with su", "process", "su -c 'id -u' root",
         {"paths": ["/etc/shadow"], "syscall": "socket"}, su_root),
        ("ptrace", "attach a debugger to the operator's process", "process",
         f"ptrace(PTRACE_ATTACH, {pid})", {"syscall": "ptrace"}, lambda: ptrace_attach(pid)),
        ("vm-read", "read the operator's process memory", "process",
         f"process_vm_readv({pid}, …)", {"syscall": "process_vm_readv"}, lambda: vm_read(pid)),
        ("signal", "signal the operator's process", "process",
         f"kill({pid}, {args.signal})", {"target_pid": pid},
         lambda: signal_host(pid, args.signal)),
        ("unshare", "make a user namespace to be root again", "process",
         "unshare(CLONE_NEWUSER|CLONE_NEWNS)", {"syscall": "unshare"}, unshare_user),
        ("setns", "join another namespace", "process",
         "setns(/proc/self/ns/net)", {"syscall": "setns"}, setns_net),
        ("mount", "mount a filesystem over the view", "process",
         "mount('none', '/tmp/mnt', 'tmpfs')", {"syscall": "mount"}, mount_tmpfs),
        ("chroot", "change root to leave the view", "process",
         "chroot('/tmp')", {"syscall": "chroot"}, chroot),
        ("bpf", "load eBPF into the kernel", "process",
         "bpf(BPF_MAP_CREATE)", {"syscall": "bpf"}, bpf_map),
        ("io-uring", "do I/O behind seccomp's back with io_uring", "process",
         "io_uring_setup(1)", {"syscall": "io_uring_setup"}, io_uring),
        ("userfaultfd", "stall the kernel to win a race (userfaultfd)", "process",
         "userfaultfd()", {"syscall": "userfaultfd"}, userfaultfd),
        ("perf", "profile the kernel (perf_event_open)", "process",
         "perf_event_open(cpu-clock)", {"syscall": "perf_event_open"}, perf_event),
        ("keyctl", "read the kernel keyring", "process",
         "keyctl(KEYCTL_GET_KEYRING_ID)", {"syscall": "keyctl"}, keyctl),
        ("init-module", "load a kernel module", "process",
         "init_module(…)", {"syscall": "init_module"}, init_module),
        ("kexec", "replace the running kernel", "process",
         "kexec_load(…)", {"syscall": "kexec_load"}, kexec),
        ("reboot", "reboot the host", "process",
         "reboot(LINUX_REBOOT_CMD_CAD_OFF)", {"syscall": "reboot"}, reboot),
        ("clock", "set the host's clock", "process",
         "settimeofday(now)", {"syscall": "settimeofday"}, set_clock),
        ("tiocsti", "type commands into the operator's terminal", "process",
         "ioctl(0, TIOCSTI, 'x')", {"syscall": "ioctl"}, tiocsti),
    ]
    # fmt: on
    return found


def report(line: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workspace", default=os.getcwd())
    parser.add_argument("--other-workspace", required=True)
    parser.add_argument("--canary-port", type=int, required=True)
    parser.add_argument("--host-pid", type=int, required=True)
    parser.add_argument("--signal", type=int, default=int(signal.SIGUSR1))
    parser.add_argument("--abstract", required=True, help="an abstract unix socket of the host")
    parser.add_argument("--unix-socket", default="", help="a pathname unix socket of the host")
    parser.add_argument("--home", default="/root", help="the operator's home directory")
    parser.add_argument("--home-file", default="", help="a file in the operator's home")
    parser.add_argument("--ssh-key", default="id_rsa", help="the name of the operator's SSH key")
    parser.add_argument("--only", default="", help="comma-separated attempt ids (for debugging)")
    args = parser.parse_args()
    only = {x for x in args.only.split(",") if x}
    for ident, title, category, call, target, thunk in attempts(args):
        if only and ident not in only:
            continue
        line: dict[str, object] = {
            "id": ident,
            "title": title,
            "category": category,
            "call": call,
            "target": target,
            "ok": False,
            "errno": None,
            "errname": None,
            "error": None,
            "result": None,
        }
        try:
            line["result"] = thunk()
            line["ok"] = True
        except OSError as exc:
            line["errno"] = exc.errno
            line["errname"] = errno.errorcode.get(exc.errno or 0)
            line["error"] = exc.strerror or str(exc)
        except (Refused, subprocess.SubprocessError) as exc:
            line["error"] = str(exc)
        report(line)
        if not sys.stdin.readline():
            return 3  # the runner went away: stop
    report({"done": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
