"""Workbench cells: a cell whose ``/`` is an image's root filesystem.

The view is an overlay mounted inside the cell's user namespace: the image's
rootfs as its read-only lower layer, shown through an idmapped mount so that
the image's own ids (0 for its root) are the cell's (0 inside, the leased
slot's unprivileged range on the host: ``_owners``), and a writable upper of
the run's own (thrown away at the end, or kept when the caller asks: its
files then hold the image's own ids, with overlay whiteouts, so it can
become a layer). Every other layer of a cell stays: the workspace, the
policy's grants and ``filesystem.mounts`` are host paths bound into the
image's view; Landlock's rules name paths inside the image; seccomp,
cgroups, the gateway, decoys, protected paths and the record are the same.

The image is untrusted input: its symbolic links are resolved here inside
its own root (never on the host's), its ``/etc/passwd`` is read with
``O_NOFOLLOW`` and a size cap, and its setuid files and device nodes are
harmless in the view (``nosuid``, ``nodev``, ``no_new_privs``, no host ids).
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from stockade.cell._plan import (
    _DECOY_NAMES_MAX,
    _PROC_HIDDEN,
    ROOT_CAPS,
    SCRATCH,
    SYSTEM_DEVICES,
    CellPlan,
    Grants,
    MountOp,
    _environment,
    _exists,
    _expand,
    _idmap,
    _is_under,
    _outermost,
    _proc_decoy,
    _protect,
    _refuse_planted_links,
    _sys_decoys,
    _tmp_options,
    denied_in_mounts,
    in_host,
    mount_entries,
    mounted_sources,
    protect_mounts,
    refuse_unenterable,
)
from stockade.errors import CellError, PolicyError
from stockade.policy._default import DEFAULT_PATH, SECRETS_DENY, SYSTEM_READ
from stockade.policy._model import Policy

ID_COUNT = 65535
"""Ids a workbench maps: 0-65534 inside, to the slot's range from its second
id on (the first is the namespace's owner, which no file or process of the
cell has: ``_owners``). 65535 inside stays unmapped, as it is in most images."""

UPPERS_ROOT = "/var/lib/stockade/uppers"
"""Where a run's own upper layer is made (root's, 0700; every cell sees
/var/lib/stockade as a decoy)."""

STOCKADE_RUN = "/run/stockade"
"""Where a workbench shows stockade's own files (the broker's socket, the
agent SDK, the gateway's CA): never in the image's own tree."""

_PASSWD_MAX = 1 << 20
"""The most of an image's /etc/passwd or /etc/group read (a real one is a few KiB)."""
_LINK_HOPS = 40
"""Symbolic links followed at most in resolving one path (the kernel's MAXSYMLINKS)."""


@dataclass(frozen=True, slots=True)
class ImageView:
    """What a cell needs of an image (``stockade.image.Image``): its root
    filesystem and the defaults of its config."""

    rootfs: str
    digest: str = ""
    env: tuple[str, ...] = ()
    workdir: str = ""
    user: str = ""

    @classmethod
    def of(cls, image: Any) -> ImageView:
        """From a ``stockade.image.Image`` (or anything shaped like one)."""
        config = getattr(image, "config", None)
        return cls(
            rootfs=os.fspath(image.rootfs),
            digest=str(getattr(image, "digest", "")),
            env=tuple(getattr(config, "env", ()) or ()),
            workdir=str(getattr(config, "workdir", "") or ""),
            user=str(getattr(config, "user", "") or ""),
        )


# ------------------------------------------------------------ inside the image


def resolve_in_image(rootfs: str, path: str) -> tuple[str, bool]:
    """``path`` as the image resolves it, every symbolic link followed inside
    its own root (an absolute target starts again at the image's ``/``, ``..``
    never climbs above it), and whether it exists there.

    Only ever ``lstat``s host paths whose every directory was found a real
    directory of the image, so no link of the image leads the host anywhere.

    Raises:
        PolicyError: a loop of links (more than 40 on the way).
    """
    todo = [p for p in path.split("/") if p]
    done: list[str] = []
    hops = 0
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(rootfs, *done, name)
        try:
            st = os.lstat(host)
        except OSError:
            rest = os.path.normpath("/".join([name, *todo])) if todo else name
            return "/" + "/".join([*done, *[p for p in rest.split("/") if p not in ("", ".")]]), False
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _LINK_HOPS:
                raise PolicyError(
                    f"{path!r} leads through more than {_LINK_HOPS} symbolic links in the image; "
                    "fix the image's links, or choose another path"
                )
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p] + todo
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            return "/" + "/".join([*done, name, *todo]), False
        done.append(name)
    return "/" + "/".join(done), True


