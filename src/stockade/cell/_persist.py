"""The persistence report: what a cell left behind that the operator's tools would run.

A read-only mount can only cover a path that exists when the cell starts, and
the kernel has no way to refuse the creation of one name inside a writable
tree without making something there first (a placeholder git would see). So
protection has two halves (docs/CELL.md, "Protected paths"): the read-only
mounts of ``_plan._protect`` over what exists, and this check, which makes no
exception for what did not:

- ``snapshot`` walks the cell's writable places before it runs (bounded by
  ``WALK_ENTRIES_MAX``) and notes every path that a known tool executes or
  loads: every ``.git`` directory and gitfile, the hooks, configs and
  ``commondir`` of each git directory (those under ``modules/`` and
  ``worktrees/`` too), the gitlinks of each index, the shell, editor and
  agent-tool files, and build files;
- ``compare`` walks again after the run and lists what was created, changed
  or removed, with the git config keys that run programs;
- ``_revert`` keeps the pre-run bytes of what changed so that ``stockade
  revert`` can put them back.

Reading only: nothing here writes to the walked trees.
"""

from __future__ import annotations

import collections
import fnmatch
import os
import stat
from collections.abc import Iterator
from typing import Literal

from stockade._slots import Frozen, Mutable
from stockade.policy._default import SHELL_FILES

Kind = Literal[
    "git-dir",
    "gitfile",
    "gitlink",
    "git-hook",
    "git-config",
    "git-meta",
    "shell",
    "editor",
    "agent",
    "tool",
    "build",
    "protected",
]
"""What a tool does with the path: ``git-*`` git runs or follows it; ``shell``
a shell or direnv sources it; ``editor`` an editor's tasks and settings;
``agent`` a coding agent's settings and MCP servers; ``tool`` a package
manager's or build tool's config; ``build`` a build file (the operator's next
``make``, ``npm test``, ``pytest`` runs it: never write-protected, since tasks
edit them, but always reported); ``protected`` any other path the policy's
``filesystem.protect`` names (the policy file among them)."""

WALK_ENTRIES_MAX = 20000
"""Directory entries looked at, at most, per snapshot: enough for a large
repository's tree (the walk skips git objects and dependency trees); past it
the report says the walk was cut and where."""
KEEP_FILE_MAX = 1 << 20
"""Pre-run bytes kept for revert, per file (git configs, hooks, rc files are
a few KiB)."""
KEEP_TOTAL_MAX = 32 << 20
INDEX_MAX = 64 << 20
"""A git index larger than this is not read for gitlinks (the report says so)."""

