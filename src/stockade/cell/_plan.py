"""From a policy to a cell plan: the mounts, Landlock grants and identity of one cell.

Planning happens in the warm parent process, before the fork, so that the
forked child only replays a list of syscalls. It reads the host filesystem
(globs, symlinks, the entries of directories that hold a hidden path, the
git directories of writable places) but changes nothing: protected paths are
covered only where they exist (see ``_protect``).

Paths inside the cell are the host's paths: a bind mount shows a host directory
at the same path, so the workspace, ``/usr`` and every grant keep their names.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Literal

from stockade._slots import Frozen
from stockade.errors import CellError, PolicyError
from stockade.policy._default import SECRETS_DENY, SYSTEM_READ
from stockade.policy._model import Policy

CELL_UID = 1000
"""The uid (and gid) of the agent inside the cell: not root, so nothing in the
cell can act as root even on files the cell itself created."""

NOBODY = 65534
"""The host uid a cell runs as when stockade runs as root and the workspace has
no other owner: a cell never runs as host root."""

MountKind = Literal[
    "bind", "tmpfs", "dir", "symlink", "file", "decoy_file", "decoy_dir", "proc", "dev", "sysfs", "overlay"
]


class MountOp(Frozen):
    """One step of building the cell's filesystem view (replayed in the child).

    ``dst`` is the path inside the cell; ``src`` a host path (for ``bind``), a
    link target (``symlink``) or unused. ``data`` is file content (``file``) or
    the names a ``decoy_dir`` shows. An ``overlay`` (a workbench's ``/``,
    cell/_workbench.py) has the image's root filesystem as ``src``, its
    read-only lower layer; the run's own upper is filled in at launch.
    """

    _fields = ("kind", "dst", "src", "writable", "data", "names", "idmap_owner", "from_view")
    __slots__ = _fields

    kind: MountKind
    dst: str
    src: str
    writable: bool
    """For a bind: whether the mount is read-write. Read grants are read-only
    mounts, except root's system directories, which Landlock makes read-only
    (see ``_read_only_mount``)."""
    data: bytes
    names: tuple[str, ...]
    idmap_owner: int | None
    """For a writable bind whose owner is not the cell's host uid: show it
    through an idmapped mount, on which that owner's files are the cell's own
    and files the cell creates belong to that owner on disk."""
    from_view: bool
    """Bind ``src`` as the cell already sees it (inside an earlier mount, such
    as the idmapped workspace) rather than from the host."""

    def __init__(
        self,
        kind: MountKind,
        dst: str,
        src: str = "",
        writable: bool = False,
        data: bytes = b"",
        names: tuple[str, ...] = (),
        idmap_owner: int | None = None,
        from_view: bool = False,
    ) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "dst", dst)
        object.__setattr__(self, "src", src)
        object.__setattr__(self, "writable", writable)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "idmap_owner", idmap_owner)
        object.__setattr__(self, "from_view", from_view)


class Grants(Frozen):
    """What Landlock allows, as paths seen inside the cell."""

    _fields = ("read", "read_exec", "write", "write_exec", "exec_files", "list_dirs", "devices")
    __slots__ = _fields

    read: tuple[str, ...]
    read_exec: tuple[str, ...]
    write: tuple[str, ...]
    write_exec: tuple[str, ...]
    exec_files: tuple[str, ...]
    list_dirs: tuple[str, ...]
    """Directories that may be listed but whose files are not granted (the
    parents of hidden paths, and ``/``)."""
    devices: tuple[str, ...]
    """Device files that may be read, written and ioctl'd (/dev/null, /dev/tty…)."""

    def __init__(
        self,
        read: tuple[str, ...] = (),
        read_exec: tuple[str, ...] = (),
        write: tuple[str, ...] = (),
        write_exec: tuple[str, ...] = (),
        exec_files: tuple[str, ...] = (),
        list_dirs: tuple[str, ...] = (),
        devices: tuple[str, ...] = (),
    ) -> None:
        object.__setattr__(self, "read", read)
        object.__setattr__(self, "read_exec", read_exec)
        object.__setattr__(self, "write", write)
        object.__setattr__(self, "write_exec", write_exec)
        object.__setattr__(self, "exec_files", exec_files)
        object.__setattr__(self, "list_dirs", list_dirs)
        object.__setattr__(self, "devices", devices)


class CellPlan(Frozen):
    """Everything the launcher needs, computed before the fork."""

    _fields = (
        "mounts",
        "grants",
        "workspace",
        "workdir",
        "host_uid",
        "host_gid",
        "env",
        "writable_roots",
        "protected",
        "hidden",
        "uid",
        "gid",
        "id_range",
        "keep_caps",
        "image_rootfs",
        "image_digest",
        "setid",
    )
    __slots__ = _fields

    mounts: tuple[MountOp, ...]
    grants: Grants
    workspace: str
    workdir: str
    host_uid: int
    host_gid: int
    env: tuple[tuple[str, str], ...]
    writable_roots: tuple[str, ...]
    """The writable places as mounted (the workspace and the outermost write
    grants that are directories): what the persistence report walks."""
    protected: tuple[str, ...]
    """Every protected path inside them, existing or not: the persistence
    report watches each, whatever its name."""
    hidden: tuple[str, ...]
    """The paths shown as decoys (for docs and the demo)."""
    uid: int
    """The command's uid inside the cell (and ``gid`` its gid): the agent's
    1000, or a workbench's user (0 for ``user: root``)."""
    gid: int
    id_range: bool
    """Whether the cell maps a whole range of ids (0-65534 inside, to the
    leased slot's range on the host: ``_owners``, cell/_workbench.py) rather
    than its one uid. ``host_uid``/``host_gid`` are then filled in at launch."""
    keep_caps: int
    """Capabilities the command keeps, inside its user namespace only (a
    bit mask; ``user: root`` keeps ``_workbench.ROOT_CAPS``), else none."""
    image_rootfs: str
    """The host directory of a workbench's image (its ``/``), or "" for none."""
    image_digest: str
    """That image's digest (``sha256:…``), for the record."""
    setid: bool
    """Whether seccomp lets the cell set a set-uid or set-gid bit: only a
    workbench whose every writable host place no other host user can reach
    (``_workbench.private_places``); everywhere else such a file, owned by
    its host owner through the idmapped bind, is refused."""

    def __init__(
        self,
        mounts: tuple[MountOp, ...],
        grants: Grants,
        workspace: str,
        workdir: str,
        host_uid: int,
        host_gid: int,
        env: tuple[tuple[str, str], ...],
        writable_roots: tuple[str, ...] = (),
        protected: tuple[str, ...] = (),
        hidden: tuple[str, ...] = (),
        uid: int = CELL_UID,
        gid: int = CELL_UID,
        id_range: bool = False,
        keep_caps: int = 0,
        image_rootfs: str = "",
        image_digest: str = "",
        setid: bool = False,
    ) -> None:
        object.__setattr__(self, "mounts", mounts)
        object.__setattr__(self, "grants", grants)
        object.__setattr__(self, "workspace", workspace)
        object.__setattr__(self, "workdir", workdir)
        object.__setattr__(self, "host_uid", host_uid)
        object.__setattr__(self, "host_gid", host_gid)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "writable_roots", writable_roots)
        object.__setattr__(self, "protected", protected)
        object.__setattr__(self, "hidden", hidden)
        object.__setattr__(self, "uid", uid)
        object.__setattr__(self, "gid", gid)
        object.__setattr__(self, "id_range", id_range)
        object.__setattr__(self, "keep_caps", keep_caps)
        object.__setattr__(self, "image_rootfs", image_rootfs)
        object.__setattr__(self, "image_digest", image_digest)
        object.__setattr__(self, "setid", setid)