def _host_path(rootfs: str, resolved: str) -> str:
    return os.path.join(rootfs, resolved.lstrip("/"))


def _read_image_file(rootfs: str, relative: tuple[str, ...]) -> bytes | None:
    """A small file of the image, opened one component at a time without
    following any link (an image's /etc pointing at the host's is refused)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for part in relative[:-1]:
            nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        file_fd = os.open(relative[-1], flags | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        os.close(fd)
        return None
    os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(file_fd).st_mode):
            return None
        return os.read(file_fd, _PASSWD_MAX)
    finally:
        os.close(file_fd)


@dataclass(frozen=True, slots=True)
class CellUser:
    """A workbench's user, resolved."""

    uid: int
    gid: int
    name: str
    home: str


def _table(rootfs: str, name: str) -> list[list[str]]:
    data = _read_image_file(rootfs, ("etc", name))
    if data is None:
        return []
    rows = []
    for line in data.decode("utf-8", "replace").splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] and not line.startswith("#"):
            rows.append(fields)
    return rows


def _id(text: str) -> int | None:
    if text.isdigit() and int(text) < ID_COUNT:
        return int(text)
    return None


def resolve_user(spec: str | None, rootfs: str) -> CellUser:
    """The cell's user for ``user:`` (or the image's ``USER``): ``root``, a
    name of the image's ``/etc/passwd``, a uid, each with ``:GROUP`` allowed
    as Docker reads it; ``None`` or "" (no ``user:`` and an image whose
    ``User`` is empty) is root, as Docker runs such an image: the image's
    root, inside a user namespace mapped to an unprivileged host range,
    never host root. A policy that wants the agent's uid says ``user: 1000``.

    Raises:
        PolicyError: a name the image does not have, or an id outside 0-65534.
    """
    if not spec:
        spec = "root"
    user, _, group = spec.partition(":")
    passwd = _table(rootfs, "passwd")
    entry = None
    uid = _id(user)
    if uid is None and user.isdigit():
        raise PolicyError(
            f"user {spec!r} is outside the cell's ids 0 to {ID_COUNT - 1}; write a uid in that range"
        )
    for fields in passwd:
        if (uid is None and fields[0] == user) or (uid is not None and _id(fields[2]) == uid):
            entry = fields
            break
    if entry is None and uid is None:
        if user == "root":
            return CellUser(0, 0, "root", "/root")
        raise PolicyError(
            f"user {user!r} is not in the image's /etc/passwd; write root, a uid, or a user the image has"
        )
    if entry is not None:
        uid = _id(entry[2])
        gid = _id(entry[3])
        if uid is None or gid is None:
            raise PolicyError(
                f"user {user!r} has ids {entry[2]}:{entry[3]} in the image's /etc/passwd, outside the "
                f"cell's 0 to {ID_COUNT - 1}; use another user"
            )
        name, home = entry[0], entry[5] if len(entry) > 5 else "/"
    else:
        assert uid is not None
        gid, name, home = uid, str(uid), "/"
    if group:
        found = _id(group)
        if found is None:
            found = next((_id(g[2]) for g in _table(rootfs, "group") if g[0] == group), None)
        if found is None:
            raise PolicyError(
                f"group {group!r} of user {spec!r} is not in the image's /etc/group; write a gid"
            )
        gid = found
    return CellUser(uid, gid, name, home or "/")


# ----------------------------------------------------------------- the plan