SKIP_DIRS = frozenset(
    {"node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".venv", "venv"}
)
"""Dependency trees and caches, not walked: they hold thousands of files no
tool of the operator's runs by name (docs/CELL.md lists what is not covered)."""

_NAMES: dict[str, Kind] = {
    **dict.fromkeys(SHELL_FILES, "shell"),
    **dict.fromkeys((".exrc", ".nvimrc", ".nvim.lua", ".lvimrc"), "editor"),
    **dict.fromkeys((".mcp.json",), "agent"),
    **dict.fromkeys(
        (".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs", "pip.conf", ".pre-commit-config.yaml"), "tool"
    ),
    **dict.fromkeys(
        (
            "Makefile",
            "makefile",
            "GNUmakefile",
            "package.json",
            "conftest.py",
            "setup.py",
            "setup.cfg",
            "pyproject.toml",
            "tox.ini",
            "noxfile.py",
            "build.rs",
            "Cargo.toml",
            "justfile",
            "Justfile",
            "Rakefile",
            "CMakeLists.txt",
            "meson.build",
            "build.gradle",
            "Taskfile.yml",
        ),
        "build",
    ),
    ".gitmodules": "git-meta",
    # git's global config where HOME is this directory (as it is in a cell).
    ".gitconfig": "git-config",
}
"""Files by name, wherever they lie in a writable place."""

_DIRS: dict[str, Kind] = {
    ".vscode": "editor",
    ".idea": "editor",
    ".claude": "agent",
    ".cursor": "agent",
    ".cargo": "tool",
}
"""Directories whose every file a tool loads (``.vscode/tasks.json``,
``.claude/settings.json``, ``.cargo/config.toml``…)."""

_RUNS_PROGRAMS = (
    "core.fsmonitor",
    "core.hookspath",
    "core.sshcommand",
    "core.pager",
    "core.editor",
    "core.askpass",
    "core.gitproxy",
    "sequence.editor",
    "diff.external",
    "diff.*.textconv",
    "diff.*.command",
    "filter.*.clean",
    "filter.*.smudge",
    "filter.*.process",
    "merge.*.driver",
    "credential.helper",
    "credential.*.helper",
    "gpg.program",
    "gpg.*.program",
    "pager.*",
    "interactive.difffilter",
    "uploadpack.packobjectshook",
    "remote.*.uploadpack",
    "remote.*.receivepack",
    "include.path",
    "includeif.*.path",
    "difftool.*.cmd",
    "mergetool.*.cmd",
    "man.*.cmd",
    "browser.*.cmd",
    "web.browser",
)
"""Git config keys whose value is a program git runs, or another config it
loads (git-config(1)); ``alias.*`` and ``submodule.*.update`` only when the
value starts with ``!`` (a shell command)."""


class Seen(Frozen):
    """One persistence-relevant path at one moment."""

    _fields = ("path", "root", "kind", "is_dir", "digest", "mode", "content", "runs")
    __slots__ = _fields
    path: str
    root: str
    """The writable place it lies in (revert resolves the path beneath it)."""
    kind: Kind
    is_dir: bool
    digest: str
    """sha256 of the content (a directory: ``""``; a symbolic link: of its target)."""
    mode: int
    content: bytes | None
    """The bytes, when small enough to keep for revert."""
    runs: tuple[str, ...]
    """For a git config: its keys that run programs, as ``key=value``; for a
    hook: its own name when it is executable."""

    def __init__(
        self,
        path: str,
        root: str,
        kind: Kind,
        is_dir: bool,
        digest: str,
        mode: int,
        content: bytes | None = None,
        runs: tuple[str, ...] = (),
    ) -> None:
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "is_dir", is_dir)
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "runs", runs)


class Snapshot(Mutable):
    """What ``snapshot`` found in the writable places."""

    _fields = ("roots", "protected", "seen", "gitlinks", "indexes", "cut")
    __slots__ = _fields
    roots: tuple[str, ...]
    protected: tuple[str, ...]
    seen: dict[str, Seen]
    gitlinks: dict[str, frozenset[str]]
    """For each git index: the paths it records as gitlinks (mode 160000)."""
    indexes: dict[str, bytes]
    """The bytes of each index that holds gitlinks or may gain some (for revert)."""
    cut: list[str]
    """Where the walk stopped early (budget spent, an index too large)."""

    def __init__(
        self,
        roots: tuple[str, ...],
        protected: tuple[str, ...] = (),
        seen: dict[str, Seen] | None = None,
        gitlinks: dict[str, frozenset[str]] | None = None,
        indexes: dict[str, bytes] | None = None,
        cut: list[str] | None = None,
    ) -> None:
        self.roots = roots
        self.protected = protected
        self.seen = {} if seen is None else seen
        self.gitlinks = {} if gitlinks is None else gitlinks
        self.indexes = {} if indexes is None else indexes
        self.cut = [] if cut is None else cut


class Change(Frozen):
    """One line of the persistence report."""

    _fields = ("path", "root", "kind", "change", "is_dir", "runs", "before", "note", "index")
    __slots__ = _fields
    path: str
    root: str
    kind: Kind
    change: Literal["created", "changed", "removed"]
    is_dir: bool
    runs: tuple[str, ...]
    before: Seen | None
    note: str
    index: str
    """For a gitlink: the index that records it."""

    def __init__(
        self,
        path: str,
        root: str,
        kind: Kind,
        change: Literal["created", "changed", "removed"],
        is_dir: bool = False,
        runs: tuple[str, ...] = (),
        before: Seen | None = None,
        note: str = "",
        index: str = "",
    ) -> None:
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "change", change)
        object.__setattr__(self, "is_dir", is_dir)
        object.__setattr__(self, "runs", runs)
        object.__setattr__(self, "before", before)
        object.__setattr__(self, "note", note)
        object.__setattr__(self, "index", index)

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "kind": self.kind,
            "change": self.change,
            "runs": list(self.runs),
            **({"note": self.note} if self.note else {}),
        }

    def line(self) -> str:
        what = f"{self.change} {self.kind} {self.path}"
        if self.runs:
            what += f" (runs: {', '.join(self.runs[:4])}{' …' if len(self.runs) > 4 else ''})"
        if self.note:
            what += f"; {self.note}"
        return what