SYSTEM_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

_DECOY_NAMES_MAX = 256
"""A decoy directory mirrors at most this many names of the host directory it
stands for: enough for an attempt on a real file to meet a Landlock refusal
(and so an event) rather than a silent ENOENT, without copying a huge tree."""

_DEFAULT_HIDDEN = (
    "/root",
    "/home",
    "/run",
    "/var/run",
    "/var/lib/stockade",
    "/var/lib/stockade/workspaces",
    "/mnt",
    "/media",
    "/srv",
)
"""Host places that hold homes, sockets and other agents' work: always shown as
decoys (empty, refused by Landlock, so every attempt is recorded)."""


_SOCKET_SCAN_MAX = 20000
"""Entries looked at, at most, when searching grants for host sockets."""


def _host_sockets(roots: list[str]) -> list[str]:
    """Unix sockets of the host lying in the policy's own grants.

    Each one found is hidden behind a decoy, so that an attempt on it meets a
    name and leaves a record like any decoy's. The decoy is not what keeps the
    cell off the socket: the connect supervisor (``_unotify``) refuses every
    host socket, found or not (the search is bounded, ``_SOCKET_SCAN_MAX``
    entries, never covers the workspace, and cannot see a socket made after
    the cell started).
    """
    found: list[str] = []
    budget = _SOCKET_SCAN_MAX
    todo = list(roots)
    while todo and budget > 0:
        directory = todo.pop()
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    budget -= 1
                    if budget <= 0:
                        break
                    try:
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except OSError:
                        continue
                    if stat.S_ISSOCK(mode):
                        found.append(entry.path)
                    elif stat.S_ISDIR(mode):
                        todo.append(entry.path)
        except OSError:
            continue
    return found


def _outermost(paths: list[str], covers: list[str]) -> list[str]:
    """``paths`` without those inside another of them or of ``covers``."""
    unique = sorted(set(paths))
    return [
        p
        for p in unique
        if not any(p != q and _is_under(p, q) for q in unique)
        and not any(p != c and _is_under(p, c) for c in covers)
    ]


def _has_magic(pattern: str) -> bool:
    """``glob.has_magic``, without importing glob (and fnmatch) for the
    default policy, whose paths hold no pattern."""
    return "*" in pattern or "?" in pattern or "[" in pattern


def _expand(pattern: str) -> list[str]:
    if _has_magic(pattern):
        import glob

        return sorted(glob.glob(pattern))
    return [pattern]


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _exists(path: str) -> bool:
    return os.path.lexists(path)