def plan_workbench(
    policy: Policy,
    image: ImageView,
    *,
    workspace: str,
    environ: dict[str, str] | os._Environ[str],
    extra_hidden: tuple[str, ...] = (),
    sockets: tuple[tuple[str, str], ...] = (),
    files: tuple[tuple[str, bytes], ...] = (),
) -> CellPlan:
    """The plan of a workbench: the image as ``/``, the host's grants in it.

    Raises:
        PolicyError: the policy cannot be honoured with this image.
    """
    workspace = os.path.realpath(workspace)
    if not os.path.isdir(workspace):
        raise PolicyError(
            f"workspace {workspace!r} is not a directory; create it or omit it to get a fresh one"
        )
    rootfs = os.path.realpath(image.rootfs)
    if not os.path.isdir(rootfs):
        raise PolicyError(
            f"image {image.digest or rootfs!r} has no root filesystem at {rootfs!r}; import or build it again"
        )
    if policy.exec.allow:
        raise PolicyError(
            "exec.allow names host programs, and a workbench runs the image's; remove exec.allow "
            "from a policy with an image"
        )
    user = resolve_user(policy.user or image.user or None, rootfs)
    fs = policy.filesystem
    dac = _permission_decoys()
    # Root's whole image: Landlock grants / entire (a right names a whole
    # tree, so mkdir /app and ls / need it there), and every decoy is one of
    # file permissions instead (``_by_permissions``), host root's, which no
    # capability of the cell's root overrides; protected paths and the
    # host's read grants are read-only mounts. Where the host lacks the
    # decoys (stockade not run as root), root keeps Landlock's holes.
    whole = user.uid == 0 and dac is not None

    def where(path: str) -> str:
        return resolve_in_image(rootfs, path)[0]

    # The host's grants, minus the system directories that base: system adds
    # (a workbench's /usr and /etc are the image's).
    reads = [p for pattern in fs.read if pattern not in SYSTEM_READ for p in _expand(pattern) if _exists(p)]
    writes = [p for pattern in fs.write for p in _expand(pattern) if _exists(p)]
    _refuse_planted_links([*reads, *writes], [workspace, *writes], -1)
    read_dirs = [os.path.realpath(p) for p in reads]
    write_dirs = _outermost([os.path.realpath(p) for p in writes], [workspace])
    read_dirs = [p for p in _outermost(read_dirs, []) if p not in write_dirs and p != workspace]
    refuse_unenterable(read_dirs, [workspace, *write_dirs], -1)

    entries: list[tuple[str, MountOp]] = [("/", MountOp("overlay", "/", src=rootfs, writable=True))]
    binds: dict[str, str] = {}  # in the cell -> on the host
    for path in read_dirs:
        binds[where(path)] = path
        entries.append((where(path), MountOp("bind", where(path), src=path, writable=False)))
    for path in sorted({*write_dirs, workspace}):
        binds[where(path)] = path
        entries.append(
            (where(path), MountOp("bind", where(path), src=path, writable=True, idmap_owner=_idmap(path, -1)))
        )
    host_reads = [where(p) for p in read_dirs]
    host_writes = [where(p) for p in [*write_dirs, workspace]]
    mount_hosts: dict[str, str] = {}
    for op in mount_entries(policy, -1, host_binds=[]):
        dst = where(op.dst)
        binds[dst] = mount_hosts[dst] = op.src
        entries.append(
            (dst, MountOp("bind", dst, src=op.src, writable=op.writable, idmap_owner=op.idmap_owner))
        )
        (host_writes if op.writable else host_reads).append(dst)

    hidden: list[str] = []
    # Deny entries: inside a host bind, the host's own (as without an image);
    # elsewhere the image's, shown as decoys whether or not the image has them
    # (/tests, /solution). base: system's secrets name the host's /etc: the
    # image's own /etc/shadow is the image's business.
    # The host's places the caller hides (the persistence reports' directory
    # when a writable grant holds it) matter only where a bind shows them;
    # elsewhere the host is not in the image's view at all.
    for path in extra_hidden:
        inside = [c for c, h in binds.items() if _is_under(path, c) and path != c]
        if inside and _exists(path):
            hidden.append(path)
            entries.append((path, _decoy_from(path, path)))
    denied_in_mounts(policy, mount_hosts)  # a deny entry on a mount's target is an error
    for pattern in fs.deny:
        for path in _expand(pattern):
            inside = [c for c, h in binds.items() if _is_under(path, c)]
            if inside:
                top = max(inside, key=len)
                host = os.path.join(binds[top], os.path.relpath(path, top)) if path != top else binds[top]
                if _exists(host) and path != top:
                    hidden.append(path)
                    entries.append((path, _decoy_from(host, path)))
                continue
            if pattern in SECRETS_DENY:
                continue
            dst, exists = resolve_in_image(rootfs, path)
            if dst == "/":
                continue
            hidden.append(dst)
            if exists:
                decoy = _decoy_from(_host_path(rootfs, dst), dst)
            else:
                name = os.path.basename(dst)
                kind = "decoy_file" if "." in name.lstrip(".") else "decoy_dir"
                decoy = MountOp(kind, dst, writable=True)  # type: ignore[arg-type]
            # Refused by file permissions where the host has the decoys (a
            # reach inside /tests is then an event, not a silent ENOENT).
            entries.append((dst, _by_permissions(decoy, dac)))
    for dst in image_devices(rootfs):
        # The image's own device nodes (a tarball may carry /opt/x as
        # /dev/mem's numbers): the overlay is nodev, and each is also a decoy,
        # so that an open meets Landlock and is recorded, not a silent EACCES.
        if dst not in hidden and not any(_is_under(dst, c) for c in binds):
            hidden.append(dst)
            entries.append((dst, MountOp("decoy_file", dst)))
    # Protected paths of the workspace and write grants, as without an image
    # (their binds are at their own paths: the image's links never lead there).
    mounted_writes = [workspace, *(p for p in write_dirs if os.path.isdir(p))]
    granted_writes = [p for p in dict.fromkeys(os.path.realpath(w) for w in writes) if os.path.isdir(p)]
    protected, protect_ops = _protect(policy, workspace, granted_writes, mounted_writes)
    entries.extend((op.dst, op) for op in protect_ops)
    # And inside the rw binds of filesystem.mounts, at their targets.
    mount_protected, mount_protect_ops = protect_mounts(policy, where)
    protected = (*protected, *mount_protected)
    entries.extend((op.dst, op) for op in mount_protect_ops)

    tmp = where("/tmp")
    entries.append((tmp, MountOp("tmpfs", tmp, writable=True, data=_tmp_options(policy))))
    entries.append(("/dev", MountOp("dev", "/dev")))
    entries.append(("/proc", MountOp("proc", "/proc")))
    sys_decoys: list[str] = []
    if os.path.isdir("/sys"):
        entries.append(("/sys", MountOp("sysfs", "/sys")))
        for op in _sys_decoys():
            # One of file permissions needs no hole in the grant of /sys.
            (sys_decoys if op.kind == "bind" else hidden).append(op.dst)
            entries.append((op.dst, op))
    proc_decoy = _proc_decoy()
    proc_decoys = [p for p in _PROC_HIDDEN if _exists(p)]
    for path in proc_decoys:
        if proc_decoy is not None:
            entries.append((path, MountOp("bind", path, src=proc_decoy, writable=False)))
        else:
            entries.append((path, MountOp("decoy_file", path)))
    for inside_path, host in sockets:
        dst = where(inside_path)
        entries.append((dst, MountOp("bind", dst, src=host, writable=True)))
    shown_files: list[str] = []
    for inside_path, content in files:
        if not _is_under(inside_path, STOCKADE_RUN):
            # The image's tree is the cell's own to change: a file mounted in
            # it (the gateway's copy of /etc/ssl/certs/ca-certificates.crt)
            # would make every other new name of its directory a refusal
            # (Landlock names what exists; the file is a hole in the grant)
            # and the file itself unreplaceable (update-ca-certificates).
            # A workbench has stockade's files under /run/stockade only, and
            # the environment points there (SSL_CERT_FILE, PIP_CERT, ...).
            continue
        dst = where(inside_path)
        if any(_is_under(dst, w) for w in host_writes):
            continue  # never inside a writable grant (the host's file would be covered)
        shown_files.append(dst)
        entries.append((dst, MountOp("file", dst, data=content)))
    workdir = where(policy.workdir or image.workdir or workspace)
    made_dirs: list[str] = []
    if not resolve_in_image(rootfs, workdir)[1] and not any(_is_under(workdir, c) for c in binds):
        made_dirs.append(workdir)
        entries.append((workdir, MountOp("dir", workdir)))
    entries.sort(key=lambda e: e[0].rstrip("/").count("/") if e[0] != "/" else -1)
    if whole:
        entries = [(dst, _by_permissions(op, dac)) for dst, op in entries]

    # As in any cell (``_plan._scratch_dir``): a right on /tmp would cover a
    # decoy or a read-only bind shown under it, so the cell's scratch is then
    # a directory of its own in it, and /tmp may only be listed.
    scratch = tmp
    if any(_is_under(p, tmp) for p in (*hidden, *host_reads, *shown_files)):
        scratch = os.path.join(tmp, os.path.basename(SCRATCH))
        entries.append((scratch, MountOp("dir", scratch)))
        entries.sort(key=lambda e: e[0].rstrip("/").count("/") if e[0] != "/" else -1)
    grants = (
        _whole_grants()
        if whole
        else _image_grants(
            rootfs,
            host_reads,
            host_writes,
            hidden,
            shown_files,
            [scratch, *made_dirs],
            [tmp] if scratch != tmp else [],
            in_host(mount_hosts),
        )
    )
    env = dict(_environment(policy, workspace, environ, scratch))
    policy_set = dict(policy.env.set)
    for entry in image.env:
        key, sep, value = entry.partition("=")
        if not sep or not key or key in ("TMPDIR", "STOCKADE_CELL", "PYTHONDONTWRITEBYTECODE"):
            continue
        if key not in policy_set or (key == "PATH" and policy_set[key] == DEFAULT_PATH):
            env[key] = value
    env["USER"] = env["LOGNAME"] = user.name
    if user.home and not any(e.startswith("HOME=") for e in image.env):
        env["HOME"] = user.home
    return CellPlan(
        mounts=tuple(op for _, op in entries),
        grants=grants,
        workspace=workspace,
        workdir=workdir,
        host_uid=-1,
        host_gid=-1,
        env=tuple(sorted(env.items())),
        writable_roots=tuple(dict.fromkeys([*mounted_writes, *mounted_sources(policy)])),
        protected=protected,
        hidden=(*hidden, *sys_decoys, *proc_decoys),
        uid=user.uid,
        gid=user.gid,
        id_range=True,
        keep_caps=ROOT_CAPS if user.uid == 0 else 0,
        image_rootfs=rootfs,
        image_digest=image.digest,
        setid=private_places([*mounted_writes, *mounted_sources(policy)]),
    )


