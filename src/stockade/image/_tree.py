"""Filesystem primitives of the image store: opening a path strictly inside a
rootfs, copying a rootfs as hard links, applying an overlay upper directory
onto a copy, and the digest of a directory tree.

Every path taken from an image (a tar member, an upper directory's entry) is
opened with ``openat2(2)`` and ``RESOLVE_BENEATH`` relative to the rootfs's
own descriptor: a symlink planted by an earlier layer (``etc -> /``,
``a -> ../../..``) cannot lead a later write out of the rootfs, whatever
renames happen meanwhile. The store runs as root and the images are the
untrusted party, so no path of theirs is ever joined to a host path as a string.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

from stockade.errors import ImageError

SYS_OPENAT2 = 437
"""openat2(2), Linux 5.6 (the same number on every architecture)."""
# <linux/openat2.h>
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
BENEATH = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS

OVERLAY_OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")
"""The xattr overlayfs marks an opaque directory of an upper with: ``trusted.``
for a mount by host root, ``user.`` for one made in a user namespace
(``userxattr``, Linux 5.11; Documentation/filesystems/overlayfs.rst)."""

KEPT_XATTR_PREFIXES = ("user.", "security.capability")
"""The xattrs an image's files keep. ``trusted.overlay.*`` and
``user.overlay.*`` are dropped: in a rootfs that becomes an overlay's lower
layer they would be read by overlayfs itself (an opaque flag or a redirect
planted by the image). ``security.capability`` (file capabilities) is kept as
the image has it and, like a setuid bit, means nothing in a cell: its mounts
are ``nosuid``."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]


