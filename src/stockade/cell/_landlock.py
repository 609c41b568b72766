"""Landlock for the cell: which paths, TCP ports and scopes the agent may use.

Split in two so that the forked child does only syscalls (see docs/KERNEL.md):

- :func:`prepare` runs in the parent. It turns :class:`LandlockRules` (paths as
  seen *inside* the cell, after ``pivot_root``) into a :class:`PreparedLandlock`:
  the ruleset attribute bytes, each path's access masks for a directory and for a
  file, the packed port rules and the ``landlock_restrict_self`` flags. It raises
  :class:`~stockade.errors.HostError` when the rules need a Landlock feature this
  kernel lacks: a cell never runs with less than its rules ask for.
- :func:`apply` runs in the child: create the ruleset, open each path
  ``O_PATH``, add the rules, restrict the thread.

The ruleset *handles* every access right the kernel's ABI knows, so whatever no
rule grants is denied: files, directories, devices' ioctls, TCP bind/connect.
Scopes (signals, abstract unix sockets) are opt-in flags of the rules.

:func:`exec_closure` expands a policy's ``exec.allow`` list into what the kernel
must be allowed to execute for those programs to start: their real paths, the
ELF interpreter (``PT_INTERP``) of each, and the interpreters of ``#!`` scripts.
"""

from __future__ import annotations

import os
import stat
import struct
from errno import ENOENT, ENOTDIR

from stockade._slots import Frozen
from stockade.cell._syscall import (
    O_CLOEXEC,
    O_PATH,
    SYS_LANDLOCK_ADD_RULE,
    SYS_LANDLOCK_CREATE_RULESET,
    SYS_LANDLOCK_RESTRICT_SELF,
    set_no_new_privs,
    syscall,
)
from stockade.errors import HostError

# --- <linux/landlock.h> -------------------------------------------------------
CREATE_RULESET_VERSION = 1 << 0
"""landlock_create_ruleset(NULL, 0, this) returns the ABI version."""

RULE_PATH_BENEATH = 1
"""struct landlock_path_beneath_attr { __u64 allowed_access; __s32 parent_fd; } (packed)."""
RULE_NET_PORT = 2
"""struct landlock_net_port_attr { __u64 allowed_access; __u64 port; } (ABI 4)."""

# Filesystem rights; the ABI that introduced each is in FS_RIGHTS_BY_ABI.
ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13
"""ABI 2 (Linux 5.19): link or rename across directories. Denied whether or not
it is handled; handling it lets a rule grant it."""
ACCESS_FS_TRUNCATE = 1 << 14
"""ABI 3 (Linux 6.2): truncate(2), ftruncate(2), open(O_TRUNC)."""
ACCESS_FS_IOCTL_DEV = 1 << 15
"""ABI 5 (Linux 6.10): ioctl(2) on character and block devices opened in the domain."""

ACCESS_NET_BIND_TCP = 1 << 0
"""ABI 4 (Linux 6.7)."""
ACCESS_NET_CONNECT_TCP = 1 << 1

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
"""ABI 6 (Linux 6.12): no connect/sendto to an abstract unix socket bound outside the domain."""
SCOPE_SIGNAL = 1 << 1
"""ABI 6 (Linux 6.12): no signal to a process outside the domain."""

RESTRICT_SELF_LOG_SAME_EXEC_OFF = 1 << 0
"""ABI 7 (Linux 6.15): do not log denials of the restricting program itself (before execve)."""
RESTRICT_SELF_LOG_NEW_EXEC_ON = 1 << 1
"""ABI 7: log denials of the programs executed after landlock_restrict_self. Off by
default: without it the agent's denials would never reach the audit log."""
RESTRICT_SELF_LOG_SUBDOMAINS_OFF = 1 << 2
"""ABI 7: do not log denials of nested domains created later."""

_FS_ABI1 = (1 << 13) - 1
FS_RIGHTS_BY_ABI: dict[int, int] = {
    1: _FS_ABI1,
    2: _FS_ABI1 | ACCESS_FS_REFER,
    3: _FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE,
    4: _FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE,
    5: _FS_ABI1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV,
}
"""Every filesystem right ABI *n* knows (ABI 5 and later add none)."""