def private_places(places: list[str]) -> bool:
    """Whether no host user but each place's owner (and root) can reach any
    file in ``places`` (the workbench's writable host paths): some directory
    on the way, the place itself or one above it, is its owner's or root's
    and lets neither group nor others search it.

    Then a set-id file the cell leaves there (owned on the host by the
    place's owner: the binds are idmapped from it) can be run on the host by
    no one it would raise: its owner and root gain nothing. Where that does
    not hold (a workspace under a searchable /var/tmp, a write grant in a
    shared directory), seccomp keeps refusing set-id modes, as in every cell.
    """
    for place in places:
        try:
            owner = os.stat(place).st_uid
        except OSError:
            return False
        path = place
        while True:
            try:
                st = os.stat(path)
            except OSError:
                return False
            if st.st_uid in (0, owner) and not st.st_mode & 0o011:
                break
            if path == "/":
                return False
            path = os.path.dirname(path)
    return True


_DEVICE_SCAN_MAX = 500_000
"""Entries of an image looked at, at most, for device nodes (a large image
holds a few hundred thousand; the walk costs about 1 s per 100,000, once)."""
_devices: dict[tuple[str, int, int], tuple[str, ...]] = {}


def image_devices(rootfs: str) -> tuple[str, ...]:
    """The character and block devices of an image (outside its /dev, which
    the cell's own replaces), as paths inside it. Walked once per image
    (store images are read-only: keyed by the rootfs's inode and mtime)."""
    try:
        st = os.stat(rootfs)
    except OSError:
        return ()
    key = (rootfs, st.st_ino, st.st_mtime_ns)
    found = _devices.get(key)
    if found is not None:
        return found
    out: list[str] = []
    budget = _DEVICE_SCAN_MAX
    todo = [""]
    while todo and budget > 0:
        rel = todo.pop()
        try:
            with os.scandir(os.path.join(rootfs, rel.lstrip("/"))) as it:
                for entry in it:
                    budget -= 1
                    if budget <= 0:
                        break
                    path = f"{rel}/{entry.name}"
                    if path in ("/dev", "/proc", "/sys"):
                        continue
                    try:
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except OSError:
                        continue
                    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                        # A char device 0/0 is an overlay whiteout, not a device.
                        if entry.stat(follow_symlinks=False).st_rdev != 0:
                            out.append(path)
                    elif stat.S_ISDIR(mode):
                        todo.append(path)
        except OSError:
            continue
    _devices[key] = found = tuple(sorted(out))
    return found