def plan_cell(
    policy: Policy,
    *,
    workspace: str,
    environ: dict[str, str] | os._Environ[str],
    extra_hidden: tuple[str, ...] = (),
    sockets: tuple[tuple[str, str], ...] = (),
    files: tuple[tuple[str, bytes], ...] = (),
) -> CellPlan:
    """Compute the plan of one cell for ``policy`` with ``workspace`` (a
    workbench's, whose ``/`` is an image, is ``_workbench.plan_workbench``'s).

    Raises:
        PolicyError: a grant cannot be honoured (e.g. the workspace is a file).
    """
    workspace = os.path.realpath(workspace)
    if not os.path.isdir(workspace):
        raise PolicyError(
            f"workspace {workspace!r} is not a directory; create it or omit it to get a fresh one"
        )
    host_uid, host_gid = _cell_identity(workspace)
    uid, gid, id_range = _host_user(policy)
    if id_range:
        # The cell's ids are the leased slot's range, known at launch: every
        # writable grant is idmapped from its owner (-1 matches no owner).
        host_uid = host_gid = -1

    fs = policy.filesystem
    ops: list[MountOp] = []
    read_dirs: list[str] = []
    write_dirs: list[str] = []

    # Grants: each path at its real location; a symlinked grant (like /bin ->
    # usr/bin on merged-/usr systems) becomes the same symlink in the cell.
    symlinks: dict[str, str] = {}
    writable_trees = [workspace, *(p for pattern in fs.write for p in _expand(pattern))]
    _refuse_planted_links(
        [p for pattern in (*fs.read, *fs.write) for p in _expand(pattern) if _exists(p)],
        writable_trees,
        host_uid,
    )
    for writable, patterns in ((False, fs.read), (True, fs.write)):
        for pattern in patterns:
            for path in _expand(pattern):
                if not _exists(path):
                    continue
                real = os.path.realpath(path)
                if os.path.islink(path):
                    symlinks[os.path.normpath(path)] = os.readlink(path)
                (write_dirs if writable else read_dirs).append(real)

    # A grant inside another that gives at least as much needs no mount of its
    # own (merged-/usr systems: /bin is a link to /usr/bin, inside /usr).
    granted_writes = [p for p in dict.fromkeys(write_dirs) if os.path.isdir(p)]
    write_dirs = _outermost(write_dirs, [workspace])
    all_read = read_dirs
    read_dirs = [p for p in _outermost(read_dirs, []) if p not in write_dirs and p != workspace]
    refuse_unenterable(read_dirs, [workspace, *write_dirs], host_uid)

    hidden_roots = [*_DEFAULT_HIDDEN, *extra_hidden]
    home = environ.get("HOME")
    if home and home not in ("/", ""):
        hidden_roots.append(os.path.realpath(home))
    deny: list[str] = []
    for pattern in fs.deny:
        deny.extend(p for p in _expand(pattern) if _exists(p))
    deny.extend(_host_sockets([p for p in (*read_dirs, *write_dirs) if p not in SYSTEM_READ]))
    # A hidden root that a grant covers (a policy granting /home/me/project)
    # stays hidden except for that grant: the grant is mounted on top of it.
    granted = [*read_dirs, *write_dirs, workspace]

    # Order matters: parents before children, so that a deeper mount (a secret
    # under /etc, the workspace under /tmp) lands on top of a shallower one.
    entries: list[tuple[str, MountOp]] = []
    for path in sorted(set(read_dirs)):
        entries.append((path, MountOp("bind", path, src=path, writable=not _read_only_mount(path))))
    for path in _read_only_inside_read(all_read, read_dirs):
        entries.append((path, MountOp("bind", path, src=path, writable=False, from_view=True)))
    for path in sorted({*write_dirs, workspace}):
        entries.append(
            (path, MountOp("bind", path, src=path, writable=True, idmap_owner=_idmap(path, host_uid)))
        )
    mount_ops = mount_entries(policy, host_uid, host_binds=granted)
    entries.extend((op.dst, op) for op in mount_ops)
    mounted_read = [op.dst for op in mount_ops if not op.writable]
    mounted_write = [op.dst for op in mount_ops if op.writable]
    hidden: list[str] = []
    for path in sorted(set(deny)):
        real = os.path.realpath(path)
        if not any(_is_under(real, g) for g in granted):
            continue  # not in the view at all: nothing to hide
        hidden.append(real)
        entries.append((real, _decoy(real, inside_grant=True)))
    mount_hosts = {op.dst: op.src for op in mount_ops}
    for path, host in denied_in_mounts(policy, mount_hosts):
        hidden.append(path)
        entries.append((path, _decoy(host, inside_grant=True)._replace(dst=path)))
    for path in absent_decoys(policy, [*granted, *mounted_read, *mounted_write]):
        # Decoys anywhere: a deny entry that names nothing here (/tests,
        # /var/run/docker.sock) is a stand-in in the cell's own root, so that
        # a reach for it meets Landlock (and is recorded) rather than ENOENT.
        hidden.append(path)
        entries.append((path, _absent_decoy(path)))
    for root in sorted(set(hidden_roots)):
        real = os.path.realpath(root)
        if os.path.islink(root) and not any(_is_under(root, g) for g in granted):
            # The host's /var/run -> /run: the same link in the cell, so that
            # /var/run/docker.sock meets the decoy, not a silent ENOENT.
            symlinks[os.path.normpath(root)] = os.readlink(root)
        if not _exists(real) or real in granted or real in hidden:
            continue
        hidden.append(real)
        entries.append((real, _decoy(real, inside_grant=any(_is_under(real, g) for g in granted))))
    mounted_writes = [workspace, *(p for p in write_dirs if os.path.isdir(p))]
    protected, protect_ops = _protect(policy, workspace, granted_writes, mounted_writes)
    entries.extend((op.dst, op) for op in protect_ops)
    mount_protected, mount_protect_ops = protect_mounts(policy)
    protected = (*protected, *mount_protected)
    entries.extend((op.dst, op) for op in mount_protect_ops)
    for path in _read_only_inside_writable(read_dirs, write_dirs, workspace):
        entries.append((path, MountOp("bind", path, src=path, writable=False, from_view=True)))
    # The cell's own /tmp, /dev and /proc are fresh, never the host's.
    entries.append(("/tmp", MountOp("tmpfs", "/tmp", writable=True, data=_tmp_options(policy))))
    scratch = _scratch_dir(read_dirs, hidden)
    if scratch != "/tmp":
        entries.append((scratch, MountOp("dir", scratch)))
    entries.append(("/dev", MountOp("dev", "/dev")))
    entries.append(("/proc", MountOp("proc", "/proc")))
    sys_decoys: list[str] = []
    if os.path.isdir("/sys"):
        # The cell's own sysfs (its network namespace's interfaces only), not
        # a bind of the host's. Read-write mount, read-only by Landlock (and
        # file permissions: it is root's): a write is refused by Landlock,
        # which records it. What it shows of the host is hidden by decoys.
        entries.append(("/sys", MountOp("sysfs", "/sys")))
        for op in _sys_decoys():
            # One of file permissions needs no hole in the grant of /sys.
            (sys_decoys if op.kind == "bind" else hidden).append(op.dst)
            entries.append((op.dst, op))
    proc_decoys = [p for p in _PROC_HIDDEN if _exists(p)]
    proc_decoy = _proc_decoy()
    for path in proc_decoys:
        if proc_decoy is not None:
            # The host's empty, root-only file: the cell's open is refused by
            # file permissions, and recorded (cell/_audit_mount.decoy_rule).
            entries.append((path, MountOp("bind", path, src=proc_decoy, writable=False)))
        else:
            entries.append((path, MountOp("decoy_file", path)))
    if any(_is_under("/etc", r) for r in read_dirs):
        entries.append(("/etc/passwd", MountOp("file", "/etc/passwd", data=_passwd(workspace))))
        entries.append(("/etc/group", MountOp("file", "/etc/group", data=_group())))
        entries.append(("/etc/hostname", MountOp("file", "/etc/hostname", data=b"stockade\n")))
    # Unix sockets the caller shows inside the cell (the broker's), each at a
    # path of its own; Landlock has no right that concerns connecting to one.
    for inside, host in sockets:
        entries.append((inside, MountOp("bind", inside, src=host, writable=True)))
    # Files the caller shows read-only (the run's CA bundle, the agent SDK).
    # One inside a bind of the host replaces a file the host has there; where
    # the host has none it is left out, since making the mount point would
    # create a file on the host. Never inside a writable grant.
    shown_files: list[str] = []
    for inside, content in files:
        bound = [g for g in granted if _is_under(inside, g)]
        if any(g not in read_dirs for g in bound):
            continue
        if bound and not os.path.isfile(inside):
            continue
        shown_files.append(inside)
        entries.append((inside, MountOp("file", inside, data=content)))
    # Parents before children (a stable sort keeps a path's own ops in order),
    # so that a deeper mount (a secret under /etc, the workspace under /tmp)
    # lands on top of a shallower one.
    entries.sort(key=lambda e: e[0].rstrip("/").count("/"))
    ops.extend(op for _, op in entries)
    for link, target in sorted(symlinks.items()):
        ops.append(MountOp("symlink", link, src=target))

    grants = _grants(
        policy,
        [*read_dirs, *mounted_read],
        [*write_dirs, *mounted_write],
        workspace,
        hidden,
        shown_files,
        mount_hosts,
    )
    workdir = policy.workdir or workspace
    env = _environment(policy, workspace, environ, _scratch_dir(read_dirs, hidden))
    if uid != CELL_UID:
        name = "root" if uid == 0 else str(uid)
        env = tuple(sorted({**dict(env), "USER": name, "LOGNAME": name}.items()))
    return CellPlan(
        mounts=tuple(ops),
        grants=grants,
        workspace=workspace,
        workdir=workdir,
        host_uid=host_uid,
        host_gid=host_gid,
        env=env,
        # A place that holds a system directory (AgentOS's write: [/]) is not
        # walked: the report would be the host's, and the walk's bound spent there.
        writable_roots=tuple(
            r
            for r in dict.fromkeys([*mounted_writes, *mounted_sources(policy)])
            if not _holds_system(r)
        ),
        protected=protected,
        hidden=(*hidden, *sys_decoys, *proc_decoys),
        uid=uid,
        gid=gid,
        id_range=id_range,
        keep_caps=ROOT_CAPS if id_range and uid == 0 else 0,
    )


# <linux/capability.h>: what root of a workbench keeps, inside its user
# namespace only: what apt-get, dpkg, chown and chmod need (Docker's default
# set without NET_RAW, MKNOD, SYS_CHROOT, AUDIT_WRITE, SETPCAP, SETFCAP).
CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL, CAP_SETGID, CAP_SETUID = 0, 1, 3, 4, 5, 6, 7
CAP_NET_BIND_SERVICE = 10
ROOT_CAPS = sum(
    1 << c
    for c in (
        CAP_CHOWN,
        CAP_DAC_OVERRIDE,
        CAP_FOWNER,
        CAP_FSETID,
        CAP_KILL,
        CAP_SETGID,
        CAP_SETUID,
        CAP_NET_BIND_SERVICE,
    )
)
"""The capabilities ``user: root`` keeps: over the cell's own ids only (a
file of an id the cell does not map, such as host root's, is out of their
reach: capable_wrt_inode_uidgid), and never CAP_SYS_ADMIN (no mount, no
namespaces: seccomp refuses those too)."""


