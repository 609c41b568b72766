"""Safe file access for the ``fs.read``, ``fs.write`` and ``fs.list`` intents.

The broker runs in the daemon, outside every cell and usually as root, so a
path an agent names must not take it anywhere the agent could not go itself.
Three things make sure of it:

1. **Grants.** A read or list needs the path inside a ``filesystem.read`` or
   ``filesystem.write`` entry of the policy (globs matched component by
   component, as the cell expands them); a write needs a ``filesystem.write``
   entry, the deepest entry winning as in the cell (a read entry inside a
   write entry is read-only). The workspace is *not* granted implicitly: the
   agent reaches its workspace directly. Never reachable: ``filesystem.deny``,
   the default policy's secrets (``/etc/shadow``…), the places every cell
   hides (``/root``, ``/home``, ``/run``, ``/srv``, ``/var/lib/stockade``…,
   except below a grant that names a path inside them, as in the cell) and
   the daemon's own places. Writes never touch a protected path
   (``filesystem.protect``; relative entries below the workspace and below the
   write grant) nor the policy file.
2. **Resolution.** The grant's directory is opened as an ``O_PATH``
   descriptor, and every component below it is opened relative to the one
   above with ``openat2(2)`` and ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
   RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV``: no symbolic link (final or not,
   absolute, relative or dangling), no ``..``, no mount point and no rename
   race leads outside the grant. A grant that lies inside a writable tree is
   itself opened without following links (an agent may have planted one
   there, as the cell refuses to mount).
3. **Permissions as the cell's.** The broker checks file modes as the cell's
   own host uid would meet them (and, in a write grant, as the grant's owner,
   whom the cell's idmapped mount stands for), never with root's override:
   a root-only file in ``/etc`` stays unreadable through the broker.

Only regular files are read or written; a fifo, socket or device is refused
without blocking (looked at first without being opened, then opened
``O_NONBLOCK`` and checked to be the same inode). A write goes only to a file
with one link: a hard link would let a write land on another path, possibly
outside the grant. Reads and writes are bounded to 16 MiB, a listing to
10,000 entries. A file the broker creates belongs to the owner of the grant's
directory, mode 0644, as if the cell had made it.

A read's plain case (no link, no mount point, a readable regular file) is
done by one C call, ``_fastread.read_beneath``, with the same system calls and
checks; anything else comes back to ``FileAccess.read``'s Python path, which
decides and explains (docs/BROKER.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, ParamSpec, TypeVar

from stockade.broker._fastread import read_beneath
from stockade.broker._refusal import Refusal, RefusalReason
from stockade.cell._plan import _DEFAULT_HIDDEN, NOBODY, _cell_identity
from stockade.cell._syscall import libc
from stockade.errors import HostError
from stockade.policy._default import SECRETS_DENY
from stockade.policy._model import Policy

SYS_OPENAT2 = 437
"""openat2(2), Linux 5.6 (arch/x86/entry/syscalls/syscall_64.tbl; the same number on every arch)."""

# <linux/openat2.h>
RESOLVE_NO_XDEV = 0x01
"""Fail with EXDEV on crossing a mount point (bind mounts included)."""
RESOLVE_NO_MAGICLINKS = 0x02
"""Fail with ELOOP on a /proc "magic link" (/proc/self/fd/N, /proc/self/root)."""
RESOLVE_NO_SYMLINKS = 0x04
"""Fail with ELOOP on any symbolic link, the final component's included."""
RESOLVE_BENEATH = 0x08
"""Fail with EXDEV when resolution would leave the directory ``dirfd``."""
AT_FDCWD = -100

BENEATH = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV

MAX_READ = 16 * 1024 * 1024
MAX_WRITE = 16 * 1024 * 1024
MAX_LIST = 10_000
CREATE_MODE = 0o644

WriteMode = Literal["create", "overwrite", "append"]
FailureCode = Literal["not_found", "exists", "is_a_directory", "not_a_directory", "too_large", "io"]
_T = TypeVar("_T")
_P = ParamSpec("_P")