def find_git(roots: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The git directories and gitfiles in ``roots`` (names only, nothing read):
    the ``.git`` of every repository, nested ones too, and the git directories
    under each one's ``modules/`` and ``worktrees/``. Bounded as ``snapshot``."""
    dirs: list[str] = []
    files: list[str] = []
    budget = [WALK_ENTRIES_MAX]
    todo = list(dict.fromkeys(roots))
    skip = set(todo)
    while todo and budget[0] > 0:
        directory = todo.pop()
        for entry in _entries(directory, budget):
            if entry.path in skip:
                continue
            is_dir = _is_dir(entry)
            if entry.name == ".git":
                if is_dir:
                    dirs.extend(_inner_git_dirs(entry.path, budget))
                elif entry.is_file(follow_symlinks=False):
                    files.append(entry.path)
            elif is_dir and entry.name not in SKIP_DIRS:
                todo.append(entry.path)
    return dirs, files


def _inner_git_dirs(gitdir: str, budget: list[int]) -> list[str]:
    """``gitdir`` and the git directories of its submodules and worktrees."""
    found = [gitdir]
    todo = [os.path.join(gitdir, "modules"), os.path.join(gitdir, "worktrees")]
    while todo and budget[0] > 0:
        directory = todo.pop()
        for entry in _entries(directory, budget):
            if not _is_dir(entry):
                continue
            if os.path.isfile(os.path.join(entry.path, "HEAD")):
                found.extend(_inner_git_dirs(entry.path, budget))
            else:
                todo.append(entry.path)  # a submodule's name may hold slashes
    return found


def _entries(directory: str, budget: list[int]) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return []
    room = max(0, budget[0])
    budget[0] -= len(entries)
    return entries[:room]


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def snapshot(roots: tuple[str, ...], *, protected: tuple[str, ...] = (), keep: bool = True) -> Snapshot:
    """Walk ``roots`` (real, absolute directories) and note what tools run or load.

    ``protected``: paths the policy protects (``filesystem.protect``, the
    policy file), noted whatever their name. ``keep``: also keep the bytes of
    small files (for revert); the check after a run does not need them.
    """
    snap = Snapshot(roots=roots, protected=protected)
    budget = [WALK_ENTRIES_MAX]
    kept = [0 if keep else KEEP_TOTAL_MAX]
    for path in protected:
        under = [r for r in roots if path.startswith(r.rstrip("/") + "/")]
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if under:
            _note(snap, max(under, key=len), path, "protected", st, kept)
    done: set[str] = set()
    for root in roots:
        if root in done:
            continue
        done.add(root)
        _walk(snap, root, root, budget, kept, done)
    return snap


def _budgeted(snap: Snapshot, todo: collections.deque[str], budget: list[int]) -> Iterator[os.DirEntry[str]]:
    """The entries of each directory in ``todo``, breadth first (the caller
    appends the directories to descend into), each spending one of ``budget``;
    where it runs out, the walk stops and the snapshot says where."""
    while todo:
        directory = todo.popleft()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            budget[0] -= 1
            if budget[0] < 0:
                snap.cut.append(f"walk stopped at {WALK_ENTRIES_MAX} entries in {directory}")
                todo.clear()
                return
            yield entry


def _walk(snap: Snapshot, root: str, top: str, budget: list[int], kept: list[int], done: set[str]) -> None:
    # Breadth first: where an agent floods a tree to spend the bound, what
    # lies near the top (the rc files, .git, .vscode) has been seen already,
    # and the report says where the walk stopped.
    todo = collections.deque([top])
    for entry in _budgeted(snap, todo, budget):
        path = entry.path
        if path in done and path != top:
            continue  # another root (a write grant inside the workspace)
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        name = entry.name
        is_dir = stat.S_ISDIR(st.st_mode)
        if name == ".git":
            if is_dir:
                _git_dir(snap, root, path, budget, kept)
            else:
                _note(snap, root, path, "gitfile", st, kept)
            continue
        kind = _DIRS.get(name)
        if kind is not None and is_dir:
            _note(snap, root, path, kind, st, kept)
            _all_files(snap, root, path, kind, budget, kept)
            continue
        kind = _NAMES.get(name)
        if kind is not None and not is_dir:
            _note(snap, root, path, kind, st, kept)
        if is_dir and name not in SKIP_DIRS:
            todo.append(path)


def _git_dir(snap: Snapshot, root: str, gitdir: str, budget: list[int], kept: list[int]) -> None:
    """A git directory: itself, its hooks, configs, ``commondir``, the gitlinks
    of its index, and the git directories of its submodules and worktrees."""
    try:
        st = os.lstat(gitdir)
    except OSError:
        return
    _note(snap, root, gitdir, "git-dir", st, kept)
    files: tuple[tuple[str, Kind], ...] = (
        ("config", "git-config"),
        ("config.worktree", "git-config"),
        ("commondir", "git-meta"),
    )
    for name, kind in files:
        path = os.path.join(gitdir, name)
        try:
            _note(snap, root, path, kind, os.lstat(path), kept)
        except OSError:
            pass
    hooks = os.path.join(gitdir, "hooks")
    if os.path.isdir(hooks) and not os.path.islink(hooks):
        _all_files(snap, root, hooks, "git-hook", budget, kept)
    _index(snap, os.path.join(gitdir, "index"))
    for sub in ("modules", "worktrees"):
        base = os.path.join(gitdir, sub)
        todo = collections.deque([base])
        for entry in _budgeted(snap, todo, budget):
            if not entry.is_dir(follow_symlinks=False):
                continue
            if os.path.isfile(os.path.join(entry.path, "HEAD")):
                _git_dir(snap, root, entry.path, budget, kept)
            else:
                todo.append(entry.path)  # a submodule's name may hold slashes
        if budget[0] < 0:
            return  # the walk's bound is spent: the snapshot says where


def _all_files(snap: Snapshot, root: str, top: str, kind: Kind, budget: list[int], kept: list[int]) -> None:
    todo = collections.deque([top])
    for entry in _budgeted(snap, todo, budget):
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            todo.append(entry.path)
        else:
            _note(snap, root, entry.path, kind, st, kept)


def _note(snap: Snapshot, root: str, path: str, kind: Kind, st: os.stat_result, kept: list[int]) -> None:
    import hashlib  # here: only a run that meets a file tools run pays for it

    is_dir = stat.S_ISDIR(st.st_mode)
    digest, content = "", None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path).encode("utf-8", "surrogateescape")
        except OSError:
            return
        digest = "link:" + hashlib.sha256(target).hexdigest()
    elif stat.S_ISREG(st.st_mode):
        data = _read(path, KEEP_FILE_MAX if kind != "build" else 8 * KEEP_FILE_MAX)
        if data is None:
            digest = f"large:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        else:
            digest = hashlib.sha256(data).hexdigest()
            if kept[0] + len(data) <= KEEP_TOTAL_MAX and len(data) <= KEEP_FILE_MAX:
                content = data
                kept[0] += len(data)
    elif not is_dir:
        digest = f"special:{stat.S_IFMT(st.st_mode)}"
    runs: tuple[str, ...] = ()
    if kind == "git-config" and content is not None:
        runs = program_keys(content)
    elif kind == "git-config" and stat.S_ISREG(st.st_mode):
        data = _read(path, KEEP_FILE_MAX)
        runs = program_keys(data) if data is not None else ("(too large to read)",)
    elif (
        kind == "git-hook"
        and stat.S_ISREG(st.st_mode)
        and st.st_mode & 0o111
        and not path.endswith(".sample")
    ):
        runs = (os.path.basename(path),)
    snap.seen[path] = Seen(path, root, kind, is_dir, digest, stat.S_IMODE(st.st_mode), content, runs)