def _decoy_from(host: str, dst: str) -> MountOp:
    """A decoy at ``dst`` for what ``host`` is (a directory mirrors its names,
    on a tmpfs of its own, so that nothing is made in the upper layer)."""
    from stockade.cell._plan import _mirror

    if os.path.isdir(host) and not os.path.islink(host):
        return MountOp("decoy_dir", dst, names=tuple(sorted(_mirror(host))[:_DECOY_NAMES_MAX]), writable=True)
    return MountOp("decoy_file", dst)


def _permission_decoys() -> tuple[str, str] | None:
    """``DIR_DECOY`` and ``PROC_DECOY`` (cell/_audit_mount.py) where the host
    has both as the audit reader makes them, else None."""
    from stockade.cell._plan import _dir_decoy

    directory, file = _dir_decoy(), _proc_decoy()
    return (directory, file) if directory is not None and file is not None else None


def _by_permissions(op: MountOp, dac: tuple[str, str] | None) -> MountOp:
    """A decoy refused by file permissions (``DIR_DECOY``, ``PROC_DECOY``
    bound there, read-only: host root's, mode 0000), whatever Landlock
    grants: every open and every lookup inside is ``EACCES``, recorded by the
    audit rules (a reach into it by the rule on reaches). Any other op, or no
    such decoys on this host, as it is."""
    if dac is None or op.kind not in ("decoy_dir", "decoy_file"):
        return op
    return MountOp("bind", op.dst, src=dac[0] if op.kind == "decoy_dir" else dac[1], writable=False)