ACCESS_FILE = (
    ACCESS_FS_EXECUTE | ACCESS_FS_WRITE_FILE | ACCESS_FS_READ_FILE | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV
)
"""The rights that make sense on a non-directory; any other on a rule whose
parent_fd is not a directory makes landlock_add_rule fail with EINVAL."""

RIGHTS_READ = ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR
RIGHTS_READ_EXEC = RIGHTS_READ | ACCESS_FS_EXECUTE
# Device nodes are never granted: a cell has no CAP_MKNOD anyway, but a refusal
# by Landlock is recorded, where the capability check is not.
_NO_DEVICES = ~(ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK)
RIGHTS_WRITE = FS_RIGHTS_BY_ABI[5] & ~ACCESS_FS_EXECUTE & _NO_DEVICES
RIGHTS_WRITE_EXEC = FS_RIGHTS_BY_ABI[5] & _NO_DEVICES
RIGHTS_EXEC_FILE = ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE

FEATURES: dict[str, tuple[int, str]] = {
    "landlock": (1, "5.13"),
    "landlock.refer": (2, "5.19"),
    "landlock.truncate": (3, "6.2"),
    "landlock.net": (4, "6.7"),
    "landlock.ioctl_dev": (5, "6.10"),
    "landlock.scope": (6, "6.12"),
    "landlock.audit": (7, "6.15"),
}
"""Feature name (as in ``HostError.feature``) to (Landlock ABI, first Linux release)."""


class LandlockRules(Frozen):
    """What the agent may reach, in paths as seen inside the cell.

    Rights are inherited down a directory tree and add up: a file that is under a
    ``read`` directory and listed in ``exec_files`` may be read and executed.
    Whatever no entry grants is denied. Paths that do not exist when the cell
    starts are skipped (nothing can reach them); a path that is a file gets only
    the file rights of its entry.
    """

    _fields = (
        "read",
        "read_exec",
        "write",
        "write_exec",
        "exec_files",
        "connect_tcp",
        "bind_tcp",
        "scope_signals",
        "scope_abstract_unix",
        "log_denials",
    )
    __slots__ = _fields
    read: tuple[str, ...]
    """Read files and list directories; no execution."""
    read_exec: tuple[str, ...]
    """Read and execute."""
    write: tuple[str, ...]
    """Read, write, truncate, create, remove, rename, link, make nodes and use
    device ioctls; no execution."""
    write_exec: tuple[str, ...]
    """Everything ``write`` grants, and execution."""
    exec_files: tuple[str, ...]
    """Single executables granted execute and read: a policy's ``exec.allow``
    passed through :func:`exec_closure`."""
    connect_tcp: tuple[int, ...]
    """TCP ports the agent may connect to (any address; the cell's only
    interface is loopback). Every other TCP connect fails with EACCES."""
    bind_tcp: tuple[int, ...]
    """TCP ports the agent may bind (0 = let the kernel pick). Every other bind
    fails with EACCES."""
    scope_signals: bool
    """Refuse signals to processes outside the cell's Landlock domain (ABI 6)."""
    scope_abstract_unix: bool
    """Refuse connecting to abstract unix sockets bound outside the domain (ABI 6)."""
    log_denials: bool
    """Send the denials of the agent (the programs run after execve) to the
    kernel audit log (ABI 7). False runs without kernel records of Landlock
    denials, on hosts older than Linux 6.15."""

    def __init__(
        self,
        read: tuple[str, ...] = (),
        read_exec: tuple[str, ...] = (),
        write: tuple[str, ...] = (),
        write_exec: tuple[str, ...] = (),
        exec_files: tuple[str, ...] = (),
        connect_tcp: tuple[int, ...] = (),
        bind_tcp: tuple[int, ...] = (),
        scope_signals: bool = True,
        scope_abstract_unix: bool = True,
        log_denials: bool = True,
    ) -> None:
        object.__setattr__(self, "read", read)
        object.__setattr__(self, "read_exec", read_exec)
        object.__setattr__(self, "write", write)
        object.__setattr__(self, "write_exec", write_exec)
        object.__setattr__(self, "exec_files", exec_files)
        object.__setattr__(self, "connect_tcp", connect_tcp)
        object.__setattr__(self, "bind_tcp", bind_tcp)
        object.__setattr__(self, "scope_signals", scope_signals)
        object.__setattr__(self, "scope_abstract_unix", scope_abstract_unix)
        object.__setattr__(self, "log_denials", log_denials)