def _read(path: str, limit: int) -> bytes | None:
    """A regular file's bytes, without following a link; ``None`` past ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size > limit:
            return None
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > limit:
                return None
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)


def _index(snap: Snapshot, path: str) -> None:
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        return
    if st.st_size > INDEX_MAX:
        snap.cut.append(f"git index {path} is over {INDEX_MAX >> 20} MiB: its gitlinks were not read")
        return
    data = _read(path, INDEX_MAX)
    if data is None:
        return
    snap.gitlinks[path] = gitlinks(data)
    snap.indexes[path] = data


def gitlinks(data: bytes) -> frozenset[str]:
    """The paths a git index (gitformat-index(5), versions 2 to 4) records as
    gitlinks, mode 160000: a nested repository git enters on ``status``."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return frozenset()
    version = int.from_bytes(data[4:8], "big")
    count = int.from_bytes(data[8:12], "big")
    if version not in (2, 3, 4):
        return frozenset()
    # 20-byte object names: SHA-1 repositories (SHA-256 ones, still
    # experimental in git, are read as garbage and yield no gitlinks).
    found: set[str] = set()
    pos = 12
    previous = b""
    for _ in range(count):
        if pos + 62 > len(data):
            break
        mode = int.from_bytes(data[pos + 24 : pos + 28], "big")
        hash_len = 20
        flags_at = pos + 40 + hash_len
        flags = int.from_bytes(data[flags_at : flags_at + 2], "big")
        at = flags_at + 2
        if flags & 0x4000 and version >= 3:
            at += 2
        if version == 4:
            strip, at = _varint(data, at)
            end = data.find(b"\0", at)
            if end < 0:
                break
            name = previous[: len(previous) - strip] + data[at:end]
            previous = name
            pos = end + 1
        else:
            end = data.find(b"\0", at)
            if end < 0:
                break
            name = data[at:end]
            length = end - pos + 1
            pos += (length + 7) // 8 * 8
        if mode >> 12 == 0o16:  # S_IFGITLINK
            found.add(name.decode("utf-8", "surrogateescape"))
    return frozenset(found)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """git's offset varint (varint.c): 7 bits a byte, each continuation adds one."""
    byte = data[at]
    at += 1
    value = byte & 0x7F
    while byte & 0x80:
        byte = data[at]
        at += 1
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, at


