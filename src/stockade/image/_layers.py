"""Applying one image layer (a tar stream, OCI image-spec layer.md) onto a rootfs.

In-tree, with Python's ``tarfile``, rather than Debian's ``umoci``: ``umoci
unpack`` wants an OCI layout (so a ``docker save`` tarball would need
``skopeo`` first: two Go programs, ~60 MB), writes a runtime bundle with its
own ``config.json`` and mtree manifest we would throw away, and resolves a
symlink that points out of the rootfs by confining it (as if the rootfs were
``/``), where the store refuses the layer and says which path tried. Layers
are plain tar; what needs care is the paths, and ``_tree.Root`` opens each
one strictly beneath the rootfs with ``openat2(RESOLVE_BENEATH)``.

Whiteouts (``.wh.NAME``) and opaque markers (``.wh..wh..opq``) apply to the
layers below only, so they are applied first, in a pass of their own; then
every other entry in archive order. Ownership is the numeric uid and gid of
the archive (never its user names: they would be looked up on the host).
Setuid bits, file capabilities and device nodes are kept as the image has
them: a cell mounts the image ``nosuid,nodev``, so they give nobody anything.
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path
from typing import IO

from stockade.errors import ImageError
from stockade.image._tree import KEPT_XATTR_PREFIXES, Root, clean_member, clear_dir, remove_at, set_owner_mode

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
XATTR_PAX = "SCHILY.xattr."


def apply_layer(tar: IO[bytes], root: Path, *, what: str) -> dict[str, int]:
    """Apply the uncompressed, seekable layer tar ``tar`` onto ``root``.

    Returns counts: entries, whiteouts, opaque, devices, setuid, dropped_xattrs.

    Raises:
        ImageError: a member's path leads out of the rootfs, a hard link's
            target does too or is missing, or the tar is corrupt.
    """
    counts = {"entries": 0, "whiteouts": 0, "opaque": 0, "devices": 0, "setuid": 0, "dropped_xattrs": 0}
    try:
        archive = tarfile.open(fileobj=tar, mode="r:")  # noqa: SIM115 (the caller owns the file)
        members = archive.getmembers()
    except (tarfile.TarError, EOFError) as exc:
        raise ImageError(
            f"{what}: the layer is not a readable tar archive ({exc}); export the image again"
        ) from None
    named = [(clean_member(m.name, what=what), m) for m in members]
    dirs: list[tuple[str, tarfile.TarInfo]] = []
    with Root(root) as rootfs:
        # Pass 1: whiteouts, against the layers below.
        for rel, member in named:
            base = rel.rpartition("/")[2]
            if not base.startswith(WHITEOUT):
                continue
            pfd, _ = rootfs.parent(rel, what=what, create=True)
            try:
                if base == OPAQUE:
                    counts["opaque"] += 1
                    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pfd)
                    try:
                        clear_dir(fd)
                    finally:
                        os.close(fd)
                else:
                    target = base[len(WHITEOUT) :]
                    if not target or target in (".", ".."):
                        raise ImageError(
                            f"{what}: whiteout {member.name!r} names no file; the layer is malformed"
                        )
                    counts["whiteouts"] += 1
                    remove_at(pfd, target)
            finally:
                os.close(pfd)
        # Pass 2: everything else, in archive order (a later entry wins).
        for rel, member in named:
            base = rel.rpartition("/")[2]
            if base.startswith(WHITEOUT):
                continue
            counts["entries"] += 1
            if not rel:
                dirs.append((rel, member))
                continue
            _extract(archive, member, rel, rootfs, counts, what=what)
            if member.isdir():
                dirs.append((rel, member))
        # Directories' own metadata last: a 0555 directory would not be
        # refused to root, but its mtime would change with every entry made in it.
        for rel, member in reversed(dirs):
            fd = (
                os.open(
                    rel or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=rootfs.fd
                )
                if not rel
                else _open_dir(rootfs, rel, what=what)
            )
            try:
                _meta(fd, member, counts)
            finally:
                os.close(fd)
    return counts


def _open_dir(rootfs: Root, rel: str, *, what: str) -> int:
    pfd, base = rootfs.parent(rel, what=what, create=False)
    try:
        return os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    finally:
        os.close(pfd)


def _extract(
    archive: tarfile.TarFile,
    member: tarfile.TarInfo,
    rel: str,
    rootfs: Root,
    counts: dict[str, int],
    *,
    what: str,
) -> None:
    pfd, base = rootfs.parent(rel, what=what, create=True)
    try:
        existing = _lstat(pfd, base)
        if member.isdir():
            if existing is not None and not stat.S_ISDIR(existing.st_mode):
                remove_at(pfd, base)
                existing = None
            if existing is None:
                os.mkdir(base, 0o700, dir_fd=pfd)
            return
        if existing is not None:
            remove_at(pfd, base)
        if member.isreg():
            fd = os.open(
                base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd
            )
            try:
                src = archive.extractfile(member)
                assert src is not None
                with os.fdopen(os.dup(fd), "wb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                _meta(fd, member, counts)
            finally:
                os.close(fd)
        elif member.issym():
            os.symlink(member.linkname, base, dir_fd=pfd)
            os.chown(base, member.uid, member.gid, dir_fd=pfd, follow_symlinks=False)
            os.utime(base, (member.mtime, member.mtime), dir_fd=pfd, follow_symlinks=False)
        elif member.islnk():
            target = clean_member(member.linkname, what=f"{what}: hard link {member.name!r}")
            tfd, tbase = rootfs.parent(target, what=what, create=False)
            try:
                tst = _lstat(tfd, tbase)
                if tst is None or stat.S_ISDIR(tst.st_mode):
                    raise ImageError(
                        f"{what}: hard link {member.name!r} points at {member.linkname!r}, which is "
                        "not a file of the layers so far; the layer is malformed"
                    )
                os.link(tbase, base, src_dir_fd=tfd, dst_dir_fd=pfd, follow_symlinks=False)
            finally:
                os.close(tfd)
        elif member.ischr() or member.isblk() or member.isfifo():
            kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK if member.isblk() else stat.S_IFIFO
            device = os.makedev(member.devmajor, member.devminor) if kind != stat.S_IFIFO else 0
            os.mknod(base, kind | 0o600, device, dir_fd=pfd)
            if kind != stat.S_IFIFO:
                counts["devices"] += 1
            os.chown(base, member.uid, member.gid, dir_fd=pfd, follow_symlinks=False)
            os.chmod(base, stat.S_IMODE(member.mode), dir_fd=pfd)
        else:
            raise ImageError(
                f"{what}: member {member.name!r} is of tar type {member.type!r}, which a layer may not hold"
            )
    except ImageError:
        raise
    except (tarfile.TarError, EOFError) as exc:
        raise ImageError(
            f"{what}: the layer is truncated or corrupt at {member.name!r} ({exc}); export it again"
        ) from None
    finally:
        os.close(pfd)


def _lstat(dirfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _meta(fd: int, member: tarfile.TarInfo, counts: dict[str, int]) -> None:
    mode = stat.S_IMODE(member.mode)
    if mode & (stat.S_ISUID | stat.S_ISGID) and not member.isdir():
        counts["setuid"] += 1
    set_owner_mode(fd, member.uid, member.gid, mode)
    for key, value in member.pax_headers.items():
        if not key.startswith(XATTR_PAX):
            continue
        name = key[len(XATTR_PAX) :]
        if not name.startswith(KEPT_XATTR_PREFIXES) or name.startswith("user.overlay."):
            counts["dropped_xattrs"] += 1
            continue
        try:
            os.setxattr(fd, name, value.encode("utf-8", "surrogateescape"))
        except OSError:
            counts["dropped_xattrs"] += 1
    os.utime(fd, (member.mtime, member.mtime))


__all__ = ["OPAQUE", "WHITEOUT", "apply_layer"]