class FsFailure(Exception):
    """Why an fs intent could not be done (a plain failure, not a denial: a
    path that is not the agent's to touch is a ``Refusal`` value instead)."""

    def __init__(self, code: FailureCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


class _Refused(Exception):
    """Internal: a check deep in a path walk refused; the public methods of
    ``FileAccess`` catch it and return its ``Refusal`` (``_refusals``)."""

    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(message)
        self.refusal = Refusal(reason, message)


def _refusals(method: Callable[_P, _T]) -> Callable[_P, _T | Refusal]:
    """A public ``FileAccess`` method whose refusals are returned, as values."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T | Refusal:
        try:
            return method(*args, **kwargs)
        except _Refused as exc:
            return exc.refusal

    return wrapper


class _OpenHow(ctypes.Structure):
    """``struct open_how`` of <linux/openat2.h>: three u64, 24 bytes (OPEN_HOW_SIZE_VER0)."""

    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_openat2_call = libc["syscall"]
"""``syscall(2)`` as a function object of its own, typed for openat2's four
arguments: the broker opens three files per fs intent, and the generic
``stockade.cell._syscall.syscall`` (which widens each argument in Python)
was a fifth of that."""
_openat2_call.restype = ctypes.c_long
_openat2_call.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
_OPEN_HOW_SIZE = ctypes.sizeof(_OpenHow)


def openat2(dirfd: int, path: str, flags: int, *, mode: int = 0, resolve: int = 0) -> int:
    """``openat2(2)``: open ``path`` relative to ``dirfd`` under the ``resolve`` restrictions.

    ``O_CLOEXEC`` is always added. EAGAIN (a concurrent rename seen during
    resolution) is retried a few times.

    Raises:
        OSError: the kernel's error (ELOOP: a symlink; EXDEV: outside ``dirfd``
            or across a mount).
        HostError: this kernel has no openat2 (before Linux 5.6).
        ValueError: a NUL in ``path``.
    """
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        # The kernel would read the name only up to it: another file.
        raise ValueError(f"openat2: a NUL in the name {path!r}")
    for _attempt in range(8):
        fd: int = _openat2_call(SYS_OPENAT2, dirfd, encoded, ctypes.addressof(how), _OPEN_HOW_SIZE)
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            raise HostError(
                "this kernel has no openat2(2), which the broker's file intents need; "
                "run stockade on Linux 5.6 or later",
                feature="openat2",
            )
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err))
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))


# ----------------------------------------------------------------- path matching


_HIDDEN_CACHE_MAX = 4096


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def _component_matches(name: str, pattern: str) -> bool:
    """One path component against one glob component, as glob(3) expands it
    (``*`` does not match a leading dot)."""
    import fnmatch

    if not any(c in pattern for c in "*?["):
        return name == pattern
    if name.startswith(".") and not pattern.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, pattern)


def _covers(entry: str, parts: Sequence[str]) -> int | None:
    """The depth of ``entry`` (a policy path, maybe a glob) if it is ``parts`` or a parent of it."""
    pattern = _parts(entry)
    if len(pattern) > len(parts):
        return None
    if all(_component_matches(p, q) for p, q in zip(parts, pattern, strict=False)):
        return len(pattern)
    return None


def _under(parts: Sequence[str], root: Sequence[str]) -> bool:
    return len(parts) >= len(root) and list(parts[: len(root)]) == list(root)


def _show(path: str) -> str:
    text = "".join(f"\\x{ord(c):02x}" if c < " " or c == "\x7f" else c for c in path)
    if len(text) > 120:
        text = text[:100] + "…" + text[-15:]
    return text


# ----------------------------------------------------------------------- access


@dataclass(frozen=True)
class _Grant:
    entry: str
    """The policy entry, for messages."""
    root: tuple[str, ...]
    """The components of the directory opened as the root (the entry, globs expanded)."""
    rel: tuple[str, ...]
    """The components below the root."""
    writable: bool
    trusted: bool
    """Whether the root may be opened following symbolic links (it lies in no writable tree)."""

    @functools.cached_property
    def encoded(self) -> tuple[bytes, tuple[bytes, ...]]:
        """The root's path and the names below it, as ``read_beneath`` takes them."""
        return os.fsencode("/" + "/".join(self.root)), tuple(os.fsencode(name) for name in self.rel)


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a listing."""

    name: str
    type: Literal["file", "dir", "symlink", "fifo", "socket", "char", "block", "other"]
    size: int


class FileAccess:
    """The fs intents' view of the host, for one policy and workspace. Thread-safe (no state)."""

    def __init__(self, policy: Policy, *, workspace: str, hidden: Sequence[str] = ()) -> None:
        """
        Args:
            policy: the run's policy (its ``filesystem`` section).
            workspace: the run's workspace on the host (for ``protect`` and the cell's identity).
            hidden: more places never reachable (the daemon's state directory).
        """
        fs = policy.filesystem
        # filesystem.mounts: a path the cell sees at a mount's target is its
        # source on the host, granted read-only or read-write as mounted.
        self._mounts = tuple(
            (tuple(_parts(os.path.normpath(m.target))), os.path.realpath(m.source)) for m in fs.mounts
        )
        self._read = tuple(
            os.path.normpath(e)
            for e in (*fs.read, *(os.path.realpath(m.source) for m in fs.mounts if m.mode == "ro"))
        )
        self._write = tuple(
            os.path.normpath(e)
            for e in (*fs.write, *(os.path.realpath(m.source) for m in fs.mounts if m.mode == "rw"))
        )
        self._workspace = os.path.realpath(workspace)
        self._writable_trees = tuple(
            _parts(t) for t in dict.fromkeys((os.path.normpath(workspace), self._workspace, *self._write))
        )
        self._deny = tuple(dict.fromkeys(os.path.normpath(e) for e in (*fs.deny, *SECRETS_DENY, *hidden)))
        roots: list[str] = []
        for root in _DEFAULT_HIDDEN:
            roots.extend(dict.fromkeys((root, os.path.realpath(root))))
        home = os.environ.get("HOME")
        if home and home != "/":
            roots.append(os.path.realpath(home))
        self._hidden_roots = tuple(_parts(r) for r in dict.fromkeys(roots))
        self._hidden_cache: dict[tuple[tuple[str, ...], tuple[str, ...]], str | None] = {}
        self._grant_cache: dict[tuple[str, bool], _Grant] = {}
        self._identities: dict[tuple[bool, int, int], _Identity] = {}
        self._root = os.geteuid() == 0
        protect: list[str] = [e for e in fs.protect if e.startswith("/")]
        self._protect_relative = tuple(e for e in fs.protect if not e.startswith("/"))
        if policy.source:
            protect.append(os.path.realpath(policy.source))
        self._protect = tuple(os.path.normpath(e) for e in protect)
        try:
            self._uid, self._gid = _cell_identity(self._workspace)
        except OSError:
            self._uid, self._gid = NOBODY, NOBODY

    # ------------------------------------------------------------- the intents

    @_refusals
    def read(self, path: str) -> bytes:
        """The content of the regular file at ``path``, or the ``Refusal``.

        Raises:
            FsFailure: not_found, is_a_directory, too_large, io.
        """
        grant = self._grant(path, write=False)
        if grant.rel:
            # The plain case in one call (``_fastread.c``): the same system
            # calls and checks as below; None whenever anything is not plain,
            # and the path below decides and explains.
            root, names = grant.encoded
            data = read_beneath(root, names, self._uid, self._gid, grant.writable and self._root, MAX_READ)
            if data is not None:
                return data
        # Descriptors closed by hand rather than through context managers,
        # which cost as much as a system call each.
        parent, name, ident = self._open_parent(grant, path)
        try:
            if name is None:
                raise FsFailure("is_a_directory", f"{_show(path)} is a directory; list it with fs.list")
            probe = self._probe(parent, name, path)
            self._check_regular(probe, path, ident, want=4, verb="read")
            if probe.st_size > MAX_READ:
                raise FsFailure("too_large", _too_large(path, probe.st_size))
            fd = self._reopen(parent, name, os.O_RDONLY, probe, path)
            try:
                data = _read_bounded(fd, MAX_READ + 1)
            finally:
                os.close(fd)
        finally:
            os.close(parent)
        if len(data) > MAX_READ:
            raise FsFailure("too_large", _too_large(path, len(data)))
        return data

    @_refusals
    def write(self, path: str, data: bytes, mode: WriteMode) -> bool:
        """Write ``data`` to the regular file at ``path``; return whether it was created.

        ``create`` makes a new file and fails if anything is there;
        ``overwrite`` replaces the content (creating the file if missing);
        ``append`` adds to the end (creating the file if missing).

        Raises:
            FsFailure: not_found (no parent), exists, is_a_directory, too_large, io.
        """
        if len(data) > MAX_WRITE:
            raise FsFailure(
                "too_large",
                f"{len(data)} bytes is more than the 16 MiB fs.write limit; write the file in parts with "
                "mode append",
            )
        grant = self._grant(path, write=True)
        with self._parent(grant, path, write=True) as (parent, name, ident):
            if name is None:
                raise FsFailure("is_a_directory", f"{_show(path)} is a directory; name a file in it")
            created = False
            fd = -1
            try:
                if mode != "create":
                    try:
                        probe = self._probe(parent, name, path)
                    except FsFailure as exc:
                        if exc.code != "not_found":
                            raise
                    else:
                        self._check_regular(probe, path, ident, want=2, verb="write")
                        if probe.st_nlink > 1:
                            raise _Refused(
                                "hard_links",
                                f"{_show(path)} has {probe.st_nlink} hard links; the broker writes only to a "
                                "file with one, so that a write cannot land on another path",
                            )
                        flags = os.O_WRONLY | (os.O_APPEND if mode == "append" else 0)
                        fd = self._reopen(parent, name, flags, probe, path)
                        if mode == "overwrite":
                            os.ftruncate(fd, 0)
                if fd < 0:
                    parent_st = os.fstat(parent)
                    if not _permits(parent_st, ident, 2 | 1):
                        raise _Refused(
                            "permissions",
                            f"the directory of {_show(path)} is not writable by the cell; the broker "
                            "creates files only where the cell could",
                        )
                    fd = self._open_at(
                        parent,
                        name,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK,
                        path,
                        mode=CREATE_MODE,
                    )
                    created = True
                    if os.geteuid() == 0:
                        os.fchown(fd, ident.owner_uid, ident.owner_gid)
                    os.fchmod(fd, CREATE_MODE)
                _write_all(fd, data)
            except OSError as exc:
                raise FsFailure("io", f"writing {_show(path)} failed: {exc.strerror}") from exc
            finally:
                if fd >= 0:
                    os.close(fd)
            return created

    @_refusals
    def list(self, path: str) -> tuple[list[Entry], bool]:
        """The entries of the directory at ``path``, sorted by name, hidden
        ones left out; and whether the listing was cut at ``MAX_LIST``.

        Raises:
            FsFailure: not_found, not_a_directory, io.
        """
        grant = self._grant(path, write=False)
        parts = _parts(os.path.normpath(path))
        with self._parent(grant, path) as (parent, name, ident):
            if name is None:
                try:
                    directory = openat2(parent, ".", os.O_RDONLY | os.O_DIRECTORY, resolve=BENEATH)
                except OSError as exc:
                    raise FsFailure("io", f"opening {_show(path)} failed: {exc.strerror}") from exc
            else:
                probe = self._probe(parent, name, path)
                if not stat.S_ISDIR(probe.st_mode):
                    raise FsFailure(
                        "not_a_directory", f"{_show(path)} is not a directory; read it with fs.read"
                    )
                directory = self._open_at(parent, name, os.O_RDONLY | os.O_DIRECTORY, path)
            with _fd(directory) as fd:
                if not _permits(os.fstat(fd), ident, 4 | 1):
                    raise _Refused("permissions", f"{_show(path)} is not readable by the cell")
                entries: list[Entry] = []
                truncated = False
                try:
                    with os.scandir(fd) as it:
                        for item in it:
                            if len(entries) >= MAX_LIST:
                                truncated = True
                                break
                            if self._hidden([*parts, item.name], grant) is not None:
                                continue
                            try:
                                st = item.stat(follow_symlinks=False)
                            except OSError:
                                continue  # gone since the directory was read
                            entries.append(Entry(item.name, _kind(st.st_mode), st.st_size))
                except OSError as exc:
                    raise FsFailure("io", f"listing {_show(path)} failed: {exc.strerror}") from exc
        entries.sort(key=lambda e: e.name)
        return entries, truncated

    # ------------------------------------------------------------------ grants

    @_refusals
    def check(self, path: str, *, write: bool) -> None:
        """The ``Refusal`` of ``path`` if no grant covers it or it is hidden (or,
        for a write, protected), without touching the filesystem; else None."""
        self._grant(path, write=write)

    def _grant(self, path: str, *, write: bool) -> _Grant:
        """The grant ``path`` lies in, refusing hidden and (for writes) protected paths.

        Raises:
            _Refused: no grant covers it, or it is hidden or protected.
        """
        # A pure function of the path and the run's policy, and a third of an
        # fs intent's time with a policy of many grants: the grants found are
        # cached (bounded, cleared when full); refusals are worked out again.
        key = (path, write)
        cached = self._grant_cache.get(key)
        if cached is not None:
            return cached
        grant = self._grant_uncached(path, write=write)
        if len(self._grant_cache) >= _HIDDEN_CACHE_MAX:
            self._grant_cache.clear()
        self._grant_cache[key] = grant
        return grant

    def _grant_uncached(self, path: str, *, write: bool) -> _Grant:
        if not path.startswith("/") or "\x00" in path:
            raise _Refused("path", f"{_show(path)!r} is not an absolute path; name the file from '/'")
        parts = _parts(os.path.normpath(path))
        for target, source in self._mounts:
            if tuple(parts[: len(target)]) == target:
                parts = [*_parts(source), *parts[len(target) :]]
                break
        best: tuple[int, bool, str] | None = None
        for writable, entries in ((False, self._read), (True, self._write)):
            for entry in entries:
                depth = _covers(entry, parts)
                # Deeper wins; at equal depth a write entry wins, as in the cell.
                if depth is not None and (best is None or (depth, writable) > (best[0], best[1])):
                    best = (depth, writable, entry)
        if best is None:
            where = "filesystem.write" if write else "filesystem.read (or filesystem.write)"
            raise _Refused(
                "grants",
                f"{_show(path)} is outside the policy's filesystem grants; add it to {where} "
                "(the workspace is not one: the agent reaches it directly)",
            )
        depth, writable, entry = best
        if write and not writable:
            raise _Refused(
                "read_only",
                f"{_show(path)} lies in the read-only grant {_show(entry)}; "
                "add a filesystem.write entry for it",
            )
        root = tuple(parts[:depth])
        grant = _Grant(entry, root, tuple(parts[depth:]), writable, trusted=not self._in_writable_tree(root))
        reason = self._hidden(parts, grant)
        if reason is not None:
            raise _Refused("hidden", f"{_show(path)} is {reason}; the broker never reaches it")
        if write:
            reason = self._protected(parts, grant)
            if reason is not None:
                raise _Refused("protected", f"{_show(path)} is {reason}; the broker never writes it")
        return grant

    def _in_writable_tree(self, root: Sequence[str]) -> bool:
        for tree in self._writable_trees:
            if len(root) > len(tree) and all(
                _component_matches(p, q) for p, q in zip(root, tree, strict=False)
            ):
                return True
        return False

    def _hidden(self, parts: Sequence[str], grant: _Grant) -> str | None:
        # The answer depends only on the policy, fixed for the run: cached, as
        # it was two thirds of an fs intent's time (bounded; cleared when full).
        key = (tuple(parts), tuple(grant.root))
        cache = self._hidden_cache
        if key in cache:
            return cache[key]
        if len(cache) >= _HIDDEN_CACHE_MAX:
            cache.clear()
        reason = cache[key] = self._hidden_uncached(parts, grant)
        return reason

    def _hidden_uncached(self, parts: Sequence[str], grant: _Grant) -> str | None:
        for entry in self._deny:
            if _covers(entry, parts) is not None:
                return f"hidden by the policy (filesystem.deny or a secret: {_show(entry)})"
        for root in self._hidden_roots:
            # As in the cell: a hidden place stays hidden except below a grant inside it.
            if _under(parts, root) and not _under(grant.root, root):
                return f"in {_show('/' + '/'.join(root))}, which every cell hides"
        return None

    def _protected(self, parts: Sequence[str], grant: _Grant) -> str | None:
        targets = list(self._protect)
        for entry in self._protect_relative:
            targets.append(os.path.join(self._workspace, entry))
            targets.append(os.path.join("/" + "/".join(grant.root), entry))
        for target in targets:
            if _covers(os.path.normpath(target), parts) is not None:
                return f"protected ({_show(target)})"
        return None

    # --------------------------------------------------------------- resolving

    @contextlib.contextmanager
    def _parent(
        self, grant: _Grant, path: str, *, write: bool = False
    ) -> Iterator[tuple[int, str | None, _Identity]]:
        """``_open_parent`` as a context manager that closes the descriptor."""
        fd, name, ident = self._open_parent(grant, path, write=write)
        try:
            yield fd, name, ident
        finally:
            os.close(fd)

    def _open_parent(
        self, grant: _Grant, path: str, *, write: bool = False
    ) -> tuple[int, str | None, _Identity]:
        """An ``O_PATH`` descriptor of the directory holding ``path`` (the
        caller closes it), its last component (``None`` when ``path`` is the
        grant's directory itself) and the identity whose permissions apply."""
        root_parts, rel = list(grant.root), list(grant.rel)
        root_fd, real = self._open_root(root_parts, grant.trusted, allow_missing=grant.writable and not rel)
        st = os.fstat(root_fd) if root_fd is not None else None
        if root_fd is None or st is None or not stat.S_ISDIR(st.st_mode):
            # A grant naming a file: its directory is the root, the file the only name in it.
            if root_fd is not None:
                os.close(root_fd)
            if rel:
                raise FsFailure("not_a_directory", f"{_show(path)}: {_show(grant.entry)} is a file")
            if not root_parts:
                raise _Refused("path", "/ is not a directory")  # cannot happen on Linux
            target = "/" + "/".join(root_parts)
            if grant.trusted and os.path.islink(target):
                target = os.path.realpath(target)
            root_parts = _parts(os.path.dirname(target))
            rel = [os.path.basename(target)]
            root_fd, real = self._open_root(root_parts, grant.trusted, allow_missing=False)
            assert root_fd is not None
            st = os.fstat(root_fd)
        fd = root_fd
        try:
            real_path = [*real, *rel]
            real_grant = _Grant(grant.entry, tuple(real), tuple(rel), grant.writable, grant.trusted)
            reason = self._hidden(real_path, real_grant)
            if reason is None and write:
                reason = self._protected(real_path, real_grant)
            if reason is not None:
                raise _Refused("link", f"{_show(path)} leads to {_show('/' + '/'.join(real_path))}, {reason}")
            ident = self._identity(grant.writable, st.st_uid, st.st_gid)
            for index, name in enumerate(rel[:-1]):
                if not _permits(st, ident, 1):
                    raise _Refused(
                        "permissions", f"{_show(path)}: a directory on the way is not searchable by the cell"
                    )
                step = self._open_at(fd, name, os.O_PATH | os.O_DIRECTORY, path, where=rel[: index + 1])
                os.close(fd)
                fd = step
                st = os.fstat(fd)
            if rel and not _permits(st, ident, 1):
                raise _Refused("permissions", f"the directory of {_show(path)} is not searchable by the cell")
        except BaseException:
            os.close(fd)
            raise
        return fd, (rel[-1] if rel else None), ident

    def _identity(self, writable: bool, owner_uid: int, owner_gid: int) -> _Identity:
        """The identity whose permissions apply in a grant whose directory ``owner_uid:owner_gid`` owns."""
        key = (writable, owner_uid, owner_gid)
        ident = self._identities.get(key)
        if ident is None:
            as_owner = writable and self._root
            ident = _Identity(
                uids=frozenset({self._uid, owner_uid} if as_owner else {self._uid}),
                gids=frozenset({self._gid, owner_gid} if as_owner else {self._gid}),
                owner_uid=owner_uid,
                owner_gid=owner_gid,
            )
            if len(self._identities) >= _HIDDEN_CACHE_MAX:
                self._identities.clear()
            self._identities[key] = ident
        return ident

    def _open_root(
        self, parts: Sequence[str], trusted: bool, *, allow_missing: bool
    ) -> tuple[int | None, Sequence[str]]:
        """An ``O_PATH`` descriptor of the grant's directory ``parts`` (None if
        missing and ``allow_missing``) and the real path it reached, in components."""
        path = "/" + "/".join(parts)
        try:
            # First without following any link: then the path reached is the
            # path named, and no readlink of /proc/self/fd is needed.
            fd = openat2(AT_FDCWD, path, os.O_PATH, resolve=RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS)
            return fd, list(parts)
        except OSError as exc:
            if exc.errno != errno.ELOOP or not trusted:
                return self._root_failure(exc, path, allow_missing=allow_missing), []
        try:
            fd = openat2(AT_FDCWD, path, os.O_PATH, resolve=RESOLVE_NO_MAGICLINKS)
        except OSError as exc:
            return self._root_failure(exc, path, allow_missing=allow_missing), []
        try:
            return fd, _parts(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError as exc:
            os.close(fd)
            raise FsFailure("io", f"opening the grant {_show(path)} failed: {exc.strerror}") from exc

    @staticmethod
    def _root_failure(exc: OSError, path: str, *, allow_missing: bool) -> None:
        """None for a missing grant that may be missing; else the failure to raise."""
        if exc.errno == errno.ENOENT:
            if allow_missing:
                return None
            raise FsFailure("not_found", f"the grant {_show(path)} does not exist on this host") from exc
        if exc.errno == errno.ELOOP:
            raise _Refused(
                "link",
                f"the grant {_show(path)} lies in a writable tree and leads through a symbolic link, "
                "which an agent could have planted; grant the real path instead",
            ) from exc
        raise FsFailure("io", f"opening the grant {_show(path)} failed: {exc.strerror}") from exc

    def _open_at(
        self, dirfd: int, name: str, flags: int, path: str, *, mode: int = 0, where: Sequence[str] = ()
    ) -> int:
        """Open one component ``name`` beneath ``dirfd``, mapping errors to failures."""
        if name in (".", "..") or "/" in name:
            raise _Refused("path", f"{_show(path)} is not a normalised path")
        try:
            return openat2(dirfd, name, flags | os.O_NOFOLLOW, mode=mode, resolve=BENEATH)
        except OSError as exc:
            here = _show(path) if not where else f"{_show(path)} (at {_show('/'.join(where))})"
            code = exc.errno
            if code == errno.ENOTDIR and _is_link(dirfd, name):
                code = errno.ELOOP  # O_DIRECTORY | O_NOFOLLOW met the link itself
            if code == errno.ELOOP:
                raise _Refused(
                    "link", f"{here} is a symbolic link, which the broker never follows; name its target"
                ) from exc
            if code == errno.EXDEV:
                raise _Refused(
                    "mount",
                    f"{here} crosses a mount point, which the broker never does; grant the mounted "
                    "directory itself",
                ) from exc
            if code == errno.ENOENT:
                raise FsFailure("not_found", f"{here} does not exist") from exc
            if code == errno.ENOTDIR:
                raise FsFailure(
                    "not_a_directory", f"{here}: a component on the way is not a directory"
                ) from exc
            if code == errno.EEXIST:
                raise FsFailure(
                    "exists", f"{here} already exists; write it with mode overwrite or append"
                ) from exc
            if code == errno.EISDIR:
                raise FsFailure("is_a_directory", f"{here} is a directory") from exc
            if code in (errno.EACCES, errno.EPERM, errno.ENXIO, errno.ETXTBSY):
                raise _Refused("permissions", f"{here} cannot be opened: {exc.strerror}") from exc
            raise FsFailure("io", f"opening {here} failed: {exc.strerror}") from exc

    def _probe(self, parent: int, name: str, path: str) -> os.stat_result:
        """What is at ``name``, looked at without opening it (no open side effects)."""
        if name not in (".", "..") and "/" not in name:
            # One component beneath a descriptor the broker resolved itself,
            # not followed if it is a link: fstatat(2) is safe here, and one
            # call instead of openat2, fstat and close. A regular file is then
            # opened with openat2's restrictions and checked to be the same
            # inode (``_reopen``); anything else takes the slow path below for
            # its exact refusal.
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except (OSError, ValueError):
                pass
            else:
                if stat.S_ISREG(st.st_mode):
                    return st
        with _fd(self._open_at(parent, name, os.O_PATH, path)) as fd:
            st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            # O_PATH | O_NOFOLLOW gives the link itself (openat2(2), RESOLVE_NO_SYMLINKS).
            raise _Refused(
                "link",
                f"{_show(path)} is a symbolic link, which the broker never follows; name its target",
            )
        return st

    def _check_regular(
        self, st: os.stat_result, path: str, ident: _Identity, *, want: int, verb: str
    ) -> None:
        if stat.S_ISDIR(st.st_mode):
            raise FsFailure("is_a_directory", f"{_show(path)} is a directory; name a file in it")
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(
                "kind",
                f"{_show(path)} is a {_kind(st.st_mode)}, not a regular file; the broker only "
                f"{verb}s regular files",
            )
        if not _permits(st, ident, want):
            raise _Refused(
                "permissions",
                f"{_show(path)} is not {verb}able by the cell (mode {stat.filemode(st.st_mode)})",
            )

    def _reopen(self, parent: int, name: str, flags: int, probe: os.stat_result, path: str) -> int:
        """Open ``name`` for real, without blocking, and make sure it is still what was probed."""
        fd = self._open_at(parent, name, flags | os.O_NONBLOCK, path)
        st = os.fstat(fd)
        if (
            (st.st_dev, st.st_ino) != (probe.st_dev, probe.st_ino)
            or not stat.S_ISREG(st.st_mode)
            or (flags & (os.O_WRONLY | os.O_RDWR) and st.st_nlink > 1)
        ):
            os.close(fd)
            raise _Refused("changed", f"{_show(path)} changed while it was being opened; try again")
        return fd


@dataclass(frozen=True, slots=True)
class _Identity:
    """Whose file permissions the broker applies: the cell's host uid, and in a
    write grant its owner (whom the cell's idmapped mount stands for)."""

    uids: frozenset[int]
    gids: frozenset[int]
    owner_uid: int
    owner_gid: int


def _is_link(dirfd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _permits(st: os.stat_result, ident: _Identity, want: int) -> bool:
    """Whether mode bits grant ``want`` (4 read, 2 write, 1 search) to ``ident``,
    as for an unprivileged process: owner bits for the owner, else group bits
    for the group, else the others' bits."""
    mode = st.st_mode
    if st.st_uid in ident.uids:
        bits = (mode >> 6) & 7
    elif st.st_gid in ident.gids:
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want == want


def _kind(mode: int) -> Literal["file", "dir", "symlink", "fifo", "socket", "char", "block", "other"]:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "char"
    if stat.S_ISBLK(mode):
        return "block"
    return "other"


@contextlib.contextmanager
def _fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _read_bounded(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, min(1024 * 1024, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _too_large(path: str, size: int) -> str:
    return (
        f"{_show(path)} is {size} bytes, more than the 16 MiB fs.read limit; read part of it with exec "
        "(head -c, tail -c)"
    )


__all__ = [
    "BENEATH",
    "MAX_LIST",
    "MAX_READ",
    "MAX_WRITE",
    "Entry",
    "FailureCode",
    "FileAccess",
    "FsFailure",
    "WriteMode",
    "openat2",
]