class PreparedLandlock(Frozen):
    """:class:`LandlockRules` computed for one ABI; :func:`apply` only does syscalls."""

    _fields = ("abi", "ruleset_attr", "paths", "ports", "restrict_flags", "rules", "held")
    __slots__ = _fields
    abi: int
    ruleset_attr: bytes
    """struct landlock_ruleset_attr, as long as this ABI needs (8, 16 or 24 bytes)."""
    paths: tuple[tuple[bytes, int, int], ...]
    """(path, rights if it is a directory, rights if it is not), one per path."""
    ports: tuple[bytes, ...]
    """Packed struct landlock_net_port_attr, one per port."""
    restrict_flags: int
    rules: tuple[bytes, ...]
    """Packed struct landlock_path_beneath_attr for paths the parent already
    opened (``O_PATH`` descriptors it keeps): the child adds them without a
    lookup. Rules bind inodes, so a descriptor opened on the host names the
    same file as the bind mount that shows it in the cell."""
    held: object
    """What keeps the descriptors named in ``rules`` open for as long as this
    prepared ruleset lives (``_layers.HostDescriptors``)."""

    def __init__(
        self,
        abi: int,
        ruleset_attr: bytes,
        paths: tuple[tuple[bytes, int, int], ...],
        ports: tuple[bytes, ...],
        restrict_flags: int,
        rules: tuple[bytes, ...] = (),
        held: object = None,
    ) -> None:
        object.__setattr__(self, "abi", abi)
        object.__setattr__(self, "ruleset_attr", ruleset_attr)
        object.__setattr__(self, "paths", paths)
        object.__setattr__(self, "ports", ports)
        object.__setattr__(self, "restrict_flags", restrict_flags)
        object.__setattr__(self, "rules", rules)
        object.__setattr__(self, "held", held)