def _host_user(policy: Policy) -> tuple[int, int, bool]:
    """(uid, gid, whole range) of a cell without an image: the agent's 1000
    with the one-id map, or ``user: root``/a uid with the slot's whole range.

    Raises:
        PolicyError: a user name, which only an image's /etc/passwd can resolve.
    """
    user = policy.user
    if user is None:
        return CELL_UID, CELL_UID, False
    if user == "root":
        return 0, 0, True
    if user.isdigit():
        return int(user), int(user), True
    raise PolicyError(
        f"user {user!r} is a name, which only an image's /etc/passwd can resolve; "
        "name an image, or write root or a uid"
    )


def mount_entries(policy: Policy, host_uid: int, *, host_binds: list[str]) -> list[MountOp]:
    """The binds of ``filesystem.mounts``: each host source at its target,
    read-only or read-write (idmapped from its owner, like a write grant).

    ``host_binds`` are the cell paths that show the host at its own paths: a
    target inside one that does not exist there would need its mount point
    made on the host, which a cell's view never does.

    Raises:
        PolicyError: a source is gone, or a target cannot be made.
    """
    ops: list[MountOp] = []
    for mount in policy.filesystem.mounts:
        source = os.path.realpath(mount.source)
        if not os.path.lexists(source):
            raise PolicyError(
                f"filesystem.mounts source {mount.source!r} does not exist (any more); "
                "create it, or fix the path"
            )
        target = os.path.normpath(mount.target)
        inside = [b for b in host_binds if _is_under(target, b)]
        if inside and not os.path.lexists(target):
            raise PolicyError(
                f"filesystem.mounts target {target!r} lies inside {max(inside, key=len)!r}, a host path "
                "shown as it is, where it does not exist and cannot be made; choose a target outside it"
            )
        writable = mount.mode == "rw"
        ops.append(
            MountOp(
                "bind",
                target,
                src=source,
                writable=writable,
                idmap_owner=_idmap(source, host_uid) if writable else None,
            )
        )
    return ops


def protect_mounts(
    policy: Policy, where: Callable[[str], str] = os.path.normpath
) -> tuple[tuple[str, ...], list[MountOp]]:
    """Protected paths inside the ``rw`` binds of ``filesystem.mounts``, as in
    a write grant (``_protect``: relative entries at its top, git directories
    found in it, the directories on the way pinned): found on the host under
    the source, covered by read-only binds at the target (``where`` maps a
    target to where the view mounts it: a workbench resolves it in the image).

    Returns the protected host paths (the persistence report walks the
    sources) and the mounts, in the cell's paths.
    """
    protected: list[str] = []
    ops: list[MountOp] = []
    for mount in policy.filesystem.mounts:
        source = os.path.realpath(mount.source)
        if mount.mode != "rw" or not os.path.isdir(source):
            continue
        target = where(os.path.normpath(mount.target))
        inside, found = _protect(policy, source, [], [source])
        protected.extend(inside)
        for op in found:
            dst = target if op.dst == source else os.path.join(target, os.path.relpath(op.dst, source))
            ops.append(op._replace(dst=dst, src=dst))
    return tuple(dict.fromkeys(protected)), ops


def refuse_unenterable(read_dirs: list[str], places: list[str], host_uid: int) -> None:
    """A writable place (the workspace, a write grant) inside a read grant is
    bound on top of that grant's bind, so it is reached through the grant's
    directories on the host: one the cell's ids may not search (a 0700
    directory of another owner, root's under /var/tmp) stops the view's own
    mount, and would stop the cell's every path to the place too. Said here,
    before anything is made, instead of as a failed mkdir in the view.

    ``host_uid`` is the host uid the cell acts as (-1 for a range of ids:
    then only a directory that anyone may search is enough).

    Raises:
        PolicyError: naming the place, the grant and the directory.
    """
    for grant in read_dirs:
        for place in places:
            if place == grant or not _is_under(place, grant):
                continue
            # The grant and each directory below it down to the place's parent.
            on_the_way = [os.path.dirname(place)]
            while on_the_way[-1] != grant and _is_under(on_the_way[-1], grant):
                on_the_way.append(os.path.dirname(on_the_way[-1]))
            for directory in reversed(on_the_way):
                try:
                    st = os.stat(directory)
                except OSError:
                    break
                owner = host_uid >= 0 and st.st_uid == host_uid and st.st_mode & 0o100
                if not (st.st_mode & 0o001 or owner):
                    raise PolicyError(
                        f"{place!r} lies inside the read grant {grant!r}, and {directory!r} on the way is "
                        f"mode {stat.S_IMODE(st.st_mode):04o} of uid {st.st_uid}, which the cell may not "
                        f"enter; grant a directory inside it, or let others search it (chmod o+x {directory})"
                    )


def in_host(mount_hosts: dict[str, str]) -> Callable[[str], str]:
    """A cell path -> the host path it shows: inside a ``filesystem.mounts``
    target (``mount_hosts``: target -> source) the source's, elsewhere itself."""

    def host(path: str) -> str:
        inside = [t for t in mount_hosts if _is_under(path, t)]
        if not inside:
            return path
        top = max(inside, key=len)
        return mount_hosts[top] if path == top else os.path.join(mount_hosts[top], os.path.relpath(path, top))

    return host


def denied_in_mounts(policy: Policy, mount_hosts: dict[str, str]) -> list[tuple[str, str]]:
    """The ``filesystem.deny`` entries inside a mount's target, as (the cell's
    path, the host path it shows) for each that exists in the source: each
    becomes a decoy there, as inside a grant.

    Raises:
        PolicyError: a deny entry that is a mount's target or holds one
            (the mount would show what the entry hides).
    """
    found: list[tuple[str, str]] = []
    host = in_host(mount_hosts)
    for pattern in policy.filesystem.deny:
        if pattern in SECRETS_DENY:
            continue  # the host's secrets at their paths; a mount shows another source
        path = os.path.normpath(pattern)
        holding = [t for t in mount_hosts if _is_under(t, path)]
        if holding:
            raise PolicyError(
                f"filesystem.deny entry {pattern!r} "
                + ("is" if path in holding else f"holds {holding[0]!r},")
                + " the target of a filesystem.mounts entry, which would show what it hides; "
                "remove the mount, or deny a path inside its target"
            )
        if host(path) == path:
            continue
        for shown in _expand(host(path)):
            if not _exists(shown):
                continue
            top = max((t for t in mount_hosts if _is_under(path, t)), key=len)
            found.append((os.path.join(top, os.path.relpath(shown, mount_hosts[top])), shown))
    return found


def mounted_sources(policy: Policy) -> list[str]:
    """The host sources of read-write mounts, which the persistence report walks."""
    return [
        os.path.realpath(m.source)
        for m in policy.filesystem.mounts
        if m.mode == "rw" and os.path.isdir(m.source)
    ]