def _whole_grants() -> Grants:
    """Landlock for root's whole image: ``/`` entire, the cell's to read,
    write and run, as root's own container is (``plan_workbench``)."""
    devices = (*(f"/dev/{name}" for name in SYSTEM_DEVICES), "/dev/pts", "/dev/ptmx")
    return Grants(write_exec=("/",), devices=devices)


_OWN = ("proc", "sys", "dev", "tmp")
"""Top-level places of the cell's own making, granted apart."""


def _image_grants(
    rootfs: str,
    reads: list[str],
    writes: list[str],
    hidden: list[str],
    shown_files: list[str],
    own_writes: list[str],
    listed: list[str],
    on_host: Callable[[str], str] = os.path.normpath,
) -> Grants:
    """Landlock for a workbench: the image's tree is the cell's to read, write
    and run (its upper is the run's own), entry by entry from ``/`` so that
    the host's read-only binds, the decoys and the files shown are holes in
    it; the host's write binds and the cell's /tmp are granted as they are.

    A name the cell creates at the top of ``/`` (or in a directory with a
    hole) is not granted: Landlock rights name what exists when the cell
    starts. ``/`` itself may not be listed (its entries may): Landlock's
    rights cover a whole tree, and a listable ``/`` would let every decoy be
    listed without a record.
    """
    holes = [*hidden, *reads, *shown_files]
    read: list[str] = []
    write: list[str] = []
    # Not / itself, as without an image: a right on a directory covers its
    # whole tree, so a listable / would make every decoy silently listable.
    list_dirs: list[str] = [*listed]

    def add(path: str, bucket: list[str]) -> None:
        inner = [h for h in holes if _is_under(h, path)]
        if not inner:
            bucket.append(path)
            return
        if path in inner:
            return
        list_dirs.append(path)
        try:
            names = os.listdir(_host_path(rootfs, path))
        except OSError:
            names = []
        for name in names:
            child = os.path.join(path, name)
            # A link gets no rule: opened for one, it would bind its target,
            # and the image would choose what is granted (a link to a decoy).
            if not os.path.islink(_host_path(rootfs, child)):
                add(child, bucket)

    try:
        top = sorted(os.listdir(rootfs))
    except OSError as exc:
        raise CellError(f"cannot list the image's root filesystem {rootfs!r}: {exc.strerror}") from exc
    for name in top:
        if name in _OWN or "/" + name in own_writes or os.path.islink(os.path.join(rootfs, name)):
            continue  # a link (/bin -> usr/bin) has the rights of where it leads
        add("/" + name, write)
    # The host's binds, with holes where a decoy lies inside one (a deny
    # entry in the workspace, the persistence reports' directory), listed on
    # the host (the grants are at their own paths, a mount's target shows
    # its source: ``on_host``).
    inner_holes = [*hidden, *shown_files]
    for path in reads:
        _add_host(path, inner_holes, read, list_dirs, on_host)
    for path in writes:
        _add_host(path, inner_holes, write, list_dirs, on_host)
    write.extend(own_writes)
    read.append("/proc")
    if os.path.isdir("/sys"):
        sys_holes = [h for h in hidden if _is_under(h, "/sys")]
        _add_host("/sys", sys_holes, read, list_dirs)
    devices = (*(f"/dev/{name}" for name in SYSTEM_DEVICES), "/dev/pts", "/dev/ptmx")
    write.append("/dev/shm")
    for path in shown_files:
        parent = os.path.dirname(path)
        if parent not in list_dirs:
            list_dirs.append(parent)
    return Grants(
        read_exec=tuple(read),
        write_exec=tuple(dict.fromkeys(write)),
        list_dirs=tuple(dict.fromkeys(list_dirs)),
        devices=devices,
        read=tuple(shown_files),
    )