_abi: int | None = None


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel; 0 when Landlock is absent
    (ENOSYS) or disabled at boot (EOPNOTSUPP). Asked once per process."""
    global _abi
    if _abi is None:
        try:
            _abi = syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
        except OSError:
            _abi = 0
    return _abi


def _need(feature: str, abi: int, what: str, escape: str = "") -> None:
    want, linux = FEATURES[feature]
    if abi < want:
        have = f"this host has ABI {abi}" if abi else "this host has no Landlock"
        raise HostError(
            f"{what} needs Landlock ABI {want} and {have}; run on Linux ≥ {linux}"
            f" with landlock in the lsm= boot parameter{escape}",
            feature=feature,
        )


def prepare(rules: LandlockRules, abi: int) -> PreparedLandlock:
    """Compute in the parent everything :func:`apply` needs for kernel ABI ``abi``.

    Raises:
        HostError: the rules need a feature that ABI ``abi`` lacks
            (``feature`` is one of :data:`FEATURES`).
        ValueError: a path is not absolute or a port is out of range.
    """
    _need("landlock", abi, "confining the cell's files")
    if rules.connect_tcp or rules.bind_tcp:
        _need("landlock.net", abi, "a TCP port rule")
    if rules.scope_signals or rules.scope_abstract_unix:
        _need("landlock.scope", abi, "scoping signals and abstract unix sockets")
    if rules.log_denials:
        _need(
            "landlock.audit",
            abi,
            "logging Landlock denials to the audit log",
            ", or run without these records (log_denials=False)",
        )

    handled_fs = FS_RIGHTS_BY_ABI[min(abi, 5)]
    handled_net = ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP if abi >= 4 else 0
    scoped = 0
    if rules.scope_signals:
        scoped |= SCOPE_SIGNAL
    if rules.scope_abstract_unix:
        scoped |= SCOPE_ABSTRACT_UNIX_SOCKET
    if abi >= 6:
        attr = struct.pack("=QQQ", handled_fs, handled_net, scoped)
    elif abi >= 4:
        attr = struct.pack("=QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("=Q", handled_fs)

    rights: dict[str, int] = {}
    for paths, mask in (
        (rules.read, RIGHTS_READ),
        (rules.read_exec, RIGHTS_READ_EXEC),
        (rules.write, RIGHTS_WRITE),
        (rules.write_exec, RIGHTS_WRITE_EXEC),
        (rules.exec_files, RIGHTS_EXEC_FILE),
    ):
        for path in paths:
            if not path.startswith("/"):
                raise ValueError(f"Landlock path {path!r} is not absolute")
            rights[path] = rights.get(path, 0) | (mask & handled_fs)
    prepared_paths = tuple((os.fsencode(path), mask, mask & ACCESS_FILE) for path, mask in rights.items())

    port_access: dict[int, int] = {}
    for ports, access in (
        (rules.connect_tcp, ACCESS_NET_CONNECT_TCP),
        (rules.bind_tcp, ACCESS_NET_BIND_TCP),
    ):
        for port in ports:
            if not 0 <= port <= 65535:
                raise ValueError(f"TCP port {port} is out of range 0-65535")
            port_access[port] = port_access.get(port, 0) | access
    prepared_ports = tuple(struct.pack("=QQ", access, port) for port, access in sorted(port_access.items()))

    flags = RESTRICT_SELF_LOG_NEW_EXEC_ON if rules.log_denials else 0
    return PreparedLandlock(abi, attr, prepared_paths, prepared_ports, flags)


def apply(prepared: PreparedLandlock) -> None:
    """Restrict the calling thread (and what it executes) to ``prepared``.

    Runs in the launcher's child after ``pivot_root``; sets no_new_privs if the
    launcher has not. Paths that do not exist are skipped.

    Raises:
        OSError: a Landlock syscall failed, or a path could not be opened for a
            reason other than not existing; ``errno`` says why.
    """
    set_no_new_privs()
    ruleset = syscall(SYS_LANDLOCK_CREATE_RULESET, prepared.ruleset_attr, len(prepared.ruleset_attr), 0)
    try:
        for rule in prepared.rules:
            syscall(SYS_LANDLOCK_ADD_RULE, ruleset, RULE_PATH_BENEATH, rule, 0)
        for path, dir_rights, file_rights in prepared.paths:
            try:
                fd = os.open(path, O_PATH | O_CLOEXEC)
            except OSError as exc:
                if exc.errno in (ENOENT, ENOTDIR):
                    continue
                raise
            try:
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                access = dir_rights if is_dir else file_rights
                if access:
                    rule = struct.pack("=Qi", access, fd)
                    syscall(SYS_LANDLOCK_ADD_RULE, ruleset, RULE_PATH_BENEATH, rule, 0)
            finally:
                os.close(fd)
        for port_rule in prepared.ports:
            syscall(SYS_LANDLOCK_ADD_RULE, ruleset, RULE_NET_PORT, port_rule, 0)
        syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, prepared.restrict_flags)
    finally:
        os.close(ruleset)


# --- exec closure ---------------------------------------------------------------

_MAX_SYMLINKS = 40  # MAXSYMLINKS in the kernel's fs/namei.c
_BINPRM_BUF_SIZE = 256  # include/linux/binfmts.h: how much of a #! line the kernel reads
_PT_INTERP = 3
DEFAULT_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _host(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/")) if root != "/" else path


def resolve(path: str, root: str = "/") -> str:
    """``path`` with every symlink resolved as it would be inside ``root``.

    Absolute link targets restart at ``root``, ``..`` stops at it, so nothing
    outside ``root`` is ever named. Components that do not exist are kept as
    they are.

    Raises:
        OSError: ELOOP, more than 40 symlinks.
    """
    todo = [part for part in reversed(path.split("/")) if part]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop()
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        try:
            target = os.readlink(_host(root, "/" + "/".join([*done, part])))
        except OSError:
            done.append(part)
            continue
        links += 1
        if links > _MAX_SYMLINKS:
            raise OSError(40, os.strerror(40), path)  # ELOOP
        if target.startswith("/"):
            done = []
        todo.extend(part for part in reversed(target.split("/")) if part)
    return "/" + "/".join(done)


def _elf_interpreter(head: bytes, file: str) -> str | None:
    """The PT_INTERP path of the ELF file ``file`` whose first bytes are ``head``."""
    if len(head) < 52 or head[:4] != b"\x7fELF":
        return None
    order = "<" if head[5] == 1 else ">"
    if head[4] == 2:  # ELFCLASS64
        if len(head) < 64:
            return None
        (phoff,) = struct.unpack_from(order + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 54)
        entry = order + "I4xQ16xQ"  # p_type, p_offset, p_filesz
    else:  # ELFCLASS32
        (phoff,) = struct.unpack_from(order + "I", head, 28)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 42)
        entry = order + "II8xI"
    with open(file, "rb") as f:
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(min(phnum, len(table) // max(phentsize, 1))):
            p_type, offset, size = struct.unpack_from(entry, table, i * phentsize)
            if p_type == _PT_INTERP and 0 < size <= 4096:
                f.seek(offset)
                return f.read(size).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    return None


def _script_interpreters(head: bytes, root: str, search_path: str) -> list[str]:
    """The interpreter of a ``#!`` line and, for ``/usr/bin/env NAME``, NAME's path."""
    if head[:2] != b"#!":
        return []
    line = head[2:_BINPRM_BUF_SIZE].split(b"\n", 1)[0].strip(b" \t")
    fields = line.decode("utf-8", "surrogateescape").split(maxsplit=1)
    if not fields:
        return []
    found = [fields[0]]
    if os.path.basename(fields[0]) == "env" and len(fields) == 2:
        # The kernel passes the rest of the line as one argument; env -S splits it.
        for word in fields[1].split():
            if word.startswith("-") or "=" in word:
                continue
            if "/" in word:
                found.append(word)
            else:
                for directory in search_path.split(":"):
                    candidate = f"{directory.rstrip('/')}/{word}"
                    if os.access(_host(root, resolve(candidate, root)), os.X_OK):
                        found.append(candidate)
                        break
            break
    return found