def absent_decoys(policy: Policy, host_binds: list[str]) -> list[str]:
    """``filesystem.deny`` entries that name no host path (and no glob): each
    becomes a decoy of its own, unless it lies in a host path shown as it is,
    where its stand-in would have to be made on the host."""
    found: list[str] = []
    for pattern in policy.filesystem.deny:
        if _has_magic(pattern) or _exists(pattern):
            continue
        # The host's own links on the way (/var/run -> /run) are the cell's
        # too: the stand-in goes where the host would have it.
        path = os.path.join(os.path.realpath(os.path.dirname(pattern)), os.path.basename(pattern))
        if path == "/" or any(_is_under(path, b) for b in host_binds):
            continue
        found.append(path)
    return found


def _absent_decoy(path: str) -> MountOp:
    """A stand-in for a path that exists nowhere: a file where the name says
    so (``docker.sock``, ``secret.txt``: it has a suffix), else a directory:
    ``DIR_DECOY`` bound there where the host has it, so that a reach inside
    (``cat /tests/test_outputs.py``) is refused by file permissions and
    recorded (cell/_audit_mount.py), not a silent ENOENT; else an empty
    directory, which Landlock refuses to list."""
    name = os.path.basename(path)
    if "." in name.lstrip("."):
        return MountOp("decoy_file", path)
    dir_decoy = _dir_decoy()
    if dir_decoy is not None:
        return MountOp("bind", path, src=dir_decoy, writable=False)
    return MountOp("decoy_dir", path)


def _dir_decoy() -> str | None:
    """``DIR_DECOY`` when it is there as the audit reader made it (an empty
    directory, root's, mode 0000), else None."""
    from stockade.cell._audit_mount import DIR_DECOY, is_dir_decoy

    try:
        st = os.lstat(DIR_DECOY)
    except OSError:
        return None
    return DIR_DECOY if is_dir_decoy(st) else None


_SYS_HIDDEN = (
    "/sys/block",
    "/sys/class/block",
    "/sys/dev/block",
    "/sys/devices/virtual/block",
    "/sys/fs/ext4",
    "/sys/fs/xfs",
    "/sys/fs/btrfs",
    "/sys/firmware",
    "/sys/class/dmi",
    "/sys/devices/virtual/dmi",
    "/sys/hypervisor",
)
"""What a cell's sysfs shows of the host beyond its own interfaces, hidden:
the disks and their I/O counters (from which one agent could watch
another's work), the filesystems' write counters, firmware tables and the
machine's identity (DMI, hypervisor). Decoys, so that an attempt meets
Landlock and is recorded."""

_PROC_HIDDEN = (
    "/proc/cmdline",
    "/proc/config.gz",
    "/proc/bootconfig",
    "/proc/sys/kernel/random/boot_id",
    "/proc/diskstats",
    "/proc/partitions",
    "/proc/interrupts",
    "/proc/softirqs",
)
"""Host-wide files of a cell's procfs that identify the host or count other
cells' work (disk I/O; interrupts and softirqs count the host's network
traffic). Landlock cannot refuse them (a hole in /proc would need its pid
directories, unknown when the cell is planned): each is a bind of the host's
``PROC_DECOY`` (cell/_audit_mount), root's and mode 0000, which file
permissions refuse and an audit rule on its inode records; where that file
is missing (no audit reader), an empty file, unrecorded."""


_SYS_DECOYS_SECONDS = 30.0
_sys_cache: dict[str, tuple[float, tuple[tuple[str, tuple[str, ...]], ...]]] = {}
"""By what is wanted (``_sys_cached``): when it was made, and each hidden
path with the names its mirror shows (none for a bind of ``DIR_DECOY``)."""


def _sys_decoys() -> tuple[MountOp, ...]:
    """The decoys of ``_sys_hidden``, each ``DIR_DECOY`` bound there where the
    host has it: every lookup and listing inside is refused by file
    permissions (``EACCES``) and recorded by the audit rule on reaches
    (``cell/_audit_mount.py``), so ``/sys/block/vda/stat`` is an attempt on
    record. Landlock then grants /sys whole: a decoy it refuses needs a hole
    in that grant, and the hole is every sibling of every directory on the
    way (~110 rules on this host, each opened in the cell's fresh sysfs:
    ~1.8 ms of each launch, issue 18).

    Where the host has no ``DIR_DECOY`` (no audit reader), a mirror of the
    hidden directory that Landlock refuses, with the host's names, made
    again at most every ``_SYS_DECOYS_SECONDS`` (mirroring them takes about
    5 ms, and a host's disks seldom change; one added since shows its class
    links as names). sysfs's entries are links into the device tree: they
    are mirrored as the directories they lead to, so that
    ``/sys/block/vda/stat`` is a decoy file there too.
    """
    dir_decoy = _dir_decoy()
    if dir_decoy is not None:
        return tuple(MountOp("bind", path, src=dir_decoy, writable=False) for path, _ in _sys_cached(False))
    return tuple(MountOp("decoy_dir", path, names=names, writable=True) for path, names in _sys_cached(True))


def _sys_cached(mirrored: bool) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``_sys_hidden``, each with the names its mirror shows when
    ``mirrored`` (else none: a bind of ``DIR_DECOY`` mirrors nothing), made
    again at most every ``_SYS_DECOYS_SECONDS``."""
    key = "mirrors" if mirrored else "paths"
    now = time.monotonic()
    cached = _sys_cache.get(key)
    if cached is None or now - cached[0] > _SYS_DECOYS_SECONDS:
        found = tuple((p, tuple(_sys_names(p)) if mirrored else ()) for p in _sys_hidden())
        cached = _sys_cache[key] = (now, found)
    return cached[1]


_BLOCK_COUNTERS = ("stat", "inflight")
"""What a block directory's decoy shows inside each disk: its I/O counters."""