def program_keys(text: bytes) -> tuple[str, ...]:
    """The keys of a git config file that make git run a program or load
    another config, as ``key=value`` (git-config(1) syntax, simplified: a
    value's quotes and escapes are kept as written)."""
    found: list[str] = []
    section = ""
    for raw in text.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            close = line.find("]")
            header = line[1:close] if close > 0 else line[1:]
            name, _, sub = header.partition(" ")
            sub = sub.strip().strip('"')
            section = f"{name.lower()}.{sub}" if sub else name.lower()
            line = line[close + 1 :].strip() if close > 0 else ""
            if not line:
                continue
        key, eq, value = line.partition("=")
        key = key.strip().lower()
        value = value.strip() if eq else "true"
        if not key:
            continue
        full = f"{section}.{key}"
        lowered = full.lower()
        bang = value.lstrip('"').startswith("!")
        if (
            any(fnmatch.fnmatchcase(lowered, pattern) for pattern in _RUNS_PROGRAMS)
            or (lowered.startswith("alias.") and bang)
            or (lowered.startswith("submodule.") and lowered.endswith(".update") and bang)
        ):
            found.append(f"{full}={value[:200]}")
    return tuple(found)


def compare(before: Snapshot, after: Snapshot) -> list[Change]:
    """What changed between two snapshots of the same places, for the report."""
    changes: list[Change] = []
    new_git_dirs = [p for p, s in after.seen.items() if s.kind == "git-dir" and p not in before.seen]

    def in_new_git_dir(path: str) -> str | None:
        for g in new_git_dirs:
            if path != g and path.startswith(g + "/"):
                return g
        return None

    inner: dict[str, list[str]] = {}
    for path in sorted(after.seen):
        seen = after.seen[path]
        old = before.seen.get(path)
        owner = in_new_git_dir(path)
        if owner is not None:
            if seen.runs:
                inner.setdefault(owner, []).extend(seen.runs)
            continue
        if old is None:
            changes.append(Change(path, seen.root, seen.kind, "created", seen.is_dir, seen.runs))
        elif old.digest != seen.digest or old.is_dir != seen.is_dir:
            runs = (
                tuple(r for r in seen.runs if r not in old.runs) if seen.kind == "git-config" else seen.runs
            )
            changes.append(Change(path, seen.root, seen.kind, "changed", seen.is_dir, runs, before=old))
        elif old.mode != seen.mode and seen.kind == "git-hook":
            changes.append(
                Change(
                    path,
                    seen.root,
                    seen.kind,
                    "changed",
                    False,
                    seen.runs,
                    before=old,
                    note="made executable" if seen.runs else "mode changed",
                )
            )
    for path in sorted(before.seen):
        if path in after.seen:
            continue
        old = before.seen[path]
        if any(
            path.startswith(p + "/")
            for p in before.seen
            if before.seen[p].kind == "git-dir" and p not in after.seen
        ):
            continue  # inside a git dir that is gone: the dir's own line says it
        changes.append(Change(path, old.root, old.kind, "removed", old.is_dir, before=old))
    changes = [
        (
            Change(
                c.path,
                c.root,
                c.kind,
                c.change,
                c.is_dir,
                tuple(dict.fromkeys(inner.get(c.path, ()))),
                note="holds hooks or config keys that run programs" if inner.get(c.path) else "",
            )
            if c.kind == "git-dir" and c.change == "created"
            else c
        )
        for c in changes
    ]
    for index, links in sorted(after.gitlinks.items()):
        gitdir = os.path.dirname(index)
        if in_new_git_dir(index) is not None or gitdir in new_git_dirs:
            continue
        added = sorted(links - before.gitlinks.get(index, frozenset()))
        if not added:
            continue
        # A repository's .git sits in its work tree; a submodule's git dir
        # (under modules/) names its work tree only in its config.
        top = os.path.dirname(gitdir) if os.path.basename(gitdir) == ".git" else gitdir
        root = after.seen[gitdir].root if gitdir in after.seen else top
        for link in added:
            changes.append(
                Change(
                    os.path.join(top, link),
                    root,
                    "gitlink",
                    "created",
                    note=f"registered as a gitlink in {index}: git status enters it",
                    index=index,
                )
            )
    return changes