def _add_host(
    path: str,
    holes: list[str],
    bucket: list[str],
    list_dirs: list[str],
    on_host: Callable[[str], str] = os.path.normpath,
) -> None:
    """``path`` of the host (the cell's own sysfs shows the host's tree) with
    holes; ``on_host`` gives where a cell path is on the host."""
    inner = [h for h in holes if _is_under(h, path)]
    if not inner:
        bucket.append(path)
        return
    if path in inner or not os.path.isdir(on_host(path)):
        return
    list_dirs.append(path)
    try:
        names = os.listdir(on_host(path))
    except OSError:
        return
    for name in names:
        _add_host(os.path.join(path, name), holes, bucket, list_dirs, on_host)


# ----------------------------------------------------------- the run's upper


@dataclass(frozen=True, slots=True)
class Upper:
    """A run's writable layer: ``upper`` and overlay's ``work``, in ``base``
    (one directory: overlayfs wants both on one mount)."""

    base: str
    upper: str
    work: str
    keep: bool


LAYERS: Literal["auto", "overlay", "copy"] = "auto"
"""How a workbench's ``/`` is made: "auto" asks ``stockade doctor``'s probe
(``_host.probe().workbench``), "overlay" or "copy" force one (tests)."""


def layers() -> Literal["overlay", "copy"]:
    if LAYERS != "auto":
        return LAYERS
    from stockade.cell._host import probe

    fact = probe().workbench
    return "copy" if fact is not None and fact.value == "copy" else "overlay"


def make_upper(upper_dir: str | None, *, copy_from: str | None = None) -> Upper:
    """A fresh upper layer for one run, or the caller's ``upper_dir`` (made
    if missing; a kept upper of an earlier run continues from where it was).

    On disk its files have the image's own ids (0 for files of the cell's
    root): the layer is shown through an idmapped mount. With ``copy_from``
    (no overlayfs on this host) it is a copy of the whole image instead
    (``cp -a``: owners, modes, links, device nodes as nodes, never read),
    shown as the root; an upper that holds anything already is used as it is.

    Raises:
        CellError: the directories cannot be made.
    """
    try:
        if upper_dir is None:
            os.makedirs(UPPERS_ROOT, mode=0o700, exist_ok=True)
            base = ""
            while not base:
                candidate = os.path.join(UPPERS_ROOT, "up-" + os.urandom(6).hex())
                try:
                    os.mkdir(candidate, 0o700)
                    base = candidate
                except FileExistsError:
                    continue
            upper = os.path.join(base, "upper")
            os.mkdir(upper, 0o755)
            keep = False
        else:
            upper = os.path.realpath(upper_dir)
            os.makedirs(upper, mode=0o755, exist_ok=True)
            base = os.path.dirname(upper)
            keep = True
        work = ""
        if copy_from is None:
            work = os.path.join(base, f".{os.path.basename(upper)}.work-{os.urandom(4).hex()}")
            os.mkdir(work, 0o700)
        for path in (upper, work):
            if path:
                os.chown(path, 0, 0)  # the image's root, through the idmapped mount
        if copy_from is not None and not os.listdir(upper):
            import subprocess

            done = subprocess.run(
                ["cp", "-a", "--reflink=auto", "--", os.path.join(copy_from, "."), upper],
                capture_output=True,
                check=False,
            )
            if done.returncode != 0:
                raise CellError(
                    f"cannot copy the image {copy_from!r} into {upper!r}: "
                    f"{done.stderr.decode(errors='replace').strip()[:300]}; "
                    "free some disk, or see `stockade doctor`"
                )
    except OSError as exc:
        raise CellError(
            f"cannot make the upper layer {upper_dir or UPPERS_ROOT!r}: {exc.strerror}; "
            "give a directory on a local filesystem that root may write"
        ) from exc
    return Upper(base=base, upper=upper, work=work, keep=keep)