def openat2(dirfd: int, path: str, flags: int, resolve: int = BENEATH) -> int:
    """``openat2(2)`` with ``O_CLOEXEC``; EAGAIN (a concurrent rename) retried.

    Raises:
        OSError: the kernel's error; EXDEV means the path leads out of ``dirfd``.
    """
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    raw = os.fsencode(path)
    for _ in range(8):
        fd = _syscall(SYS_OPENAT2, dirfd, raw, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def clean_member(name: str, *, what: str) -> str:
    """A relative path of an image with ``./`` and trailing ``/`` removed;
    ``""`` is the rootfs itself.

    Raises:
        ImageError: the path is absolute or has a ``..`` component.
    """
    if "\0" in name:
        raise ImageError(f"{what}: path {name!r} holds a NUL byte; the archive is corrupt, export it again")
    if name.startswith("/"):
        raise ImageError(
            f"{what}: path {name!r} is absolute and would be written outside the image's rootfs; "
            "an image layer's paths are relative (export the image again)"
        )
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageError(
            f"{what}: path {name!r} climbs out with '..' and would be written outside the image's rootfs; "
            "refused (the archive is malformed or hostile)"
        )
    return "/".join(parts)


class Root:
    """A rootfs directory held open, with paths resolved strictly beneath it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def parent(self, rel: str, *, what: str, create: bool) -> tuple[int, str]:
        """An O_PATH descriptor of ``rel``'s parent directory and ``rel``'s last
        component; missing parents are made (0755, root) when ``create``.

        Raises:
            ImageError: the parent leads out of the rootfs (a symlink to an
                absolute or climbing path) or is not a directory.
        """
        head, _, base = rel.rpartition("/")
        if not head:
            return os.dup(self.fd), base
        try:
            return openat2(self.fd, head, os.O_PATH | os.O_DIRECTORY), base
        except OSError as exc:
            if exc.errno == errno.ENOENT and create:
                self._makedirs(head, what=what)
                return self.parent(rel, what=what, create=False)
            raise self._refusal(rel, head, exc, what=what) from None

    def _makedirs(self, head: str, *, what: str) -> None:
        done = ""
        for part in head.split("/"):
            done = f"{done}/{part}" if done else part
            try:
                fd = openat2(self.fd, done, os.O_PATH | os.O_DIRECTORY)
                os.close(fd)
                continue
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise self._refusal(done, done, exc, what=what) from None
            pfd, base = self.parent(done, what=what, create=False)
            try:
                os.mkdir(base, 0o755, dir_fd=pfd)
            except FileExistsError:
                pass
            finally:
                os.close(pfd)

    def _refusal(self, rel: str, head: str, exc: OSError, *, what: str) -> ImageError:
        if exc.errno == errno.EXDEV:
            return ImageError(
                f"{what}: path {rel!r} goes through a symlink in {head!r} that leads out of the image's "
                "rootfs; refused (an image may not write outside itself)"
            )
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            return ImageError(
                f"{what}: path {rel!r} has {head!r} as its parent, which is not a directory; "
                "the layer is malformed, export the image again"
            )
        return ImageError(f"{what}: path {rel!r} cannot be opened in the rootfs ({exc.strerror})")


def remove_at(dirfd: int, name: str) -> bool:
    """Remove ``name`` in ``dirfd`` (a whole tree for a directory); whether it was there."""
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        # rmtree with dir_fd walks by descriptors and never follows a symlink.
        shutil.rmtree(name, dir_fd=dirfd)
    else:
        os.unlink(name, dir_fd=dirfd)
    return True


def clear_dir(dirfd: int, keep: frozenset[str] = frozenset()) -> None:
    """Empty the directory ``dirfd`` except the names in ``keep``."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        for name in os.listdir(fd):
            if name not in keep:
                remove_at(fd, name)
    finally:
        os.close(fd)


def copy_tree_linked(source: Path, dest: Path) -> None:
    """``dest`` (absent) as a copy of ``source``: directories made anew, every
    other file a hard link, ownership, modes, times and xattrs kept.

    Hard links are safe because no rootfs is ever written in place: a commit
    replaces a changed file by unlinking the link and writing a new inode
    (``apply_upper``). ``cp -a --link`` is GNU coreutils'; it does this in C
    at ~10k files per 0.2 s.

    Raises:
        ImageError: the copy failed (the disk is full, say).
    """
    done = subprocess.run(
        ["cp", "-a", "--link", "--no-target-directory", "--", str(source), str(dest)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ImageError(
            f"copying the rootfs {source} failed: {done.stderr.strip()}; check the disk under {dest.parent}"
        )


def is_whiteout(st: os.stat_result) -> bool:
    """An overlayfs whiteout: a character device 0:0."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: str) -> bool:
    for name in OVERLAY_OPAQUE:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def apply_upper(upper: Path, root: Path) -> int:
    """Apply an overlay upper directory (a build cell's kept upper, a COPY's
    layer) onto the rootfs ``root``, in place: whiteouts delete, opaque
    directories replace the lower one's whole content, everything else
    replaces what was there (a new inode: ``root`` shares inodes with its
    parent image). Returns how many entries were applied.

    Raises:
        ImageError: an entry leads out of ``root``.
    """
    count = 0
    with Root(root) as rootfs:
        for dirpath, dirnames, filenames in os.walk(upper):
            rel_dir = os.path.relpath(dirpath, upper)
            rel_dir = "" if rel_dir == "." else rel_dir
            for name in sorted(dirnames + filenames):
                src = os.path.join(dirpath, name)
                rel = f"{rel_dir}/{name}" if rel_dir else name
                st = os.lstat(src)
                pfd, base = rootfs.parent(rel, what="commit", create=True)
                try:
                    count += 1
                    if is_whiteout(st):
                        remove_at(pfd, base)
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        _dir_from(src, st, pfd, base, opaque=is_opaque(src))
                        continue
                    remove_at(pfd, base)
                    _copy_entry(src, st, pfd, base)
                finally:
                    os.close(pfd)
    return count


def _dir_from(src: str, st: os.stat_result, pfd: int, base: str, *, opaque: bool) -> None:
    try:
        cur = os.stat(base, dir_fd=pfd, follow_symlinks=False)
        if not stat.S_ISDIR(cur.st_mode):
            remove_at(pfd, base)
            os.mkdir(base, 0o700, dir_fd=pfd)
    except FileNotFoundError:
        os.mkdir(base, 0o700, dir_fd=pfd)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    try:
        if opaque:
            clear_dir(fd)
        set_owner_mode(fd, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
        copy_xattrs_path(src, fd)
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)


def _copy_entry(src: str, st: os.stat_result, pfd: int, base: str) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), base, dir_fd=pfd)
        os.chown(base, st.st_uid, st.st_gid, dir_fd=pfd, follow_symlinks=False)
        os.utime(base, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=pfd, follow_symlinks=False)
        return
    if stat.S_ISREG(st.st_mode):
        with open(src, "rb") as fin:
            fd = os.open(
                base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd
            )
            try:
                with os.fdopen(os.dup(fd), "wb") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
                set_owner_mode(fd, st.st_uid, st.st_gid, mode)
                copy_xattrs_path(src, fd)
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fd)
        return
    # A device node or a FIFO of the image, made as it is: harmless in a
    # cell, whose mounts are nodev.
    os.mknod(base, st.st_mode, st.st_rdev, dir_fd=pfd)
    os.chown(base, st.st_uid, st.st_gid, dir_fd=pfd, follow_symlinks=False)
    os.chmod(base, mode, dir_fd=pfd)


def set_owner_mode(fd: int, uid: int, gid: int, mode: int) -> None:
    """chown then chmod: chown(2) clears setuid and setgid bits, so the mode comes last."""
    os.fchown(fd, uid, gid)
    os.fchmod(fd, mode)


def copy_xattrs_path(src: str, fd: int) -> None:
    try:
        names = os.listxattr(src, follow_symlinks=False)
    except OSError:
        return
    for name in names:
        if name.startswith(KEPT_XATTR_PREFIXES) and not name.startswith("user.overlay."):
            try:
                os.setxattr(fd, name, os.getxattr(src, name, follow_symlinks=False))
            except OSError:
                continue


def walk_entries(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``root`` (not ``root`` itself), sorted, with its lstat."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            yield rel, os.lstat(os.path.join(dirpath, name))


def tree_digest(root: Path) -> str:
    """``sha256:…`` of a directory tree: every entry's path, type, mode,
    owner, size, content (files), target (symlinks), device number and kept
    xattrs, in sorted order. Two trees with the same digest are the same
    files, byte for byte and bit for bit; times are left out."""
    h = hashlib.sha256()
    for rel, st in walk_entries(root):
        path = os.path.join(root, rel)
        line = f"{rel}\0{st.st_mode:o}\0{st.st_uid}\0{st.st_gid}"
        if stat.S_ISREG(st.st_mode):
            line += f"\0{st.st_size}\0{file_sha256(path)}"
        elif stat.S_ISLNK(st.st_mode):
            line += f"\0{os.readlink(path)}"
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            line += f"\0{st.st_rdev}"
        if stat.S_ISDIR(st.st_mode) and is_opaque(path):
            line += "\0opaque"
        h.update(line.encode("utf-8", "surrogateescape") + b"\n")
    return "sha256:" + h.hexdigest()


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tree_size(root: Path) -> int:
    """Bytes of the regular files under ``root``, each inode counted once."""
    seen: set[int] = set()
    total = 0
    for _, st in walk_entries(root):
        if stat.S_ISREG(st.st_mode) and st.st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_size
    return total


__all__ = [
    "BENEATH",
    "Root",
    "apply_upper",
    "clean_member",
    "clear_dir",
    "copy_tree_linked",
    "file_sha256",
    "openat2",
    "remove_at",
    "set_owner_mode",
    "tree_digest",
    "tree_size",
    "walk_entries",
]