def report_lines(detail: dict[str, object], *, limit: int = 20) -> list[str]:
    """A ``cell.persistence`` event's detail as lines for a terminal (empty
    when the cell left nothing): what the CLI and the demo print at the end."""
    changes = detail.get("changes")
    cut = detail.get("cut")
    warning = (
        [f"  the walk was cut ({'; '.join(str(c) for c in cut[:2])}): files past it were not checked"]
        if isinstance(cut, list) and cut
        else []
    )
    if not isinstance(changes, list) or not changes:
        return (
            ["persistence report: nothing found, but not everything was looked at:", *warning]
            if warning
            else []
        )
    lines = [
        f"persistence report: {len(changes)} file(s) that your tools run or load were created or "
        "changed in writable places (git, your shell, editor or build would run them):"
    ]
    for row in changes[:limit]:
        if not isinstance(row, dict):
            continue
        runs = row.get("runs") or []
        text = f"  - {row.get('change')} {row.get('kind')} {row.get('path')}"
        if isinstance(runs, list) and runs:
            text += f" (runs: {', '.join(str(r) for r in runs[:4])}{' …' if len(runs) > 4 else ''})"
        if row.get("note"):
            text += f"; {row.get('note')}"
        lines.append(text)
    if len(changes) > limit:
        lines.append(f"  … and {len(changes) - limit} more (see the cell.persistence event)")
    lines.extend(warning)
    if detail.get("revert"):
        lines.append(
            f"  look at them before you run git, a shell or a build there; undo them: {detail['revert']}"
        )
    elif detail.get("error"):
        lines.append(f"  {detail['error']}")
    return lines