def exec_closure(
    paths: tuple[str, ...] | list[str],
    *,
    root: str = "/",
    search_path: str = DEFAULT_SEARCH_PATH,
) -> tuple[str, ...]:
    """What the kernel must be allowed to execute for each of ``paths`` to run.

    Each path (as seen inside the cell, whose root is ``root`` here) is resolved
    through its symlinks; an ELF file adds its ``PT_INTERP`` interpreter (e.g.
    ``/lib64/ld-linux-x86-64.so.2``), a ``#!`` script adds its interpreter and,
    for ``#!/usr/bin/env NAME``, NAME as found on ``search_path``; those are
    expanded in turn. Shared libraries need no entry: they are mapped, not
    executed, and ``read`` rights suffice. Files that do not exist or cannot be
    read are kept as given, without expansion. Order is kept, duplicates dropped.
    """
    seen: dict[str, None] = {}
    todo = list(reversed(paths))
    while todo:
        path = resolve(todo.pop(), root)
        if path in seen:
            continue
        seen[path] = None
        file = _host(root, path)
        try:
            with open(file, "rb") as f:
                head = f.read(_BINPRM_BUF_SIZE)
            found = _script_interpreters(head, root, search_path)
            interp = _elf_interpreter(head, file)
        except OSError:
            continue
        if interp:
            found.append(interp)
        todo.extend(reversed(found))
    return tuple(seen)


__all__ = [
    "FEATURES",
    "LandlockRules",
    "PreparedLandlock",
    "apply",
    "exec_closure",
    "landlock_abi",
    "prepare",
    "resolve",
]