def _sys_names(path: str) -> list[str]:
    """The names a sysfs decoy shows. A ``block`` directory shows its disks
    and, in each, only its I/O counters (``_BLOCK_COUNTERS``): two levels of
    everything were 256 names for each of the four block directories of a
    host with ten loop devices, 1,024 files made at every cell's start, which
    cost 15-25 ms of its launch (issue 18). Reading a disk's counters is
    what a decoy there must record; any other name of a disk is simply not
    there. Other directories are mirrored two levels deep."""
    if os.path.basename(path) != "block":
        return _mirror(path, follow=True)
    try:
        disks = sorted(os.listdir(path))[: _DECOY_NAMES_MAX // 4]
    except OSError:
        return []
    names: list[str] = []
    for disk in disks:
        names.append(disk + "/")
        names.extend(f"{disk}/{c}" for c in _BLOCK_COUNTERS if os.path.exists(os.path.join(path, disk, c)))
    return sorted(names)


def _proc_decoy() -> str | None:
    """``PROC_DECOY`` when it is there as the audit reader made it (empty,
    root's, mode 0000), else None (the /proc decoys are then plain empty
    files, unrecorded)."""
    from stockade.cell._audit_mount import PROC_DECOY

    try:
        st = os.lstat(PROC_DECOY)
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_size and not st.st_mode & 0o7777:
        return PROC_DECOY
    return None


def _sys_hidden() -> list[str]:
    """``_SYS_HIDDEN`` as it exists here, and the ``block`` directory of each
    disk in the device tree (``/sys/devices/pci…/virtio1/block``): the disk's
    counters are there too, whatever its class links say."""
    found = [p for p in _SYS_HIDDEN if _exists(p)]
    try:
        disks = os.listdir("/sys/class/block")
    except OSError:
        disks = []
    for name in disks:
        path = os.path.realpath(os.path.join("/sys/class/block", name))
        while path.startswith("/sys/devices/") and os.path.basename(path) != "block":
            path = os.path.dirname(path)
        if os.path.basename(path) == "block" and not any(_is_under(path, f) for f in found):
            found.append(path)
    return sorted(set(found))


def _cell_identity(workspace: str) -> tuple[int, int]:
    """The host uid/gid the cell acts as: never root.

    An unprivileged caller can only map its own uid. Root maps the workspace's
    owner (so files the agent writes belong to whoever owns the project) or,
    for a root-owned workspace, nobody.
    """
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    st = os.stat(workspace)
    if st.st_uid != 0:
        return st.st_uid, st.st_gid
    return NOBODY, NOBODY


def _read_only_mount(path: str) -> bool:
    """Whether a read grant is a read-only mount (else Landlock alone keeps it read-only).

    Landlock has no right for chmod, chown, utimes or xattrs, and on a file the
    cell's uid owns, file permissions do not stop those either: any file of a
    grant may be the cell's (a user's own data, whatever its directory's
    owner), so a read grant is a read-only mount, on which they fail with
    EROFS (recorded through the audit rules of cell/_audit_mount, as every
    write there is). The exception is a system directory owned by root
    (``/usr``, ``/etc``: ``SYSTEM_READ`` and what lies in it), whose files
    are root's and so refuse the cell by file permissions; it stays a plain
    bind so that Landlock refuses a new file there and records it. A grant
    inside it that is not root's is a read-only mount of its own
    (``_read_only_inside_read``).
    """
    if not any(_is_under(path, system) for system in SYSTEM_READ):
        return True
    try:
        return os.stat(path).st_uid != 0
    except OSError:
        return True


def _read_only_inside_read(all_read: list[str], read_dirs: list[str]) -> list[str]:
    """Read grants inside a plain-bind read grant (a system directory) that
    must be read-only mounts themselves (``_read_only_mount``): ``/etc/myapp``
    owned by the agent's user, granted beside ``/etc``."""
    nested: list[str] = []
    for path in sorted(set(all_read)):
        if path in read_dirs or not _read_only_mount(path):
            continue
        holders = [r for r in read_dirs if r != path and _is_under(path, r)]
        if holders and not any(_read_only_mount(r) for r in holders):
            nested.append(path)
    return nested


def _plantable(path: str, tree: str, host_uid: int) -> bool:
    """Whether a cell writing ``tree`` could have made a symbolic link on the way to ``path``."""
    rooted = _idmap(tree, host_uid) == 0
    current = tree
    for part in os.path.relpath(path, tree).split(os.sep):
        parent, current = current, os.path.join(current, part)
        try:
            link, above = os.lstat(current), os.stat(parent)
        except OSError:
            return True
        if not stat.S_ISLNK(link.st_mode):
            continue
        if rooted or link.st_uid != 0 or above.st_uid != 0 or above.st_mode & 0o022:
            return True
    return False


def _idmap(path: str, host_uid: int) -> int | None:
    """The owner to idmap a writable grant from, if it is not the cell's own.

    Only root can make idmapped mounts; an unprivileged caller's cell is the
    caller, and owns what the caller owns. Never root for a tree that holds a
    system directory (``/``, ``/usr``): there the cell would write as host root;
    it acts as its own unprivileged uid instead, which file permissions stop.
    """
    if os.geteuid() != 0:
        return None
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return None
    if owner == 0 and any(_is_under(system, os.path.realpath(path)) for system in SYSTEM_READ):
        return None
    return owner if owner != host_uid else None


MIRROR_REUSE_SECONDS = 1.0
"""How long the names of a hidden directory are reused by the plans of other
cells, while the directory's own inode and mtime stay the same. Every cell
hides the workspaces' root, which holds a workspace per running cell: five
hundred cells started at once each listed the five hundred others (a stat of
each, two levels deep), and their plans took the whole start-up (issue 18).
A workspace made since changes the root's mtime and is seen at once (a
listing made within ``_MTIME_TICK`` of the directory's last change is not
kept: a change in the same clock tick would leave its mtime as it was); a
file made inside another cell's workspace within the second may be missing
from the list (a silent ENOENT there instead of a recorded refusal)."""
_MTIME_TICK = 50_000_000
"""Nanoseconds: more than the kernel's coarse clock tick that file times use."""
_mirrors: dict[tuple[str, bool], tuple[float, int, int, tuple[str, ...]]] = {}
_mirrors_lock = threading.Lock()
"""Held while a listing is made: cells planned at the same moment wait for
the one listing rather than each making its own."""


def _mirror(path: str, *, follow: bool = False) -> list[str]:
    """Relative names under ``path`` (``_list_mirror``), reused for
    ``MIRROR_REUSE_SECONDS`` across the cells of this process."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    key = (path, follow)
    with _mirrors_lock:
        hit = _mirrors.get(key)
        now = time.monotonic()
        fresh = hit is not None and now - hit[0] < MIRROR_REUSE_SECONDS
        if hit is not None and fresh and hit[1:3] == (st.st_ino, st.st_mtime_ns):
            return list(hit[3])
        listed_at = time.time_ns()
        names = _list_mirror(path, follow=follow)
        if len(_mirrors) > 256:
            _mirrors.clear()
        if listed_at - st.st_mtime_ns > _MTIME_TICK:
            _mirrors[key] = (now, st.st_ino, st.st_mtime_ns, tuple(names))
        return names


def _list_mirror(path: str, *, follow: bool = False) -> list[str]:
    """Relative names under ``path``, two levels deep, directories ending in "/",
    at most ``_DECOY_NAMES_MAX`` of them, parents before children.

    Where there are more, the most recently changed entries come first (at most
    half the budget at the top level, the rest for what they hold): an agent at
    work now (a fresh workspace among hundreds of old ones) is what another
    agent would go for, and the cap must not cut it for idle ones.
    """
    try:
        with os.scandir(path) as it:
            top = list(it)
    except OSError:
        return []
    if len(top) > _DECOY_NAMES_MAX // 2:
        # Only when the cap cuts: a stat each, on every plan of every cell.
        top.sort(key=lambda e: (-_mtime(e), e.name))
    names: list[str] = []
    below: list[str] = []
    for entry in top[: _DECOY_NAMES_MAX // 2]:
        if entry.is_dir(follow_symlinks=follow):
            names.append(entry.name + "/")
            below.append(entry.name + "/")
        else:
            names.append(entry.name)
    for prefix in below:
        try:
            with os.scandir(os.path.join(path, prefix)) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if len(names) >= _DECOY_NAMES_MAX:
                return sorted(names)
            name = prefix + entry.name
            names.append(name + "/" if entry.is_dir(follow_symlinks=False) else name)
    return sorted(names)


def _mtime(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _decoy(path: str, *, inside_grant: bool) -> MountOp:
    """A stand-in for a hidden path: same name, no content, nothing granted.

    A directory keeps the names of its entries two levels deep (as empty files
    or directories) so that an attempt on ``~/.ssh/id_rsa`` meets Landlock,
    which refuses it and records the path, instead of a silent "no such file".
    """
    if os.path.isdir(path) and not os.path.islink(path):
        names = _mirror(path)
        # ``writable`` marks a decoy that must cover part of a bind mount
        # with a tmpfs; elsewhere it is made in the cell's own root.
        return MountOp("decoy_dir", path, names=tuple(sorted(names)), writable=inside_grant)
    return MountOp("decoy_file", path)


def _refuse_links(target: str, workspace: str) -> None:
    """A protected path, or a directory on the way to it, that is a symbolic
    link cannot be protected: the agent could point the link elsewhere (the
    link itself is not a mount point), and following it is how a planted link
    would lead stockade's own writes out of the workspace.

    Raises:
        CellError: with the link and the fix.
    """
    path = target
    while path != workspace and _is_under(path, workspace):
        if os.path.islink(path):
            raise CellError(
                f"protected path {target!r} goes through the symbolic link {path!r}, which an agent "
                "could re-point; make it a regular file or directory, or leave it out of the workspace"
            )
        path = os.path.dirname(path)


def _file_on_the_way(target: str, workspace: str) -> str | None:
    """The outermost existing non-directory between the workspace and ``target``."""
    chain: list[str] = []
    path = os.path.dirname(target)
    while path != workspace and _is_under(path, workspace):
        chain.append(path)
        path = os.path.dirname(path)
    for path in reversed(chain):
        if os.path.lexists(path) and not os.path.isdir(path):
            return path
    return None


def _refuse_planted_links(grants: list[str], writable: list[str], host_uid: int) -> None:
    """A grant inside a writable tree must not go through a symbolic link that
    the agent may have planted there in an earlier run (replacing ``out/`` with
    a link to /etc): the next cell would mount the link's target.

    A link the cell could not have made is fine: one owned by root in a root's
    directory that no one else may write, in a tree the cell does not act as
    root in (merged-/usr's ``/bin -> usr/bin`` under a policy writing ``/``).

    Raises:
        CellError: naming the grant and the tree.
    """
    for path in grants:
        for tree in writable:
            if path != tree and _is_under(path, tree):
                resolved = os.path.realpath(path)
                if resolved != os.path.normpath(path) and _plantable(path, tree, host_uid):
                    raise CellError(
                        f"grant {path!r} lies inside the writable {tree!r} and leads through a "
                        f"symbolic link (to {resolved!r}), which an agent could have planted; "
                        "grant the real path instead, outside the writable tree"
                    )


def _protect(
    policy: Policy, workspace: str, granted_writes: list[str], mounted: list[str]
) -> tuple[tuple[str, ...], list[MountOp]]:
    """Every protected path inside writable places, and read-only mounts over
    those that exist.

    A relative entry is placed at the top of the workspace and of every write
    grant (the broker and the subset proof assume so); an entry under
    ``.git/`` in every git directory found there (``_persist.find_git``:
    nested repositories, and the git directories of submodules and worktrees
    under ``.git/modules`` and ``.git/worktrees``); a gitfile found anywhere
    is itself protected (it names the git directory). Every directory between
    the mounted writable place and a protected path becomes a mount point too
    (a bind of itself), because the kernel refuses to rename or remove a
    mount point: renaming ``.git`` away to write a fresh ``.git/hooks`` fails
    with EBUSY.

    A protected path that does not exist is not covered, and nothing is made
    in its place: a mount needs an existing file, and a placeholder would be
    the user's to see (git gives ``.git/commondir`` a meaning, ``git add -A``
    commits an empty ``.bashrc``) and, being on the host, anyone's to unlink,
    which detaches the mount in every running cell. Its creation is caught
    by the persistence report instead (``_persist``; docs/CELL.md).
    """
    from stockade.cell._persist import find_git

    fs = policy.filesystem
    roots = list(dict.fromkeys([workspace, *granted_writes]))
    in_git = [e[len(".git/") :] for e in fs.protect if e.startswith(".git/")]
    plain = [e for e in fs.protect if not e.startswith(".git/") and not e.startswith("/")]
    targets: list[str] = []
    for root in roots:
        # Relative entries, git's too: a .git that is a file (a worktree or
        # submodule) turns its entries into the gitfile itself below.
        for entry in (*plain, *(f".git/{rest}" for rest in in_git)):
            targets.extend(_expand(os.path.normpath(os.path.join(root, entry))))
    targets.extend(p for e in fs.protect if e.startswith("/") for p in _expand(os.path.normpath(e)))
    if policy.source:
        targets.append(os.path.realpath(policy.source))
    git_dirs, gitfiles = find_git(tuple(r for r in roots if not _holds_system(r)))
    for gitdir in git_dirs:
        # A submodule's git directory keeps its config writable: `git
        # submodule update` rewrites core.worktree there every time (EBUSY on
        # a mount point). A change to it is in the persistence report, with
        # the keys that run programs, and revert restores it.
        submodule = "/.git/modules/" in gitdir + "/"
        targets.extend(
            p
            for rest in in_git
            if not (submodule and rest in _SUBMODULE_WRITABLE)
            for p in _expand(os.path.join(gitdir, rest))
        )
    targets.extend(gitfiles)
    ops: list[MountOp] = []
    pinned: set[str] = set()
    covered: set[str] = set()
    inside: list[str] = []

    def pin(path: str, top: str) -> None:
        chain: list[str] = []
        while path != top and _is_under(path, top):
            chain.append(path)
            path = os.path.dirname(path)
        for directory in reversed(chain):
            if directory not in pinned:
                pinned.add(directory)
                ops.append(MountOp("bind", directory, src=directory, writable=True, from_view=True))

    # Every git directory is pinned, whatever it holds: renamed away, a fresh
    # one of the agent's (with hooks) would stand in its place.
    for gitdir in git_dirs:
        under = [m for m in mounted if _is_under(gitdir, m) and gitdir != m]
        if under:
            pin(gitdir, max(under, key=len))
    for target in sorted(set(targets)):
        under = [m for m in mounted if _is_under(target, m) and target != m]
        if not under:
            continue  # outside every writable place: read-only or hidden already
        inside.append(target)
        top = max(under, key=len)
        _refuse_links(target, top)
        blocker = _file_on_the_way(target, top)
        if blocker is not None:
            # e.g. a .git that is a file (a worktree or submodule): it names
            # the real git directory, so it is what must not change.
            target = blocker
        if any(_is_under(target, c) for c in covered) or not os.path.lexists(target):
            continue  # read-only already (``protect: [.git]``), or nothing to cover
        covered.add(target)
        pin(os.path.dirname(target), top)
        ops.append(MountOp("bind", target, src=target, writable=False, from_view=True))
    return tuple(inside), ops


_SUBMODULE_WRITABLE = ("config", "config.worktree")


def _holds_system(root: str) -> bool:
    """Whether a writable place is or holds a system directory (an AgentOS
    manifest writing ``/``): not walked for git directories."""
    return any(_is_under(system, root) for system in SYSTEM_READ)


def _tmp_options(policy: Policy) -> bytes:
    """Mount options of the cell's /tmp beyond its mode: ``limits.disk`` as
    tmpfs's own limits (tmpfs(5): ``size``, ``nr_inodes``), which the kernel
    enforces (ENOSPC) for every writer, root of the cell included. Its pages
    are charged to the memory cgroup of the process that writes them, so the
    cell's memory limit bounds /tmp too, as it always did."""
    disk = policy.limits.disk
    if disk is None:
        return b""
    options = []
    if disk.bytes is not None:
        options.append(f"size={disk.bytes}")
    if disk.files is not None:
        options.append(f"nr_inodes={disk.files}")
    return ",".join(options).encode()


SCRATCH = "/tmp/.stockade-tmp"


def _scratch_dir(read_dirs: list[str], hidden: list[str]) -> str:
    """Where the cell may write temporary files: /tmp, unless a read-only grant
    or a hidden path lies under /tmp.

    Landlock rights flow down through mount points, so a write grant on the
    cell's /tmp would also cover a read-only host directory shown under it.
    Then /tmp itself may only be listed, and TMPDIR points to a directory of
    its own inside it.
    """
    if any(_is_under(path, "/tmp") for path in (*read_dirs, *hidden)):
        return SCRATCH
    return "/tmp"


def _read_only_inside_writable(read_dirs: list[str], write_dirs: list[str], workspace: str) -> list[str]:
    """Read grants that lie inside a writable one.

    Landlock rights add up down a tree, so no Landlock rule can make part of a
    writable tree read-only; these are made read-only mounts instead (the
    mount layer refuses writes there with EROFS, recorded through the audit
    rules of cell/_audit_mount). An AgentOS manifest granting ``/`` with the
    system directories read-only is the common case.
    """
    nested: list[str] = []
    for path in read_dirs:
        if any(path != w and _is_under(path, w) for w in (*write_dirs, workspace)):
            nested.append(path)
    return nested


def _grants(
    policy: Policy,
    read_dirs: list[str],
    write_dirs: list[str],
    workspace: str,
    hidden: list[str],
    shown_files: list[str],
    mount_hosts: dict[str, str] | None = None,
) -> Grants:
    """Landlock grants that match the view, with holes where paths are hidden.

    Landlock rules cover a whole hierarchy, so a grant on /etc would also
    cover a decoy mounted at /etc/shadow. A granted directory that holds a
    hidden path is therefore granted entry by entry, skipping the hidden one,
    and only listed itself. ``mount_hosts`` (a ``filesystem.mounts`` target
    -> its host source) says where such a directory is listed on the host.
    """
    on_host = in_host(mount_hosts or {})
    any_exec = not policy.exec.allow
    read: list[str] = []
    write: list[str] = []
    # Not even / may be listed: an agent enumerating the places it cannot see
    # is worth a record. Directories that hold a hidden path may be listed.
    list_dirs: list[str] = []

    def add(path: str, bucket: list[str], candidates: list[str] = hidden) -> None:
        holes = [h for h in candidates if _is_under(h, path)]
        if not holes:
            bucket.append(path)
            return
        add_holed(path, bucket, holes)

    def add_holed(path: str, bucket: list[str], holes: list[str]) -> None:
        # ``holes``: the hidden paths under ``path``, none of them above it.
        host = on_host(path)
        if path in holes or not os.path.isdir(host):
            return
        list_dirs.append(path)
        try:
            names = os.listdir(host)
        except OSError:
            return
        # Each hole lies under one entry, the one its next name says: /etc's
        # hundreds of entries are not each matched to every hidden path, and
        # an entry that holds none is granted whole.
        prefix = path.rstrip("/") + "/"
        below: dict[str, list[str]] = {}
        for hole in holes:
            below.setdefault(hole[len(prefix) :].split("/", 1)[0], []).append(hole)
        base = path if path.endswith("/") else path + "/"  # os.path.join's, for a name without "/"
        for name in names:
            inner = below.get(name)
            if inner is None:
                bucket.append(base + name)
            else:
                add_holed(base + name, bucket, inner)

    for path in read_dirs:
        add(path, read)
    for path in [*write_dirs, workspace]:
        add(path, write)
    scratch = _scratch_dir(read_dirs, hidden)
    write.append(scratch)  # the cell's own tmpfs (or a part of it: see _scratch_dir)
    if scratch != "/tmp":
        list_dirs.append("/tmp")
    read.append("/proc")
    if os.path.isdir("/sys"):
        add("/sys", read)  # with holes at its decoys (_sys_hidden)
    devices = (*(f"/dev/{name}" for name in SYSTEM_DEVICES), "/dev/pts", "/dev/ptmx")
    write.append("/dev/shm")
    # The cell's own /dev (a tmpfs of a few device nodes) may be listed:
    # ttyname(3) scans it, so `tty`, `bash -i` and every login shell were
    # recorded as a refused listing, noise that teaches users to skip refusals.
    list_dirs.append("/dev")
    # Shown files are read-only; their directories may be listed (Python's
    # importer lists a directory before it finds a module in it).
    for path in shown_files:
        parent = os.path.dirname(path)
        if not any(_is_under(parent, d) for d in read_dirs) and parent not in list_dirs:
            list_dirs.append(parent)
    fixed = ("/etc/passwd", "/etc/group", "/etc/hostname", *shown_files)
    if any_exec:
        return Grants(
            read_exec=tuple(read),
            write_exec=tuple(write),
            list_dirs=tuple(list_dirs),
            devices=devices,
            read=fixed,
        )
    return Grants(
        read=(*read, *fixed),
        write=tuple(write),
        exec_files=tuple(policy.exec.allow),
        list_dirs=tuple(list_dirs),
        devices=devices,
    )


def _passwd(workspace: str) -> bytes:
    # The host's /etc/passwd names the host's users; the cell needs only its own.
    return (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"agent:x:{CELL_UID}:{CELL_UID}:stockade agent:{workspace}:/bin/sh\n"
        f"nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n"
    ).encode()


def _group() -> bytes:
    return f"root:x:0:\nagent:x:{CELL_UID}:\nnogroup:x:{NOBODY}:\n".encode()


def _environment(
    policy: Policy, workspace: str, environ: dict[str, str] | os._Environ[str], scratch: str
) -> tuple[tuple[str, str], ...]:
    """Nothing of the caller's environment crosses unless the policy names it."""
    env: dict[str, str] = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workspace,
        "USER": "agent",
        "LOGNAME": "agent",
        "TMPDIR": scratch,
        "STOCKADE_CELL": "1",
        # Python writes bytecode next to the modules it imports: beside a
        # read-only one (the agent SDK, system packages) each try would be a
        # refusal on record that nobody attempted. It writes none, and still
        # reads what is there: the system's modules come precompiled. (A
        # PYTHONPYCACHEPREFIX in the scratch, which is new each run, made
        # Python ignore those and compile its standard library at every
        # start: 8 ms of each python3 in a cell, issue 18.)
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    secret = policy.llm.api_key_env if policy.llm is not None else None
    for name in policy.env.passthrough:
        value = environ.get(name)
        if value is not None and name != secret:  # the loader refuses it too
            env[name] = value
    env.update(dict(policy.env.set))
    return tuple(sorted(env.items()))