def check_upper(upper: Upper, plan: CellPlan) -> None:
    """Refuse a kept upper in which a path that Landlock's rules name (the
    image's directories the plan read from the lower layer) became a
    symbolic link: the launcher opens each rule's path in the view, and a
    link an earlier run wrote would carry the rule to wherever it leads.

    Raises:
        CellError: naming the link and what to do.
    """
    if not upper.keep:
        return  # a fresh upper is empty
    grants = plan.grants
    for path in (*grants.write_exec, *grants.read_exec, *grants.list_dirs):
        current = upper.upper
        for part in [p for p in path.split("/") if p]:
            current = os.path.join(current, part)
            try:
                st = os.lstat(current)
            except OSError:
                break
            if stat.S_ISLNK(st.st_mode):
                raise CellError(
                    f"the kept upper layer {upper.upper!r} makes {path!r} go through the symbolic link "
                    f"{current!r}, which an earlier run left; remove it, or start from a fresh upper_dir"
                )


def finish_upper(upper: Upper, plan: CellPlan) -> None:
    """After the run: remove a thrown-away upper, or tidy a kept one (the
    empty mount points the view made in it, where the image has nothing, are
    stockade's, not the run's), and overlay's work directory either way."""
    if not upper.keep:
        _discard(upper.base)
        return
    if upper.work:
        shutil.rmtree(upper.work, ignore_errors=True)
    points = sorted({op.dst for op in plan.mounts if op.dst != "/"}, key=len, reverse=True)
    for point in points:
        path = point
        while path not in ("/", ""):
            if resolve_in_image(plan.image_rootfs, path)[1]:
                break
            host = os.path.join(upper.upper, path.lstrip("/"))
            try:
                st = os.lstat(host)
                if stat.S_ISDIR(st.st_mode):
                    os.rmdir(host)  # only if empty: what the run put there stays
                elif stat.S_ISREG(st.st_mode) and st.st_size == 0:
                    os.unlink(host)
                else:
                    break
            except OSError:
                break
            path = os.path.dirname(path)


_TRASH = os.path.join(UPPERS_ROOT, ".discarded")
_sweeper: threading.Thread | None = None
_sweep_lock = threading.Lock()


def _discard(base: str) -> None:
    """Throw a run's upper away: renamed out of the way at once (one
    syscall), removed by a thread of its own. Removing even a near-empty
    layer took about 1 ms per directory on this ext4 (the view's mount
    points), most of a workbench's cost over a plain cell; whatever a crash
    leaves in the trash goes with the next one."""
    global _sweeper
    try:
        os.makedirs(_TRASH, mode=0o700, exist_ok=True)
        os.rename(base, os.path.join(_TRASH, os.path.basename(base)))
    except OSError:
        shutil.rmtree(base, ignore_errors=True)
        return
    with _sweep_lock:
        if _sweeper is None or not _sweeper.is_alive():
            _sweeper = threading.Thread(target=_sweep, name="stockade-upper-sweeper", daemon=True)
            _sweeper.start()


def _sweep() -> None:
    while True:
        try:
            names = os.listdir(_TRASH)
        except OSError:
            return
        if not names:
            return
        for name in names:
            shutil.rmtree(os.path.join(_TRASH, name), ignore_errors=True)


# ------------------------------------------------------------ the id ranges


def range_userns(base: int) -> int:
    """A user namespace fd mapping ids 0-65534 to ``base``-…, for the
    idmapped layers of a workbench's overlay (on disk the image's ids, in the
    cell the same ids). Made for one run: the caller closes it (a slot's base
    changes from run to run, so a kept one would pile up one per slot).

    Raises:
        CellError: the namespace could not be made.
    """
    from stockade.cell._launch import userns_with_maps

    return userns_with_maps(f"0 {base} {ID_COUNT}\n", f"0 {base} {ID_COUNT}\n")


__all__ = [
    "ID_COUNT",
    "CellUser",
    "ImageView",
    "Upper",
    "check_upper",
    "finish_upper",
    "layers",
    "make_upper",
    "plan_workbench",
    "range_userns",
    "resolve_in_image",
    "resolve_user",
]
